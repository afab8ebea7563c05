#ifndef TRACECUT_TOOLS_CLI_COMPARE_FLAGS_H_
#define TRACECUT_TOOLS_CLI_COMPARE_FLAGS_H_

// The tolerance flags of every numeric check on the command line
// (`partition --check`, `transform --check`, `debug`): --rtol and --atol,
// with the defaults of runtime/compare.h, and `debug`'s older --tolerance
// (an alias of --rtol); the worst element in --json summaries.
//
//   c.flags.push_back(...); for (FlagSpec& f : CompareFlags()) ...
//   ASSIGN_OR_RETURN(runtime::CompareOptions o, CompareOptionsFromFlags(args));

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/compare.h"
#include "tools/cli/common.h"
#include "util/json.h"

namespace tracecut::cli {

// --rtol=X and --atol=X (plus --tolerance=X when `tolerance_alias`), their
// help stating the defaults.
std::vector<FlagSpec> CompareFlags(bool tolerance_alias = false);

// The options the flags ask for; the defaults for those not given. A value
// that is not a finite number >= 0, or --tolerance with --rtol, is a usage
// error naming the flag.
absl::StatusOr<runtime::CompareOptions> CompareOptionsFromFlags(
    const ParsedArgs& args);

// CompareOptionsFromFlags for a command whose check is optional: also a
// usage error when a tolerance is given without --check.
absl::StatusOr<runtime::CompareOptions> CheckOptionsFromFlags(
    const ParsedArgs& args);

// A check's worst element for --json: {"path", "flat_index", "index",
// "actual", "expected", "abs_error", "rel_error"}, or null.
util::Json WorstJson(const std::optional<runtime::ElementDiff>& worst);

// "|actual - ref| <= atol + rtol * |ref| elementwise (defaults: rtol 0.0001,
// atol 1e-05)", for --help texts.
std::string ToleranceRule();

}  // namespace tracecut::cli

#endif  // TRACECUT_TOOLS_CLI_COMPARE_FLAGS_H_
