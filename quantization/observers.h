#ifndef TRACECUT_QUANTIZATION_OBSERVERS_H_
#define TRACECUT_QUANTIZATION_OBSERVERS_H_

// Observers: the statistics that quantization parameters come from, as
// llm-compressor 0.14 computes them (llmcompressor/observers/*.py) on the
// CPU, bit-exact (see Note [Bit-exact with compressed-tensors] in
// fake_quant.h).
//
//   ASSIGN_OR_RETURN(QParams q, WeightQParams(weight, *scheme.weights));
//   ASSIGN_OR_RETURN(at::Tensor codes, Quantize(weight, q, *scheme.weights,
//                                               at::kChar));
//
// * minmax (llm-compressor's memoryless_minmax for weights): per-parameter
//   min and max of the flattened value.
// * mse (memoryless_mse for weights): the eager `_grid_search_mse`: the
//   min/max shrunk by p = 1 - i / grid for i < maxshrink * grid, keeping per
//   parameter the p with the smallest sum |fake_quant(x) - x|^norm, stopping
//   after `patience` steps without any improvement (defaults maxshrink 0.2,
//   grid 100, norm 2.4, patience 5, expand 1; observer_kwargs override).
// * Activations: static_minmax (running min / max over batches) and minmax
//   (moving average with averaging_constant, default 0.01), per tensor; the
//   parameters come from the same CalculateQParams.
//
// Weight parameters are returned in the dtypes llm-compressor's modules hold
// them in (compressed-tensors' initialize_qparams): the scale in the
// weight's dtype (fp16 for a non-float weight), the zero point in zp_dtype,
// the global scale in fp32 [1].

#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quantization/fake_quant.h"
#include "quantization/quant_args.h"

namespace tracecut::quantization {

struct MinMax {
  at::Tensor min_vals;
  at::Tensor max_vals;
};

// flatten_for_calibration of a weight [rows, cols]:
// (num_observations, *qparam_shape, group_size).
absl::StatusOr<at::Tensor> FlattenWeight(const at::Tensor& weight,
                                         const QuantizationArgs& args);
// ... and of an activation [..., hidden] (tensor, token, group strategies).
absl::StatusOr<at::Tensor> FlattenActivation(const at::Tensor& value,
                                             const QuantizationArgs& args);
// ... and of an attention's keys or values [batch, heads, seq, head_dim]
// (tensor, attn_head strategies).
absl::StatusOr<at::Tensor> FlattenAttention(const at::Tensor& value,
                                            const QuantizationArgs& args);

// amin / amax over dims (0, -1) of a flattened value.
MinMax ObservedMinMax(const at::Tensor& observed);

struct MseOptions {
  double maxshrink = 0.20;
  int64_t patience = 5;
  double grid = 100.0;
  double norm = 2.4;
  double expand = 1.0;
  // From args.observer_kwargs (maxshrink, patience, grid, norm, expand);
  // InvalidArgument naming a bad one.
  static absl::StatusOr<MseOptions> FromArgs(const QuantizationArgs& args);
};

// _grid_search_mse over a flattened value.
absl::StatusOr<MinMax> MseMinMax(const at::Tensor& observed,
                                 const QuantizationArgs& args,
                                 const MseOptions& options);

// The statistics the weight observer named by args.observer (minmax when
// unset) takes of `weight`.
absl::StatusOr<MinMax> WeightMinMax(const at::Tensor& weight,
                                    const QuantizationArgs& args);

// The global scale of tensor_group weights that share one (llm-compressor
// fuses q/k/v and gate/up): generate_gparam of the absmax over all of them.
absl::StatusOr<at::Tensor> FusedGlobalScale(const std::vector<MinMax>& stats);

// The parameters llm-compressor's QuantizationModifier gives a weight
// [rows, cols]: observer, global scale (tensor_group, from this weight alone
// unless `global_scale` is given), calculate_qparams, stored in the module's
// parameter dtypes. NaN/Inf weights are refused.
absl::StatusOr<QParams> WeightQParams(const at::Tensor& weight,
                                      const QuantizationArgs& args,
                                      const at::Tensor& global_scale = {});

// A static activation observer (static_minmax or minmax per tensor): feed
// it every calibration batch of one module's input, then Finish().
class ActivationObserver {
 public:
  // InvalidArgument for args that are not static per-tensor activations
  // (or tensor_group "local", where only the global scale is calibrated).
  static absl::StatusOr<ActivationObserver> Create(
      const QuantizationArgs& args);
  // An observer of an attention's keys or values (a KV cache: static, per
  // tensor or per head, attn_head).
  static absl::StatusOr<ActivationObserver> CreateForAttention(
      const QuantizationArgs& args);

  absl::Status Observe(const at::Tensor& value);
  bool has_statistics() const { return stats_.min_vals.defined(); }
  const MinMax& statistics() const { return stats_; }
  // Replaces the statistics: what ranks of a data-parallel run reduced, or
  // a stand-in for a module no calibration token reached.
  void set_statistics(MinMax stats) { stats_ = std::move(stats); }
  const QuantizationArgs& args() const { return args_; }
  // Parameters with the scale in `scale_dtype` (the module weight's dtype);
  // for "local" args only the global scale is set.
  absl::StatusOr<QParams> Finish(c10::ScalarType scale_dtype) const;

 private:
  explicit ActivationObserver(QuantizationArgs args, bool moving_average,
                              double averaging_constant, bool attention)
      : args_(std::move(args)),
        moving_average_(moving_average),
        averaging_constant_(averaging_constant),
        attention_(attention) {}
  static absl::StatusOr<ActivationObserver> Make(const QuantizationArgs& args,
                                                 bool attention);

  QuantizationArgs args_;
  bool moving_average_;
  double averaging_constant_;
  bool attention_;  // Keys or values of an attention (FlattenAttention).
  MinMax stats_;
};

// An error for a resolved compressed-tensors scheme tracecut cannot run:
// output activations (Unimplemented), static input activations no observer
// calibrates (InvalidArgument; per tensor and NVFP4's "local" global scale
// are calibrated). Dynamic activations (W8A8, FP8_DYNAMIC, FP8_BLOCK,
// MXFP4) are recorded, not calibrated.
absl::Status CheckTypedSchemeRuns(const QuantizationScheme& s);

}  // namespace tracecut::quantization

#endif  // TRACECUT_QUANTIZATION_OBSERVERS_H_
