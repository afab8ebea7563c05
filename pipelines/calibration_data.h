#ifndef TRACECUT_PIPELINES_CALIBRATION_DATA_H_
#define TRACECUT_PIPELINES_CALIBRATION_DATA_H_

// Calibration data: model inputs with a leading sample dimension, from a
// file or (token ids) a seeded generator, checked against the model, cut
// into batches.
//
//   ModelInputs model = ...;  // The traced graph's inputs (calibrate.h).
//   ASSIGN_OR_RETURN(CalibrationData data,
//                    LoadCalibrationData("calib.pt", model, /*batch_size=*/4));
//
// or, for token ids only:
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
// Token files (LoadTokenFile picks the format by content, not by extension):
//  * a `torch.save` file (the zip format, torch.save's default since
//    PyTorch 1.6) holding token ids as
//      - an integer tensor [N, seq] (or [seq] for one sample),
//      - a dict with an "input_ids" tensor,
//      - a list of 1-D tensors, int lists, or dicts with "input_ids" (each
//        one sample, of any length).
//    LibTorch's unpickler reads tensors, lists, tuples, dicts, numbers and
//    strings (not sets or other Python classes: the error says so);
//  * JSON lines: one sample per line, a JSON array of ints or an object
//    with "input_ids"; blank lines are skipped.
// Samples of different lengths (a tokenizer's output without padding) are
// never padded: consecutive samples of one length share a batch
// (MakeRaggedCalibrationData), so with llm-compressor's default batch size
// of 1 every sample is a batch of its own length, as there.
//
// Model inputs made from token ids per batch, by placeholder name:
// input_ids / decoder_input_ids (the tokens), attention_mask /
// decoder_attention_mask (ones), token_type_ids (zeros), position_ids
// (0..seq-1 per row).
//
// Data for any model (Note [Calibration data files]): LoadCalibrationData
// also reads a torch.save'd tensor, list, tuple or dict of tensors and a
// .safetensors file, matched to the model's inputs by position or by name
// (images, audio features, encoder-decoder pairs); each tensor holds N
// samples along its first dimension.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tracer/hf/inputs.h"

namespace tracecut::pipelines {

// Batches of model inputs.
struct CalibrationData {
  std::vector<std::string> input_names;  // Placeholder names, graph order.
  // batches[b][i] is input i of batch b.
  std::vector<std::vector<c10::IValue>> batches;
  int64_t num_samples = 0;
  // Of the token ids (the longest, the shortest); 0 when there are none.
  int64_t seq_len = 0;
  int64_t min_seq_len = 0;
  std::string source;  // "calib.pt", "synthetic (64 samples, seed 0)".
  // Hash of the token ids and batch layout (util::Fnv1a64), for checkpoints.
  uint64_t fingerprint = 0;
  // Token ids [N, seq] int64 (undefined for data without token ids).
  at::Tensor tokens;
  // "pixel_values: float32[8, 3, 32, 32]", one per input, for data read
  // from tensors (empty for token ids).
  std::vector<std::string> descriptions;
};

// Token ids as a file holds them: `ids` [N, seq] int64 when every sample
// has the same length; otherwise `ids` is undefined and `samples` holds
// each sample, int64 [len], in the file's order.
struct TokenIds {
  at::Tensor ids;
  std::vector<at::Tensor> samples;
  bool ragged() const { return !ids.defined(); }
};

// What token ids must satisfy.
struct TokenLimits {
  std::optional<int64_t> vocab_size;   // ids in [0, vocab_size).
  std::optional<int64_t> max_seq_len;  // max_position_embeddings.
  // The lengths the exported program is valid for (tracer/hf/inputs.h's
  // seq_lens); empty: any. `program` names it in errors.
  std::vector<tracer::hf::LengthRange> seq_lens;
  std::string program;
};

// An input of the traced model (a graph placeholder) and its example
// input, which calibration data must agree with.
struct ModelInput {
  std::string name;
  std::string dtype;           // "float32", "int64", ...; "" when unknown.
  std::vector<int64_t> shape;  // The example's; empty when unknown.
};

// What calibration data is checked against.
struct ModelInputs {
  std::vector<ModelInput> inputs;  // Graph order.
  TokenLimits limits;              // For input_ids / decoder_input_ids.
};

// "input_ids: int64[2, 16], attention_mask: int64[2, 16]".
std::string DescribeModelInputs(const ModelInputs& model);

// The samples' token count: "128", or "20-128" when they differ.
std::string SeqLenText(const CalibrationData& data);

// Whether token ids make every input (see above): the inputs include
// input_ids or decoder_input_ids and nothing that cannot be made from them.
bool TakesTokensOnly(const std::vector<std::string>& input_names);

// Reads a calibration data file for `model` and cuts it into batches of
// `batch_size` samples. By content:
//  * JSON lines, and a torch.save'd tensor or list when the model takes
//    token ids only: token ids, exactly as LoadTokenFile + CheckTokens +
//    MakeCalibrationData;
//  * otherwise a torch.save'd tensor (the first input), tuple or list (by
//    position), dict (by input name) or a .safetensors file (by tensor
//    name): see MakeFeatureData.
// Errors are InvalidArgument (NotFound for a missing file), one line
// naming the file and, where one is at fault, the input.
absl::StatusOr<CalibrationData> LoadCalibrationData(const std::string& path,
                                                    const ModelInputs& model,
                                                    int64_t batch_size);

// Batches from values by input name (in the file's order). Each value is a
// tensor [N, ...] with the rank of the model's example input (or one less:
// one sample), or a list of per-sample tensors or int lists; all share N.
// Checked: every name is an input of the model (an attention_mask,
// token_type_ids or position_ids the model does not take is accepted only
// when it holds what the model assumes: ones, zeros, 0..seq-1); integer vs
// floating point as the example input (then converted to its dtype);
// floating point values finite; token ids in range (TokenLimits). Inputs
// the file leaves out are made from the token ids (see above); any other
// missing input is an error.
absl::StatusOr<CalibrationData> MakeFeatureData(
    const std::vector<std::pair<std::string, c10::IValue>>& values,
    const ModelInputs& model, int64_t batch_size, std::string source);

// Reads token ids from a torch.save file or JSON lines (see above) as an
// int64 tensor [N, seq]. Errors name the file (and the line or sample), and
// samples of different lengths are one (LoadCalibrationData takes them).
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

// Batches of token-id samples of different lengths (each int [len]): a
// batch holds consecutive samples of one length, at most `batch_size`.
// Each sample is checked as CheckTokens checks a tensor (errors name the
// sample); seq_len and min_seq_len are the longest and the shortest.
absl::StatusOr<CalibrationData> MakeRaggedCalibrationData(
    const std::vector<at::Tensor>& samples, const TokenLimits& limits,
    const std::vector<std::string>& input_names, int64_t batch_size,
    std::string source);

// Rank `rank`'s shard of `data`: sample i (over all batches, in order) goes
// to rank i % world_size, in batches of the largest batch size of `data`
// (samples of different shapes in different batches).
// Every input must be a tensor with the samples along dimension 0.
// InvalidArgument when a rank would get no sample.
absl::StatusOr<CalibrationData> ShardCalibrationData(
    const CalibrationData& data, int rank, int world_size);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_CALIBRATION_DATA_H_
