// Calibration data for any model: tensors from a torch.save file or a
// .safetensors file, matched to the model's inputs (Note [Calibration data
// files]).

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "pipelines/calibration_data.h"
#include "pipelines/calibration_data_internal.h"
#include "quantization/quantize.h"
#include "runtime/torch_status.h"
#include "tracer/input_files.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {

// Note [Calibration data files]
// A file gives per-input tensors whose first dimension is the sample (N
// samples, the same N for every input); batches are cut along it. What the
// file holds decides how values meet inputs: a dict or a .safetensors file
// by name, a tuple or list by position (graph inputs are the forward's
// arguments, in order), a lone tensor is the first input. Token-only models
// keep LoadTokenFile's reading of a tensor or list (samples of token ids),
// so the files that worked before mean what they meant. Sizes other than N
// are not checked against the example input: a sequence may be longer, a
// CNN may take other image sizes; an input that the traced model cannot
// take fails in the first subgraph that reads it, naming the batch.

namespace {

bool IsTokenName(absl::string_view name) {
  return name == "input_ids" || name == "decoder_input_ids";
}

bool IsMadeFromTokens(absl::string_view name) {
  return IsTokenName(name) || name == "attention_mask" ||
         name == "decoder_attention_mask" || name == "token_type_ids" ||
         name == "position_ids";
}

std::string DescribeInput(const ModelInput& in) {
  if (in.dtype.empty()) return in.name;
  return absl::StrCat(in.name, ": ", in.dtype, "[",
                      absl::StrJoin(in.shape, ", "), "]");
}

bool IsFloatDType(absl::string_view dtype) {
  return absl::StartsWith(dtype, "float") || dtype == "bfloat16";
}

std::optional<at::ScalarType> ScalarTypeOf(absl::string_view dtype) {
  static const auto* kTypes =
      new std::vector<std::pair<std::string, at::ScalarType>>{
          {"float32", at::kFloat}, {"float64", at::kDouble},
          {"float16", at::kHalf},  {"bfloat16", at::kBFloat16},
          {"int64", at::kLong},    {"int32", at::kInt},
          {"int16", at::kShort},   {"int8", at::kChar},
          {"uint8", at::kByte},    {"bool", at::kBool},
      };
  for (const auto& [name, type] : *kTypes) {
    if (name == dtype) return type;
  }
  return std::nullopt;
}

// Whether `t` is what an input the model does not take would be made as
// (so leaving it out changes nothing).
bool IsDefaultValue(absl::string_view name, const at::Tensor& t) {
  if (t.numel() == 0) return true;
  at::Tensor v = t.to(at::kLong);
  if (name == "attention_mask" || name == "decoder_attention_mask") {
    return v.eq(1).all().item<bool>();
  }
  if (name == "token_type_ids") return v.eq(0).all().item<bool>();
  // position_ids: 0..seq-1 along the last dimension.
  at::Tensor want = at::arange(v.size(-1), at::kLong).expand_as(v);
  return v.equal(want);
}

// One input's value as a tensor [N, ...], checked against the model's
// example input and converted to its dtype.
absl::StatusOr<at::Tensor> InputTensor(const c10::IValue& value,
                                       const ModelInput& in,
                                       const std::string& where) {
  const bool want_float = IsFloatDType(in.dtype);
  const bool want_int = !in.dtype.empty() && !want_float;
  at::Tensor t;
  if (value.isTensor()) {
    t = value.toTensor();
  } else if (value.isList() && want_int) {
    // Samples of token ids (1-D tensors or int lists), stacked.
    absl::StatusOr<at::Tensor> ids = TokensFromIValue(value, where);
    if (!ids.ok()) return ids.status();
    t = *ids;
  } else if (value.isList() || value.isTuple()) {
    // Per-sample tensors, stacked (each with or without its own leading 1).
    std::vector<at::Tensor> parts;
    for (const c10::IValue& e : value.isList()
                                    ? value.toListRef().vec()
                                    : value.toTupleRef().elements().vec()) {
      if (!e.isTensor()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " is a list holding a ", e.tagKind(),
                         "; expected tensors (one per sample)"));
      }
      parts.push_back(e.toTensor());
    }
    if (parts.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is empty"));
    }
    const bool has_batch_dim =
        !in.shape.empty() &&
        parts[0].dim() == static_cast<int64_t>(in.shape.size());
    for (const at::Tensor& p : parts) {
      if (!p.sizes().equals(parts[0].sizes()) ||
          p.scalar_type() != parts[0].scalar_type()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": its samples differ in shape or dtype (",
            quantization::internal::DescribeTensor(parts[0]), " and ",
            quantization::internal::DescribeTensor(p), ")"));
      }
    }
    t = has_batch_dim ? at::cat(parts) : at::stack(parts);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is a ", value.tagKind(), ", expected a tensor"));
  }
  const std::string like =
      in.dtype.empty()
          ? std::string()
          : absl::StrCat(" like the model's example input ", in.dtype, "[",
                         absl::StrJoin(in.shape, ", "), "]");
  const bool is_float = at::isFloatingType(t.scalar_type());
  const bool is_int = at::isIntegralType(t.scalar_type(), /*includeBool=*/true);
  if ((want_float && !is_float) || (want_int && !is_int)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " must be ", want_float ? "a floating-point" : "an integer",
        " tensor", like, ", got ", quantization::internal::DescribeTensor(t)));
  }
  if (!is_float && !is_int) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " must be a real tensor, got ",
                     quantization::internal::DescribeTensor(t)));
  }
  if (!in.shape.empty()) {
    const int64_t rank = static_cast<int64_t>(in.shape.size());
    if (t.dim() == rank - 1 && rank > 1) t = t.unsqueeze(0);  // One sample.
    if (t.dim() != rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " must have rank ", rank, " ([N, ...]", like,
                       "), got ", quantization::internal::DescribeTensor(t)));
    }
  }
  if (t.dim() == 0 || t.size(0) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " holds no samples (", quantization::internal::DescribeTensor(t),
        "; the first dimension is the sample)"));
  }
  if (t.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is empty: ", quantization::internal::DescribeTensor(t)));
  }
  if (is_float) {
    at::Tensor bad = t.isfinite().logical_not();
    if (bad.any().item<bool>()) {
      const int64_t sample = bad.nonzero()[0][0].item<int64_t>();
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has NaN or Inf values (", bad.sum().item<int64_t>(),
          ", the first in sample ", sample, ")"));
    }
  }
  if (std::optional<at::ScalarType> type = ScalarTypeOf(in.dtype)) {
    if (t.scalar_type() != *type) {
      at::Tensor converted = t.to(*type);
      if (!is_float && !at::isFloatingType(*type) &&
          !converted.to(t.scalar_type()).equal(t)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": its values do not fit ", in.dtype, " (",
                         quantization::internal::DescribeTensor(t), ")"));
      }
      t = converted;
    }
  }
  return t.contiguous();
}

}  // namespace

