#ifndef TRACECUT_PIPELINES_CALIBRATION_DATA_INTERNAL_H_
#define TRACECUT_PIPELINES_CALIBRATION_DATA_INTERNAL_H_

// File reading shared by token files (calibration_data.cc) and data for any
// model (calibration_data_features.cc). Not API: calibration_data.h is.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipelines/calibration_data.h"

namespace tracecut::pipelines::internal {

// The bytes of a calibration data file; errors name it ("calibration data
// '<path>': ..."): InvalidArgument for a directory, NotFound when it cannot
// be opened.
absl::StatusOr<std::string> ReadDataFile(const std::string& path);

// Token ids from JSON lines, and from an unpickled value (see
// calibration_data.h); errors name `path` / `source`.
absl::StatusOr<TokenIds> TokenIdsFromJsonLines(const std::string& text,
                                               const std::string& path);
absl::StatusOr<TokenIds> TokenIdsFromIValue(const c10::IValue& value,
                                            absl::string_view source);

// Whether `bytes` look like a torch.save file (zip or legacy pickle).
bool IsTorchSave(const std::string& bytes);

// LibTorch's unpickling of a torch.save file; InvalidArgument naming `path`.
absl::StatusOr<c10::IValue> Unpickle(const std::string& bytes,
                                     const std::string& path);

}  // namespace tracecut::pipelines::internal

#endif  // TRACECUT_PIPELINES_CALIBRATION_DATA_INTERNAL_H_
