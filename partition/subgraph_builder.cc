// Building the subgraphs and the output graph once PartitionGraph has placed
// every node (see partitioner_internal.h).

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ir/graph.h"
#include "partition/partitioner_internal.h"
#include "partition/subgraph.h"
#include "util/status_macros.h"

namespace tracecut::partition::partitioner_internal {
namespace {

// The placeholder through which a graph reads `m` from outside: a model
// input keeps its target, scope and meta; a value computed elsewhere is
// named after its node and keeps only its output types.
absl::StatusOr<ir::Node*> AddInputPlaceholder(ir::Graph& g, const ir::Node* m) {
  const bool model_input = m->op() == ir::OpKind::kPlaceholder;
  ASSIGN_OR_RETURN(
      ir::Node * p,
      g.AddNode(ir::OpKind::kPlaceholder, model_input ? m->target() : m->name(),
                {}, {}, m->name()));
  if (model_input) {
    p->set_scope(m->scope());
    p->ShareMetaOf(*m);
  } else {
    p->meta().outputs = m->meta().outputs;
  }
  return p;
}

// A copy of `a` whose k-th node reference is replaced by copy[refs[k]],
// advancing `refs` past the references it used.
ir::Argument CopyArgument(const ir::Argument& a, const int*& refs,
                          const std::vector<ir::Node*>& copy) {
  if (a.is_node()) return ir::Argument::Ref(copy[*refs++]);
  if (!a.is_sequence()) return a;
  std::vector<ir::Argument> elements;
  elements.reserve(a.elements().size());
  for (const ir::Argument& e : a.elements()) {
    elements.push_back(CopyArgument(e, refs, copy));
  }
  return a.kind() == ir::Argument::Kind::kTuple
             ? ir::Argument::Tuple(std::move(elements))
             : ir::Argument::List(std::move(elements));
}

// Copying a node is mostly waiting for it: on a graph far larger than the
// caches each node (and what its vectors and strings point to) is a
// handful of misses. Fetches the node kPrefetchAhead members ahead, and
// what it points to half as far ahead (its fields are cached by then).
constexpr size_t kPrefetchAhead = 8;

void Prefetch(const std::vector<const ir::Node*>& nodes,
              const std::vector<int>& members, size_t k) {
  if (k + kPrefetchAhead < members.size()) {
    const char* p =
        reinterpret_cast<const char*>(nodes[members[k + kPrefetchAhead]]);
    for (size_t off = 0; off < sizeof(ir::Node); off += 64) {
      __builtin_prefetch(p + off);
    }
  }
  if (k + kPrefetchAhead / 2 < members.size()) {
    const ir::Node* n = nodes[members[k + kPrefetchAhead / 2]];
    __builtin_prefetch(n->args().data());
    __builtin_prefetch(n->name().data());
    __builtin_prefetch(n->target().data());
    // The meta's and the stack's reference counts sit next to them (one
    // allocation each); copying the node increments both.
    __builtin_prefetch(&n->meta(), 1);
    __builtin_prefetch(&n->scope().stack(), 1);
  }
}

}  // namespace

absl::Status BuildSubgraphs(const IndexedGraph& indexed,
                            const ParamReads& params, const Homes& homes,
                            Partition* partition) {
  const std::vector<const ir::Node*>& nodes = indexed.nodes;
  const Adjacency& adj = indexed.adj;
  const int num_nodes = indexed.size();
  const int num_sg = static_cast<int>(homes.members.size());
  const int out = indexed.out;
  auto op = [&](int i) { return indexed.op(i); };
  const std::vector<int>& home = homes.home;
  const std::vector<int>& node_param = params.node_param;
  std::vector<int> seen(num_nodes, -1);
  std::vector<int> param_stamp(params.size.size(), -1);
  // copy[j] is node j's counterpart in the subgraph being built (valid
  // where copied_in[j] == s).
  std::vector<ir::Node*> copy(num_nodes, nullptr);
  std::vector<int> copied_in(num_nodes, -1);
  std::vector<int> inputs;
  for (int s = 0; s < num_sg; ++s) {
    Subgraph& sub = partition->subgraphs[s];
    inputs.clear();
    for (int i : homes.members[s]) {
      for (int j : adj.Inputs(i)) {
        if (op(j) == ir::OpKind::kGetAttr) continue;  // Read here too.
        if (op(j) != ir::OpKind::kPlaceholder && home[j] == s) continue;
        if (seen[j] != s) {
          seen[j] = s;
          inputs.push_back(j);
        }
      }
    }
    std::sort(inputs.begin(), inputs.end());

    auto g = std::make_unique<ir::Graph>();
    sub.input_names.reserve(inputs.size());
    for (int j : inputs) {
      const ir::Node* m = nodes[j];
      ASSIGN_OR_RETURN(ir::Node * p, AddInputPlaceholder(*g, m));
      copy[j] = p;
      copied_in[j] = s;
      sub.input_names.push_back(m->name());
      if (homes.last_reader[j] == s && !homes.read_by_output[j]) {
        sub.last_use.push_back(m->name());
      }
    }
    std::vector<ir::Argument> outs;
    int64_t bytes = 0;
    const std::vector<int>& members = homes.members[s];
    for (size_t k = 0; k < members.size(); ++k) {
      Prefetch(nodes, members, k);
      const int i = members[k];
      const ir::Node* n = nodes[i];
      const int* refs = adj.Refs(i);
      for (const int* r = refs; r != adj.Refs(i + 1); ++r) {
        if (copied_in[*r] != s) {
          return absl::InternalError(absl::StrCat(
              "partition: ", n->Describe(), " reads ", nodes[*r]->Describe(),
              ", which subgraph ", s, " neither computes nor receives"));
        }
      }
      std::vector<ir::Argument> args;
      args.reserve(n->args().size());
      for (const ir::Argument& a : n->args()) {
        args.push_back(CopyArgument(a, refs, copy));
      }
      ir::Kwargs kwargs;
      kwargs.reserve(n->kwargs().size());
      for (const auto& [k, v] : n->kwargs()) {
        kwargs.emplace_back(k, CopyArgument(v, refs, copy));
      }
      absl::StatusOr<ir::Node*> added = g->AddNode(
          n->op(), n->target(), std::move(args), std::move(kwargs), n->name());
      if (!added.ok()) {
        return absl::InternalError(
            absl::StrCat("partition: cannot copy ", n->Describe(),
                         " into subgraph ", s, ": ", added.status().message()));
      }
      ir::Node* c = *added;
      if (c->name() != n->name()) {
        return absl::InternalError(absl::StrCat("partition: ", n->Describe(),
                                                " was renamed to '", c->name(),
                                                "' in subgraph ", s));
      }
      c->set_scope(n->scope());
      c->ShareMetaOf(*n);
      copy[i] = c;
      copied_in[i] = s;
      if (node_param[i] >= 0) {
        int id = node_param[i];
        if (param_stamp[id] != s) {
          param_stamp[id] = s;
          bytes += params.KnownBytes(id);
          (n->op() == ir::OpKind::kGetAttr ? sub.param_targets
                                           : sub.leaf_modules)
              .push_back(n->target());
        }
        if (n->op() == ir::OpKind::kGetAttr) continue;
      }
      bool escapes = false;
      for (int u : adj.Users(i)) {
        if (u == out || home[u] > s) {
          escapes = true;
          break;
        }
      }
      if (escapes) {
        outs.push_back(ir::Argument::Ref(c));
        sub.output_names.push_back(n->name());
      }
    }
    // AddNode rather than Output(), which first scans the whole graph for
    // an output node this graph cannot have yet.
    RETURN_IF_ERROR(g->AddNode(ir::OpKind::kOutput, "output",
                               {ir::Argument::Tuple(std::move(outs))}, {},
                               "output")
                        .status());
    sub.graph = std::move(g);
    sub.param_bytes = bytes;
  }
  for (int i = 0; i < num_nodes; ++i) {
    ++partition->subgraphs[home[i]].node_count;
  }
  return absl::OkStatus();
}

void FillHomeMap(const IndexedGraph& g, const std::vector<int>& home,
                 Partition* partition) {
  constexpr int kAhead = 8;
  const int n = g.size();
  partition->home.reserve(n);
  for (int i = 0; i < n; ++i) {
    // The names are scattered over the original graph.
    if (i + kAhead < n) __builtin_prefetch(g.nodes[i + kAhead]->name().data());
    partition->home.emplace(g.nodes[i]->name(), home[i]);
  }
}

absl::Status BuildOutputGraph(const IndexedGraph& g, const ir::Graph& graph,
                              Partition* partition) {
  const ir::Node* output = g.output;
  for (int i = 0; i < g.size(); ++i) {
    if (g.op(i) == ir::OpKind::kPlaceholder) {
      partition->model_inputs.push_back(g.nodes[i]->name());
    }
  }
  auto og = std::make_unique<ir::Graph>();
  absl::flat_hash_map<const ir::Node*, ir::Node*> og_map;
  const std::vector<ir::Node*> output_reads = output->inputs();
  for (const ir::Node* m : output_reads) {
    if (m->op() == ir::OpKind::kGetAttr) continue;
    partition->model_outputs.push_back(m->name());
    ASSIGN_OR_RETURN(ir::Node * p, AddInputPlaceholder(*og, m));
    og_map[m] = p;
  }
  for (const ir::Node* m : output_reads) {
    if (m->op() != ir::OpKind::kGetAttr) continue;
    ASSIGN_OR_RETURN(ir::Node * a, og->AddNode(ir::OpKind::kGetAttr,
                                               m->target(), {}, {}, m->name()));
    a->set_scope(m->scope());
    a->ShareMetaOf(*m);
    og_map[m] = a;
  }
  auto og_remap = [&](ir::Node* n) -> ir::Node* {
    auto it = og_map.find(n);
    return it == og_map.end() ? n : it->second;
  };
  std::vector<ir::Argument> og_args;
  for (const ir::Argument& a : output->args()) {
    og_args.push_back(a.MapNodes(og_remap));
  }
  ir::Kwargs og_kwargs;
  for (const auto& [k, v] : output->kwargs()) {
    og_kwargs.emplace_back(k, v.MapNodes(og_remap));
  }
  ASSIGN_OR_RETURN(
      ir::Node * og_out,
      og->AddNode(ir::OpKind::kOutput, output->target(), std::move(og_args),
                  std::move(og_kwargs), output->name()));
  og_out->set_scope(output->scope());
  og_out->ShareMetaOf(*output);
  og->meta() = graph.meta();
  partition->output_graph = std::move(og);
  return absl::OkStatus();
}

}  // namespace tracecut::partition::partitioner_internal
