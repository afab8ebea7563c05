#ifndef TRACECUT_RUNTIME_DEVICE_H_
#define TRACECUT_RUNTIME_DEVICE_H_

// Where tensors are computed: `--device=cpu|cuda|cuda:N|auto`.
//
//   ASSIGN_OR_RETURN(c10::Device device, runtime::ResolveDevice("auto"));
//   c10::IValue on_device = runtime::ToDevice(batch_input, device);
//
// tracecut links only libtorch_cpu (a test binary that loaded the CUDA
// libraries would pay for it at every start, and a CPU-only LibTorch must
// build). The CUDA backend is loaded when a CUDA device is asked for: the
// libtorch_cuda.so beside the libtorch_cpu.so this process runs with,
// loaded before anything asks LibTorch about CUDA (its hooks are looked up
// once, on first use). Without that library, a driver or a GPU, asking for
// CUDA is one error saying which of them is missing.

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::runtime {

// Parses and checks a device: "cpu"; "cuda" or "cuda:N" (loads the CUDA
// backend; an error without a usable GPU N); "auto" (cuda:0 when one is
// usable, else cpu).
absl::StatusOr<c10::Device> ResolveDevice(absl::string_view spec);

// Loads the CUDA backend (see above). Ok when CUDA devices are usable;
// otherwise the reason. Idempotent.
absl::Status LoadCudaBackend();

// "cpu", "cuda:0".
std::string DeviceName(c10::Device device);

// `value` with every tensor in it (through tuples, lists and dicts) on
// `device`; tensors already there are not copied, other values are kept.
c10::IValue ToDevice(const c10::IValue& value, c10::Device device);

// ToDevice of each value; a LibTorch error (out of device memory) as a
// Status.
absl::StatusOr<std::vector<c10::IValue>> ValuesToDevice(
    const std::vector<c10::IValue>& values, c10::Device device);

// The most bytes LibTorch's caching allocator held for tensors on a CUDA
// `device` since the process started; 0 for the CPU.
absl::StatusOr<int64_t> DevicePeakBytes(c10::Device device);

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_DEVICE_H_