std::string DescribeModelInputs(const ModelInputs& model) {
  std::vector<std::string> parts;
  for (const ModelInput& in : model.inputs) parts.push_back(DescribeInput(in));
  return absl::StrJoin(parts, ", ");
}

bool TakesTokensOnly(const std::vector<std::string>& input_names) {
  bool tokens = false;
  for (const std::string& name : input_names) {
    if (!IsMadeFromTokens(name)) return false;
    tokens |= IsTokenName(name);
  }
  return tokens;
}

// Input `name`, which the data leaves out, made from the token ids `like`
// as the model assumes it (IsMadeFromTokens).
at::Tensor MadeFromTokens(const std::string& name, const at::Tensor& like) {
  if (IsTokenName(name)) return like;
  if (name == "attention_mask" || name == "decoder_attention_mask") {
    return at::ones_like(like);
  }
  if (name == "token_type_ids") return at::zeros_like(like);
  return at::arange(like.size(1), at::kLong).expand_as(like).contiguous();
}

absl::StatusOr<CalibrationData> MakeFeatureData(
    const std::vector<std::pair<std::string, c10::IValue>>& values,
    const ModelInputs& model, int64_t batch_size, std::string source) {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be >= 1, got ", batch_size));
  }
  const std::string file = absl::StrCat("calibration data '", source, "'");
  return runtime::TorchCall(file, [&]() -> absl::StatusOr<CalibrationData> {
    std::map<std::string, at::Tensor> given;
    std::string first;  // The input that sets N.
    // Token-derived values the model was traced without, left out because
    // they hold what the model assumes; they must still describe the same
    // tokens (checked below), or the data is not what the user thinks.
    std::vector<std::pair<std::string, at::Tensor>> dropped;
    for (const auto& [name, value] : values) {
      const ModelInput* in = nullptr;
      for (const ModelInput& m : model.inputs) {
        if (m.name == name) in = &m;
      }
      const std::string where = absl::StrCat(file, ": input '", name, "'");
      if (in == nullptr) {
        if (IsMadeFromTokens(name) && !IsTokenName(name)) {
          // A tokenizer's attention_mask of ones (as a tensor or as lists)
          // is what the model assumes anyway.
          absl::StatusOr<at::Tensor> t = value.isTensor()
                                             ? value.toTensor()
                                             : TokensFromIValue(value, where);
          if (t.ok() && IsDefaultValue(name, *t)) {
            dropped.emplace_back(name, *t);
            continue;
          }
        }
        return absl::InvalidArgumentError(absl::StrCat(
            file, " has '", name, "', which is not an input of the model (",
            DescribeModelInputs(model), ")",
            IsMadeFromTokens(name)
                ? "; the model was traced without it: leave it out, or "
                  "trace with it (--input / --example-inputs)"
                : ""));
      }
      ASSIGN_OR_RETURN(at::Tensor t, InputTensor(value, *in, where));
      if (!first.empty() && t.size(0) != given[first].size(0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " has ", t.size(0), " samples, but '", first, "' has ",
            given[first].size(0),
            " (the first dimension of every input is the sample)"));
      }
      if (first.empty()) first = name;
      given[name] = t;
    }
    // Token ids: ranges, and what is made from them.
    const at::Tensor* ids = nullptr;
    for (const char* name : {"input_ids", "decoder_input_ids"}) {
      auto it = given.find(name);
      if (it == given.end()) continue;
      absl::Status s = CheckTokens(it->second, model.limits, source);
      if (!s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat(s.message(), " (input '", name, "')"));
      }
      if (ids == nullptr) ids = &it->second;
    }
    for (const auto& [name, t] : dropped) {
      auto like = given.find(name == "decoder_attention_mask" &&
                                     given.contains("decoder_input_ids")
                                 ? "decoder_input_ids"
                                 : "input_ids");
      if (like == given.end() && ids != nullptr) {
        like = given.find("decoder_input_ids");
      }
      const bool same =
          like != given.end()
              ? t.sizes() == like->second.sizes()
              : first.empty() ||
                    (t.dim() > 0 && t.size(0) == given[first].size(0));
      if (!same) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": input '", name, "' has shape [",
            absl::StrJoin(t.sizes(), ", "), "], but ",
            like != given.end()
                ? absl::StrCat("'", like->first, "' has [",
                               absl::StrJoin(like->second.sizes(), ", "), "]")
                : absl::StrCat("'", first, "' has ", given[first].size(0),
                               " samples"),
            " (the model was traced without '", name,
            "', but it must still match the tokens it describes)"));
      }
    }
    CalibrationData data;
    data.source = source;
    std::vector<at::Tensor> tensors;
    for (const ModelInput& in : model.inputs) {
      data.input_names.push_back(in.name);
      auto it = given.find(in.name);
      at::Tensor t;
      if (it != given.end()) {
        t = it->second;
      } else if (IsMadeFromTokens(in.name) && ids != nullptr) {
        const at::Tensor& like = in.name == "decoder_attention_mask" &&
                                         given.contains("decoder_input_ids")
                                     ? given["decoder_input_ids"]
                                     : *ids;
        t = MadeFromTokens(in.name, like);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            file, " has no '", in.name, "', which the model takes (",
            DescribeModelInputs(model), ")"));
      }
      tensors.push_back(t);
    }
    if (tensors.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": the model takes no inputs"));
    }
    const int64_t n = tensors[0].size(0);
    data.num_samples = n;
    if (ids != nullptr) {
      data.tokens = ids->to(at::kLong).contiguous();
      data.seq_len = data.min_seq_len = ids->size(1);
    }
    uint64_t h = util::Fnv1a64(absl::StrCat("features/", batch_size));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& t = tensors[i];
      std::string d = absl::StrCat(data.input_names[i], ": ",
                                   quantization::internal::DescribeTensor(t));
      h = util::Fnv1a64(d, h);
      h = util::Fnv1a64(
          absl::string_view(static_cast<const char*>(t.data_ptr()),
                            t.numel() * t.element_size()),
          h);
      data.descriptions.push_back(std::move(d));
    }
    data.fingerprint = h;
    for (int64_t start = 0; start < n; start += batch_size) {
      const int64_t len = std::min(batch_size, n - start);
      std::vector<c10::IValue> batch;
      for (const at::Tensor& t : tensors) {
        batch.emplace_back(t.narrow(0, start, len).clone());
      }
      data.batches.push_back(std::move(batch));
    }
    return data;
  });
}

