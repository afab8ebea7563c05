#include "runtime/device_placement.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

using TensorMemo = absl::flat_hash_map<const c10::TensorImpl*, at::Tensor>;

// `t` on `device`, the same tensor for every alias (memo), with the
// original's requires_grad and no autograd history.
at::Tensor CopyTo(const at::Tensor& t, c10::Device device, TensorMemo& memo) {
  auto it = memo.find(t.unsafeGetTensorImpl());
  if (it != memo.end()) return it->second;
  at::Tensor copy;
  {
    c10::NoGradGuard no_grad;
    copy = t.detach().to(device);
  }
  if (t.requires_grad()) copy.set_requires_grad(true);
  memo.emplace(t.unsafeGetTensorImpl(), copy);
  return copy;
}

// Calls fn(object, slot) for every tensor slot of the module at `path` and
// its submodules, or for the one tensor attribute `path` names.
template <typename Fn>
absl::Status ForEachTensorSlot(const torch::jit::Module& root,
                               const std::string& path, Fn fn) {
  torch::jit::Module module = root;
  std::vector<std::string> parts;
  if (!path.empty()) parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!module.hasattr(parts[i])) {
      return absl::NotFoundError(absl::StrCat(
          "placing '", path, "' on the device: no attribute '", parts[i], "'"));
    }
    c10::IValue v = module.attr(parts[i]);
    if (v.isModule()) {
      module = v.toModule();
      continue;
    }
    if (i + 1 == parts.size() && v.isTensor()) {
      const auto& object = module._ivalue();
      fn(object, object->type()->getAttributeSlot(parts[i]));
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("placing '", path, "' on the device: '", parts[i],
                     "' is neither a module nor a tensor"));
  }
  for (const torch::jit::Module& m : module.modules()) {
    const auto& object = m._ivalue();
    for (size_t s = 0; s < object->slots().size(); ++s) {
      if (object->getSlot(s).isTensor()) fn(object, s);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DevicePlacement> DevicePlacement::Place(
    const torch::jit::Module& root, const std::vector<std::string>& paths,
    c10::Device device) {
  DevicePlacement p;
  p.root_ = root;
  p.device_ = device;
  if (device.is_cpu()) return p;
  TensorMemo memo;
  RETURN_IF_ERROR(TorchCall("placing on the device", [&] {
    absl::Status status;
    for (const std::string& path : paths) {
      status.Update(ForEachTensorSlot(
          root, path,
          [&](const c10::intrusive_ptr<c10::ivalue::Object>& object,
              size_t slot) {
            const at::Tensor t = object->getSlot(slot).toTensor();
            if (!t.defined() || t.device() == device) return;
            const bool first = !memo.contains(t.unsafeGetTensorImpl());
            at::Tensor moved = CopyTo(t, device, memo);
            if (first) p.placed_.push_back({t, moved});
            object->setSlot(slot, moved);
          }));
    }
    return status;
  }));
  return p;
}

absl::Status DevicePlacement::Return() {
  if (device_.is_cpu() || placed_.empty()) return absl::OkStatus();
  TensorMemo home;  // Device tensor -> its host tensor.
  for (const Placed& p : placed_) {
    home.emplace(p.device.unsafeGetTensorImpl(), p.host);
  }
  RETURN_IF_ERROR(TorchCall("returning tensors to the host", [&] {
    const c10::Device host(c10::kCPU);
    for (const torch::jit::Module& m : root_.modules()) {
      const auto& object = m._ivalue();
      for (size_t s = 0; s < object->slots().size(); ++s) {
        const c10::IValue& v = object->getSlot(s);
        if (!v.isTensor() || !v.toTensor().defined() ||
            v.toTensor().device() != device_) {
          continue;
        }
        object->setSlot(s, CopyTo(v.toTensor(), host, home));
      }
    }
  }));
  placed_.clear();
  return absl::OkStatus();
}

}  // namespace tracecut::runtime
