#include "tracer/hf/inputs.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/dtype.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::tracer::hf {

using util::Json;

namespace {

// 2^26 elements: 512 MiB as int64, far above any real example input (a
// batch of two 224x224 images has 301056).
constexpr uint64_t kMaxInputElements = uint64_t{1} << 26;
constexpr size_t kMaxInputRank = 16;

constexpr const char* kKinds[] = {"tokens", "ones", "zeros", "normal",
                                  "arange"};

absl::Status SpecError(absl::string_view source, size_t index,
                       absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": inputs[", index, "]: ", what));
}

absl::StatusOr<InputSpec> ParseSpec(const Json& j, absl::string_view source,
                                    size_t index) {
  if (!j.is_object()) {
    return SpecError(
        source, index,
        absl::StrCat("must be an object, got ", util::JsonTypeName(j)));
  }
  InputSpec spec;
  const Json* name = util::FindMember(j, "name");
  if (name == nullptr || !name->is_string() ||
      name->get<std::string>().empty()) {
    return SpecError(source, index, "\"name\" must be a non-empty string");
  }
  spec.name = name->get<std::string>();
  const Json* shape = util::FindMember(j, "shape");
  if (shape == nullptr || !shape->is_array()) {
    return SpecError(source, index,
                     absl::StrCat("\"shape\" of '", spec.name,
                                  "' must be a list of integers"));
  }
  // The example input is made in memory: its element count is bounded so a
  // crafted file cannot ask for terabytes ([1000000, 1000000]).
  uint64_t numel = 1;
  bool too_many = shape->size() > kMaxInputRank;
  for (const Json& d : *shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return SpecError(source, index,
                       absl::StrCat("\"shape\" of '", spec.name,
                                    "' must be a list of integers >= 0"));
    }
    spec.shape.push_back(d.get<int64_t>());
    too_many |= __builtin_mul_overflow(
        numel, static_cast<uint64_t>(d.get<int64_t>()), &numel);
  }
  if (too_many || numel > kMaxInputElements) {
    return SpecError(
        source, index,
        absl::StrCat("\"shape\" of '", spec.name, "' has ",
                     too_many ? "too many" : absl::StrCat(numel),
                     " elements; an example input may have at most ",
                     kMaxInputElements, " in at most ", kMaxInputRank,
                     " dimensions"));
  }
  if (const Json* dtype = util::FindMember(j, "dtype"); dtype != nullptr) {
    if (!dtype->is_string() || !IsKnownDType(dtype->get<std::string>())) {
      return SpecError(
          source, index,
          absl::StrCat("\"dtype\" of '", spec.name, "' must be one of ",
                       absl::StrJoin(runtime::InputDTypeNames(), ", "),
                       ", got ", util::DumpJson(*dtype)));
    }
    spec.dtype = dtype->get<std::string>();
  }
  if (const Json* kind = util::FindMember(j, "kind"); kind != nullptr) {
    bool known = kind->is_string() &&
                 std::find(std::begin(kKinds), std::end(kKinds),
                           kind->get<std::string>()) != std::end(kKinds);
    if (!known) {
      return SpecError(
          source, index,
          absl::StrCat("\"kind\" of '", spec.name, "' must be one of ",
                       absl::StrJoin(kKinds, ", "), ", got ",
                       util::DumpJson(*kind)));
    }
    spec.kind = kind->get<std::string>();
  }
  if (const Json* high = util::FindMember(j, "high");
      high != nullptr && !high->is_null()) {
    if (!high->is_number_integer() || high->get<int64_t>() <= 0) {
      return SpecError(source, index,
                       absl::StrCat("\"high\" of '", spec.name,
                                    "' must be a positive integer"));
    }
    spec.high = high->get<int64_t>();
  }
  if (spec.kind == "tokens" && !spec.high.has_value()) {
    return SpecError(
        source, index,
        absl::StrCat("'", spec.name, "' has kind \"tokens\" but no \"high\""));
  }
  return spec;
}

}  // namespace

bool IsKnownDType(absl::string_view dtype) {
  return runtime::IsInputDType(dtype);
}

