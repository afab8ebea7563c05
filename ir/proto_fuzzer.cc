// libFuzzer target for the binary graph form: any bytes must deserialize or
// fail cleanly; whatever loads must serialize and load back identically, and
// print to text that parses to the same graph (the two formats hold the
// same graphs). Run as //ir:proto_fuzzer_smoke_test.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "ir/proto.h"
#include "ir/text.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "proto_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void Check(absl::string_view input, bool verify) {
  tracecut::ir::FromProtoOptions options;
  options.verify = verify;
  auto graph = tracecut::ir::DeserializeGraph(input, options);
  if (!graph.ok()) return;
  auto bytes = tracecut::ir::SerializeGraph(**graph);
  if (!bytes.ok()) Fail("cannot serialize", bytes.status().ToString());
  auto again = tracecut::ir::DeserializeGraph(*bytes, options);
  if (!again.ok())
    Fail("serialized graph does not load", again.status().ToString());
  if (!tracecut::ir::StructurallyEqual(**graph, **again)) {
    Fail("reloaded graph differs", tracecut::ir::PrintGraph(**graph));
  }
  if (*tracecut::ir::SerializeGraph(**again) != *bytes) {
    Fail("serialization is not stable", tracecut::ir::PrintGraph(**graph));
  }
  tracecut::ir::ParseOptions text_options;
  text_options.verify = verify;
  std::string text = tracecut::ir::PrintGraph(**graph);
  auto parsed = tracecut::ir::ParseGraph(text, text_options);
  if (!parsed.ok()) {
    Fail("text of a loaded graph does not parse",
         parsed.status().ToString() + "\n" + text);
  }
  if (!tracecut::ir::StructurallyEqual(**graph, **parsed)) {
    Fail("text of a loaded graph parses to another graph", text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  Check(input, /*verify=*/true);
  Check(input, /*verify=*/false);
  return 0;
}
