// libFuzzer target for the IR text parser: any input must parse or fail
// cleanly, and whatever parses must print and re-parse exactly.
//
// Built two ways: as //ir:text_fuzzer_smoke_test with the deterministic
// driver in ir/internal/fuzz_driver.cc, and with clang's libFuzzer by
// ir/run_libfuzzer.sh.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "ir/text.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& a,
                       const std::string& b) {
  std::fprintf(stderr, "text_fuzzer: %s\n--- first:\n%s\n--- second:\n%s\n",
               what, a.c_str(), b.c_str());
  std::abort();
}

void CheckRoundTrip(absl::string_view input, bool verify) {
  tracecut::ir::ParseOptions options;
  options.verify = verify;
  auto parsed = tracecut::ir::ParseGraph(input, options);
  if (!parsed.ok()) {
    // Errors must say where.
    if (parsed.status().message().find("line ") != 0) {
      Fail("parse error without a position",
           std::string(parsed.status().message()), std::string(input));
    }
    return;
  }
  std::string printed = tracecut::ir::PrintGraph(**parsed);
  auto reparsed = tracecut::ir::ParseGraph(printed, options);
  if (!reparsed.ok()) {
    Fail("printed graph does not parse", printed,
         std::string(reparsed.status().message()));
  }
  std::string reprinted = tracecut::ir::PrintGraph(**reparsed);
  if (reprinted != printed) Fail("print is not stable", printed, reprinted);
  if (!tracecut::ir::StructurallyEqual(**parsed, **reparsed)) {
    Fail("re-parsed graph differs", printed, reprinted);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  CheckRoundTrip(input, /*verify=*/true);
  CheckRoundTrip(input, /*verify=*/false);
  return 0;
}
