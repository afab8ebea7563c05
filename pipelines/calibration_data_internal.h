#ifndef TRACECUT_PIPELINES_CALIBRATION_DATA_INTERNAL_H_
#define TRACECUT_PIPELINES_CALIBRATION_DATA_INTERNAL_H_

// File reading shared by token files (calibration_data.cc) and data for any
// model (calibration_data_features.cc). Not API: calibration_data.h is.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <string>

#include "absl/status/statusor.h"

namespace tracecut::pipelines::internal {

// The bytes of a calibration data file; errors name it ("calibration data
// '<path>': ..."): InvalidArgument for a directory, NotFound when it cannot
// be opened.
absl::StatusOr<std::string> ReadDataFile(const std::string& path);

// Token ids [N, seq] from JSON lines (see calibration_data.h).
absl::StatusOr<at::Tensor> ParseJsonLines(const std::string& text,
                                          const std::string& path);

// Whether `bytes` look like a torch.save file (zip or legacy pickle).
bool IsTorchSave(const std::string& bytes);

// LibTorch's unpickling of a torch.save file; InvalidArgument naming `path`.
absl::StatusOr<c10::IValue> Unpickle(const std::string& bytes,
                                     const std::string& path);

}  // namespace tracecut::pipelines::internal

#endif  // TRACECUT_PIPELINES_CALIBRATION_DATA_INTERNAL_H_
