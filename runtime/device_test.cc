#include "runtime/device.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "util/testing/status_matchers.h"

namespace tracecut::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using util::testing::StatusIs;

TEST(DeviceTest, ParsesCpuAndRefusesNonsense) {
  ASSERT_OK_AND_ASSIGN(c10::Device cpu, ResolveDevice("cpu"));
  EXPECT_TRUE(cpu.is_cpu());
  EXPECT_EQ(DeviceName(cpu), "cpu");
  EXPECT_THAT(ResolveDevice("gpu").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected cpu, cuda, cuda:N or auto")));
  for (const char* bad : {"cuda:", "cuda:x", "cuda:-1", "cuda0"}) {
    EXPECT_THAT(ResolveDevice(bad).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("expected cuda or cuda:N")))
        << bad;
  }
}

// CI has no GPU: there `cuda` is one error naming what is missing and
// `auto` is the CPU. Where a GPU is visible both resolve to it.
TEST(DeviceTest, CudaIsAUsableGpuOrOneClearError) {
  absl::Status backend = LoadCudaBackend();
  absl::StatusOr<c10::Device> cuda = ResolveDevice("cuda");
  ASSERT_OK_AND_ASSIGN(c10::Device automatic, ResolveDevice("auto"));
  if (backend.ok()) {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_TRUE(cuda->is_cuda());
    EXPECT_EQ(cuda->index(), 0);
    EXPECT_EQ(automatic, *cuda);
    EXPECT_THAT(
        ResolveDevice("cuda:127").status(),
        StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("visible")));
    ASSERT_OK_AND_ASSIGN(int64_t peak, DevicePeakBytes(*cuda));
    EXPECT_GE(peak, 0);
  } else {
    EXPECT_THAT(cuda.status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        StartsWith("--device=cuda: CUDA: ")));
    EXPECT_THAT(std::string(cuda.status().message()),
                HasSubstr(std::string(backend.message())));
    EXPECT_TRUE(automatic.is_cpu());
    // The same answer every time: the backend is looked at once.
    EXPECT_EQ(LoadCudaBackend(), backend);
  }
}

TEST(DeviceTest, ToDeviceWalksContainersAndKeepsTensorsInPlace) {
  at::Tensor a = at::arange(4, at::kFloat);
  at::Tensor b = at::ones({2, 2});
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  dict.insert("b", b);
  c10::IValue nested = c10::ivalue::Tuple::create(
      {a, c10::List<at::Tensor>({a, b}), dict, c10::IValue(int64_t{7})});
  c10::IValue moved = ToDevice(nested, c10::Device(c10::kCPU));
  const auto& e = moved.toTupleRef().elements();
  ASSERT_EQ(e.size(), 4u);
  // Already on the device: the same tensors, not copies.
  EXPECT_TRUE(e[0].toTensor().is_same(a));
  std::vector<at::Tensor> list = e[1].toTensorVector();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_TRUE(list[1].is_same(b));
  EXPECT_TRUE(e[2].toGenericDict().at("b").toTensor().is_same(b));
  EXPECT_EQ(e[3].toInt(), 7);
  ASSERT_OK_AND_ASSIGN(int64_t peak, DevicePeakBytes(c10::Device(c10::kCPU)));
  EXPECT_EQ(peak, 0);
}

}  // namespace
}  // namespace tracecut::runtime
