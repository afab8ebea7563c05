#include "modifiers/testing/traced_llama.h"

#include <gtest/gtest.h>

#include <utility>

#include "tracer/load.h"
#include "tracer/tracer.h"
#include "util/testing/runfiles.h"

namespace tracecut::modifiers::testing {

runtime::GraphModule TraceLlamaFixture() {
  absl::StatusOr<tracer::LoadedModel> model =
      tracer::LoadModel(util::testing::Runfile("tests/fixtures/llama.pt"));
  if (!model.ok()) ADD_FAILURE() << model.status();
  absl::StatusOr<tracer::TraceOptions> options =
      tracer::WithModelFiles(*model, tracer::TraceOptions());
  if (!options.ok()) ADD_FAILURE() << options.status();
  absl::StatusOr<runtime::GraphModule> gm =
      tracer::Trace(model->module, *options);
  if (!gm.ok()) ADD_FAILURE() << gm.status();
  // What a calibration carries along (its config.json, as calibrate does).
  gm->mutable_extra_files() = model->extra_files;
  if (model->config.has_value()) {
    gm->mutable_extra_files()["config.json"] = model->config->text();
  }
  return std::move(gm).value();
}

SubgraphInfo WholeModel(const RunContext& ctx) {
  SubgraphInfo info;
  info.label = "(whole model)";
  for (const LeafModule& leaf : ctx.leaf_modules()) {
    info.leaf_modules.push_back(leaf.path);
  }
  return info;
}

ModuleCall CallOf(const LeafModule& leaf,
                  const std::vector<c10::IValue>& inputs, int64_t batch) {
  ModuleCall call;
  call.path = leaf.path;
  call.type = leaf.type;
  call.inputs = inputs;
  call.batch = batch;
  return call;
}

}  // namespace tracecut::modifiers::testing
