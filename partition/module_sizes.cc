#include "partition/module_sizes.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace tracecut::partition {
namespace {

int64_t Bytes(const at::Tensor& t) {
  return static_cast<int64_t>(t.numel()) *
         static_cast<int64_t>(t.element_size());
}

std::optional<int64_t> Lookup(const torch::jit::Module& root,
                              absl::string_view path) {
  c10::IValue value = root._ivalue();
  if (!path.empty()) {
    for (absl::string_view part : absl::StrSplit(path, '.')) {
      if (!value.isModule()) return std::nullopt;
      torch::jit::Module m = value.toModule();
      std::string name(part);
      if (!m.hasattr(name)) return std::nullopt;
      value = m.attr(name);
    }
  }
  if (value.isTensor()) return Bytes(value.toTensor());
  if (!value.isModule()) return std::nullopt;
  torch::jit::Module m = value.toModule();
  absl::flat_hash_set<const void*> seen;
  int64_t total = 0;
  auto add = [&](const at::Tensor& t) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) total += Bytes(t);
  };
  for (const at::Tensor& t : m.parameters(/*recurse=*/true)) add(t);
  for (const at::Tensor& t : m.buffers(/*recurse=*/true)) add(t);
  return total;
}

}  // namespace

ParamBytesFn ModuleParamBytes(const torch::jit::Module& root) {
  return [root](absl::string_view path) -> std::optional<int64_t> {
    try {
      return Lookup(root, path);
    } catch (...) {  // LibTorch throws c10::Error on odd attributes.
      return std::nullopt;
    }
  };
}

}  // namespace tracecut::partition
