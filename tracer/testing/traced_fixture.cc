#include "tracer/testing/traced_fixture.h"

#include <gtest/gtest.h>

#include <utility>

#include "absl/status/statusor.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "util/testing/runfiles.h"

namespace tracecut::tracer::testing {

TracedFixture TraceFixture(const std::string& runfile) {
  absl::StatusOr<LoadedModel> model =
      LoadModel(util::testing::Runfile(runfile));
  if (!model.ok()) ADD_FAILURE() << model.status();
  absl::StatusOr<TraceOptions> options = WithModelFiles(*model, TraceOptions());
  if (!options.ok()) ADD_FAILURE() << options.status();
  absl::StatusOr<runtime::GraphModule> gm = Trace(model->module, *options);
  if (!gm.ok()) ADD_FAILURE() << gm.status();
  auto inputs = ResolveExampleInputs(model->module, *options);
  if (!inputs.ok()) ADD_FAILURE() << inputs.status();
  gm->mutable_extra_files() = model->extra_files;
  if (model->config.has_value()) {
    gm->mutable_extra_files()["config.json"] = model->config->text();
  }
  return {model->module, std::move(gm).value(), inputs->values};
}

}  // namespace tracecut::tracer::testing
