#include "partition/partitioner.h"

#include <algorithm>
#include <climits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "ir/module_pattern.h"
#include "partition/partitioner_internal.h"
#include "util/format.h"
#include "util/status_macros.h"

namespace tracecut::partition {

// Note [Placement]
// ~~~~~~~~~~~~~~~~
// Nodes are numbered in graph order (a topological order) and get a "slot":
// 0 is the head, slot k >= 1 is the k-th target instance in order of its
// first node. Slots are later grouped, in order, into subgraphs, so any
// placement that is monotone in slots is monotone in subgraphs too.
//
// * Target nodes take their instance's slot.
// * Feasibility: walking forward, need(n) is the earliest slot n could run
//   in (max over inputs, looking through non-target nodes). A target node
//   whose need exceeds its slot reads, through some chain, a value of an
//   instance that starts later: no order of whole instances works, and we
//   say which two instances conflict.
// * Non-target computation before the first target node is the head
//   (slot 0): embedding, mask construction, rotary tables.
// * Any other non-target node goes to the earliest slot among its users
//   (as late as possible), walking backwards. That is the subgraph of its
//   earliest consumer, and never earlier than its inputs: every user u has
//   slot(u) >= need(u) >= need(n) once feasibility holds. So the tail (norm,
//   lm_head) lands in the last slot, and glue computed between layers lands
//   with the layer that first reads it instead of being shipped through the
//   intermediates cache. Nodes without users keep need(n) (next to their
//   inputs).
// * get_attr nodes have no inputs; their home is the earliest slot among
//   their users, and every other subgraph that uses them gets its own read
//   (see Note [Subgraph values] in subgraph.cc).
// * Placeholders (model inputs) live in slot 0; they are available to every
//   subgraph.
//
// Every step is one pass over nodes and their use lists.

// Note [Partitioning on two threads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Copying the nodes into the subgraphs is about half of partitioning a large
// graph. Two other passes need nothing it produces: the self-check
// (CheckTargetPlacement, which walks the original's scope stacks against
// the placement and the subgraphs' module_paths, both fixed before copying
// starts) and filling Partition::home (a map as large as the graph). On a
// graph of kTwoThreadsMinNodes nodes or more they run on a second thread
// while this one copies; both only read the original graph, and they write
// no field BuildSubgraphs touches. The result is the same either way; a
// smaller graph is not worth starting a thread for (tens of microseconds).

namespace {

constexpr int kTwoThreadsMinNodes = 4096;

using partitioner_internal::BuildOutputGraph;
using partitioner_internal::BuildSubgraphs;
using partitioner_internal::CompileModulePatterns;
using partitioner_internal::FindTargetInstances;
using partitioner_internal::Homes;
using partitioner_internal::IndexedGraph;
using partitioner_internal::IndexGraph;
using partitioner_internal::Instance;
using partitioner_internal::IsCompute;
using partitioner_internal::ModulePatterns;
using partitioner_internal::NoTargetError;
using partitioner_internal::ParamReads;
using partitioner_internal::TargetInstances;

// ----- Errors ---------------------------------------------------------------

std::string DescribeInstance(const Instance& inst) {
  if (inst.type.empty()) return absl::StrCat("'", inst.path, "'");
  return absl::StrCat("'", inst.path, "' (", ir::Scope::ShortType(inst.type),
                      ")");
}

bool PathContains(absl::string_view outer, absl::string_view inner) {
  if (outer == inner) return false;
  if (outer.empty()) return true;
  return absl::StartsWith(inner, outer) && inner.size() > outer.size() &&
         inner[outer.size()] == '.';
}

absl::Status OrderError(const ir::Node* node, const Instance& reader,
                        const Instance& later) {
  std::string msg = absl::StrCat(
      "partition: cannot order sequential targets: ", node->Describe(),
      " belongs to ", DescribeInstance(reader), " and depends on ",
      DescribeInstance(later), ", which starts after ",
      DescribeInstance(reader), " does");
  const Instance* outer = nullptr;
  const Instance* inner = nullptr;
  if (PathContains(reader.path, later.path)) {
    outer = &reader;
    inner = &later;
  } else if (PathContains(later.path, reader.path)) {
    outer = &later;
    inner = &reader;
  }
  if (outer != nullptr) {
    absl::StrAppend(
        &msg, "; the targets nest ('", inner->path, "' is inside '",
        outer->path,
        "') and the outer one's own nodes come both before and after the "
        "inner one, so they cannot be separate subgraphs: use "
        "nesting=outermost, or target only the inner modules");
  } else {
    absl::StrAppend(
        &msg,
        "; a target instance must run as one step, so a module called "
        "around another target cannot be one: ignore one of them or target "
        "an enclosing module");
  }
  return absl::FailedPreconditionError(msg);
}

int64_t ElementBytes(absl::string_view dtype) {
  static const auto* kSizes = new absl::flat_hash_map<std::string, int64_t>{
      {"float32", 4}, {"float64", 8}, {"float16", 2},   {"bfloat16", 2},
      {"int64", 8},   {"int32", 4},   {"int16", 2},     {"int8", 1},
      {"uint8", 1},   {"bool", 1},    {"complex64", 8}, {"complex128", 16},
      {"float", 4},   {"double", 8},  {"half", 2},      {"long", 8},
      {"int", 4},
  };
  auto it = kSizes->find(dtype);
  return it == kSizes->end() ? 0 : it->second;
}

// ----- Phases of PartitionGraph ---------------------------------------------

// Slots of Note [Placement]: 0 is the head, k >= 1 the k-th instance.
struct Slots {
  std::vector<int> slot;  // Node i's slot.
  std::vector<int> need;  // The earliest slot node i can run in.
  int first_target = 0;   // Index of the first target node.
  int num_slots = 0;
};

// Feasibility (forward): target nodes take their instance's slot, every
// node gets its need, and a target node that needs a later slot than its
// own is an OrderError naming the instance that forces it.
absl::StatusOr<Slots> CheckFeasibility(const IndexedGraph& g,
                                       const TargetInstances& t) {
  const int num_nodes = g.size();
  const std::vector<int>& inst = t.inst;
  Slots s;
  s.num_slots = static_cast<int>(t.instances.size()) + 1;
  std::vector<int>& slot = s.slot;
  std::vector<int>& need = s.need;
  slot.assign(num_nodes, -1);
  need.assign(num_nodes, 0);
  // need_from[i]: the instance that forces need[i].
  std::vector<int> need_from(num_nodes, -1);
  int first_target = num_nodes;
  for (int i = 0; i < num_nodes; ++i) {
    if (inst[i] >= 0) {
      slot[i] = inst[i] + 1;
      first_target = std::min(first_target, i);
    }
  }
  s.first_target = first_target;
  for (int i = 0; i < num_nodes; ++i) {
    if (g.op(i) == ir::OpKind::kPlaceholder ||
        g.op(i) == ir::OpKind::kGetAttr) {
      continue;
    }
    int best = 0;
    int from = -1;
    for (int j : g.adj.Inputs(i)) {
      int v = inst[j] >= 0 ? slot[j] : need[j];
      if (v > best) {
        best = v;
        from = inst[j] >= 0 ? inst[j] : need_from[j];
      }
    }
    if (inst[i] >= 0) {
      if (best > slot[i]) {
        return OrderError(g.nodes[i], t.instances[inst[i]], t.instances[from]);
      }
      need[i] = slot[i];
      need_from[i] = inst[i];
    } else {
      need[i] = best;
      need_from[i] = from;
    }
  }
  return s;
}

// Placement (backward), Note [Placement]: every node outside a target gets
// the earliest slot among its users; then checks that no node runs before
// its inputs.
absl::Status PlaceNodes(const IndexedGraph& g, const std::vector<int>& inst,
                        Slots& s) {
  const int num_nodes = g.size();
  const int last_slot = s.num_slots - 1;
  const int first_target = s.first_target;
  std::vector<int>& slot = s.slot;
  const std::vector<int>& need = s.need;
  for (int i = num_nodes - 1; i >= 0; --i) {
    if (inst[i] >= 0) continue;
    switch (g.op(i)) {
      case ir::OpKind::kOutput:
        slot[i] = last_slot;
        continue;
      case ir::OpKind::kPlaceholder:
        slot[i] = 0;
        continue;
      default:
        break;
    }
    if (IsCompute(g.op(i)) && i < first_target) {
      slot[i] = 0;
      continue;
    }
    int earliest = INT_MAX;
    for (int u : g.adj.Users(i)) {
      earliest = std::min(earliest, slot[u]);
    }
    // Dead nodes stay next to their inputs (never in the head once past the
    // first target).
    slot[i] = earliest != INT_MAX ? earliest
              : i > first_target  ? std::max(need[i], 1)
                                  : need[i];
  }
  for (int i = 0; i < num_nodes; ++i) {
    for (int j : g.adj.Inputs(i)) {
      if (g.op(j) == ir::OpKind::kGetAttr ||
          g.op(j) == ir::OpKind::kPlaceholder) {
        continue;
      }
      if (slot[j] > slot[i]) {
        return absl::InternalError(
            absl::StrCat("partition: placement put ", g.nodes[i]->Describe(),
                         " before its input ", g.nodes[j]->Describe()));
      }
    }
  }
  return absl::OkStatus();
}

// Parameter reads per slot and their sizes: a get_attr is read in its own
// slot and in every slot of its users; a leaf module in its own.
// Parameter reads per slot: a get_attr is read in its own slot and in
// every slot of its users; a leaf module in its own.
void CollectParamReads(const IndexedGraph& g, const Slots& s,
                       ParamReads& params) {
  const std::vector<int>& slot = s.slot;
  const std::vector<int>& node_param = params.node_param;
  params.by_slot.resize(s.num_slots);
  // (slot, parameter) pairs, deduplicated by sorting: only sums over a
  // slot's parameters are taken, so their order within a slot is free.
  std::vector<std::pair<int, int>> reads;
  for (int i = 0; i < g.size(); ++i) {
    const int id = node_param[i];
    if (id < 0) continue;
    reads.push_back({slot[i], id});
    if (g.op(i) != ir::OpKind::kGetAttr) continue;
    for (int u : g.adj.Users(i)) {
      if (u != g.out) reads.push_back({slot[u], id});
    }
  }
  std::sort(reads.begin(), reads.end());
  reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
  for (const auto& [slot_index, id] : reads) {
    params.by_slot[slot_index].push_back(id);
  }
}

// Which subgraph each slot goes to.
struct Grouping {
  std::vector<int> slot_to_sg;
  int num_sg = 0;
};

// Groups consecutive slots into subgraphs: targets_per_subgraph of them, or
// as many as fit max_param_bytes; the head is a subgraph of its own when it
// computes anything, else it joins the first one.
Grouping GroupSlots(const IndexedGraph& g, const Slots& slots,
                    const ParamReads& params, const PartitionOptions& options) {
  const int num_slots = slots.num_slots;
  Grouping grouping;
  std::vector<int>& slot_to_sg = grouping.slot_to_sg;
  slot_to_sg.assign(num_slots, 0);
  bool head = false;
  for (int i = 0; i < g.size(); ++i) {
    if (slots.slot[i] == 0 && IsCompute(g.op(i))) {
      head = true;
      break;
    }
  }
  const int64_t budget = options.max_param_bytes;
  const int cap = options.targets_per_subgraph > 0
                      ? options.targets_per_subgraph
                  : budget > 0 ? INT_MAX
                               : 1;
  int num_sg = head ? 1 : 0;
  std::vector<int> stamp(params.size.size(), -1);
  int group = -1;
  int64_t group_bytes = 0;
  int group_count = 0;
  auto add = [&](int s) {
    for (int id : params.by_slot[s]) {
      if (stamp[id] != group) {
        stamp[id] = group;
        group_bytes += params.KnownBytes(id);
      }
    }
    ++group_count;
    slot_to_sg[s] = group;
  };
  for (int s = 1; s < num_slots; ++s) {
    if (group >= 0 && group_count < cap) {
      if (budget <= 0) {
        add(s);
        continue;
      }
      int64_t delta = 0;
      for (int id : params.by_slot[s]) {
        if (stamp[id] != group) delta += params.KnownBytes(id);
      }
      if (group_bytes + delta <= budget) {
        add(s);
        continue;
      }
    }
    group = num_sg++;
    group_bytes = 0;
    group_count = 0;
    add(s);
  }
  slot_to_sg[0] = head ? 0 : slot_to_sg[1];
  grouping.num_sg = num_sg;
  return grouping;
}

// Homes, last readers and members of every subgraph.
Homes AssignHomes(const IndexedGraph& g, const std::vector<int>& slot,
                  const Grouping& grouping) {
  const int num_nodes = g.size();
  Homes homes;
  std::vector<int>& home = homes.home;
  home.resize(num_nodes);
  for (int i = 0; i < num_nodes; ++i) home[i] = grouping.slot_to_sg[slot[i]];
  homes.last_reader.assign(num_nodes, -1);
  homes.read_by_output.assign(num_nodes, 0);
  for (int i = 0; i < num_nodes; ++i) {
    for (int u : g.adj.Users(i)) {
      if (u == g.out) {
        homes.read_by_output[i] = 1;
      } else {
        homes.last_reader[i] = std::max(homes.last_reader[i], home[u]);
      }
    }
  }
  std::vector<std::vector<int>>& members = homes.members;
  members.resize(grouping.num_sg);
  for (int i = 0; i < num_nodes; ++i) {
    if (g.op(i) == ir::OpKind::kPlaceholder || i == g.out) continue;
    members[home[i]].push_back(i);
    if (g.op(i) != ir::OpKind::kGetAttr) continue;
    std::vector<int> readers;
    for (int u : g.adj.Users(i)) {
      if (u != g.out && home[u] != home[i]) {
        readers.push_back(home[u]);
      }
    }
    std::sort(readers.begin(), readers.end());
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    for (int s : readers) members[s].push_back(i);
  }
  // get_attr copies were appended out of order.
  for (auto& m : members) std::sort(m.begin(), m.end());
  return homes;
}

// The target patterns that matched, and the budget's warnings.
void AddTargetsUsedAndWarnings(const PartitionOptions& options,
                               const std::vector<Instance>& instances,
                               const ParamReads& params, Partition* partition) {
  std::vector<char> used(options.targets.size(), 0);
  for (const Instance& i : instances) used[i.pattern] = 1;
  for (size_t p = 0; p < options.targets.size(); ++p) {
    if (used[p]) partition->targets_used.push_back(options.targets[p]);
  }
  const int64_t budget = options.max_param_bytes;
  if (budget > 0 && params.unknown_sizes > 0) {
    partition->warnings.push_back(absl::StrCat(
        "sizes of ", params.unknown_sizes,
        " parameter or leaf-module paths are unknown and count as 0 bytes "
        "against max_param_bytes"));
  }
  if (budget > 0) {
    for (Subgraph& sub : partition->subgraphs) {
      if (sub.param_bytes <= budget) continue;
      std::string what =
          sub.module_paths.empty()
              ? std::string("the head")
              : absl::StrCat("a single target (", sub.module_paths[0], ")");
      std::string w = absl::StrCat(
          "subgraph ", sub.index, " reads ", util::HumanBytes(sub.param_bytes),
          " of parameters, over max_param_bytes (", util::HumanBytes(budget),
          "): ", what, " cannot be split");
      sub.warnings.push_back(w);
      partition->warnings.push_back(std::move(w));
    }
  }
}

}  // namespace

ParamBytesFn ParamBytesFromMap(absl::flat_hash_map<std::string, int64_t> map) {
  return
      [map = std::move(map)](absl::string_view path) -> std::optional<int64_t> {
        auto it = map.find(path);
        if (it == map.end()) return std::nullopt;
        return it->second;
      };
}

std::optional<int64_t> TensorBytes(const ir::TensorMeta& meta) {
  int64_t element = ElementBytes(meta.dtype);
  if (element == 0) return std::nullopt;
  int64_t n = 1;
  for (int64_t d : meta.shape) {
    if (d < 0) return std::nullopt;
    n *= d;
  }
  return n * element;
}

absl::string_view NestingName(Nesting nesting) {
  return nesting == Nesting::kOutermost ? "outermost" : "innermost";
}

bool ModulePatternMatches(absl::string_view pattern, absl::string_view path,
                          absl::string_view type) {
  return ir::ModulePattern(pattern).Matches(path, type);
}

absl::StatusOr<Partition> PartitionGraph(const ir::Graph& graph,
                                         const PartitionOptions& options) {
  if (options.targets.empty()) {
    return absl::InvalidArgumentError(
        "partition: no sequential targets given (e.g. LlamaDecoderLayer)");
  }
  if (options.targets_per_subgraph < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: targets_per_subgraph must be >= 0, got ",
                     options.targets_per_subgraph));
  }
  if (options.max_param_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: max_param_bytes must be >= 0, got ",
                     options.max_param_bytes));
  }
  ASSIGN_OR_RETURN(ModulePatterns patterns, CompileModulePatterns(options));
  if (graph.output_node() == nullptr) {
    return absl::InvalidArgumentError(
        "partition: the graph has no output node");
  }
  ASSIGN_OR_RETURN(IndexedGraph g, IndexGraph(graph, options.param_bytes));
  TargetInstances t = FindTargetInstances(g, patterns, options.nesting);
  if (t.instances.empty()) return NoTargetError(graph, options);
  ASSIGN_OR_RETURN(Slots slots, CheckFeasibility(g, t));
  RETURN_IF_ERROR(PlaceNodes(g, t.inst, slots));
  ParamReads& params = g.params;
  CollectParamReads(g, slots, params);
  Grouping grouping = GroupSlots(g, slots, params, options);
  Homes homes = AssignHomes(g, slots.slot, grouping);

  Partition partition;
  partition.subgraphs.resize(grouping.num_sg);
  for (int s = 0; s < grouping.num_sg; ++s) partition.subgraphs[s].index = s;
  for (int s = 1; s < slots.num_slots; ++s) {
    partition.subgraphs[grouping.slot_to_sg[s]].module_paths.push_back(
        t.instances[s - 1].path);
  }
  // The self-check and Partition::home read the placement and the original
  // graph only, so on a large graph they run beside the copying (Note
  // [Partitioning on two threads]).
  absl::Status checked;
  auto check_and_fill_homes = [&] {
    checked = partitioner_internal::CheckTargetPlacement(g, homes.home,
                                                         partition.subgraphs);
    if (checked.ok()) FillHomeMap(g, homes.home, &partition);
  };
  absl::Status built;
  if (options.threads != 1 && g.size() >= kTwoThreadsMinNodes) {
    std::thread helper(check_and_fill_homes);
    built = BuildSubgraphs(g, params, homes, &partition);
    helper.join();
  } else {
    built = BuildSubgraphs(g, params, homes, &partition);
    if (built.ok()) check_and_fill_homes();
  }
  RETURN_IF_ERROR(built);
  RETURN_IF_ERROR(checked);
  RETURN_IF_ERROR(BuildOutputGraph(g, graph, &partition));
  AddTargetsUsedAndWarnings(options, t.instances, params, &partition);
  return partition;
}

