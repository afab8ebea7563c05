#ifndef TRACECUT_PIPELINES_COMPRESSED_OUTPUT_H_
#define TRACECUT_PIPELINES_COMPRESSED_OUTPUT_H_

// A calibrated model written as a compressed-tensors checkpoint directory:
// what `tracecut calibrate --format=compressed-tensors -o OUT_DIR` writes,
// and what transformers (`from_pretrained`) and vLLM load.
//
//   RETURN_IF_ERROR(WriteCompressedTensors(gm, results, {.output_dir = out,
//                                                        .source_dir = ckpt}));
//
// OUT_DIR holds config.json (the model's, with a quantization_config,
// checkpoint/compressed_tensors.h), model.safetensors (or shards of at most
// `max_shard_bytes` with model.safetensors.index.json): every quantized
// Linear's packed weight and parameters, and the model's other tensors as
// they are; and the source checkpoint's other files (tokenizer, generation
// config) copied through. With a source checkpoint, exactly its tensor names
// are written (a quantized weight as its compressed tensors), so buffers
// transformers does not save (rotary caches, lifted constants) stay out.
//
// The directory is built next to OUT_DIR and renamed into place: a failed
// run leaves nothing, and an earlier compressed-tensors output at OUT_DIR is
// replaced only once the new one is complete. Any other existing OUT_DIR is
// refused. The same model and results give byte-identical files.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "pipelines/modifier.h"
#include "runtime/graph_module.h"

namespace tracecut::pipelines {

struct CompressedOutputOptions {
  std::string output_dir;
  // The Hugging Face checkpoint directory the model came from; empty: none
  // (every parameter and buffer is written, less lifted constants).
  std::string source_dir;
  int64_t max_shard_bytes = int64_t{5} << 30;
};

// Errors (nothing written): no config.json (embedded or in source_dir); a
// module whose weight was only observed, whose activations were observed,
// that is not a Linear, or whose scheme compressed-tensors cannot store; a
// source tensor the model does not have.
absl::Status WriteCompressedTensors(const runtime::GraphModule& gm,
                                    const CalibrationResults& results,
                                    const CompressedOutputOptions& options);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_COMPRESSED_OUTPUT_H_
