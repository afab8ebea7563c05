#include "transforms/registry.h"

#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "transforms/change_truediv_to_mul_by_inverse.h"
#include "transforms/deep_copy.h"
#include "transforms/eliminate_dead_code.h"
#include "transforms/fold_constants.h"
#include "transforms/fuse_batchnorm1d_in_linear.h"
#include "transforms/fuse_batchnorm2d_in_conv2d.h"
#include "transforms/fuse_bias_in_linear.h"
#include "transforms/gelu_tanh_approx.h"
#include "transforms/lint_and_recompile.h"
#include "transforms/merge_linears.h"

namespace tracecut::transforms {
namespace {

using Factory = std::function<std::unique_ptr<Transformation>()>;

template <typename T, typename... Args>
Factory Make(Args... args) {
  return [=] { return std::make_unique<T>(args...); };
}

const std::map<std::string, Factory>& Registry() {
  static const auto* registry = new std::map<std::string, Factory>{
      {std::string(ChangeTrueDivToMulByInverse::kName),
       Make<ChangeTrueDivToMulByInverse>(false)},
      {absl::StrCat(ChangeTrueDivToMulByInverse::kName, "-inexact"),
       Make<ChangeTrueDivToMulByInverse>(true)},
      {std::string(DeepCopy::kName), Make<DeepCopy>()},
      {std::string(EliminateDeadCode::kName), Make<EliminateDeadCode>(true)},
      {std::string(FoldConstants::kName),
       Make<FoldConstants>(FoldConstantsOptions())},
      {std::string(FuseBatchNorm1dInLinear::kName),
       Make<FuseBatchNorm1dInLinear>()},
      {std::string(FuseBatchNorm2dInConv2d::kName),
       Make<FuseBatchNorm2dInConv2d>()},
      {std::string(FuseBiasInLinear::kName), Make<FuseBiasInLinear>()},
      {std::string(GeluTanhApprox::kName), Make<GeluTanhApprox>()},
      {std::string(LintAndRecompile::kName), Make<LintAndRecompile>()},
      {std::string(MergeLinears::kName), Make<MergeLinears>()},
  };
  return *registry;
}

}  // namespace

std::vector<std::string> RegisteredPassNames() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : Registry()) names.push_back(name);
  return names;
}

absl::StatusOr<std::unique_ptr<Transformation>> MakePass(
    absl::string_view name) {
  auto it = Registry().find(std::string(name));
  if (it == Registry().end()) {
    return absl::NotFoundError(absl::StrCat(
        "unknown pass '", name,
        "'; known passes: ", absl::StrJoin(RegisteredPassNames(), ", ")));
  }
  return it->second();
}

absl::StatusOr<std::unique_ptr<PassPipeline>> MakePassPipeline(
    absl::string_view names, PassPipelineOptions options) {
  auto pipeline =
      std::make_unique<PassPipeline>("pipeline", std::move(options));
  for (absl::string_view raw : absl::StrSplit(names, ',')) {
    absl::string_view name = absl::StripAsciiWhitespace(raw);
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty pass name in '", names, "'"));
    }
    absl::StatusOr<std::unique_ptr<Transformation>> pass = MakePass(name);
    if (!pass.ok()) return pass.status();
    pipeline->AddPass(*std::move(pass));
  }
  return pipeline;
}

}  // namespace tracecut::transforms
