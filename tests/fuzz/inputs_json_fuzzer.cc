// libFuzzer target for tracecut_inputs.json (tracer/hf/inputs.h), which an
// archive embeds and every subcommand turns into tensors: any text parses
// or fails with a Status naming the source; what parses asks for at most
// 2^26 elements in all (so making the example inputs cannot exhaust
// memory), with known dtypes and kinds and non-negative dimensions. Run as
// //tests/fuzz:inputs_json_fuzzer_smoke_test.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tracer/hf/inputs.h"

namespace {

constexpr absl::string_view kSource = "fuzz.pt2:tracecut_inputs.json";

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "inputs_json_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tracecut::tracer::hf::InputsFile> file =
      tracecut::tracer::hf::ParseInputsJson(text, kSource);
  if (!file.ok()) {
    if (!absl::StrContains(file.status().message(), kSource)) {
      Fail("error does not name the source", file.status().ToString());
    }
    return 0;
  }
  unsigned __int128 total = 0;
  for (const auto& spec : file->inputs) {
    if (!tracecut::tracer::hf::IsKnownDType(spec.dtype)) {
      Fail("unknown dtype accepted", spec.dtype);
    }
    // Saturating: a zero dimension anywhere makes it empty.
    unsigned __int128 numel = 1;
    for (int64_t d : spec.shape) {
      if (d < 0) Fail("negative dimension accepted", spec.name);
      numel = std::min<unsigned __int128>(numel * static_cast<uint64_t>(d),
                                          uint64_t{1} << 40);
    }
    total += numel;
  }
  if (total > (uint64_t{1} << 26)) {
    Fail("accepted inputs of more than 2^26 elements", "");
  }
  return 0;
}