namespace {

// CheckTargetPlacement over nodes fed one at a time with their homes.
class PlacementChecker {
 public:
  using Stack = std::vector<ir::ScopeEntry>;

  // Fails when a target path is in two subgraphs' module_paths.
  absl::Status Init(const std::vector<Subgraph>& subgraphs) {
    for (const Subgraph& sub : subgraphs) {
      for (const std::string& path : sub.module_paths) {
        auto [it, inserted] = owner_.try_emplace(path, sub.index);
        if (!inserted) {
          return absl::InternalError(absl::StrCat(
              "partition: target '", path, "' is in subgraphs ", it->second,
              " and ", sub.index, "; each target must be in exactly one"));
        }
      }
    }
    return absl::OkStatus();
  }

  // Checks compute node `n`. `home(n)` gives n's subgraph; only called for
  // nodes inside a target. `shared_depth`: how many leading entries `stack`
  // shares with the previous compute node's (IndexedGraph::shared_depth).
  // `leaf_in_stack`: a call_module whose stack ends with the module it
  // calls (the leaf needs no lookup of its own).
  template <typename HomeFn>
  absl::Status Check(const ir::Node* n, ir::OpKind op, const Stack* stack,
                     int shared_depth, bool leaf_in_stack, HomeFn&& home) {
    // The innermost instance: with Nesting::kInnermost an outer target
    // keeps only its own nodes (with kOutermost inner ones are no
    // instances at all).
    Advance(stack, shared_depth);
    Owner found = level_.back();
    if (op == ir::OpKind::kCallModule && !leaf_in_stack) {
      if (auto it = owner_.find(n->target()); it != owner_.end()) {
        found = {it->second, n->target()};
      }
    }
    if (found.owner < 0) return absl::OkStatus();
    const int h = home(n);
    if (h != found.owner) {
      return absl::InternalError(absl::StrCat(
          "partition: ", n->Describe(), " belongs to target '", found.path,
          "' (subgraph ", found.owner, ") but runs in subgraph ", h,
          "; each target must be in exactly one subgraph"));
    }
    return absl::OkStatus();
  }

