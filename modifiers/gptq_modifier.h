#ifndef TRACECUT_MODIFIERS_GPTQ_MODIFIER_H_
#define TRACECUT_MODIFIERS_GPTQ_MODIFIER_H_

// GPTQ as a calibration modifier (llm-compressor's GPTQModifier): per
// selected Linear, the Hessian of its inputs is accumulated over the
// calibration tokens of the subgraph's calibration pass, and at the end of
// the subgraph the weight is quantized column by column with error feedback
// (gptq.h) and written back fake-quantized.
//
//   GptqModifierOptions options;
//   options.weights.modules.ignore = {"lm_head"};
//   options.weights.scheme.bits = 4;
//   options.weights.scheme.group_size = 128;
//   modifiers.push_back(std::make_unique<GptqModifier>(options));
//
// Besides its own error, each module's record gets `rtn_error`: the output
// error round-to-nearest would have on the same inputs, so the report shows
// what GPTQ bought per layer (unless the run does not measure baselines:
// RunContext::measure_baselines). See WeightQuantModifier
// (weight_quant_modifier.h) for what is selected and recorded.

#include <map>
#include <string>

#include "modifiers/gptq_modifier.pb.h"
#include "modifiers/weight_quant_modifier.h"
#include "quantization/gptq.h"
#include "quantization/gptq_typed.h"

namespace tracecut::modifiers {

struct GptqModifierOptions {
  // weights.scheme (or weights.typed, whose weights.actorder applies) is
  // what GPTQ uses.
  WeightQuantOptions weights;
  double dampening_frac = 0.01;
  int64_t block_size = 128;
  bool act_order = false;
  bool static_groups = false;
};

class GptqModifier : public WeightQuantModifier {
 public:
  explicit GptqModifier(GptqModifierOptions options);
  std::string name() const override { return "gptq"; }
  bool PropagatesChanges() const override { return true; }
  absl::Status OnRunStart(RunContext& ctx) override;
  absl::Status OnSubgraphEnd(RunContext& ctx,
                             const SubgraphInfo& subgraph) override;
  absl::Status OnRunEnd(RunContext& ctx) override;

 protected:
  std::string method() const override { return "gptq"; }
  bool NeedsHessian() const override { return true; }
  absl::StatusOr<WeightQuantOutcome> QuantizeWeight(
      absl::string_view path, const at::Tensor& weight,
      const at::Tensor& hessian) override;
  // Typed channel and group schemes: Linears sharing a Hessian are stacked
  // into one weight and solved in one GPTQ pass (Note [Shared Hessians]).
  bool SolvesTogether() const override;
  absl::StatusOr<std::vector<WeightQuantOutcome>> QuantizeTogether(
      const std::vector<std::string>& paths,
      const std::vector<at::Tensor>& weights,
      const at::Tensor& hessian) override;

 private:
  // GPTQ with options().typed (quantization/gptq_typed.h): its parameters
  // are round-to-nearest's, fixed up front as llm-compressor's observer
  // gives them.
  absl::StatusOr<WeightQuantOutcome> QuantizeTypedGptq(
      absl::string_view path, const at::Tensor& weight,
      const at::Tensor& hessian);
  quantization::GptqOptions gptq_;
  // The factor of a shared Hessian (Note [Shared Hessians] in
  // weight_quant_modifier.h), by its tensor, while Linears that use it are
  // left.
  struct SharedFactor {
    at::Tensor hessian;  // Held, so that the key stays its.
    quantization::HessianFactor factor;
  };
  std::map<const c10::TensorImpl*, SharedFactor> factors_;
  bool measure_baselines_ = true;  // RunContext::measure_baselines.
};

// The activation order a GPTQ entry runs a compressed-tensors scheme with,
// as GPTQModifier.resolve_actorder: the entry's actorder when set (true is
// "weight", false none), else the scheme's own, else "static".
quantization::ActOrder ResolveActOrder(const recipe::GptqModifier& gptq,
                                       quantization::ActOrder from_scheme);

// GPTQ's solver options of an entry with tracecut's integer scheme.
quantization::GptqOptions ToGptqOptions(const recipe::GptqModifier& gptq);

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_GPTQ_MODIFIER_H_
