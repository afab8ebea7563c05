// Saving lowered modules as TorchScript archives, atomically.

#include <torch/csrc/jit/api/module.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/lowering.h"
#include "runtime/torch_status.h"
#include "runtime/zip_writer.h"
#include "util/files.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {

absl::Status SaveModuleAtomically(
    const torch::jit::Module& module, const std::string& path,
    const torch::jit::ExtraFilesMap& extra_files) {
  const std::string context = absl::StrCat("cannot save '", path, "'");
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": not a file path"));
  }
  // Serialized in memory, then written: LibTorch's file writer throws from
  // its destructor when a write fails (a full disk), which terminates; the
  // in-memory one is kept from failing towards LibTorch (zip_writer.h).
  ASSIGN_OR_RETURN(std::string bytes,
                   SaveModuleBytes(module, extra_files, context));
  return util::Annotate(util::WriteFileAtomically(path, bytes), context);
}

absl::Status SaveTorchScript(const GraphModule& gm, const std::string& path,
                             const SaveOptions& options) {
  ASSIGN_OR_RETURN(torch::jit::Module lowered,
                   LowerToTorchScript(gm, options.lowering));
  torch::jit::ExtraFilesMap files;
  if (options.include_extra_files) files = gm.extra_files();
  for (const auto& [name, content] : options.extra_files) files[name] = content;
  return SaveModuleAtomically(lowered, path, files);
}

}  // namespace tracecut::runtime
