#ifndef TRACECUT_PIPELINES_CALIBRATION_DATA_H_
#define TRACECUT_PIPELINES_CALIBRATION_DATA_H_

// Calibration data for language models: token ids [N, seq] from a file or a
// seeded generator, checked against the model, cut into batches of model
// inputs.
//
//   ASSIGN_OR_RETURN(at::Tensor tokens, LoadTokenFile("calib.pt"));
//   TokenLimits limits;
//   limits.vocab_size = 32000;
//   RETURN_IF_ERROR(CheckTokens(tokens, limits, "calib.pt"));
//   ASSIGN_OR_RETURN(CalibrationData data,
//                    MakeCalibrationData(tokens, {"input_ids",
//                                                 "attention_mask"},
//                                        /*batch_size=*/4, "calib.pt"));
//
// Files (LoadTokenFile picks the format by content, not by extension):
//  * a `torch.save` file (the zip format, torch.save's default since
//    PyTorch 1.6) holding token ids as
//      - an integer tensor [N, seq] (or [seq] for one sample),
//      - a dict with an "input_ids" tensor,
//      - a list of 1-D tensors, int lists, or dicts with "input_ids" (each
//        one sample; all the same length: there is no padding).
//    LibTorch's unpickler lacks one opcode Python uses for dicts with a
//    single entry: a dict holding only "input_ids" cannot be read (the
//    error says so); tokenizer output ("input_ids" and "attention_mask")
//    and plain tensors can;
//  * JSON lines: one sample per line, a JSON array of ints or an object
//    with "input_ids"; blank lines are skipped.
//
// Model inputs made per batch, by placeholder name: input_ids /
// decoder_input_ids (the tokens), attention_mask (ones), token_type_ids
// (zeros), position_ids (0..seq-1 per row). Any other input is an error.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::pipelines {

// Batches of model inputs.
struct CalibrationData {
  std::vector<std::string> input_names;  // Placeholder names, graph order.
  // batches[b][i] is input i of batch b.
  std::vector<std::vector<c10::IValue>> batches;
  int64_t num_samples = 0;
  int64_t seq_len = 0;
  std::string source;  // "calib.pt", "synthetic (64 samples, seed 0)".
  // Hash of the token ids and batch layout (FNV-1a 64), for checkpoints.
  uint64_t fingerprint = 0;
  // Token ids [N, seq] int64.
  at::Tensor tokens;
};

// What token ids must satisfy.
struct TokenLimits {
  std::optional<int64_t> vocab_size;   // ids in [0, vocab_size).
  std::optional<int64_t> max_seq_len;  // max_position_embeddings.
};

// Reads token ids from a torch.save file or JSON lines (see above) as an
// int64 tensor [N, seq]. Errors name the file (and the line or sample).
// Does not check ranges: see CheckTokens.
absl::StatusOr<at::Tensor> LoadTokenFile(const std::string& path);

// Token ids from an already loaded value (what LoadTokenFile does after
// unpickling); `source` names it in errors.
absl::StatusOr<at::Tensor> TokensFromIValue(const c10::IValue& value,
                                            absl::string_view source);

// N deterministic samples of `seq_len` ids uniform in [0, vocab_size) from a
// CPU generator seeded with `seed`.
absl::StatusOr<at::Tensor> SyntheticTokens(int64_t num_samples, int64_t seq_len,
                                           int64_t vocab_size, uint64_t seed);

// InvalidArgument naming `source` when `tokens` is not an integer tensor
// [N >= 1, seq >= 1], or has an id outside [0, vocab_size) (giving sample,
// position and value), or is longer than max_seq_len.
absl::Status CheckTokens(const at::Tensor& tokens, const TokenLimits& limits,
                         absl::string_view source);

// Cuts checked tokens into batches of `batch_size` samples (the last may be
// smaller) with one value per model input.
absl::StatusOr<CalibrationData> MakeCalibrationData(
    const at::Tensor& tokens, const std::vector<std::string>& input_names,
    int64_t batch_size, std::string source);

// FNV-1a 64 of bytes, chained from `seed` (the offset basis by default):
// stable across runs and machines, for checkpoint fingerprints.
uint64_t Fnv1a64(absl::string_view bytes,
                 uint64_t seed = 0xcbf29ce484222325ULL);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_CALIBRATION_DATA_H_
