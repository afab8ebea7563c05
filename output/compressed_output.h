#ifndef TRACECUT_OUTPUT_COMPRESSED_OUTPUT_H_
#define TRACECUT_OUTPUT_COMPRESSED_OUTPUT_H_

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
// they are; the source checkpoint's other files (tokenizer, generation
// config) copied through; and recipe.yaml, when the options carry one. With a
// source checkpoint, exactly its tensor names are written (a quantized weight
// as its compressed tensors), so buffers transformers does not save (rotary
// caches, lifted constants) stay out.
//
// The directory is built next to OUT_DIR and renamed into place: a failed
// run leaves nothing, and an earlier compressed-tensors output at OUT_DIR is
// replaced only once the new one is complete. Any other existing OUT_DIR is
// refused. The same model and results give byte-identical files.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors.h"
#include "modifiers/modifier.h"
#include "runtime/graph_module.h"

namespace tracecut::output {

struct CompressedOutputOptions {
  std::string output_dir;
  // The Hugging Face checkpoint directory the model came from; empty: none
  // (every parameter and buffer is written, less lifted constants).
  std::string source_dir;
  int64_t max_shard_bytes = int64_t{5} << 30;
  // Written as recipe.yaml when not empty: the llm-compressor recipe that
  // reproduces the output (pipelines/recipe_yaml.h).
  std::string recipe_yaml;
};

// Errors (nothing written): no config.json (embedded or in source_dir); a
// module whose weight was only observed, whose activations were observed,
// that is not a Linear, or whose scheme compressed-tensors cannot store; a
// source tensor the model does not have; fused MoE experts (a tensor the
// checkpoint stores in pieces, checkpoint/layout.h) not quantized, as
// transformers and vLLM read those from compressed-tensors only quantized,
// one packed Linear per expert.
absl::Status WriteCompressedTensors(
    const runtime::GraphModule& gm,
    const modifiers::CalibrationResults& results,
    const CompressedOutputOptions& options);

// A model whose MoE experts are fused into 3-D parameters is written with
// each expert's Linears one by one (checkpoint/layout.h), which transformers
// converts back into its fused experts only for some schemes: 5.17 for
// W4A16, W8A16, FP8 and FP8_DYNAMIC (tests/hf/schemes_test.py); for the
// others it fails to load the checkpoint, or loads wrong experts without an
// error (NVFP4), while vLLM reads them. A warning naming the scheme and an
// expert when a quantized expert has another scheme; nullopt otherwise.
std::optional<std::string> FusedExpertsLoadWarning(
    const modifiers::CalibrationResults& results,
    const checkpoint::Layout& layout);

// The same directory written shard by shard, for runs that hold one
// subgraph's weights at a time (weight_stream.h): each WriteShard writes
// `work_dir`/part-NNNNN.safetensors at once; Finish adds the source
// checkpoint's tensors no shard holds (copied as stored), renames the parts
// to model-0000K-of-0000N.safetensors, writes the index, config.json and the
// source's other files, and renames `work_dir` onto OUT_DIR (so `work_dir`
// must be on OUT_DIR's file system). The parts survive a killed run, so a
// resumed one writes only the rest; the same run gives the same bytes.
class CompressedTensorsWriter {
 public:
  // Checks OUT_DIR and the config up front; needs options.source_dir to be
  // a checkpoint directory.
  static absl::StatusOr<std::unique_ptr<CompressedTensorsWriter>> Create(
      const CompressedOutputOptions& options,
      const torch::jit::ExtraFilesMap& extra_files, std::string work_dir);

  // Removes the parts of an earlier run.
  absl::Status Clear();
  // `tensors`: model path -> final value. A quantized Linear's weight is
  // written as its compressed tensors (after checking its parameters are
  // finite); other tensors under their checkpoint name in the checkpoint's
  // dtype; a path the checkpoint does not hold (a tied alias) is skipped.
  absl::Status WriteShard(
      int index, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
      const modifiers::CalibrationResults& results);
  absl::Status Finish(const modifiers::CalibrationResults& results);

 private:
  CompressedTensorsWriter(CompressedOutputOptions options, std::string work_dir)
      : options_(std::move(options)), work_dir_(std::move(work_dir)) {}
  std::string PartPath(int index) const;

  CompressedOutputOptions options_;
  std::string work_dir_;
  std::string where_;   // "cannot write 'OUT_DIR'".
  std::string config_;  // The model's config.json.
  std::optional<checkpoint::Checkpoint> source_;
  checkpoint::Layout layout_;  // Model tensors it stores in pieces.
  // Modules of torch.nn.Linear's subclasses (tracecut_model.json).
  std::vector<std::string> linear_subclasses_;
};

}  // namespace tracecut::output

#endif  // TRACECUT_OUTPUT_COMPRESSED_OUTPUT_H_
