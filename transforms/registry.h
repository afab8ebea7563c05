#ifndef TRACECUT_TRANSFORMS_REGISTRY_H_
#define TRACECUT_TRANSFORMS_REGISTRY_H_

// Passes by name, for command lines and recipes
// (`tracecut transform --passes=merge-linears,fuse-batchnorm2d-in-conv2d`).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<PassPipeline> p,
//                    MakePassPipeline("change-truediv-to-mul-by-inverse,"
//                                 "merge-linears"));
//
// Every pass of transforms/ is here with its default options, plus
// "change-truediv-to-mul-by-inverse-inexact" (allow_inexact = true).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transforms/pass_pipeline.h"
#include "transforms/transformation.h"

namespace tracecut::transforms {

// Registered names, sorted.
std::vector<std::string> RegisteredPassNames();

// A new instance of the pass called `name`; NOT_FOUND lists the names.
absl::StatusOr<std::unique_ptr<Transformation>> MakePass(
    absl::string_view name);

// A pipeline of the comma-separated passes in `names` (spaces ignored, empty
// entries rejected).
absl::StatusOr<std::unique_ptr<PassPipeline>> MakePassPipeline(
    absl::string_view names, PassPipelineOptions options = {});

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_REGISTRY_H_
