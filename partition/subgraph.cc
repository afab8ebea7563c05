#include "partition/subgraph.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "util/status_macros.h"

namespace tracecut::partition {

// Note [Subgraph values]
// ~~~~~~~~~~~~~~~~~~~~~~
// What crosses a subgraph boundary is a value: the result of a node, named
// after it, or a model input. A subgraph's placeholders are exactly the
// values it reads from outside, and its output tuple exactly the values a
// later subgraph (or the model's output) reads, so an intermediates cache
// holds nothing it does not need, and `last_use` says when to drop each
// entry.
//
// Parameters are not values: a get_attr node is a reference into the module
// that owns the weights, and every subgraph that uses a parameter reads it
// itself with its own get_attr node (same name and target). Passing weights
// through the cache instead would store, per calibration batch, a copy of
// e.g. a tied embedding matrix between the head and lm_head. The node's
// home (for counting and plans) is the first subgraph that reads it.

int Partition::SubgraphOf(absl::string_view node_name) const {
  auto it = home.find(node_name);
  return it == home.end() ? -1 : it->second;
}

namespace {

std::string Sub(int index) { return absl::StrCat("subgraph ", index); }

// The output node's tuple elements, or an error.
absl::StatusOr<std::vector<ir::Node*>> OutputValues(const ir::Graph& g,
                                                    int index) {
  const ir::Node* out = g.output_node();
  if (out == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(Sub(index), " has no output node"));
  }
  if (out->args().size() != 1 ||
      out->args()[0].kind() != ir::Argument::Kind::kTuple) {
    return absl::FailedPreconditionError(absl::StrCat(
        Sub(index), ": the output node must return one Tuple of values"));
  }
  std::vector<ir::Node*> values;
  for (const ir::Argument& a : out->args()[0].elements()) {
    if (!a.is_node()) {
      return absl::FailedPreconditionError(absl::StrCat(
          Sub(index), ": the output tuple holds a non-node element"));
    }
    values.push_back(a.node());
  }
  return values;
}

// Operand equality across graphs: references compare by node name.
bool SameArgument(const ir::Argument& a, const ir::Argument& b) {
  if (a.kind() != b.kind()) return false;
  if (a.is_node()) return a.node()->name() == b.node()->name();
  if (!a.is_sequence()) return a == b;
  const auto& x = a.elements();
  const auto& y = b.elements();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!SameArgument(x[i], y[i])) return false;
  }
  return true;
}

