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
  // Consecutive nodes of one module have the same scope stack (often the
  // same shared one: ir::Scope copies share it), so a run of them is
  // matched once.
  const std::vector<ir::ScopeEntry>* memo_stack = nullptr;
  int memo_inst = -1;
  for (int i = 0; i < num_nodes; ++i) {
    if (!IsCompute(g.nodes[i])) continue;
    const std::vector<ir::ScopeEntry>* stack = &g.nodes[i]->scope().stack();
    const bool leaf = g.op(i) == ir::OpKind::kCallModule;
    if (!leaf && memo_stack != nullptr &&
        (stack == memo_stack || *stack == *memo_stack)) {
      inst[i] = memo_inst;
      continue;
    }
    std::optional<ModuleRef> chosen;
    int pattern = -1;
    ForEachModule(g.nodes[i], [&](const ModuleRef& m) {
      const ModuleMatcher::EntryMatch& match = matcher.Lookup(m.path, m.type);
      if (match.ignored) return false;
      if (match.target >= 0) {
        chosen = m;
        pattern = match.target;
        return nesting == Nesting::kInnermost;
      }
      return true;
    });
    if (!leaf) {
      memo_stack = stack;
      memo_inst = -1;
    }
    if (!chosen) continue;
    auto [it, inserted] = instance_of.try_emplace(
        chosen->path, static_cast<int>(instances.size()));
    if (inserted) {
      instances.push_back(
          {std::string(chosen->path), std::string(chosen->type), pattern});
    } else if (instances[it->second].type.empty() && !chosen->type.empty()) {
      instances[it->second].type = std::string(chosen->type);
    }
    inst[i] = it->second;
    if (!leaf) memo_inst = it->second;
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
