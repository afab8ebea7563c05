#include "tools/cli/compare_flags.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

std::string Number(double v) { return absl::StrFormat("%g", v); }

// The value of --`flag`, if given, as a finite number >= 0.
absl::StatusOr<std::optional<double>> Tolerance(const ParsedArgs& args,
                                                absl::string_view flag) {
  std::optional<std::string> text = args.Get(flag);
  if (!text.has_value()) return std::nullopt;
  double value = 0;
  if (!absl::SimpleAtod(*text, &value) || !std::isfinite(value) || value < 0) {
    return UsageError(absl::StrCat(
        "--", flag, " wants a finite number >= 0, not '", *text, "'"));
  }
  return value;
}

}  // namespace

std::vector<FlagSpec> CompareFlags(bool tolerance_alias) {
  std::vector<FlagSpec> flags = {
      FlagSpec::Value("rtol", "X",
                      absl::StrCat("relative tolerance: an element fails when "
                                   "|actual - ref| > atol + rtol*|ref| "
                                   "(default ",
                                   Number(runtime::kDefaultRtol), ")")),
      FlagSpec::Value("atol", "X",
                      absl::StrCat("absolute tolerance (default ",
                                   Number(runtime::kDefaultAtol), ")")),
  };
  flags.push_back(FlagSpec::Value(
      "device", "DEV",
      "where the compared runs compute: cpu (default), cuda, cuda:N or auto "
      "(docs/devices.md); the model is left as it was"));
  if (tolerance_alias) {
    flags.push_back(FlagSpec::Value("tolerance", "X",
                                    "an alias of --rtol=X (its older name)"));
  }
  return flags;
}

absl::StatusOr<runtime::CompareOptions> CompareOptionsFromFlags(
    const ParsedArgs& args) {
  runtime::CompareOptions options;
  ASSIGN_OR_RETURN(std::optional<double> rtol, Tolerance(args, "rtol"));
  ASSIGN_OR_RETURN(std::optional<double> atol, Tolerance(args, "atol"));
  ASSIGN_OR_RETURN(std::optional<double> alias, Tolerance(args, "tolerance"));
  if (rtol.has_value() && alias.has_value()) {
    return UsageError("--tolerance is an alias of --rtol: give one of them");
  }
  if (rtol.has_value()) options.rtol = *rtol;
  if (alias.has_value()) options.rtol = *alias;
  if (atol.has_value()) options.atol = *atol;
  if (std::optional<std::string> device = args.Get("device")) {
    absl::StatusOr<c10::Device> resolved = runtime::ResolveDevice(*device);
    if (resolved.status().code() == absl::StatusCode::kInvalidArgument) {
      return UsageError(resolved.status().message());
    }
    ASSIGN_OR_RETURN(options.device, std::move(resolved));
  }
  return options;
}

absl::StatusOr<runtime::CompareOptions> CheckOptionsFromFlags(
    const ParsedArgs& args) {
  ASSIGN_OR_RETURN(runtime::CompareOptions options,
                   CompareOptionsFromFlags(args));
  if (!args.Has("check") &&
      (args.Has("rtol") || args.Has("atol") || args.Has("tolerance"))) {
    return UsageError(
        "--rtol and --atol set the tolerances of --check: add --check");
  }
  if (!args.Has("check") && args.Has("device")) {
    return UsageError("--device says where --check computes: add --check");
  }
  return options;
}

util::Json WorstJson(const std::optional<runtime::ElementDiff>& worst) {
  using util::Json;
  if (!worst.has_value()) return Json();
  Json w = Json::object();
  w["path"] = Json(worst->path);
  w["flat_index"] = Json(worst->flat_index);
  Json index = Json::array();
  for (int64_t i : worst->index) index.push_back(Json(i));
  w["index"] = std::move(index);
  w["actual"] = Json(worst->actual);
  w["expected"] = Json(worst->expected);
  w["abs_error"] = Json(worst->abs_error);
  w["rel_error"] = Json(worst->rel_error);
  return w;
}

std::string ToleranceRule() {
  return absl::StrCat(
      "|actual - ref| <= atol + rtol*|ref| elementwise (defaults: rtol ",
      Number(runtime::kDefaultRtol), ", atol ", Number(runtime::kDefaultAtol),
      ")");
}

}  // namespace tracecut::cli
