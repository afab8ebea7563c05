#include "tracer/leaf_policy.h"

#include <utility>

#include "absl/strings/match.h"
#include "ir/names.h"

namespace tracecut::tracer {
namespace {

// Glob with a configurable single-star class: for paths '*' stays within a
// module path segment (ir/names.h: any characters but the separator, so
// "block1-*" matches "block1-0"), for types it does not; '**' always spans.
// Recursive: patterns and paths are short.
bool Glob(absl::string_view p, absl::string_view s, bool star_stops_at_dot) {
  constexpr char kDot = ir::kModulePathSeparator;
  while (!p.empty()) {
    if (p[0] == '*') {
      bool spans = !star_stops_at_dot;
      size_t stars = 1;
      if (p.size() > 1 && p[1] == '*') {
        spans = true;
        stars = 2;
      }
      absl::string_view rest = p.substr(stars);
      for (size_t i = 0;; ++i) {
        if (Glob(rest, s.substr(i), star_stops_at_dot)) return true;
        if (i == s.size() || (!spans && s[i] == kDot)) return false;
      }
    }
    if (s.empty()) return false;
    if (p[0] != s[0] && !(p[0] == '?' && s[0] != kDot)) return false;
    p.remove_prefix(1);
    s.remove_prefix(1);
  }
  return s.empty();
}

absl::string_view ShortName(absl::string_view type) {
  size_t dot = type.rfind('.');
  return dot == absl::string_view::npos ? type : type.substr(dot + 1);
}

bool TypeMatches(absl::string_view pattern, absl::string_view type) {
  if (pattern.find('*') == absl::string_view::npos &&
      pattern.find('?') == absl::string_view::npos) {
    return pattern == type || pattern == ShortName(type);
  }
  return Glob(pattern, type, false) || Glob(pattern, ShortName(type), false);
}

}  // namespace

bool GlobMatch(absl::string_view pattern, absl::string_view path) {
  return Glob(pattern, path, true);
}

LeafPolicy LeafPolicy::Default() {
  LeafPolicy p;
  p.torch_nn_ = true;
  p.types_.push_back("Conv1D");
  return p;
}

LeafPolicy LeafPolicy::TorchNn() {
  LeafPolicy p;
  p.torch_nn_ = true;
  return p;
}

LeafPolicy& LeafPolicy::AddType(std::string type) {
  types_.push_back(std::move(type));
  return *this;
}

LeafPolicy& LeafPolicy::AddPath(std::string pattern) {
  paths_.push_back(std::move(pattern));
  return *this;
}

LeafPolicy& LeafPolicy::AddTypeOrPath(std::string pattern) {
  types_.push_back(pattern);
  paths_.push_back(std::move(pattern));
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
  absl::string_view name = ShortName(type);
  return name != "Sequential" && name != "ModuleList" && name != "ModuleDict" &&
         name != "ParameterList" && name != "ParameterDict";
}

bool LeafPolicy::IsLeaf(absl::string_view path, absl::string_view type) const {
  if (torch_nn_ && IsTorchNnLeafType(type)) return true;
  for (const std::string& t : types_) {
    if (TypeMatches(t, type)) return true;
  }
  for (const std::string& p : paths_) {
    if (p == path || GlobMatch(p, path)) return true;
  }
  for (const Predicate& pred : predicates_) {
    if (pred(path, type)) return true;
  }
  return false;
}

}  // namespace tracecut::tracer
