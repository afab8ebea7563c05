#ifndef TRACECUT_RUNTIME_DEVICE_PLACEMENT_H_
#define TRACECUT_RUNTIME_DEVICE_PLACEMENT_H_

// A subgraph's tensors on the calibration device while it runs
// (`--device=cuda`), and back on the host after it.
//
//   ASSIGN_OR_RETURN(DevicePlacement placed,
//                    DevicePlacement::Place(model.module(), paths, device));
//   ... run the subgraph, compress it ...
//   RETURN_IF_ERROR(placed.Return());  // before its weights are written
//
// Place copies every tensor of the modules (or the tensor attributes) at
// `paths` to the device; tensors shared between attributes (tied weights)
// get one copy. Return puts the host tensors back: a tensor nobody changed
// gets its original host tensor (the same object: no copy, ties and bytes
// kept), one a modifier replaced (RunContext::UpdateTensor gives every
// alias a new tensor) is copied to the host once and every attribute of
// the model that holds it gets that copy.

#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tracecut::runtime {

class DevicePlacement {
 public:
  // `paths`: module paths ("" is the root) or dotted tensor attribute
  // paths. Nothing is moved for a CPU `device`.
  static absl::StatusOr<DevicePlacement> Place(
      const torch::jit::Module& root, const std::vector<std::string>& paths,
      c10::Device device);

  DevicePlacement() = default;
  DevicePlacement(DevicePlacement&&) = default;
  DevicePlacement& operator=(DevicePlacement&&) = default;

  // Every tensor of the model on the device back on the host. Idempotent.
  absl::Status Return();

  // Places every tensor of `root` (DevicePlacement::Place with "") and
  // returns them when `fn` is done, also when it fails: for checks that
  // run a model on the device and leave it as it was.
  template <typename Fn>
  static auto WithModuleOn(const torch::jit::Module& root, c10::Device device,
                           Fn fn) -> decltype(fn());

  // Tensors copied to the device, counted once.
  int64_t tensors() const { return static_cast<int64_t>(placed_.size()); }

 private:
  struct Placed {
    at::Tensor host;
    at::Tensor device;
  };
  torch::jit::Module root_;
  c10::Device device_ = c10::Device(c10::kCPU);
  std::vector<Placed> placed_;
};

template <typename Fn>
auto DevicePlacement::WithModuleOn(const torch::jit::Module& root,
                                   c10::Device device, Fn fn)
    -> decltype(fn()) {
  absl::StatusOr<DevicePlacement> placed = Place(root, {""}, device);
  if (!placed.ok()) return placed.status();
  auto result = fn();
  absl::Status returned = placed->Return();
  if (!returned.ok()) return returned;
  return result;
}

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_DEVICE_PLACEMENT_H_
