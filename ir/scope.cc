// Scope: the module call stack a node was recorded under (graph.h).
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::ir {

const std::string& Scope::path() const {
  static const std::string* const kEmpty = new std::string();
  return stack_ == nullptr ? *kEmpty : stack_->back().path;
}

const std::string& Scope::type() const {
  static const std::string* const kEmpty = new std::string();
  return stack_ == nullptr ? *kEmpty : stack_->back().type;
}

std::string Scope::short_type() const { return ShortType(type()); }

const std::vector<ScopeEntry>& Scope::EmptyStack() {
  static const auto* const kEmpty = new std::vector<ScopeEntry>();
  return *kEmpty;
}

Scope Scope::Push(ScopeEntry entry) const {
  std::vector<ScopeEntry> stack;
  stack.reserve(depth() + 1);
  stack = this->stack();
  stack.push_back(std::move(entry));
  return Scope(std::move(stack));
}

bool Scope::Contains(absl::string_view path) const {
  for (const ScopeEntry& e : stack()) {
    if (e.path == path) return true;
  }
  return false;
}

std::string Scope::DemangleType(absl::string_view qualified) {
  std::vector<absl::string_view> kept;
  for (absl::string_view part : absl::StrSplit(qualified, '.')) {
    if (absl::StartsWith(part, "___torch_mangle_")) continue;
    kept.push_back(part);
  }
  if (!kept.empty() && kept.front() == "__torch__") kept.erase(kept.begin());
  return absl::StrJoin(kept, ".");
}

std::string Scope::ShortType(absl::string_view qualified) {
  size_t dot = qualified.rfind('.');
  return std::string(
      dot == absl::string_view::npos ? qualified : qualified.substr(dot + 1));
}

}  // namespace tracecut::ir
