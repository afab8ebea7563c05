#include "tracer/leaf_policy.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "ir/graph.h"
#include "ir/module_pattern.h"

namespace tracecut::tracer {

LeafPolicy LeafPolicy::Default() {
  LeafPolicy p;
  p.torch_nn_ = true;
  p.types_.emplace_back("Conv1D");
  return p;
}

LeafPolicy LeafPolicy::TorchNn() {
  LeafPolicy p;
  p.torch_nn_ = true;
  return p;
}

LeafPolicy& LeafPolicy::AddType(std::string type) {
  types_.emplace_back(type);
  return *this;
}

LeafPolicy& LeafPolicy::AddPath(std::string pattern) {
  paths_.emplace_back(pattern);
  return *this;
}

LeafPolicy& LeafPolicy::AddTypeOrPath(std::string pattern) {
  types_.emplace_back(pattern);
  paths_.emplace_back(pattern);
  return *this;
}

LeafPolicy& LeafPolicy::AddPredicate(Predicate predicate) {
  predicates_.push_back(std::move(predicate));
  return *this;
}

bool LeafPolicy::IsTorchNnLeafType(absl::string_view type) {
  if (!absl::StartsWith(type, "torch.nn.") &&
      !absl::StartsWith(type, "torch.ao.nn.")) {
    return false;
  }
  const std::string name = ir::Scope::ShortType(type);
  return name != "Sequential" && name != "ModuleList" && name != "ModuleDict" &&
         name != "ParameterList" && name != "ParameterDict";
}

bool LeafPolicy::IsLeaf(absl::string_view path, absl::string_view type) const {
  if (torch_nn_ && IsTorchNnLeafType(type)) return true;
  for (const ir::ModulePattern& t : types_) {
    if (t.MatchesType(type)) return true;
  }
  for (const ir::ModulePattern& p : paths_) {
    if (p.MatchesPath(path)) return true;
  }
  for (const Predicate& pred : predicates_) {
    if (pred(path, type)) return true;
  }
  return false;
}

}  // namespace tracecut::tracer
