#ifndef TRACECUT_CONSUMER_MODIFIER_ACTIVATION_MAX_H_
#define TRACECUT_CONSUMER_MODIFIER_ACTIVATION_MAX_H_

// A calibration modifier written outside tracecut: it records, for every
// subgraph of a sequential run (every decoder layer of a Llama), the largest
// absolute activation any of its leaf modules produced, and the largest per
// module. It changes nothing; at the end of each subgraph it adds a note
// to each module's record in the run's CalibrationResults, so the
// calibration report shows the maxima too:
//   "max |output| 0.7359 (model.layers.0: 0.7359)"
//
//   ActivationMax act_max;
//   CalibrationResults results;
//   ASSIGN_OR_RETURN(PipelineResult r,
//                    RunPipeline(gm, data, {&act_max}, results, options));
//   std::cout << act_max.ToJson();

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "modifiers/modifier.h"

namespace consumer {

class ActivationMax : public tracecut::modifiers::Modifier {
 public:
  struct Layer {
    int subgraph = 0;
    std::string label;  // "model.layers.0", "(head)".
    double max_abs = 0;
    int64_t calls = 0;
    std::map<std::string, double> modules;  // Leaf path -> max |output|.
  };

  std::string name() const override { return "activation-max"; }

  // Every leaf module whose output is a tensor.
  bool WantsModule(absl::string_view path,
                   absl::string_view type) const override {
    return true;
  }
  absl::Status OnSubgraphStart(
      tracecut::modifiers::RunContext& ctx,
      const tracecut::modifiers::SubgraphInfo& subgraph) override;
  absl::Status OnModuleCall(
      tracecut::modifiers::RunContext& ctx,
      const tracecut::modifiers::ModuleCall& call) override;
  absl::Status OnSubgraphEnd(
      tracecut::modifiers::RunContext& ctx,
      const tracecut::modifiers::SubgraphInfo& subgraph) override;

  // Subgraphs in execution order (those that called a leaf module).
  const std::vector<Layer>& layers() const { return layers_; }

  // {"layers": [{"subgraph": 1, "label": "model.layers.0", "max_abs": ...,
  //   "calls": ..., "modules": {"model.layers.0.mlp.up_proj": ...}}, ...]}
  std::string ToJson() const;

 private:
  std::vector<Layer> layers_;
};

// A new ActivationMax, for the calibrate binary of tracecut_modifier
// (modifier/BUILD).
std::unique_ptr<tracecut::modifiers::Modifier> MakeActivationMax();

}  // namespace consumer

#endif  // TRACECUT_CONSUMER_MODIFIER_ACTIVATION_MAX_H_
