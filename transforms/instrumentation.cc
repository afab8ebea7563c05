#include "transforms/instrumentation.h"

#include <filesystem>
#include <iostream>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ir/module_pattern.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "util/files.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

// `status` with `suffix` after its message, same code and payloads.
absl::Status AppendToMessage(const absl::Status& status,
                             absl::string_view suffix) {
  absl::Status out(status.code(), absl::StrCat(status.message(), suffix));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) {
        out.SetPayload(url, payload);
      });
  return out;
}

// A file name from a pass name: [A-Za-z0-9._-] kept, the rest '_'.
std::string FileStem(const PassRun& pass) {
  std::string stem =
      pass.pass != nullptr ? std::string(pass.pass->name()) : pass.name;
  for (char& c : stem) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    if (!ok) c = '_';
  }
  if (pass.reverse) absl::StrAppend(&stem, ".reverse");
  return stem;
}

constexpr absl::string_view kPassKey = "# pass: ";
constexpr absl::string_view kDirectionKey = "# direction: ";

}  // namespace

bool PassNameMatches(absl::string_view pattern, absl::string_view name) {
  // Pass names have no dots, so ir::ModulePattern's type matching is plain
  // glob ('*', '?') or "re:" regex over the whole name.
  return !pattern.empty() && ir::ModulePattern(pattern).MatchesType(name);
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

VerifierInstrumentation::VerifierInstrumentation(
    std::vector<ModuleChecker> checkers)
    : checkers_(std::move(checkers)) {
  if (checkers_.empty()) checkers_ = {VerifyGraph, CheckModuleReferences};
}

absl::Status VerifierInstrumentation::Check(const runtime::GraphModule& gm,
                                            absl::string_view prefix) const {
  for (const ModuleChecker& check : checkers_) {
    absl::Status s = check(gm);
    if (!s.ok()) return util::Annotate(s, prefix);
  }
  return absl::OkStatus();
}

absl::Status VerifierInstrumentation::RunBeforePipeline(
    const runtime::GraphModule& gm) {
  return Check(gm, "invalid input");
}

absl::Status VerifierInstrumentation::RunAfterPass(
    const PassRun& pass, const runtime::GraphModule& gm, bool changed) {
  if (!changed) return absl::OkStatus();
  return Check(gm, absl::StrCat("failed after ", pass.name));
}

IrDumpInstrumentation::IrDumpInstrumentation(std::string pattern,
                                             bool only_if_changed,
                                             DumpSink sink)
    : pattern_(std::move(pattern)),
      only_if_changed_(only_if_changed),
      sink_(std::move(sink)) {}

absl::Status IrDumpInstrumentation::RunAfterPass(const PassRun& pass,
                                                 const runtime::GraphModule& gm,
                                                 bool changed) {
  if (only_if_changed_ && !changed) return absl::OkStatus();
  if (!PassNameMatches(pattern_, pass.name)) return absl::OkStatus();
  const std::string text = ir::PrintGraph(gm.graph());
  if (sink_) {
    sink_(pass.name, text);
  } else {
    std::cerr << "// IR after " << pass.name << "\n" << text << std::flush;
  }
  return absl::OkStatus();
}

std::vector<std::string> TouchedNodes(const ir::Graph& graph,
                                      absl::string_view pass, int64_t app) {
  std::vector<std::string> names;
  for (const ir::Node* n : GetTransformedNodes(graph, pass, app)) {
    names.push_back(n->name());
  }
  return names;
}

absl::Status PassChangeRecorder::RunAfterPass(const PassRun& pass,
                                              const runtime::GraphModule& gm,
                                              bool changed) {
  entries_.push_back(
      {pass.name, changed, TouchedNodes(gm.graph(), pass.name, pass.app)});
  return absl::OkStatus();
}

ReproducerInstrumentation::ReproducerInstrumentation(std::string dir)
    : dir_(std::move(dir)) {}

absl::Status ReproducerInstrumentation::RunBeforePass(
    const PassRun& pass, const runtime::GraphModule& gm) {
  input_ = gm.graph().Clone();
  return absl::OkStatus();
}

absl::Status ReproducerInstrumentation::RunAfterPassFailed(
    const PassRun& pass, const runtime::GraphModule& gm, absl::Status error) {
  if (input_ == nullptr) return error;
  std::unique_ptr<ir::Graph> input = std::move(input_);
  const std::string pass_name =
      pass.pass != nullptr ? std::string(pass.pass->name()) : pass.name;
  std::string text = absl::StrCat(
      "# tracecut reproducer: running the pass below on this graph (with the "
      "same model's\n# parameters, which are not in this file) failed "
      "with:\n");
  for (absl::string_view line :
       absl::StrSplit(absl::StrCat(absl::StatusCodeToString(error.code()), ": ",
                                   error.message()),
                      '\n')) {
    absl::StrAppend(&text, "#   ", line, "\n");
  }
  absl::StrAppend(&text, kPassKey, pass_name, "\n", kDirectionKey,
                  pass.reverse ? "reverse" : "run", "\n",
                  ir::PrintGraph(*input));

  absl::Status written = util::MakeDirs(dir_);
  std::string path;
  if (written.ok()) {
    const std::string stem = FileStem(pass);
    path = (std::filesystem::path(dir_) / absl::StrCat(stem, ".ir")).string();
    std::error_code ec;
    for (int i = 2; std::filesystem::exists(path, ec); ++i) {
      path = (std::filesystem::path(dir_) / absl::StrCat(stem, ".", i, ".ir"))
                 .string();
    }
    written = util::WriteFileAtomically(path, text);
  }
  if (!written.ok()) {
    return AppendToMessage(
        error, absl::StrCat(" [no reproducer: ", written.message(), "]"));
  }
  written_.push_back(path);
  return AppendToMessage(error, absl::StrCat(" [reproducer: ", path, "]"));
}

absl::StatusOr<Reproducer> ParseReproducer(absl::string_view text) {
  Reproducer r;
  bool has_pass = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "#")) break;
    if (absl::ConsumePrefix(&line, kPassKey)) {
      r.pass = std::string(line);
      has_pass = true;
    } else if (absl::ConsumePrefix(&line, kDirectionKey)) {
      r.reverse = line == "reverse";
    }
  }
  if (!has_pass) {
    return absl::InvalidArgumentError(
        "not a tracecut reproducer: no '# pass: NAME' line before the graph");
  }
  // Unverified: the input of a pass after one that broke the graph while
  // claiming no change still has to load.
  ir::ParseOptions options;
  options.verify = false;
  ASSIGN_OR_RETURN(r.graph, ir::ParseGraph(text, options));
  return r;
}

absl::StatusOr<Reproducer> ReadReproducer(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, util::ReadFile(path));
  return util::Annotate(ParseReproducer(text), path);
}

}  // namespace tracecut::transforms
