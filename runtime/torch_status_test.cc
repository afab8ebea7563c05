#include "runtime/torch_status.h"

#include <c10/util/Logging.h>
#include <torch/jit.h>
#include <torch/script.h>

#include <new>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tracecut::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(TorchCallTest, PassesValuesThrough) {
  absl::StatusOr<int> v = TorchCall("ctx", [] { return 3; });
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
  absl::Status s = TorchCall("ctx", [] {});
  EXPECT_TRUE(s.ok());
}

TEST(TorchCallTest, PassesStatusesThrough) {
  absl::Status s = TorchCall("ctx", [] { return absl::NotFoundError("mine"); });
  EXPECT_EQ(s, absl::NotFoundError("mine"));
  absl::StatusOr<int> v = TorchCall(
      "ctx", []() -> absl::StatusOr<int> { return absl::AbortedError("x"); });
  EXPECT_EQ(v.status(), absl::AbortedError("x"));
}

TEST(TorchCallTest, ConvertsTorchCheckWithoutBacktrace) {
  absl::Status s = TorchCall("loading m.pt", [] {
    TORCH_CHECK(false, "bad thing happened\nsecond line");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "loading m.pt: bad thing happened");
  auto full = s.GetPayload(kTorchMessagePayload);
  ASSERT_TRUE(full.has_value());
  EXPECT_THAT(std::string(*full), HasSubstr("second line"));
  EXPECT_THAT(std::string(*full), Not(HasSubstr("frame #")));
}

TEST(TorchCallTest, MapsErrorKindsToCodes) {
  EXPECT_EQ(TorchCall("", [] { TORCH_CHECK_INDEX(false, "idx"); }).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(
      TorchCall("", [] { TORCH_CHECK_NOT_IMPLEMENTED(false, "ni"); }).code(),
      absl::StatusCode::kUnimplemented);
  EXPECT_EQ(TorchCall("", [] { throw std::bad_alloc(); }).code(),
            absl::StatusCode::kResourceExhausted);
  absl::Status unknown = TorchCall("ctx", [] { throw 42; });
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnknown);
  EXPECT_THAT(std::string(unknown.message()), StartsWith("ctx: "));
  EXPECT_EQ(TorchCall("", [] { TORCH_INTERNAL_ASSERT(false, "oops"); }).code(),
            absl::StatusCode::kInternal);
}

TEST(TorchCallTest, OutOfMemorySaysHowMuch) {
  absl::Status bad_alloc = TorchCall("cache", [] { throw std::bad_alloc(); });
  EXPECT_EQ(bad_alloc.message(), "cache: out of memory (std::bad_alloc)");
  absl::Status oom = TorchCall("mm", [] {
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "DefaultCPUAllocator: can't allocate memory: you tried "
                     "to allocate 8192000 bytes. Error code 12");
  });
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(oom.message(), "mm: out of memory: cannot allocate 7.8 MiB");
  // The CPU allocator throws a plain c10::Error.
  absl::Status cpu = TorchCall("", [] {
    CAFFE_ENFORCE_EQ(12, 0,
                     "DefaultCPUAllocator: can't allocate memory: you tried "
                     "to allocate 1024 bytes. Error code 12");
  });
  EXPECT_EQ(cpu.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cpu.message(), "out of memory: cannot allocate 1.0 KiB");
}

TEST(TorchCallTest, OperatorFailureKeepsTheMessage) {
  absl::StatusOr<at::Tensor> r = TorchCall("mm", [] {
    return torch::mm(torch::ones({2, 3}), torch::ones({4, 3}));
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "mm: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x3)");
}

TEST(TorchCallTest, TorchScriptInterpreterErrorShowsTheCause) {
  auto cu = torch::jit::compile(R"(
def f(a, b):
    return torch.mm(a, b)
)");
  absl::StatusOr<c10::IValue> r = TorchCall("running f", [&] {
    return cu->run_method("f", torch::ones({2, 3}), torch::ones({4, 3}));
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      r.status().message(),
      "running f: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x3)");
}

TEST(TorchCallTest, CompileErrorIsOneLine) {
  absl::Status s = TorchCall("compiling", [] {
    torch::jit::compile("def f(a):\n    return a.no_such_method()\n");
  });
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), StartsWith("compiling: "));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("\n")));
}

TEST(TorchErrorSummaryTest, UsesLastErrorLineOfInterpreterMessages) {
  std::runtime_error e(
      "The following operation failed in the TorchScript interpreter.\n"
      "Traceback of TorchScript (most recent call last):\n"
      "  File \"<string>\", line 3, in f\n"
      "RuntimeError: outer: the: real cause\n");
  EXPECT_EQ(TorchErrorSummary(e), "outer: the: real cause");
}

}  // namespace
}  // namespace tracecut::runtime
