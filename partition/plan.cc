#include "partition/plan.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "ir/dot.h"
#include "ir/graph.h"
#include "partition/partitioner.h"
#include "partition/plan.pb.h"
#include "partition/subgraph.h"
#include "util/format.h"
#include "util/json.h"

namespace tracecut::partition {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;

// ----- Text -----------------------------------------------------------------

// "a, b, c, d, ... (+3)": at most `keep` names.
std::string Elide(const google::protobuf::RepeatedPtrField<std::string>& names,
                  int keep) {
  if (names.empty()) return "-";
  std::vector<std::string> shown;
  for (int i = 0; i < names.size() && i < keep; ++i) shown.push_back(names[i]);
  std::string out = absl::StrJoin(shown, ", ");
  if (names.size() > keep) {
    absl::StrAppend(&out, ", ... (+", names.size() - keep, ")");
  }
  return out;
}

// "model.layers.0", "model.layers.0, model.layers.1",
// "model.layers.0 .. model.layers.3 (4)".
std::string Modules(const SubgraphPlan& s) {
  const auto& paths = s.module_paths();
  if (paths.empty()) return "(head)";
  if (paths.size() <= 2) return absl::StrJoin(paths, ", ");
  return absl::StrCat(paths[0], " .. ", paths[paths.size() - 1], " (",
                      paths.size(), ")");
}

// ----- JSON -----------------------------------------------------------------

// Protobuf's JSON printer writes 64-bit integers as strings (the proto3 JSON
// mapping, for JavaScript); ours are counts and byte sizes that scripts
// compare as numbers, and PlanFromJson reads either form.
void Int64sAsNumbers(const Descriptor& d, util::Json& json) {
  for (int i = 0; i < d.field_count(); ++i) {
    const FieldDescriptor* f = d.field(i);
    auto it = json.find(f->name());
    if (it == json.end()) continue;
    auto convert = [f](util::Json& v) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        Int64sAsNumbers(*f->message_type(), v);
        return;
      }
      if (!v.is_string()) return;
      const std::string& text = v.get_ref<const std::string&>();
      int64_t n;
      uint64_t u;
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT64 &&
          absl::SimpleAtoi(text, &n)) {
        v = n;
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64 &&
                 absl::SimpleAtoi(text, &u)) {
        v = u;
      }
    };
    if (f->is_repeated()) {
      for (util::Json& e : *it) convert(e);
    } else {
      convert(*it);
    }
  }
}

}  // namespace

PartitionPlan BuildPlan(const Partition& partition,
                        const PartitionOptions& options) {
  PartitionPlan plan;
  int64_t nodes = 0;
  for (const Subgraph& s : partition.subgraphs) {
    SubgraphPlan* p = plan.add_subgraphs();
    p->set_index(s.index);
    p->set_node_count(s.node_count);
    nodes += s.node_count;
    for (const auto& v : s.module_paths) p->add_module_paths(v);
    for (const auto& v : s.input_names) p->add_input_names(v);
    for (const auto& v : s.output_names) p->add_output_names(v);
    for (const auto& v : s.last_use) p->add_last_use(v);
    p->set_param_bytes(s.param_bytes);
    for (const auto& v : s.param_targets) p->add_param_targets(v);
    for (const auto& v : s.leaf_modules) p->add_leaf_modules(v);
    for (const auto& v : s.warnings) p->add_warnings(v);
  }
  for (const auto& v : partition.targets_used) plan.add_targets_used(v);
  PlanOptions* o = plan.mutable_options();
  for (const auto& v : options.targets) o->add_targets(v);
  for (const auto& v : options.ignore) o->add_ignore(v);
  o->set_targets_per_subgraph(options.targets_per_subgraph);
  o->set_max_param_bytes(options.max_param_bytes);
  o->set_nesting(std::string(NestingName(options.nesting)));
  for (const auto& v : partition.model_inputs) plan.add_model_inputs(v);
  for (const auto& v : partition.model_outputs) plan.add_model_outputs(v);
  plan.set_node_count(nodes);
  for (const auto& v : partition.warnings) plan.add_warnings(v);
  return plan;
}

