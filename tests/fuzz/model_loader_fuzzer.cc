// libFuzzer target for the model loader boundary (tracer/load.h): any bytes
// in a .pt file must load or fail with a Status naming the file, never a
// crash or an escaping c10::Error; whatever loads is traced (tracer.h) with
// its embedded example inputs, which again must succeed or fail with a
// Status. LoadModel reads a path, so each input is written to a temporary
// file first. Run as //tests/fuzz:model_loader_fuzzer_smoke_test.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tracer/load.h"
#include "tracer/tracer.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "model_loader_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

const std::string& TempPath() {
  static const std::string* path = [] {
    const char* dir = std::getenv("TEST_TMPDIR");
    return new std::string(absl::StrCat(dir != nullptr ? dir : "/tmp",
                                        "/model_loader_fuzzer_", ::getpid(),
                                        ".pt"));
  }();
  return *path;
}

void Check(const std::string& path) {
  absl::StatusOr<tracecut::tracer::LoadedModel> model;
  try {
    model = tracecut::tracer::LoadModel(path);
  } catch (const std::exception& e) {
    Fail("LoadModel threw", e.what());
  }
  if (!model.ok()) {
    if (model.status().message().find(path) == absl::string_view::npos) {
      Fail("load error does not name the file", model.status().ToString());
    }
    return;
  }
  try {
    auto options = tracecut::tracer::WithModelFiles(
        *model, tracecut::tracer::TraceOptions());
    if (!options.ok()) return;
    // Mutated input specs may ask for huge example tensors; keep the
    // shadow execution small.
    for (const auto& spec : options->input_specs) {
      int64_t numel = 1;
      for (int64_t d : spec.shape) {
        if (d < 0 || d > 4096 || (numel *= (d == 0 ? 1 : d)) > (1 << 20)) {
          return;
        }
      }
    }
    (void)tracecut::tracer::Trace(model->module, *options);
  } catch (const std::exception& e) {
    Fail("tracing a loaded model threw", e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = TempPath();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data),
              static_cast<std::streamsize>(size));
    if (!out) Fail("cannot write the temporary model file", path);
  }
  Check(path);
  ::unlink(path.c_str());
  return 0;
}
