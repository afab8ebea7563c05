#include "partition/plan.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"
#include "ir/dot.h"
#include "ir/graph.h"
#include "partition/partitioner.h"
#include "partition/plan.pb.h"
#include "partition/subgraph.h"
#include "util/format.h"

namespace tracecut::partition {
namespace {

using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::Reflection;

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

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(ch);  // UTF-8 passes through.
        }
    }
  }
  out->push_back('"');
}

void AppendMessage(const Message& m, int indent, std::string* out);

// One scalar or message element of field `f` (index < 0: singular).
void AppendValue(const Message& m, const FieldDescriptor* f, int index,
                 int indent, std::string* out) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(
          out, rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(
          out, rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(
          out, rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(
          out, rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      absl::StrAppend(
          out, rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      absl::StrAppend(
          out, rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out->append((rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f))
                      ? "true"
                      : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      AppendJsonString(
          (rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name(),
          out);
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      AppendJsonString(
          rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f), out);
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      AppendMessage(
          rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f),
          indent, out);
      break;
  }
}

// Objects one field a line; lists of scalars on one line, lists of messages
// one element a line.
void AppendMessage(const Message& m, int indent, std::string* out) {
  const auto* d = m.GetDescriptor();
  const Reflection* r = m.GetReflection();
  const std::string pad(indent + 2, ' ');
  out->append("{");
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    out->append(i == 0 ? "\n" : ",\n");
    out->append(pad);
    AppendJsonString(f->name(), out);
    out->append(": ");
    if (!f->is_repeated()) {
      AppendValue(m, f, -1, indent + 2, out);
      continue;
    }
    const int n = r->FieldSize(m, f);
    if (n == 0) {
      out->append("[]");
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      out->append("[");
      for (int k = 0; k < n; ++k) {
        out->append(k == 0 ? "\n" : ",\n");
        out->append(pad + "  ");
        AppendValue(m, f, k, indent + 4, out);
      }
      out->append("\n" + pad + "]");
    } else {
      out->append("[");
      for (int k = 0; k < n; ++k) {
        if (k > 0) out->append(", ");
        AppendValue(m, f, k, indent + 2, out);
      }
      out->append("]");
    }
  }
  out->append(d->field_count() == 0 ? "}"
                                    : "\n" + std::string(indent, ' ') + "}");
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
  std::string out;
  AppendMessage(plan, 0, &out);
  out.push_back('\n');
  return out;
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
