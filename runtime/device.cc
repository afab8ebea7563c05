#include "runtime/device.h"

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <dlfcn.h>
#include <link.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

constexpr absl::string_view kCpuLibrary = "/libtorch_cpu.so";

// The directory of the libtorch_cpu.so this process runs with.
int FindTorchCpu(struct dl_phdr_info* info, size_t, void* data) {
  absl::string_view name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  if (!absl::EndsWith(name, kCpuLibrary)) return 0;
  name.remove_suffix(kCpuLibrary.size());
  *static_cast<std::string*>(data) = std::string(name);
  return 1;
}

absl::Status LoadOnce() {
  std::string dir;
  dl_iterate_phdr(FindTorchCpu, &dir);
  if (dir.empty()) {
    return absl::FailedPreconditionError(
        "CUDA: cannot tell where this process's libtorch_cpu.so is, so "
        "cannot load the libtorch_cuda.so beside it");
  }
  const std::string cuda = absl::StrCat(dir, "/libtorch_cuda.so");
  // RTLD_GLOBAL: its static initializers register CUDA kernels and hooks
  // with the LibTorch already loaded; nothing here is ever unloaded.
  if (dlopen(cuda.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA: this LibTorch (", dir, ") has no usable CUDA backend: ",
        why != nullptr ? why : "dlopen failed",
        " (a CPU-only LibTorch, or its CUDA libraries are missing)"));
  }
  return TorchCall("CUDA", [&]() -> absl::Status {
    const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
    if (!hooks.hasCUDA()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA: no usable GPU (LibTorch's CUDA backend from ", cuda,
          " loaded, but it sees no device: no GPU, no driver, or "
          "CUDA_VISIBLE_DEVICES hides them)"));
    }
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status LoadCudaBackend() {
  static absl::Status* loaded = new absl::Status(LoadOnce());
  return *loaded;
}

absl::StatusOr<c10::Device> ResolveDevice(absl::string_view spec) {
  if (spec == "cpu") return c10::Device(c10::kCPU);
  if (spec == "auto") {
    if (LoadCudaBackend().ok()) return c10::Device(c10::kCUDA, 0);
    return c10::Device(c10::kCPU);
  }
  absl::string_view rest = spec;
  if (!absl::ConsumePrefix(&rest, "cuda")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown device '", spec, "' (expected cpu, cuda, cuda:N or auto)"));
  }
  int index = 0;
  if (!rest.empty() &&
      (!absl::ConsumePrefix(&rest, ":") || !absl::SimpleAtoi(rest, &index) ||
       index < 0 || index > 127)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad device '", spec, "' (expected cuda or cuda:N, N >= 0)"));
  }
  if (absl::Status s = LoadCudaBackend(); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device=", spec, ": ", s.message()));
  }
  ASSIGN_OR_RETURN(
      int count, TorchCall("CUDA", [] {
        return static_cast<int>(at::detail::getCUDAHooks().getNumGPUs());
      }));
  if (index >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device=", spec, ": only ", count, " CUDA device",
                     count == 1 ? " is" : "s are", " visible"));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::string DeviceName(c10::Device device) { return device.str(); }

c10::IValue ToDevice(const c10::IValue& value, c10::Device device) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined() || t.device() == device) return value;
    return t.to(device);
  }
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    std::vector<c10::IValue> moved;
    moved.reserve(elements.size());
    for (const c10::IValue& e : elements) moved.push_back(ToDevice(e, device));
    return c10::ivalue::Tuple::create(std::move(moved));
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> moved;
    for (const at::Tensor& t : value.toTensorVector()) {
      moved.push_back(t.defined() ? t.to(device) : t);
    }
    return moved;
  }
  if (value.isList()) {
    c10::impl::GenericList list = value.toList();
    c10::impl::GenericList moved(list.elementType());
    for (const c10::IValue& e : list) moved.push_back(ToDevice(e, device));
    return moved;
  }
  if (value.isGenericDict()) {
    c10::impl::GenericDict dict = value.toGenericDict();
    c10::impl::GenericDict moved(dict.keyType(), dict.valueType());
    for (const auto& entry : dict) {
      moved.insert(entry.key(), ToDevice(entry.value(), device));
    }
    return moved;
  }
  return value;
}

absl::StatusOr<std::vector<c10::IValue>> ValuesToDevice(
    const std::vector<c10::IValue>& values, c10::Device device) {
  return TorchCall(absl::StrCat("copying values to ", DeviceName(device)), [&] {
    std::vector<c10::IValue> moved;
    moved.reserve(values.size());
    for (const c10::IValue& v : values) {
      moved.push_back(ToDevice(v, device));
    }
    return moved;
  });
}

absl::StatusOr<int64_t> DevicePeakBytes(c10::Device device) {
  if (device.is_cpu()) return 0;
  return TorchCall("device memory", [&] {
    c10::CachingDeviceAllocator::DeviceStats stats =
        c10::getDeviceAllocator(device.type())->getDeviceStats(device.index());
    return stats
        .allocated_bytes[static_cast<size_t>(
            c10::CachingAllocator::StatType::AGGREGATE)]
        .peak;
  });
}

}  // namespace tracecut::runtime
