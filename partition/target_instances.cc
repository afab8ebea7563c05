// Phase 1 of PartitionGraph: which target instance each node belongs to,
// by matching the module patterns against the nodes' scope stacks (see
// partitioner_internal.h).

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "ir/module_pattern.h"
#include "partition/partitioner.h"
#include "partition/partitioner_internal.h"
#include "util/status_macros.h"

namespace tracecut::partition::partitioner_internal {
namespace {

absl::StatusOr<std::vector<ir::ModulePattern>> CompileAll(
    const std::vector<std::string>& patterns, absl::string_view what) {
  std::vector<ir::ModulePattern> out;
  for (const std::string& text : patterns) {
    if (text.empty() || text == ir::kModulePatternRegexPrefix) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: empty ", what, " pattern"));
    }
    out.emplace_back(text);
    if (!out.back().valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: invalid regex in ", what, " pattern '", text,
                       "': ", out.back().error()));
    }
  }
  return out;
}

// Matches scope entries against the target and ignore patterns, once per
// distinct module path.
class ModuleMatcher {
 public:
  struct EntryMatch {
    int target = -1;  // Index of the first target pattern that matches.
    bool ignored = false;
  };

  ModuleMatcher(const std::vector<ir::ModulePattern>& targets,
                const std::vector<ir::ModulePattern>& ignore)
      : targets_(targets), ignore_(ignore) {}

  const EntryMatch& Lookup(absl::string_view path, absl::string_view type) {
    auto it = memo_.find(path);
    if (it != memo_.end()) return it->second;
    EntryMatch m;
    for (const ir::ModulePattern& p : ignore_) {
      if (p.Matches(path, type)) {
        m.ignored = true;
        break;
      }
    }
    for (size_t i = 0; i < targets_.size() && !m.ignored; ++i) {
      if (targets_[i].Matches(path, type)) {
        m.target = static_cast<int>(i);
        break;
      }
    }
    return memo_.emplace(std::string(path), m).first->second;
  }

 private:
  const std::vector<ir::ModulePattern>& targets_;
  const std::vector<ir::ModulePattern>& ignore_;
  absl::flat_hash_map<std::string, EntryMatch> memo_;
};

std::string PatternList(const std::vector<std::string>& patterns) {
  return absl::StrCat("[", absl::StrJoin(patterns, ", "), "]");
}

}  // namespace

absl::StatusOr<ModulePatterns> CompileModulePatterns(
    const PartitionOptions& options) {
  ModulePatterns patterns;
  ASSIGN_OR_RETURN(patterns.targets, CompileAll(options.targets, "target"));
  ASSIGN_OR_RETURN(patterns.ignore, CompileAll(options.ignore, "ignore"));
  return patterns;
}