std::string PlanToText(const PartitionPlan& plan) {
  std::string out = absl::StrCat(
      "partition: ", plan.subgraphs_size(), " subgraphs, ", plan.node_count(),
      " nodes, targets: ",
      plan.targets_used().empty() ? "-"
                                  : absl::StrJoin(plan.targets_used(), ", "),
      "\n");
  std::vector<std::vector<std::string>> rows = {
      {"#", "nodes", "params", "modules", "inputs", "outputs"}};
  for (const SubgraphPlan& s : plan.subgraphs()) {
    rows.push_back({absl::StrCat(s.index()), absl::StrCat(s.node_count()),
                    util::HumanBytes(s.param_bytes()), Modules(s),
                    Elide(s.input_names(), 4), Elide(s.output_names(), 4)});
  }
  const size_t cols = rows[0].size();
  std::vector<size_t> width(cols, 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < cols; ++c)
      width[c] = std::max(width[c], row[c].size());
  }
  // Counts right-aligned, text left-aligned, no trailing spaces.
  const std::vector<bool> right = {true, true, false, false, false, false};
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < cols; ++c) {
      if (c > 0) line.append("  ");
      std::string fill(width[c] - row[c].size(), ' ');
      line.append(right[c] ? fill + row[c]
                           : (c + 1 == cols ? row[c] : row[c] + fill));
    }
    absl::StrAppend(&out, line, "\n");
  }
  for (const std::string& w : plan.warnings()) {
    absl::StrAppend(&out, "warning: ", w, "\n");
  }
  return out;
}

std::string PlanToJson(const PartitionPlan& plan) {
  // Protobuf prints every scalar and list field with this option, but not an
  // unset message field: give `options` its defaults, as BuildPlan does.
  PartitionPlan with_options;
  const PartitionPlan* to_print = &plan;
  if (!plan.has_options()) {
    with_options = plan;
    with_options.mutable_options();
    to_print = &with_options;
  }
  google::protobuf::util::JsonPrintOptions print;
  print.always_print_primitive_fields = true;
  print.preserve_proto_field_names = true;
  std::string compact;
  auto printed =
      google::protobuf::util::MessageToJsonString(*to_print, &compact, print);
  // Printing fails only for Any or map fields, which a plan has none of.
  absl::StatusOr<util::Json> json =
      printed.ok() ? util::ParseJson(compact, "PartitionPlan")
                   : absl::InternalError(printed.ToString());
  if (!json.ok()) {
    return util::DumpJson(
               util::Json::object(
                   {{"error", std::string(json.status().message())}}),
               2) +
           "\n";
  }
  Int64sAsNumbers(*PartitionPlan::descriptor(), *json);
  return util::DumpJson(*json, 2) + "\n";
}

absl::StatusOr<PartitionPlan> PlanFromJson(absl::string_view json) {
  PartitionPlan plan;
  google::protobuf::util::JsonParseOptions options;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &plan, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition plan JSON: ", status.ToString()));
  }
  return plan;
}

std::string PartitionToDot(const ir::Graph& graph, const Partition& partition) {
  ir::DotOptions options;
  options.graph_name = "partition";
  for (const ir::Node* n : graph.nodes()) {
    int s = partition.SubgraphOf(n->name());
    if (s >= 0) options.clusters[n->name()] = s;
  }
  for (const Subgraph& s : partition.subgraphs) {
    std::string what =
        s.module_paths.empty() ? std::string("head") : s.module_paths.front();
    if (s.module_paths.size() > 1) {
      absl::StrAppend(&what, " (+", s.module_paths.size() - 1, ")");
    }
    options.cluster_labels.push_back(absl::StrCat("#", s.index, " ", what));
  }
  return ir::ToDot(graph, options);
}

}  // namespace tracecut::partition
