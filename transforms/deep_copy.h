#ifndef TRACECUT_TRANSFORMS_DEEP_COPY_H_
#define TRACECUT_TRANSFORMS_DEEP_COPY_H_

// deep-copy: replaces the GraphModule with a deep copy of itself
// (GraphModule::Clone: graph, module objects, types and tensors), so later
// passes cannot affect anything the input shared (Optimum's DeepCopy).
// PassPipeline::Apply already runs on a clone; this pass is for pipelines run
// in place with Run. Reverse copies again. Reports "unchanged": the copy
// computes the same thing and has the same graph.

#include "transforms/transformation.h"

namespace tracecut::transforms {

class DeepCopy : public ReversibleTransformation {
 public:
  static constexpr absl::string_view kName = "deep-copy";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;
  absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) override {
    return Run(gm);
  }
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_DEEP_COPY_H_
