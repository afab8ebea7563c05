#ifndef TRACECUT_RUNTIME_COMPARE_H_
#define TRACECUT_RUNTIME_COMPARE_H_

// The numeric comparator of every check in tracecut (`partition --check`,
// `transform --check`, `debug`): two values of the same structure, compared
// elementwise with relative and absolute tolerance, allclose-style.
//
//   ASSIGN_OR_RETURN(CompareResult r, CompareValues(after, before));
//   if (!r.passed) return absl::InternalError(r.FailureSummary("output"));
//   std::cerr << r.ErrorSummary();  // "max abs error 1.2e-06, max rel ..."
//
// Several values can be gathered into one result under their own paths:
//
//   Comparator c(options);
//   RETURN_IF_ERROR(c.Add(outs[k], reference[k], "%" + names[k]));
//
// Note [Comparison semantics]
// * An element passes when |a - b| <= atol + rtol * |b|, where b is the
//   expected (reference) value and a the actual one (torch.isclose's rule).
// * Tensors need the same shape (not the same dtype) and are compared in
//   float64, so bf16/fp16 values and integers compare exactly as their
//   float64 images (integers beyond 2^53 round). Complex tensors are
//   rejected. Tuples and lists compare elementwise (a tuple matches a list of
//   the same length), dicts by key; ints, doubles and bools numerically,
//   as one element each; None, strings and devices must be equal.
// * Non-finite values: NaN on both sides of an element counts as equal (as
//   torch.allclose(equal_nan=True)): a check asks whether a rewrite
//   reproduces the model, and a model that produces NaN in the same places
//   before and after is reproduced. NaN on one side only, or an infinity
//   against anything but the same infinity, is a violation with infinite
//   absolute and relative error.
// * max_rel_error is max |a - b| / |b| over the elements; an element with
//   b == 0 and a != b has relative error +inf (atol is what lets such
//   elements pass).
// * The worst violation is the one with the largest excess
//   |a - b| - (atol + rtol * |b|) (non-finite mismatches first); ties go to
//   the first in traversal order (paths in order, elements in flat order).

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::runtime {

// The default tolerances of every check (and of the CLI's --rtol/--atol).
// rtol 1e-4 accepts the float32 rounding of a correct rewrite on large
// activations (a BatchNorm fusion on outputs of magnitude 60 differs by
// ~6e-5); atol 1e-5 covers elements near zero.
inline constexpr double kDefaultRtol = 1e-4;
inline constexpr double kDefaultAtol = 1e-5;

struct CompareOptions {
  double rtol = kDefaultRtol;
  double atol = kDefaultAtol;
  // Where the compared runs compute (runtime/device.h); the comparison
  // itself reads the values on the host.
  c10::Device device = c10::Device(c10::kCPU);
};

// InvalidArgument unless rtol and atol are finite and >= 0.
absl::Status ValidateCompareOptions(const CompareOptions& options);

// One compared element.
struct ElementDiff {
  // Where the element's value lies in the compared structure: "" for the
  // value itself, then "[1]" for a tuple or list item, "['logits']" for a
  // dict entry, or whatever path Comparator::Add was given ("%layer_out").
  std::string path;
  // The element's index in the tensor in row-major (flat) order and as a
  // multi-index; -1 and empty for an int, double or bool.
  int64_t flat_index = -1;
  std::vector<int64_t> index;
  double actual = 0;
  double expected = 0;
  double abs_error = 0;
  double rel_error = 0;

  // "[0] element 17 [0, 17]" (the multi-index for tensors of 2 or more
  // dimensions; empty for a scalar at the top).
  std::string Location() const;
  // "3.2 vs 3.1 (abs 0.1, rel 0.032)": actual vs expected.
  std::string Values() const;
  // "[0] element 17 [0, 17]: 3.2 vs 3.1 (abs 0.1, rel 0.032)".
  std::string ToString() const;
};

struct CompareResult {
  // The tolerances it was computed with.
  double rtol = kDefaultRtol;
  double atol = kDefaultAtol;
  bool passed = true;  // violations == 0
  int64_t elements = 0;
  int64_t violations = 0;
  double max_abs_error = 0;
  double max_rel_error = 0;
  // The worst violation (Note [Comparison semantics]); set iff violations.
  std::optional<ElementDiff> worst;

  // "max abs error 1.2e-06, max rel error 3.4e-07".
  std::string ErrorSummary() const;
  // "12 of 1000 elements exceed atol 1e-05 + rtol 0.0001*|ref|; worst at
  // output [0] element 17 [0, 17]: 3.2 vs 3.1 (abs 0.1, rel 0.032); max abs
  // error 0.1, max rel error 0.05", with `what` ("output") naming what the
  // paths are in. For a failed result.
  std::string FailureSummary(absl::string_view what) const;
};

// Gathers comparisons of several values into one CompareResult.
class Comparator {
 public:
  explicit Comparator(const CompareOptions& options = {});

  // Compares `actual` with `expected` (the reference), its elements under
  // `path`. Errors (InvalidArgument for bad options, FailedPrecondition for
  // values that cannot be compared) name the path where the structures
  // differ: "[1]: shape [2, 3] vs [2, 4]" (actual's first). Values compared
  // before the error stay counted.
  absl::Status Add(const c10::IValue& actual, const c10::IValue& expected,
                   absl::string_view path = "");

  const CompareResult& result() const { return result_; }

 private:
  absl::Status AddValue(const c10::IValue& actual, const c10::IValue& expected,
                        const std::string& path);
  absl::Status AddTensor(const at::Tensor& actual, const at::Tensor& expected,
                         const std::string& path);
  void AddNumber(double actual, double expected, const std::string& path);

  CompareOptions options_;
  CompareResult result_;
  double worst_excess_ = 0;
};

// One comparison: Comparator(options).Add(actual, expected).
absl::StatusOr<CompareResult> CompareValues(const c10::IValue& actual,
                                            const c10::IValue& expected,
                                            const CompareOptions& options = {});

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_COMPARE_H_