namespace {

// The token ids of `dict` when it holds samples of different lengths under
// "input_ids" and nothing else but an "attention_mask" of ones of the same
// lengths; nullopt for any other dict (MakeFeatureData's to read).
absl::StatusOr<std::optional<TokenIds>> RaggedTokenDict(
    const c10::impl::GenericDict& dict, const std::string& path) {
  auto ids_it = dict.find(c10::IValue("input_ids"));
  if (ids_it == dict.end() || !ids_it->value().isList()) return std::nullopt;
  for (const auto& e : dict) {
    if (!e.key().isString() || (e.key().toStringRef() != "input_ids" &&
                                e.key().toStringRef() != "attention_mask")) {
      return std::nullopt;
    }
  }
  absl::StatusOr<TokenIds> ids =
      internal::TokenIdsFromIValue(ids_it->value(), path);
  if (!ids.ok() || !ids->ragged()) return std::nullopt;
  auto mask_it = dict.find(c10::IValue("attention_mask"));
  if (mask_it != dict.end()) {
    absl::StatusOr<TokenIds> mask = internal::TokenIdsFromIValue(
        mask_it->value(), absl::StrCat(path, ": attention_mask"));
    if (!mask.ok()) return mask.status();
    const bool ones =
        mask->ragged() && mask->samples.size() == ids->samples.size() &&
        std::equal(
            mask->samples.begin(), mask->samples.end(), ids->samples.begin(),
            [](const at::Tensor& m, const at::Tensor& t) {
              return m.numel() == t.numel() && m.eq(1).all().item<bool>();
            });
    if (!ones) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration data '", path,
          "': the attention_mask of samples of different lengths must be "
          "ones of each sample's length (tracecut does not pad; padding "
          "tokens are left out of calibration)"));
    }
  }
  return std::optional<TokenIds>(*std::move(ids));
}

}  // namespace

