// libFuzzer target for calibration recipes (pipelines/recipe.h): any text
// must parse and validate or fail with a Status naming the source; a recipe
// that loads must validate again on its own, print to text that loads to
// the same recipe, and convert (ToGptqOptions, ToQuantScheme). The bytes
// are also read as a binary Recipe for ValidateRecipe, which then sees
// values the text parser would reject first. Every 16th input goes through
// LoadRecipe from a file too. Run as //tests/fuzz:recipe_fuzzer_smoke_test.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "modifiers/gptq_modifier.h"
#include "modifiers/recipe_config.h"
#include "pipelines/recipe.h"
#include "pipelines/recipe.pb.h"

namespace {

namespace recipe = ::tracecut::recipe;
using ::tracecut::pipelines::LoadRecipe;
using ::tracecut::pipelines::ParseRecipe;
using ::tracecut::pipelines::ValidateRecipe;

constexpr absl::string_view kSource = "fuzz.textproto";

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "recipe_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void CheckError(const absl::Status& s, absl::string_view source) {
  if (s.ok()) return;
  if (!absl::StartsWith(s.message(), source)) {
    Fail("error does not start with the source name", s.ToString());
  }
}

void CheckValid(const recipe::Recipe& r) {
  absl::Status again = ValidateRecipe(r, kSource);
  if (!again.ok()) {
    Fail("a parsed recipe fails ValidateRecipe", again.ToString());
  }
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(r, &text)) {
    Fail("cannot print a parsed recipe", r.ShortDebugString());
  }
  auto reparsed = ParseRecipe(text, kSource);
  if (!reparsed.ok()) {
    Fail("printed recipe does not parse",
         reparsed.status().ToString() + "\n" + text);
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(r, *reparsed)) {
    Fail("printed recipe parses to another recipe", text);
  }
  for (const recipe::Modifier& m : r.modifiers()) {
    if (m.has_gptq()) (void)tracecut::modifiers::ToGptqOptions(m.gptq());
    if (m.has_rtn()) (void)tracecut::modifiers::ToQuantScheme(m.rtn().scheme());
    if (m.has_observer()) {
      (void)tracecut::modifiers::ToQuantScheme(m.observer().scheme());
    }
  }
}

// LoadRecipe from a file holding `input`: the same answer as ParseRecipe.
void CheckLoad(absl::string_view input, bool parsed_ok) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp",
                                  "/recipe_fuzzer_", ::getpid(), ".textproto");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(input.data(), static_cast<std::streamsize>(input.size()));
    if (!out) return;  // No room for the file: nothing to check.
  }
  auto loaded = LoadRecipe(path);
  ::unlink(path.c_str());
  CheckError(loaded.status(), path);
  if (loaded.ok() != parsed_ok) {
    Fail("LoadRecipe and ParseRecipe disagree", loaded.status().ToString());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Invalid UTF-8 in binary string fields is an expected parse failure;
  // protobuf's log line for each would drown the output.
  static const bool kQuiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)kQuiet;
  static uint64_t calls = 0;
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  auto r = ParseRecipe(input, kSource);
  CheckError(r.status(), kSource);
  if (r.ok()) CheckValid(*r);
  if (calls++ % 16 == 0) CheckLoad(input, r.ok());

  recipe::Recipe binary;
  if (binary.ParseFromArray(data, static_cast<int>(size))) {
    // Unknown fields would print as numbers the text parser rejects.
    binary.DiscardUnknownFields();
    absl::Status s = ValidateRecipe(binary, kSource);
    CheckError(s, kSource);
    if (s.ok()) CheckValid(binary);
  }
  return 0;
}
