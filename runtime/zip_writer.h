#ifndef TRACECUT_RUNTIME_ZIP_WRITER_H_
#define TRACECUT_RUNTIME_ZIP_WRITER_H_

// Serializing through LibTorch's zip writer without ever aborting.
//
//   ASSIGN_OR_RETURN(std::vector<char> bytes,
//                    runtime::PickleSave(state, "checkpoint state"));
//   ASSIGN_OR_RETURN(std::string pt, runtime::SaveModuleBytes(m, files, "x"));
//
// caffe2::serialize::PyTorchStreamWriter finishes the archive from its
// destructor when nobody did, and throws from there when a write failed
// before: while the first failure (std::bad_alloc under `ulimit -v`, a full
// disk) unwinds, that is std::terminate, exit 134. Here the writer's sink
// never fails towards LibTorch: it records the first failure, drops the
// rest, and the failure comes back as a Status once the writer is gone.

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::runtime {

// torch::jit::pickle_save's bytes (what torch::jit::pickle_load and
// torch.load read). Out of memory is RESOURCE_EXHAUSTED naming `what`.
absl::StatusOr<std::vector<char>> PickleSave(const c10::IValue& value,
                                             absl::string_view what);

// torch::jit::Module::save's bytes (a TorchScript archive) with
// `extra_files` embedded. Errors name `what`.
absl::StatusOr<std::string> SaveModuleBytes(
    const torch::jit::Module& module,
    const torch::jit::ExtraFilesMap& extra_files, absl::string_view what);

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_ZIP_WRITER_H_