absl::StatusOr<InputsFile> ParseInputsJson(absl::string_view text,
                                           absl::string_view source) {
  ASSIGN_OR_RETURN(Json j, util::ParseJson(text, source));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": must be a JSON object with \"inputs\""));
  }
  InputsFile file;
  const Json* inputs = util::FindMember(j, "inputs");
  if (inputs == nullptr || !inputs->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": \"inputs\" must be a list"));
  }
  uint64_t total = 0;
  for (size_t i = 0; i < inputs->size(); ++i) {
    ASSIGN_OR_RETURN(InputSpec spec, ParseSpec((*inputs)[i], source, i));
    uint64_t numel = 1;  // At most kMaxInputElements (ParseSpec checked).
    for (int64_t d : spec.shape) numel *= static_cast<uint64_t>(d);
    total += numel;
    if (total > kMaxInputElements) {
      return SpecError(
          source, i,
          absl::StrCat("the example inputs up to '", spec.name, "' have ",
                       total, " elements together; at most ", kMaxInputElements,
                       " are allowed"));
    }
    for (const InputSpec& other : file.inputs) {
      if (other.name == spec.name) {
        return SpecError(source, i,
                         absl::StrCat("duplicate input '", spec.name, "'"));
      }
    }
    file.inputs.push_back(std::move(spec));
  }
  if (const Json* outputs = util::FindMember(j, "outputs");
      outputs != nullptr) {
    if (!outputs->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": \"outputs\" must be a list of strings"));
    }
    for (const Json& o : *outputs) {
      if (!o.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": \"outputs\" must be a list of strings"));
      }
      file.outputs.push_back(o.get<std::string>());
    }
  }
  if (const Json* lens = util::FindMember(j, "seq_lens"); lens != nullptr) {
    const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
        source,
        ": \"seq_lens\" must be a list of [min, max] (integers >= 1, max "
        ">= min or null)"));
    if (!lens->is_array()) return bad;
    for (const Json& r : *lens) {
      if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() ||
          r[0].get<int64_t>() < 1 ||
          !(r[1].is_null() || (r[1].is_number_integer() &&
                               r[1].get<int64_t>() >= r[0].get<int64_t>()))) {
        return bad;
      }
      LengthRange range;
      range.min = r[0].get<int64_t>();
      if (!r[1].is_null()) range.max = r[1].get<int64_t>();
      file.seq_lens.push_back(range);
    }
  }
  return file;
}

absl::StatusOr<std::optional<InputSpec>> DummyInputSpec(
    const HfConfig* config, absl::string_view name, const DummyShape& shape) {
  int64_t seq = shape.seq;
  auto need = [&](absl::string_view key) -> absl::StatusOr<int64_t> {
    if (config == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("a dummy '", name, "' needs config.json (for \"", key,
                       "\"); give --config=config.json or example inputs"));
    }
    ASSIGN_OR_RETURN(std::optional<int64_t> v, config->FindInt(key));
    if (!v.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat(config->source(), ": a dummy '", name, "' needs \"", key,
                       "\", which is missing"));
    }
    if (*v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          config->source(), ": \"", key, "\" must be positive, got ", *v));
    }
    return *v;
  };
  if (config != nullptr) {
    ASSIGN_OR_RETURN(std::optional<int64_t> max_pos,
                     config->FindInt("max_position_embeddings"));
    if (max_pos.has_value() && *max_pos > 0) seq = std::min(seq, *max_pos);
  }
  const std::vector<int64_t> tokens_shape = {shape.batch, seq};
  InputSpec spec;
  spec.name = std::string(name);
  if (name == "input_ids" || name == "decoder_input_ids" || name == "labels") {
    ASSIGN_OR_RETURN(int64_t vocab, need("vocab_size"));
    spec.shape = tokens_shape;
    spec.dtype = "int64";
    spec.kind = "tokens";
    spec.high = vocab;
  } else if (name == "attention_mask" || name == "decoder_attention_mask") {
    spec.shape = tokens_shape;
    spec.dtype = "int64";
    spec.kind = "ones";
  } else if (name == "token_type_ids") {
    spec.shape = tokens_shape;
    spec.dtype = "int64";
    spec.kind = "zeros";
  } else if (name == "position_ids") {
    spec.shape = tokens_shape;
    spec.dtype = "int64";
    spec.kind = "arange";
  } else if (name == "pixel_values") {
    int64_t channels = 3;
    if (config != nullptr) {
      ASSIGN_OR_RETURN(std::optional<int64_t> c,
                       config->FindInt("num_channels"));
      if (c.has_value()) channels = *c;
    }
    ASSIGN_OR_RETURN(int64_t image, need("image_size"));
    spec.shape = {shape.batch, channels, image, image};
    spec.dtype = "float32";
    spec.kind = "normal";
  } else if (name == "inputs_embeds") {
    ASSIGN_OR_RETURN(int64_t hidden, need("hidden_size"));
    spec.shape = {shape.batch, seq, hidden};
    spec.dtype = "float32";
    spec.kind = "normal";
  } else {
    return std::optional<InputSpec>();
  }
  return std::optional<InputSpec>(std::move(spec));
}

}  // namespace tracecut::tracer::hf