TargetInstances FindTargetInstances(const IndexedGraph& g,
                                    const ModulePatterns& patterns,
                                    Nesting nesting) {
  ModuleMatcher matcher(patterns.targets, patterns.ignore);
  const int num_nodes = g.size();
  TargetInstances t;
  std::vector<int>& inst = t.inst;
  std::vector<Instance>& instances = t.instances;
  inst.assign(num_nodes, -1);
  absl::flat_hash_map<std::string, int> instance_of;
  auto instance = [&](const ModuleRef& m, int pattern) {
    auto [it, inserted] =
        instance_of.try_emplace(m.path, static_cast<int>(instances.size()));
    if (inserted) {
      instances.push_back({std::string(m.path), std::string(m.type), pattern});
    } else if (instances[it->second].type.empty() && !m.type.empty()) {
      instances[it->second].type = std::string(m.type);
    }
    return it->second;
  };
  // The walk over a node's stack, kept per depth for the stack of the
  // previous node: the next node's stack mostly shares all but its last
  // entries with it (nodes of one module share one stack; a leaf call's
  // stack is its parent's plus itself), so only the entries past the
  // common prefix are matched again.
  struct Level {
    int chosen = -1;  // Depth of the entry chosen so far, or -1.
    int pattern = -1;
    // The walk stopped (an ignored module, or the outermost match): deeper
    // entries and a leaf module called here cannot change `chosen`.
    bool stopped = false;
  };
  using Stack = std::vector<ir::ScopeEntry>;
  static const Stack* const kEmpty = new Stack();
  const Stack* cur = kEmpty;
  std::vector<Level> level(1);  // level[d]: after cur's entries [0, d).
  // Instance of cur's entry d once a node took it (instances are numbered
  // in order of their first node), else -1.
  std::vector<int> inst_at;
  for (int i = 0; i < num_nodes; ++i) {
    if (!IsCompute(g.op(i))) continue;
    const Stack* stack = g.stacks[i];
    if (stack != cur) {
      const int k = g.shared_depth[i];
      level.resize(k + 1);
      inst_at.resize(k);
      for (size_t d = k; d < stack->size(); ++d) {
        Level l = level.back();
        if (!l.stopped) {
          const ir::ScopeEntry& e = (*stack)[d];
          const ModuleMatcher::EntryMatch& match =
              matcher.Lookup(e.path, e.type);
          if (match.ignored) {
            l.stopped = true;
          } else if (match.target >= 0) {
            l.chosen = static_cast<int>(d);
            l.pattern = match.target;
            l.stopped = nesting != Nesting::kInnermost;
          }
        }
        level.push_back(l);
      }
      inst_at.resize(stack->size(), -1);
      cur = stack;
    }
    const Level& l = level.back();
    // A leaf module is matched after its stack (ForEachModule's order),
    // unless its scope ends with it already.
    if (g.op(i) == ir::OpKind::kCallModule && !l.stopped &&
        !g.leaf_in_stack[i]) {
      const std::string& target = g.nodes[i]->target();
      const ModuleMatcher::EntryMatch& leaf = matcher.Lookup(target, "");
      if (!leaf.ignored && leaf.target >= 0) {
        inst[i] = instance(ModuleRef{target, ""}, leaf.target);
        continue;
      }
    }
    if (l.chosen < 0) continue;
    int& id = inst_at[l.chosen];
    if (id < 0) {
      const ir::ScopeEntry& e = (*stack)[l.chosen];
      id = instance(ModuleRef{e.path, e.type}, l.pattern);
    }
    inst[i] = id;
  }
  return t;
}

absl::Status NoTargetError(const ir::Graph& graph,
                           const PartitionOptions& options) {
  // Short type -> distinct paths, to suggest what the layers are called.
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> by_type;
  for (const ir::Node* n : graph.nodes()) {
    ForEachModule(n, [&](const ModuleRef& m) {
      if (!m.type.empty()) {
        by_type[ir::Scope::ShortType(m.type)].insert(std::string(m.path));
      }
      return true;
    });
  }
  std::string msg = absl::StrCat("partition: sequential targets ",
                                 PatternList(options.targets),
                                 " match no module in the graph");
  if (!options.ignore.empty()) {
    absl::StrAppend(&msg, " (outside the ignored ", PatternList(options.ignore),
                    ")");
  }
  if (by_type.empty()) {
    absl::StrAppend(&msg,
                    "; the graph's nodes carry no module scopes (was it traced "
                    "with scopes?)");
    return absl::NotFoundError(msg);
  }
  // Types whose instances sit in numbered containers ("model.layers.3")
  // come first: those are the layers; then by instance count.
  struct TypeCount {
    std::string type;
    size_t count;
    size_t indexed;
  };
  std::vector<TypeCount> types;
  for (const auto& [type, paths] : by_type) {
    size_t indexed = 0;
    for (const std::string& path : paths) {
      absl::string_view last = path;
      if (size_t dot = last.rfind('.'); dot != absl::string_view::npos) {
        last.remove_prefix(dot + 1);
      }
      indexed += !last.empty() &&
                 std::all_of(last.begin(), last.end(),
                             [](char c) { return c >= '0' && c <= '9'; });
    }
    types.push_back({type, paths.size(), indexed});
  }
  std::sort(types.begin(), types.end(), [](const auto& a, const auto& b) {
    if (a.indexed != b.indexed) return a.indexed > b.indexed;
    if (a.count != b.count) return a.count > b.count;
    return a.type < b.type;
  });
  const bool repeated = std::any_of(types.begin(), types.end(),
                                    [](const auto& t) { return t.count > 1; });
  std::vector<std::string> shown;
  for (const TypeCount& t : types) {
    if (repeated && t.count < 2) continue;
    if (shown.size() == 12) {
      shown.push_back("...");
      break;
    }
    shown.push_back(absl::StrCat(t.type, " (", t.count, ")"));
  }
  absl::StrAppend(&msg,
                  repeated ? "; module types with several instances (likely "
                             "layers): "
                           : "; module types present: ",
                  absl::StrJoin(shown, ", "));
  return absl::NotFoundError(msg);
}

}  // namespace tracecut::partition::partitioner_internal
