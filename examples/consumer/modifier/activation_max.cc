#include "modifier/activation_max.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace consumer {

using tracecut::modifiers::ModuleCall;
using tracecut::modifiers::RunContext;
using tracecut::modifiers::SubgraphInfo;

absl::Status ActivationMax::OnSubgraphStart(RunContext& ctx,
                                            const SubgraphInfo& subgraph) {
  Layer layer;
  layer.subgraph = subgraph.index;
  layer.label = subgraph.label;
  layers_.push_back(std::move(layer));
  return absl::OkStatus();
}

absl::Status ActivationMax::OnModuleCall(RunContext& ctx,
                                         const ModuleCall& call) {
  if (layers_.empty() || call.output == nullptr || !call.output->isTensor()) {
    return absl::OkStatus();
  }
  const at::Tensor& out = call.output->toTensor();
  if (out.numel() == 0 || !out.is_floating_point()) return absl::OkStatus();
  const double max_abs = out.abs().max().item<double>();
  Layer& layer = layers_.back();
  double& module_max = layer.modules[std::string(call.path)];
  module_max = std::max(module_max, max_abs);
  layer.max_abs = std::max(layer.max_abs, max_abs);
  ++layer.calls;
  return absl::OkStatus();
}

absl::Status ActivationMax::OnSubgraphEnd(RunContext& ctx,
                                          const SubgraphInfo& subgraph) {
  if (layers_.empty()) return absl::OkStatus();
  const Layer& layer = layers_.back();
  for (const auto& [path, max_abs] : layer.modules) {
    tracecut::modifiers::ModuleRecord& record = ctx.results().Module(path);
    if (record.type.empty()) {
      const tracecut::modifiers::LeafModule* leaf = ctx.FindLeaf(path);
      if (leaf != nullptr) record.type = leaf->type;
      record.subgraph = subgraph.index;
    }
    record.notes.push_back(absl::StrFormat(
        "max |output| %.4g (%s: %.4g)", max_abs, layer.label, layer.max_abs));
  }
  return absl::OkStatus();
}

std::string ActivationMax::ToJson() const {
  std::vector<std::string> layers;
  for (const Layer& layer : layers_) {
    if (layer.calls == 0) continue;
    std::vector<std::string> modules;
    for (const auto& [path, max_abs] : layer.modules) {
      modules.push_back(absl::StrFormat("        \"%s\": %.9g", path, max_abs));
    }
    layers.push_back(absl::StrFormat(
        "    {\n      \"subgraph\": %d,\n      \"label\": \"%s\",\n"
        "      \"max_abs\": %.9g,\n      \"calls\": %d,\n"
        "      \"modules\": {\n%s\n      }\n    }",
        layer.subgraph, layer.label, layer.max_abs, layer.calls,
        absl::StrJoin(modules, ",\n")));
  }
  return absl::StrCat("{\n  \"layers\": [\n", absl::StrJoin(layers, ",\n"),
                      "\n  ]\n}\n");
}

std::unique_ptr<tracecut::modifiers::Modifier> MakeActivationMax() {
  return std::make_unique<ActivationMax>();
}

}  // namespace consumer
