#ifndef TRACECUT_MODIFIERS_OBSERVER_MODIFIER_H_
#define TRACECUT_MODIFIERS_OBSERVER_MODIFIER_H_

// Observers: modifiers that watch a tensor of selected leaf modules during
// calibration and turn the range they saw into quantization parameters.
// They never change weights.
//
//   ObserverOptions options;
//   options.kind = ObserverKind::kMovingAverageMinMax;
//   options.scheme.bits = 8;
//   modifiers.push_back(std::make_unique<Observer>(options));
//
// What is observed:
//  * input / output activations (the module's first forward argument, or
//    its output tensor): per-tensor parameters, saved as the module's
//    `input_scale` / `input_zero_point` (or `output_...`) buffers.
//      min-max: the min and max over every calibration batch;
//      moving-average min-max: the first batch sets the range, each later
//        batch moves it towards its own min and max by `averaging_constant`
//        (torch.ao's MovingAverageMinMaxObserver, llm-compressor's default
//        for static activations).
//    Batches are seen in calibration order, so every pipeline gives the
//    same parameters when it computes the same activations.
//  * the weight: min-max parameters of the module's 2-D weight under the
//    scheme (per tensor, channel or group), taken at the end of the
//    module's subgraph (after earlier modifiers compressed it), recorded as
//    its weight parameters unless a quantizer recorded them already.
//
// Parameters follow Note [Quantization convention] in quantize.h. An
// activation with NaN or infinite entries is an error naming the module and
// the batch.

#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "modifiers/modifier.h"
#include "quantization/quantize.h"
#include "runtime/collective.h"

namespace tracecut::modifiers {

enum class ObserverKind { kMinMax, kMovingAverageMinMax };
enum class ObservedTensor { kInput, kOutput, kWeight };

// "minmax" / "moving-average-minmax".
absl::string_view ObserverKindName(ObserverKind kind);
// "input" / "output" / "weight".
absl::string_view ObservedTensorName(ObservedTensor tensor);

struct ObserverOptions {
  ModuleSelector modules;
  ObserverKind kind = ObserverKind::kMinMax;
  ObservedTensor observe = ObservedTensor::kInput;
  // Activations are always per tensor (group_size / per_tensor ignored).
  quantization::QuantScheme scheme;
  double averaging_constant = 0.01;  // In (0, 1].
  // Data-parallel calibration (distributed.h; not owned): at the end of
  // each subgraph the ranks' ranges are combined, so every rank records the
  // same parameters. min-max: the min and max over all ranks, exactly what
  // one process sees. Moving average: the ranks' averages weighted by their
  // batch counts (a moving average depends on batch order, which a shared
  // run does not have; this is an approximation). Null or a world of one:
  // this process alone.
  runtime::Collective* collective = nullptr;
};

class Observer : public Modifier {
 public:
  explicit Observer(ObserverOptions options);

  // "minmax-input-observer", "moving-average-minmax-output-observer", ...
  std::string name() const override;
  bool WantsModule(absl::string_view path,
                   absl::string_view type) const override;
  absl::Status OnRunStart(RunContext& ctx) override;
  absl::Status OnModuleCall(RunContext& ctx, const ModuleCall& call) override;
  absl::Status OnSubgraphEnd(RunContext& ctx,
                             const SubgraphInfo& subgraph) override;
  absl::Status OnRunEnd(RunContext& ctx) override;

 private:
  ActivationRange& RangeOf(ModuleRecord& record) const;
  // Combines what the ranks saw of the subgraph's selected modules and
  // leaves in pending_ those any rank saw.
  absl::Status CombineRanks(RunContext& ctx, const SubgraphInfo& subgraph);

  ObserverOptions options_;
  std::set<std::string> selected_;
  std::set<std::string> pending_;  // Seen since the last subgraph end.
};

// The per-tensor parameters of a range [lo, hi] under `scheme` (fp32 scale
// [1], int32 zero point [1]).
absl::StatusOr<quantization::QuantParams> RangeParams(
    double lo, double hi, const quantization::QuantScheme& scheme);

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_OBSERVER_MODIFIER_H_
