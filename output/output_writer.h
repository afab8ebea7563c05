#ifndef TRACECUT_OUTPUT_OUTPUT_WRITER_H_
#define TRACECUT_OUTPUT_OUTPUT_WRITER_H_

// Where a calibrated model goes: one interface for every output format, so
// a calibration saves through one call.
//
//   std::unique_ptr<OutputWriter> out = TorchScriptOutput("model.pt");
//   RETURN_IF_ERROR(out->Write(gm, results));
//
// Every writer puts its output in place whole or not at all.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "modifiers/modifier.h"
#include "output/compressed_output.h"
#include "runtime/graph_module.h"

namespace tracecut::output {

class OutputWriter {
 public:
  virtual ~OutputWriter() = default;
  // Writes the calibrated `gm` (its weights final, quantization parameters
  // exported) with what the modifiers recorded in `results`.
  virtual absl::Status Write(const runtime::GraphModule& gm,
                             const modifiers::CalibrationResults& results) = 0;
};

// A compressed-tensors checkpoint directory (WriteCompressedTensors).
std::unique_ptr<OutputWriter> CompressedTensorsOutput(
    CompressedOutputOptions options);

// A TorchScript archive (runtime::SaveTorchScript).
std::unique_ptr<OutputWriter> TorchScriptOutput(std::string path);

// The shards `writer` wrote as weights streamed, finished into its
// directory (CompressedTensorsWriter::Finish; `gm` is not read).
std::unique_ptr<OutputWriter> StreamedOutput(CompressedTensorsWriter& writer);

}  // namespace tracecut::output

#endif  // TRACECUT_OUTPUT_OUTPUT_WRITER_H_
