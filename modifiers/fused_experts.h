#ifndef TRACECUT_MODIFIERS_FUSED_EXPERTS_H_
#define TRACECUT_MODIFIERS_FUSED_EXPERTS_H_

// MoE experts that transformers 5 fuses into 3-D parameters (Mixtral's
// `mlp.experts.gate_up_proj` [experts, 2 x intermediate, hidden] and
// `down_proj` [experts, hidden, intermediate]) while its checkpoints, and
// the compressed-tensors checkpoints transformers and vLLM load, hold one
// Linear per expert and projection (`block_sparse_moe.experts.3.w1`). The
// checkpoint layout (checkpoint/layout.h) says which slice of a fused
// parameter each per-expert Linear is; this finds the experts modules of a
// model, gives the weight quantization modifiers each such Linear's inputs
// (the tokens routed to its expert) and reads and writes its weight slice,
// so the experts are quantized exactly as those Linears would be.
//
//   ASSIGN_OR_RETURN(FusedExperts experts, FusedExperts::Find(ctx, selector));
//   // In OnModuleCall, for a call of an experts module:
//   RETURN_IF_ERROR(experts.ForEachInput(ctx, call, add_input));
//
// Per expert e, the tokens routed to it (rows of the hidden states whose
// top-k expert indices hold e) are w1's and w3's inputs, and act(x w1^T) *
// (x w3^T) is w2's, with the module's own `act_fn`. The first call of each
// experts module checks that this recomputes the module's output (weighted
// by the routing weights and summed per token) within 1e-4 relative; a
// module that computes something else is an error naming it, never a
// silently wrong Hessian.

#include <ATen/core/Tensor.h>

#include <array>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/layout.h"
#include "modifiers/modifier.h"

namespace tracecut::modifiers {

// The module type a per-expert Linear is selected as.
inline constexpr char kFusedLinearType[] = "torch.nn.modules.linear.Linear";

// One expert's projection as the checkpoint stores it: a Linear whose
// weight is a slice of a fused parameter.
struct FusedLinear {
  std::string tensor;          // The fused parameter's path.
  checkpoint::Piece piece;     // piece.name: "<linear path>.weight".
  std::vector<int64_t> shape;  // The Linear's weight, [out, in].
  std::string experts;         // The experts module's path.
  int expert = 0;
  int slot = 0;  // 0: gate (w1), 1: up (w3), 2: down (w2).
};

class FusedExperts {
 public:
  // The experts modules (leaf modules of `ctx`'s model) whose fused
  // parameters the model's checkpoint layout splits into per-expert
  // Linears, with the Linears `selector` selects (matched by their
  // checkpoint path and type Linear). Fused parameters that are not a
  // gate/up and down pair per expert are left out with a warning.
  // With `all_tokens`, every expert's Linears get all the tokens of the
  // call (llm-compressor's calibrate_all_experts), not only those routed to
  // it; the module's output, and so the model's, is unchanged.
  static absl::StatusOr<FusedExperts> Find(RunContext& ctx,
                                           const ModuleSelector& selector,
                                           absl::string_view owner,
                                           bool all_tokens = false);

  bool empty() const { return linears_.empty(); }
  bool IsExperts(absl::string_view module) const {
    return modules_.contains(std::string(module));
  }
  // The selected per-expert Linears, by checkpoint path.
  const std::map<std::string, FusedLinear>& linears() const { return linears_; }
  const FusedLinear* FindLinear(absl::string_view path) const;

  // The hidden states [tokens, hidden] that `call` (of an experts module)
  // routes: every gate and up projection's input before routing.
  absl::StatusOr<at::Tensor> Hidden(RunContext& ctx,
                                    const ModuleCall& call) const;

  // Calls `add(path, x)` with the inputs [tokens, in] of every selected
  // per-expert Linear that `call` (of an experts module) routed tokens to.
  absl::Status ForEachInput(
      RunContext& ctx, const ModuleCall& call,
      const std::function<absl::Status(const std::string&, const at::Tensor&)>&
          add);

  // The weight of a per-expert Linear, [out, in] (a copy).
  absl::StatusOr<at::Tensor> Weight(RunContext& ctx,
                                    const std::string& path) const;
  // Stages `weight` as the new value of its slice; Commit writes every
  // staged fused parameter with one RunContext::UpdateTensor each.
  absl::Status StageWeight(RunContext& ctx, const std::string& path,
                           const at::Tensor& weight);
  absl::Status Commit(RunContext& ctx);

 private:
  // One experts module: per expert, the paths of its gate (w1), up (w3)
  // and down (w2) Linears.
  struct Module {
    std::string gate_up, down;
    std::vector<std::array<std::string, 3>> linears;
    std::vector<std::array<checkpoint::Piece, 3>> pieces;
    bool checked = false;
  };
  // The hidden states, the experts each token is routed to [tokens, k]
  // and their weights [tokens, k] among `call`'s inputs.
  struct Routing {
    at::Tensor hidden, index, weights;
  };
  absl::StatusOr<Routing> RoutingOf(RunContext& ctx, const ModuleCall& call,
                                    const Module& m) const;
  absl::Status Check(RunContext& ctx, const ModuleCall& call, const Module& m,
                     const at::Tensor& hidden, const at::Tensor& index,
                     const at::Tensor& weights);

  bool all_tokens_ = false;
  std::map<std::string, Module> modules_;
  std::map<std::string, FusedLinear> linears_;  // Selected ones.
  std::map<std::string, at::Tensor> staged_;    // Fused path -> new value.
};

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_FUSED_EXPERTS_H_
