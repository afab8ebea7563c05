#include "modifiers/output_drift.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

absl::Status OutputDrift::Add(const at::Tensor& want, const at::Tensor& got) {
  return runtime::TorchCall("output drift", [&]() -> absl::Status {
    at::Tensor w = want.to(at::kDouble);
    diff_ +=
        (got.to(w.device()).to(at::kDouble) - w).pow(2).sum().item<double>();
    norm_ += w.pow(2).sum().item<double>();
    return absl::OkStatus();
  });
}

double OutputDrift::relative() const {
  return std::sqrt(diff_ / std::max(norm_, 1e-300));
}

absl::StatusOr<NormSmoothing> SmoothNormWeight(
    const at::Tensor& w, const at::Tensor& scales,
    absl::FunctionRef<absl::Status(const at::Tensor&)> set,
    absl::FunctionRef<absl::StatusOr<OutputDrift>()> drift) {
  at::Tensor plain, offset;
  RETURN_IF_ERROR(runtime::TorchCall("smoothing a norm", [&] {
    plain = (w / scales).to(w.scalar_type());
    offset = ((w.to(at::kFloat) + 1) / scales - 1).to(w.scalar_type());
  }));
  NormSmoothing out;
  RETURN_IF_ERROR(set(plain));
  ASSIGN_OR_RETURN(out.drift, drift());
  RETURN_IF_ERROR(set(offset));
  ASSIGN_OR_RETURN(OutputDrift with_offset, drift());
  if (with_offset.relative() < out.drift.relative()) {
    out.drift = with_offset;
    out.offset = true;
    return out;
  }
  RETURN_IF_ERROR(set(plain));
  return out;
}

absl::Status OutputDrift::Check(c10::ScalarType dtype, absl::string_view where,
                                absl::string_view outputs) const {
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  const double changed = relative();
  if (changed <= (half ? 5e-2 : 1e-3)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: smoothing changed what %s compute (relative error %.3g): the "
      "smooth layer's weight does not scale its output (balance layers "
      "that do not read its output, or a layer computing neither x * weight "
      "nor x * (1 + weight)); give mappings without it",
      where, outputs, changed));
}

}  // namespace tracecut::modifiers
