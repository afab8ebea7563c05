// libFuzzer target for what a downloaded checkpoint controls before any
// tensor is read: the safetensors header (checkpoint/safetensors_header.h)
// and the file names of an index's weight_map (checkpoint/closed_dir.h).
// The first byte picks which:
//   even: the rest is a safetensors file. It parses or fails with a Status
//         naming the file; what parses has tensors that tile the data
//         section exactly, in known dtypes, with shape x dtype = bytes.
//   odd:  the rest is a model.safetensors.index.json. Every weight_map value
//         (and the rest itself, as one name) resolves, if at all, to a
//         regular file inside the fixture checkpoint directory, whose
//         neighbours (a secret next to it, links out, a FIFO, a directory)
//         are never the answer.
// Run as //tests/fuzz:safetensors_fuzzer_smoke_test, or with libFuzzer via
// FUZZ_TARGET=safetensors tests/fuzz/run_libfuzzer.sh.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/closed_dir.h"
#include "checkpoint/safetensors_header.h"
#include "util/path_guard.h"

namespace {

namespace fs = std::filesystem;
using ::tracecut::checkpoint::ClosedDir;
using ::tracecut::checkpoint::ParseSafetensorsHeader;
using ::tracecut::checkpoint::SafetensorsDTypeBits;
using ::tracecut::checkpoint::SafetensorsHeader;

constexpr absl::string_view kName = "fuzz.safetensors";

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "safetensors_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void CheckHeader(absl::string_view file) {
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(file, kName);
  if (!h.ok()) {
    if (!absl::StartsWith(h.status().message(), kName) ||
        h.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("error is not InvalidArgument naming the file",
           h.status().ToString());
    }
    return;
  }
  if (h->data_start < 8 || h->data_start > file.size()) {
    Fail("data_start outside the file", absl::StrCat(h->data_start));
  }
  const uint64_t data_size = file.size() - h->data_start;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, e] : h->tensors) {
    const int bits = SafetensorsDTypeBits(e.dtype);
    if (bits == 0) Fail("unknown dtype accepted", e.dtype);
    // Saturating: a zero dimension anywhere makes it empty.
    unsigned __int128 bytes = bits / 8;
    for (int64_t d : e.shape) {
      if (d < 0) Fail("negative dimension accepted", name);
      bytes =
          std::min<unsigned __int128>(bytes * static_cast<uint64_t>(d),
                                      static_cast<unsigned __int128>(1) << 80);
    }
    if (e.end < e.begin || e.end > data_size ||
        bytes != static_cast<unsigned __int128>(e.end - e.begin)) {
      Fail("tensor range or size wrong", name);
    }
    ranges.emplace_back(e.begin, e.end);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t cursor = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != cursor) Fail("ranges overlap or leave a gap", "");
    cursor = end;
  }
  if (cursor != data_size) Fail("data section not covered exactly", "");
}

// A checkpoint directory with hostile neighbours, made once.
struct Fixture {
  std::string base, dir;
  std::vector<std::string> inside;  // Real paths that may be answers.
};

const Fixture& GetFixture() {
  static const Fixture* f = [] {
    auto* f = new Fixture;
    const char* tmp = std::getenv("TEST_TMPDIR");
    f->base = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                           "/safetensors_fuzzer_", ::getpid());
    f->dir = f->base + "/ckpt";
    fs::remove_all(f->base);
    fs::create_directories(f->dir + "/sub");
    std::ofstream(f->dir + "/model.safetensors") << "w";
    std::ofstream(f->dir + "/sub/part.safetensors") << "w";
    std::ofstream(f->base + "/secret") << "s";
    fs::create_symlink(f->base + "/secret", f->dir + "/out_link");
    fs::create_symlink("sub/part.safetensors", f->dir + "/in_link");
    fs::create_directory_symlink(f->base, f->dir + "/up");
    ::mkfifo((f->dir + "/fifo").c_str(), 0600);
    for (const char* p : {"/model.safetensors", "/sub/part.safetensors"}) {
      f->inside.push_back(fs::canonical(f->dir + p).string());
    }
    return f;
  }();
  return *f;
}

void CheckName(const ClosedDir& dir, const std::string& name) {
  absl::StatusOr<std::string> real = dir.Resolve(name, "fuzz entry");
  if (!real.ok()) {
    if (!absl::StartsWith(real.status().message(), "fuzz entry")) {
      Fail("resolve error does not start with the entry",
           real.status().ToString());
    }
    return;
  }
  const std::vector<std::string>& inside = GetFixture().inside;
  if (std::find(inside.begin(), inside.end(), *real) == inside.end()) {
    Fail("resolved to a file that is not a regular file inside",
         absl::StrCat("'", name, "' -> '", *real, "'"));
  }
}

void CheckIndex(absl::string_view text) {
  static const ClosedDir* dir = [] {
    absl::StatusOr<ClosedDir> d = ClosedDir::Open(GetFixture().dir);
    if (!d.ok()) Fail("fixture", d.status().ToString());
    return new ClosedDir(*std::move(d));
  }();
  CheckName(*dir, std::string(text.substr(0, 256)));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object()) {
    return;
  }
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (file.is_string()) CheckName(*dir, file.get<std::string>());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  if (data[0] % 2 == 0) {
    CheckHeader(rest);
  } else {
    CheckIndex(rest);
  }
  return 0;
}
