#include "transforms/pipeline.h"

#include <cstdio>
#include <iostream>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

bool GlobMatch(absl::string_view pattern, absl::string_view s) {
  // Iterative glob with backtracking over the last '*'.
  size_t p = 0, i = 0, star = absl::string_view::npos, mark = 0;
  while (i < s.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == s[i])) {
      ++p;
      ++i;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = i;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

}  // namespace

bool PassNameMatches(absl::string_view pattern, absl::string_view name) {
  if (pattern.empty()) return false;
  if (absl::StartsWith(pattern, "re:")) {
    try {
      return std::regex_match(std::string(name),
                              std::regex(std::string(pattern.substr(3))));
    } catch (const std::regex_error&) {
      return false;
    }
  }
  return GlobMatch(pattern, name);
}

absl::Status VerifyGraph(const runtime::GraphModule& gm) {
  return ir::Verify(gm.graph());
}

absl::Status CheckModuleReferences(const runtime::GraphModule& gm) {
  for (const ir::Node* n : gm.graph().nodes()) {
    if (n->op() == ir::OpKind::kGetAttr) {
      const std::string& target = n->target();
      const size_t dot = target.rfind('.');
      const std::string parent =
          dot == std::string::npos ? "" : target.substr(0, dot);
      const std::string attr =
          dot == std::string::npos ? target : target.substr(dot + 1);
      auto m = gm.GetSubmodule(parent);
      if (!m.ok() || !m->hasattr(attr)) {
        return absl::FailedPreconditionError(absl::StrCat(
            n->Describe(), ": the module has no attribute '", target, "'"));
      }
    } else if (n->op() == ir::OpKind::kCallModule) {
      auto m = gm.GetSubmodule(n->target());
      if (!m.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(n->Describe(), ": no submodule '", n->target(), "'"));
      }
      if (!m->find_method("forward")) {
        return absl::FailedPreconditionError(absl::StrCat(
            n->Describe(), ": submodule '", n->target(), "' has no forward"));
      }
    }
  }
  return absl::OkStatus();
}

Pipeline::Pipeline(std::string name, PipelineOptions options)
    : name_(std::move(name)), options_(std::move(options)) {
  if (options_.checkers.empty()) {
    options_.checkers = {VerifyGraph, CheckModuleReferences};
  }
}

bool Pipeline::preserves_computation() const {
  for (const auto& p : passes_) {
    if (!p->preserves_computation()) return false;
  }
  return true;
}

bool Pipeline::is_reversible() const {
  for (const auto& p : passes_) {
    if (!p->is_reversible()) return false;
  }
  return true;
}

int Pipeline::application_count() const {
  int n = 0;
  for (const auto& p : passes_) n += p->application_count();
  return n;
}

Transformation& Pipeline::AddPass(std::unique_ptr<Transformation> pass) {
  passes_.push_back(std::move(pass));
  return *passes_.back();
}

absl::Status Pipeline::Check(const runtime::GraphModule& gm,
                             absl::string_view after) const {
  if (!options_.verify) return absl::OkStatus();
  for (const ModuleChecker& check : options_.checkers) {
    absl::Status s = check(gm);
    if (!s.ok()) {
      return Annotate(s, after.empty()
                             ? std::string("invalid input: ")
                             : absl::StrCat("failed after ", after, ": "));
    }
  }
  return absl::OkStatus();
}

void Pipeline::MaybeDump(const runtime::GraphModule& gm, absl::string_view pass,
                         bool changed) const {
  if (options_.dump_after.empty()) return;
  if (options_.dump_only_if_changed && !changed) return;
  if (!PassNameMatches(options_.dump_after, pass)) return;
  const std::string text = ir::PrintGraph(gm.graph());
  if (options_.dump_sink) {
    options_.dump_sink(pass, text);
  } else {
    std::cerr << "// IR after " << pass << "\n" << text << std::flush;
  }
}

absl::StatusOr<bool> Pipeline::Run(runtime::GraphModule& gm) {
  records_.clear();
  RETURN_IF_ERROR(Check(gm, ""));
  // Restored on every return: the pin is only there while a pass runs.
  const std::optional<int64_t> outer_pin = PinnedApplicationId(gm.graph());
  struct Unpin {
    runtime::GraphModule& gm;
    std::optional<int64_t> pin;
    ~Unpin() { PinApplicationId(gm.graph(), pin); }
  } unpin{gm, outer_pin};
  int64_t app = NextApplicationId(gm.graph());
  bool any = false;
  for (const auto& pass : passes_) {
    PinApplicationId(gm.graph(), app);
    const absl::Time start = absl::Now();
    absl::StatusOr<bool> changed = runtime::TorchCall(
        absl::StrCat(pass->name()), [&] { return pass->Run(gm); });
    const absl::Duration took = absl::Now() - start;
    PinApplicationId(gm.graph(), outer_pin);
    if (!changed.ok()) {
      return Annotate(changed.status(),
                      absl::StrCat(pass->name(), " failed: "));
    }
    records_.push_back({std::string(pass->name()), *changed, took, app,
                        pass->preserves_computation()});
    app += pass->application_count();
    if (*changed) {
      any = true;
      RETURN_IF_ERROR(Check(gm, pass->name()));
    }
    MaybeDump(gm, pass->name(), *changed);
    if (options_.after_pass) {
      absl::Status s = options_.after_pass(records_.back(), gm);
      if (!s.ok()) return s;
    }
  }
  return any;
}

absl::StatusOr<runtime::GraphModule> Pipeline::Apply(
    const runtime::GraphModule& gm) {
  ASSIGN_OR_RETURN(runtime::GraphModule copy, gm.Clone());
  RETURN_IF_ERROR(Run(copy).status());
  return copy;
}

absl::StatusOr<bool> Pipeline::Reverse(runtime::GraphModule& gm) {
  for (const auto& pass : passes_) {
    if (!pass->is_reversible()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot reverse pipeline ", name_, ": pass ",
                       pass->name(), " is not reversible"));
    }
  }
  records_.clear();
  RETURN_IF_ERROR(Check(gm, ""));
  bool any = false;
  for (auto it = passes_.rbegin(); it != passes_.rend(); ++it) {
    auto* pass = dynamic_cast<ReversibleTransformation*>(it->get());
    if (pass == nullptr) {
      return absl::InternalError(absl::StrCat(
          (*it)->name(),
          " claims to be reversible but is not a ReversibleTransformation"));
    }
    const std::string label = absl::StrCat(pass->name(), " (reverse)");
    const absl::Time start = absl::Now();
    absl::StatusOr<bool> changed =
        runtime::TorchCall(label, [&] { return pass->Reverse(gm); });
    const absl::Duration took = absl::Now() - start;
    if (!changed.ok()) {
      return Annotate(changed.status(), absl::StrCat(label, " failed: "));
    }
    records_.push_back({label, *changed, took, 0, true});
    if (*changed) {
      any = true;
      RETURN_IF_ERROR(Check(gm, label));
    }
    MaybeDump(gm, label, *changed);
  }
  return any;
}

std::string Pipeline::TimingReport() const {
  std::string out;
  for (const PassRecord& r : records_) {
    char ms[32];
    std::snprintf(ms, sizeof(ms), "%.3f", absl::ToDoubleMilliseconds(r.time));
    absl::StrAppend(&out, r.name, ": ", r.changed ? "changed" : "unchanged",
                    ", ", ms, " ms\n");
  }
  return out;
}

}  // namespace tracecut::transforms
