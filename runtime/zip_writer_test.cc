#include "runtime/zip_writer.h"

#include <sys/resource.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::runtime {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

c10::IValue State() {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("w", torch::arange(12, torch::kFloat32).reshape({3, 4}));
  d.insert("step", int64_t{7});
  return d;
}

TEST(ZipWriterTest, PickleSaveIsTorchsPickleSave) {
  ASSERT_OK_AND_ASSIGN(std::vector<char> bytes, PickleSave(State(), "state"));
  EXPECT_EQ(bytes, torch::jit::pickle_save(State()));
  c10::IValue back = torch::jit::pickle_load(bytes);
  auto d = back.toGenericDict();
  EXPECT_TRUE(torch::equal(d.at("w").toTensor(),
                           torch::arange(12, torch::kFloat32).reshape({3, 4})));
  EXPECT_EQ(d.at("step").toInt(), 7);
}

TEST(ZipWriterTest, SaveModuleBytesLoads) {
  torch::jit::Module m("M");
  m.register_buffer("b", torch::ones({2}));
  m.define("def forward(self, x):\n  return x + self.b\n");
  ASSERT_OK_AND_ASSIGN(std::string bytes,
                       SaveModuleBytes(m, {{"note.txt", "hi"}}, "m"));
  std::istringstream in(bytes);
  torch::jit::ExtraFilesMap extra = {{"note.txt", ""}};
  torch::jit::Module back = torch::jit::load(in, torch::kCPU, extra);
  EXPECT_EQ(extra["note.txt"], "hi");
  EXPECT_TRUE(torch::equal(back.forward({torch::zeros({2})}).toTensor(),
                           torch::ones({2})));
}

// Out of memory while the archive is written: LibTorch's own pickle_save
// aborts (its writer's destructor throws during unwinding); PickleSave
// returns RESOURCE_EXHAUSTED. Run in a child under an address-space limit
// just above what it already uses.
void SaveUnderLimit(bool ours) {
  torch::Tensor big = torch::ones({64 << 20}, torch::kFloat32);  // 256 MiB.
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("big", big);
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  struct rlimit limit;
  limit.rlim_cur = limit.rlim_max =
      pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) + (96 << 20);
  ::setrlimit(RLIMIT_AS, &limit);
  if (!ours) {
    torch::jit::pickle_save(d);
    std::exit(2);  // Not reached when the limit bites.
  }
  absl::StatusOr<std::vector<char>> bytes = PickleSave(d, "big state");
  std::exit(!bytes.ok() &&
                    bytes.status().code() ==
                        absl::StatusCode::kResourceExhausted &&
                    absl::StrContains(bytes.status().message(), "big state")
                ? 0
                : 1);
}

TEST(ZipWriterDeathTest, OutOfMemoryIsAStatusNotAnAbort) {
  if (kSanitized) GTEST_SKIP() << "sanitizers reserve more than the limit";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(SaveUnderLimit(/*ours=*/true), ::testing::ExitedWithCode(0), "");
  // The failure this guards against, reproduced with LibTorch's own.
  EXPECT_EXIT(SaveUnderLimit(/*ours=*/false),
              ::testing::KilledBySignal(SIGABRT), "");
}

}  // namespace
}  // namespace tracecut::runtime