 private:
  struct Owner {
    int owner = -1;
    absl::string_view path;
  };

  // Makes level_ describe `stack`, looking up only the entries past those
  // it shares with the previous node's stack.
  void Advance(const Stack* stack, int k) {
    if (stack == cur_) return;
    level_.resize(k + 1);
    for (size_t d = k; d < stack->size(); ++d) {
      const ir::ScopeEntry& e = (*stack)[d];
      Owner o = level_.back();
      if (auto it = owner_.find(e.path); it != owner_.end()) {
        o = {it->second, e.path};
      }
      level_.push_back(o);
    }
    cur_ = stack;
  }

  absl::flat_hash_map<absl::string_view, int> owner_;
  const Stack* cur_ = &kEmptyStack;
  // level_[d]: the innermost owner among cur_'s entries [0, d).
  std::vector<Owner> level_ = std::vector<Owner>(1);
  static inline const Stack kEmptyStack;
};

}  // namespace

absl::Status CheckTargetPlacement(const ir::Graph& graph,
                                  const Partition& partition) {
  PlacementChecker checker;
  RETURN_IF_ERROR(checker.Init(partition.subgraphs));
  auto home = [&](const ir::Node* n) {
    return partition.SubgraphOf(n->name());
  };
  const PlacementChecker::Stack* prev = nullptr;
  for (const ir::Node* n : graph.nodes()) {
    // Inputs, parameter reads and the output live anywhere.
    if (!IsCompute(n)) continue;
    const auto& stack = n->scope().stack();
    const int shared =
        prev == nullptr ? 0 : partitioner_internal::CommonPrefix(*prev, stack);
    prev = &stack;
    RETURN_IF_ERROR(checker.Check(
        n, n->op(), &stack, shared,
        !stack.empty() && stack.back().path == n->target(), home));
  }
  return absl::OkStatus();
}

namespace partitioner_internal {

absl::Status CheckTargetPlacement(const IndexedGraph& g,
                                  const std::vector<int>& home,
                                  const std::vector<Subgraph>& subgraphs) {
  PlacementChecker checker;
  RETURN_IF_ERROR(checker.Init(subgraphs));
  for (int i = 0; i < g.size(); ++i) {
    if (!IsCompute(g.op(i))) continue;
    auto home_of = [&](const ir::Node*) { return home[i]; };
    RETURN_IF_ERROR(checker.Check(g.nodes[i], g.op(i), g.stacks[i],
                                  g.shared_depth[i], g.leaf_in_stack[i],
                                  home_of));
  }
  return absl::OkStatus();
}

}  // namespace partitioner_internal

}  // namespace tracecut::partition
