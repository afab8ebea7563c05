#ifndef TRACECUT_TRACER_HF_INPUTS_H_
#define TRACECUT_TRACER_HF_INPUTS_H_

// Descriptions of example inputs (no LibTorch): what tracecut_inputs.json
// holds, and the Hugging Face-style dummy inputs derived from a config and a
// forward argument name. tracer/example_inputs.h turns them into tensors.
//
// tracecut_inputs.json (embedded in fixture .pt files):
//   {"inputs": [{"name": "input_ids", "shape": [2, 16], "dtype": "int64",
//                "kind": "tokens", "high": 256},
//               {"name": "attention_mask", "shape": [2, 16],
//                "dtype": "int64", "kind": "ones"}],
//    "outputs": ["logits"]}

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tracer/hf/config.h"

namespace tracecut::tracer::hf {

struct InputSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype = "float32";  // A torch dtype name: "int64", "float32".
  // How values are made (deterministically, from a seeded generator):
  // "tokens" (uniform integers in [0, high)), "ones", "zeros", "normal"
  // (standard normal), "arange" (0, 1, ... along the last dimension).
  std::string kind = "normal";
  std::optional<int64_t> high;  // For "tokens".

  friend bool operator==(const InputSpec& a, const InputSpec& b) {
    return a.name == b.name && a.shape == b.shape && a.dtype == b.dtype &&
           a.kind == b.kind && a.high == b.high;
  }
};

// Token-sequence lengths [min, max] (max nullopt: unbounded).
struct LengthRange {
  int64_t min = 1;
  std::optional<int64_t> max;
  friend bool operator==(const LengthRange& a, const LengthRange& b) {
    return a.min == b.min && a.max == b.max;
  }
};

struct InputsFile {
  std::vector<InputSpec> inputs;
  std::vector<std::string> outputs;  // Names of the forward's outputs.
  // "seq_lens": the token lengths the program is valid for, when its
  // export's guards restrict them (a model whose code is unrolled for the
  // example's length); empty: any length.
  std::vector<LengthRange> seq_lens;
};

// Parses tracecut_inputs.json; `source` names it in errors.
absl::StatusOr<InputsFile> ParseInputsJson(absl::string_view text,
                                           absl::string_view source);

// The dtype names specs may use (torch's: "float32", "int64", "bool", ...).
bool IsKnownDType(absl::string_view dtype);

struct DummyShape {
  int64_t batch = 2;
  int64_t seq = 16;
};

// The HF dummy input for a forward argument called `name`, as HFTracer's
// `_generate_dummy_input` would make it: input_ids / decoder_input_ids
// tokens in [0, vocab_size), attention_mask ones, token_type_ids zeros,
// position_ids arange, pixel_values normal [batch, num_channels, image_size,
// image_size], inputs_embeds normal [batch, seq, hidden_size]. The sequence
// length is capped at max_position_embeddings. nullopt when the name is not
// one of these; an error when the config lacks (or mistypes) what the input
// needs. `config` may be null (then only config-free inputs are known).
absl::StatusOr<std::optional<InputSpec>> DummyInputSpec(
    const HfConfig* config, absl::string_view name, const DummyShape& shape);

}  // namespace tracecut::tracer::hf

#endif  // TRACECUT_TRACER_HF_INPUTS_H_