bool SameOperands(const ir::Node& a, const ir::Node& b) {
  if (a.args().size() != b.args().size() ||
      a.kwargs().size() != b.kwargs().size()) {
    return false;
  }
  for (size_t i = 0; i < a.args().size(); ++i) {
    if (!SameArgument(a.args()[i], b.args()[i])) return false;
  }
  for (size_t i = 0; i < a.kwargs().size(); ++i) {
    if (a.kwargs()[i].first != b.kwargs()[i].first ||
        !SameArgument(a.kwargs()[i].second, b.kwargs()[i].second)) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status VerifySchedule(const Partition& partition) {
  if (partition.output_graph == nullptr) {
    return absl::FailedPreconditionError("partition has no output graph");
  }
  // Value name -> producing subgraph (-1: model input).
  absl::flat_hash_map<std::string, int> available;
  absl::flat_hash_map<std::string, int> freed;
  absl::flat_hash_map<std::string, int> produced_by;
  absl::flat_hash_set<std::string> model_inputs(partition.model_inputs.begin(),
                                                partition.model_inputs.end());
  absl::flat_hash_set<std::string> model_outputs(
      partition.model_outputs.begin(), partition.model_outputs.end());
  absl::flat_hash_set<std::string> read_inputs;
  for (const std::string& name : partition.model_inputs) available[name] = -1;
  for (const Subgraph& s : partition.subgraphs) {
    for (const std::string& name : s.output_names) {
      produced_by.try_emplace(name, s.index);
    }
  }

  for (size_t i = 0; i < partition.subgraphs.size(); ++i) {
    const Subgraph& s = partition.subgraphs[i];
    const int idx = static_cast<int>(i);
    if (s.index != idx) {
      return absl::FailedPreconditionError(
          absl::StrCat("subgraph at position ", i, " has index ", s.index));
    }
    if (s.graph == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(Sub(idx), " has no graph"));
    }
    std::vector<ir::Node*> placeholders = s.graph->placeholders();
    if (placeholders.size() != s.input_names.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Sub(idx), " has ", placeholders.size(),
                       " placeholders for ", s.input_names.size(), " inputs"));
    }
    absl::flat_hash_set<absl::string_view> inputs;
    for (size_t k = 0; k < placeholders.size(); ++k) {
      const std::string& name = s.input_names[k];
      if (placeholders[k]->name() != name) {
        return absl::FailedPreconditionError(
            absl::StrCat(Sub(idx), ": placeholder ", k, " is %",
                         placeholders[k]->name(), ", expected %", name));
      }
      inputs.insert(name);
      if (model_inputs.contains(name)) read_inputs.insert(name);
      if (available.contains(name)) continue;
      if (auto f = freed.find(name); f != freed.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(Sub(idx), " reads %", name, ", which ", Sub(f->second),
                         " freed (last_use)"));
      }
      if (auto p = produced_by.find(name); p != produced_by.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(Sub(idx), " reads %", name, ", which the later ",
                         Sub(p->second), " produces"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat(Sub(idx), " reads %", name,
                       ", which no subgraph produces and is no model input"));
    }
    ASSIGN_OR_RETURN(std::vector<ir::Node*> outs, OutputValues(*s.graph, idx));
    if (outs.size() != s.output_names.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Sub(idx), " returns ", outs.size(), " values for ",
                       s.output_names.size(), " output names"));
    }
    for (const std::string& name : s.last_use) {
      if (!inputs.contains(name)) {
        return absl::FailedPreconditionError(absl::StrCat(
            Sub(idx), ": last_use %", name, " is not one of its inputs"));
      }
    }
    for (const std::string& name : s.output_names) {
      if (available.contains(name) || freed.contains(name) ||
          produced_by.at(name) != idx) {
        return absl::FailedPreconditionError(absl::StrCat(
            "%", name, " is produced twice (again by ", Sub(idx), ")"));
      }
      available[name] = idx;
    }
    for (const std::string& name : s.last_use) {
      if (model_outputs.contains(name)) {
        return absl::FailedPreconditionError(absl::StrCat(
            Sub(idx), " frees %", name, ", which the model output reads"));
      }
      available.erase(name);
      freed[name] = idx;
    }
  }

  for (const std::string& name : partition.model_outputs) {
    if (!available.contains(name)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the model output reads %", name, ", which is not available"));
    }
  }
  for (const ir::Node* p : partition.output_graph->placeholders()) {
    if (!available.contains(p->name())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the output graph reads %", p->name(), ", which is not available"));
    }
  }
  // Leaks: what is still cached must be a model output or an unread input.
  std::vector<std::pair<int, std::string>> leaks;
  for (const auto& [name, producer] : available) {
    if (model_outputs.contains(name)) continue;
    if (producer < 0 && !read_inputs.contains(name)) continue;
    leaks.push_back({producer, name});
  }
  if (!leaks.empty()) {
    std::sort(leaks.begin(), leaks.end());
    const auto& [producer, name] = leaks.front();
    return absl::FailedPreconditionError(absl::StrCat(
        "%", name, " (from ",
        producer < 0 ? std::string("the model inputs") : Sub(producer),
        ") is never freed: missing from its last reader's last_use, or an "
        "output nothing reads",
        leaks.size() > 1 ? absl::StrCat(" (", leaks.size() - 1, " more)")
                         : ""));
  }
  return absl::OkStatus();
}

