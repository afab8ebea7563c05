#ifndef TRACECUT_MODIFIERS_OUTPUT_DRIFT_H_
#define TRACECUT_MODIFIERS_OUTPUT_DRIFT_H_

// How far a transform moved what the model computes: SmoothQuant and AWQ
// must leave the outputs they rescale as they were, up to float rounding.
// A smooth layer whose weight does not scale its output (a mapping whose
// balance layers do not read its output) would otherwise change the model
// without a word; they also use it to tell a norm computing x * (1 +
// weight), as Gemma's, from one computing x * weight.
//
//   OutputDrift drift;
//   RETURN_IF_ERROR(drift.Add(before, after));  // per output, any number
//   RETURN_IF_ERROR(drift.Check(weight_dtype, "awq: model.layers.0.x",
//                               "model.layers.0.mlp"));

#include <ATen/core/Tensor.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::modifiers {

class OutputDrift {
 public:
  // Adds one output before (`want`) and after (`got`) the transform.
  absl::Status Add(const at::Tensor& want, const at::Tensor& got);
  // ||got - want|| / ||want|| over everything added (fp64).
  double relative() const;
  // InvalidArgument "<where>: smoothing changed what <outputs> compute..."
  // when relative() exceeds float rounding for weights of `dtype` (1e-3;
  // 5e-2 for fp16 / bf16).
  absl::Status Check(c10::ScalarType dtype, absl::string_view where,
                     absl::string_view outputs) const;

 private:
  double diff_ = 0;
  double norm_ = 0;
};

// A norm smooth layer's weight `w` divided by the smoothing `scales`: a norm
// computing x * w needs w / s, one computing x * (1 + w) (Gemma's)
// 1 + w' = (1 + w) / s. `set` puts a candidate into the model and `drift`
// measures the outputs with it; both are tried and the one that moves them
// less is kept, so that no rounding tolerance can hide the wrong one.
// Returns its drift; `offset` says whether it was the (1 + w) one.
struct NormSmoothing {
  OutputDrift drift;
  bool offset = false;
};
absl::StatusOr<NormSmoothing> SmoothNormWeight(
    const at::Tensor& w, const at::Tensor& scales,
    absl::FunctionRef<absl::Status(const at::Tensor&)> set,
    absl::FunctionRef<absl::StatusOr<OutputDrift>()> drift);

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_OUTPUT_DRIFT_H_
