// libFuzzer target for torch.export archives (tracer/export/pt2_archive.h,
// through tracer::LoadModel): any bytes in a .pt2 load or fail with a
// Status naming the file, never a crash or an escaping exception, and no
// member is inflated past the archive's size (plus the allowance) before it
// is refused. LoadModel reads a path, so each input is written to a
// temporary file first. Seeds: a small exported program and its crafted
// variants (gen_hostile_seeds.py). Run as
// //tests/fuzz:pt2_archive_fuzzer_smoke_test.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tracer/load.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "pt2_archive_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

const std::string& TempPath() {
  static const std::string* path = [] {
    const char* dir = std::getenv("TEST_TMPDIR");
    return new std::string(absl::StrCat(dir != nullptr ? dir : "/tmp",
                                        "/pt2_archive_fuzzer_", ::getpid(),
                                        ".pt2"));
  }();
  return *path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = TempPath();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data),
              static_cast<std::streamsize>(size));
  }
  absl::StatusOr<tracecut::tracer::LoadedModel> model;
  try {
    model = tracecut::tracer::LoadModel(path);
  } catch (const std::exception& e) {
    Fail("LoadModel threw", e.what());
  }
  if (!model.ok() &&
      model.status().message().find(path) == absl::string_view::npos) {
    Fail("load error does not name the file", model.status().ToString());
  }
  return 0;
}