absl::Status VerifyPartition(const ir::Graph& original,
                             const Partition& partition) {
  RETURN_IF_ERROR(VerifySchedule(partition));
  std::vector<std::string> inputs;
  for (const ir::Node* p : original.placeholders()) inputs.push_back(p->name());
  if (inputs != partition.model_inputs) {
    return absl::FailedPreconditionError(
        "partition: model inputs differ from the graph's placeholders");
  }
  absl::flat_hash_map<std::string, int> computed;
  for (const Subgraph& s : partition.subgraphs) {
    for (const ir::Node* n : s.graph->nodes()) {
      if (n->op() == ir::OpKind::kPlaceholder ||
          n->op() == ir::OpKind::kOutput) {
        continue;
      }
      const ir::Node* o = original.FindNode(n->name());
      if (o == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(Sub(s.index), " holds ", n->Describe(),
                         ", which the original graph lacks"));
      }
      if (o->op() != n->op() || o->target() != n->target() ||
          o->scope() != n->scope() || !SameOperands(*o, *n)) {
        return absl::FailedPreconditionError(absl::StrCat(
            Sub(s.index), " holds ", n->Describe(), ", which differs from ",
            o->Describe(), " in the original graph"));
      }
      if (n->op() == ir::OpKind::kGetAttr) continue;
      if (partition.SubgraphOf(n->name()) != s.index) {
        return absl::FailedPreconditionError(absl::StrCat(
            Sub(s.index), " computes ", n->Describe(), ", whose home is ",
            Sub(partition.SubgraphOf(n->name()))));
      }
      ++computed[n->name()];
    }
  }
  for (const ir::Node* o : original.nodes()) {
    if (partition.SubgraphOf(o->name()) < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("partition: ", o->Describe(), " has no subgraph"));
    }
    if (o->op() == ir::OpKind::kPlaceholder || o->op() == ir::OpKind::kOutput ||
        o->op() == ir::OpKind::kGetAttr) {
      continue;
    }
    int count = computed.contains(o->name()) ? computed.at(o->name()) : 0;
    if (count != 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("partition: ", o->Describe(), " is computed by ", count,
                       " subgraphs"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ir::Graph>> Reassemble(
    const Partition& partition) {
  RETURN_IF_ERROR(VerifySchedule(partition));
  auto g = std::make_unique<ir::Graph>();
  // Value name -> node in `g`.
  absl::flat_hash_map<std::string, ir::Node*> values;
  // get_attr (name, target) already read in `g`.
  absl::flat_hash_map<std::pair<std::string, std::string>, ir::Node*> attrs;

  // Model inputs, in order, with their original targets, scopes and meta
  // (taken from the first graph that reads each; an input nothing reads
  // keeps its name as target).
  absl::flat_hash_map<std::string, const ir::Node*> input_nodes;
  for (const std::string& name : partition.model_inputs) {
    input_nodes[name] = nullptr;
  }
  auto note_inputs = [&](const ir::Graph& sg) {
    for (const ir::Node* p : sg.placeholders()) {
      auto it = input_nodes.find(p->name());
      if (it != input_nodes.end() && it->second == nullptr) it->second = p;
    }
  };
  for (const Subgraph& s : partition.subgraphs) note_inputs(*s.graph);
  note_inputs(*partition.output_graph);
  for (const std::string& name : partition.model_inputs) {
    const ir::Node* p = input_nodes.at(name);
    ASSIGN_OR_RETURN(ir::Node * q, g->AddNode(ir::OpKind::kPlaceholder,
                                              p != nullptr ? p->target() : name,
                                              {}, {}, name));
    if (p != nullptr) {
      q->set_scope(p->scope());
      q->ShareMetaOf(*p);
    }
    values[name] = q;
  }

  auto copy_body = [&](const ir::Graph& sg, int index,
                       absl::flat_hash_map<const ir::Node*, ir::Node*>& local)
      -> absl::Status {
    auto remap = [&](ir::Node* n) -> ir::Node* {
      auto it = local.find(n);
      return it == local.end() ? n : it->second;
    };
    for (const ir::Node* n : sg.nodes()) {
      switch (n->op()) {
        case ir::OpKind::kPlaceholder: {
          auto it = values.find(n->name());
          if (it == values.end()) {
            return absl::FailedPreconditionError(
                absl::StrCat("reassemble: ", Sub(index), " reads %", n->name(),
                             ", which is not available"));
          }
          local[n] = it->second;
          continue;
        }
        case ir::OpKind::kOutput:
          continue;
        case ir::OpKind::kGetAttr: {
          auto key = std::make_pair(n->name(), n->target());
          if (auto it = attrs.find(key); it != attrs.end()) {
            local[n] = it->second;
            continue;
          }
          break;
        }
        default:
          break;
      }
      std::vector<ir::Argument> args;
      for (const ir::Argument& a : n->args()) args.push_back(a.MapNodes(remap));
      ir::Kwargs kwargs;
      for (const auto& [k, v] : n->kwargs()) {
        kwargs.emplace_back(k, v.MapNodes(remap));
      }
      absl::StatusOr<ir::Node*> copy = g->AddNode(
          n->op(), n->target(), std::move(args), std::move(kwargs), n->name());
      if (!copy.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("reassemble: ", Sub(index), ": ", n->Describe(), ": ",
                         copy.status().message()));
      }
      (*copy)->set_scope(n->scope());
      (*copy)->ShareMetaOf(*n);
      local[n] = *copy;
      if (n->op() == ir::OpKind::kGetAttr) {
        attrs[{n->name(), n->target()}] = *copy;
      }
    }
    return absl::OkStatus();
  };

  for (const Subgraph& s : partition.subgraphs) {
    absl::flat_hash_map<const ir::Node*, ir::Node*> local;
    RETURN_IF_ERROR(copy_body(*s.graph, s.index, local));
    ASSIGN_OR_RETURN(std::vector<ir::Node*> outs,
                     OutputValues(*s.graph, s.index));
    for (size_t k = 0; k < outs.size(); ++k) {
      values[s.output_names[k]] = local.at(outs[k]);
    }
  }

  // The output graph's placeholders read `values`; its output node (and
  // any get_attr it reads) closes the graph.
  absl::flat_hash_map<const ir::Node*, ir::Node*> local;
  for (const ir::Node* n : partition.output_graph->nodes()) {
    if (n->op() == ir::OpKind::kPlaceholder) {
      local[n] = values.at(n->name());
      continue;
    }
    auto remap = [&](ir::Node* m) -> ir::Node* {
      auto it = local.find(m);
      return it == local.end() ? m : it->second;
    };
    std::vector<ir::Argument> args;
    for (const ir::Argument& a : n->args()) args.push_back(a.MapNodes(remap));
    ir::Kwargs kwargs;
    for (const auto& [k, v] : n->kwargs()) {
      kwargs.emplace_back(k, v.MapNodes(remap));
    }
    ir::Node* copy = nullptr;
    if (n->op() == ir::OpKind::kGetAttr &&
        attrs.contains({n->name(), n->target()})) {
      copy = attrs.at({n->name(), n->target()});
    } else {
      ASSIGN_OR_RETURN(copy, g->AddNode(n->op(), n->target(), std::move(args),
                                        std::move(kwargs), n->name()));
      copy->set_scope(n->scope());
      copy->ShareMetaOf(*n);
    }
    local[n] = copy;
  }
  g->meta() = partition.output_graph->meta();
  return g;
}

}  // namespace tracecut::partition