absl::StatusOr<CalibrationData> LoadCalibrationData(const std::string& path,
                                                    const ModelInputs& model,
                                                    int64_t batch_size) {
  std::vector<std::string> names;
  for (const ModelInput& in : model.inputs) names.push_back(in.name);
  const bool tokens_only = TakesTokensOnly(names);
  auto as_tokens = [&](const TokenIds& ids) -> absl::StatusOr<CalibrationData> {
    if (ids.ragged()) {
      return MakeRaggedCalibrationData(ids.samples, model.limits, names,
                                       batch_size, path);
    }
    RETURN_IF_ERROR(CheckTokens(ids.ids, model.limits, path));
    return MakeCalibrationData(ids.ids, names, batch_size, path);
  };
  ASSIGN_OR_RETURN(std::string bytes, internal::ReadDataFile(path));
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration data '", path, "': the file is empty"));
  }
  c10::IValue value;
  if (tracer::LooksLikeSafetensors(bytes)) {
    ASSIGN_OR_RETURN(
        std::shared_ptr<const checkpoint::SafetensorsFile> file,
        checkpoint::SafetensorsFile::FromBytes(std::move(bytes), path));
    std::vector<std::pair<std::string, c10::IValue>> values;
    for (const std::string& name : file->names()) {
      ASSIGN_OR_RETURN(at::Tensor t, file->Get(name));
      values.emplace_back(name, t);
    }
    return MakeFeatureData(values, model, batch_size, path);
  }
  if (!internal::IsTorchSave(bytes)) {
    if (!tokens_only) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration data '", path,
          "' is neither a torch.save file nor a .safetensors file (JSON "
          "lines give token ids, but the model takes ",
          DescribeModelInputs(model), ")"));
    }
    ASSIGN_OR_RETURN(TokenIds ids,
                     internal::TokenIdsFromJsonLines(bytes, path));
    return as_tokens(ids);
  }
  ASSIGN_OR_RETURN(value, internal::Unpickle(bytes, path));
  if (tokens_only && (value.isTensor() || value.isList())) {
    ASSIGN_OR_RETURN(TokenIds ids, internal::TokenIdsFromIValue(value, path));
    return as_tokens(ids);
  }
  if (tokens_only && value.isGenericDict()) {
    // A tokenizer's output without padding: {"input_ids": samples of
    // different lengths, "attention_mask": ones of the same lengths}.
    absl::StatusOr<std::optional<TokenIds>> ragged =
        RaggedTokenDict(value.toGenericDict(), path);
    if (!ragged.ok()) return ragged.status();
    if (ragged->has_value()) return as_tokens(**ragged);
  }
  std::vector<std::pair<std::string, c10::IValue>> values;
  if (value.isGenericDict()) {
    for (const auto& e : value.toGenericDict()) {
      if (!e.key().isString()) {
        return absl::InvalidArgumentError(
            absl::StrCat("calibration data '", path, "' is a dict with a ",
                         e.key().tagKind(), " key; keys are input names (",
                         DescribeModelInputs(model), ")"));
      }
      values.emplace_back(e.key().toStringRef(), e.value());
    }
  } else {
    std::vector<c10::IValue> items;
    if (value.isTuple()) {
      items = value.toTupleRef().elements().vec();
    } else if (value.isList()) {
      items = value.toListRef().vec();
    } else {
      items = {value};
    }
    if (items.size() > model.inputs.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration data '", path, "' holds ", items.size(),
                       " values, but the model takes ", model.inputs.size(),
                       " (", DescribeModelInputs(model), ")"));
    }
    for (size_t i = 0; i < items.size(); ++i) {
      values.emplace_back(model.inputs[i].name, items[i]);
    }
  }
  return MakeFeatureData(values, model, batch_size, path);
}

}  // namespace tracecut::pipelines
