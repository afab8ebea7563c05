#include "pipelines/calibration_data.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "checkpoint/safetensors.h"
#include "pipelines/calibration_data_internal.h"
#include "pipelines/interrupt.h"
#include "quantization/quantize.h"
#include "runtime/torch_status.h"
#include "tracer/input_files.h"
#include "util/hash.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

using util::Json;

// One sample from a JSON line: an int array or {"input_ids": [...]}.
absl::StatusOr<std::vector<int64_t>> SampleFromJson(const Json& v,
                                                    absl::string_view where) {
  const Json* ids = &v;
  if (v.is_object()) {
    ids = util::FindMember(v, "input_ids");
    if (ids == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": an object without \"input_ids\""));
    }
  }
  if (!ids->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected an array of token ids, got ",
                     util::JsonTypeName(*ids)));
  }
  std::vector<int64_t> out;
  out.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const Json& e = (*ids)[i];
    if (!e.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": token ", i, " is a ", util::JsonTypeName(e),
                       ", expected an integer"));
    }
    out.push_back(e.get<int64_t>());
  }
  return out;
}

// Samples as TokenIds: stacked when they share one length.
absl::StatusOr<TokenIds> ToTokenIds(
    const std::vector<std::vector<int64_t>>& samples,
    absl::string_view source) {
  if (samples.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration data '", source, "': no samples"));
  }
  TokenIds out;
  const size_t seq = samples[0].size();
  const bool same = std::all_of(samples.begin(), samples.end(),
                                [&](const auto& s) { return s.size() == seq; });
  if (!same) {
    // One tensor each: a bound on their count bounds the memory.
    constexpr size_t kMaxRaggedSamples = size_t{1} << 20;
    if (samples.size() > kMaxRaggedSamples) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration data '", source, "': ", samples.size(),
                       " samples of different lengths, more than the ",
                       kMaxRaggedSamples, " tracecut takes"));
    }
    for (const auto& s : samples) {
      out.samples.push_back(
          at::tensor(at::ArrayRef<int64_t>(s), at::kLong).clone());
    }
    return out;
  }
  out.ids = at::empty(
      {static_cast<int64_t>(samples.size()), static_cast<int64_t>(seq)},
      at::kLong);
  int64_t* data = out.ids.data_ptr<int64_t>();
  for (const auto& s : samples) {
    std::copy(s.begin(), s.end(), data);
    data += seq;
  }
  return out;
}

// The [N, seq] tensor of `ids`; InvalidArgument when the samples differ in
// length.
absl::StatusOr<at::Tensor> Stacked(const TokenIds& ids,
                                   absl::string_view source) {
  if (!ids.ragged()) return ids.ids;
  for (size_t i = 1; i < ids.samples.size(); ++i) {
    if (ids.samples[i].numel() != ids.samples[0].numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration data '", source, "': sample ", i, " has ",
          ids.samples[i].numel(), " tokens, but sample 0 has ",
          ids.samples[0].numel(), " (a tensor [N, seq] needs one length)"));
    }
  }
  return absl::InternalError("ragged token ids of one length");
}

// A sample from one element of an unpickled list.
absl::StatusOr<std::vector<int64_t>> SampleFromIValue(
    const c10::IValue& v, const std::string& where) {
  c10::IValue ids = v;
  if (v.isGenericDict()) {
    auto dict = v.toGenericDict();
    auto it = dict.find(c10::IValue("input_ids"));
    if (it == dict.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a dict without \"input_ids\""));
    }
    ids = it->value();
  }
  if (ids.isTensor()) {
    at::Tensor t = ids.toTensor();
    if (t.dim() == 2 && t.size(0) == 1) t = t[0];
    if (t.dim() != 1 || !at::isIntegralType(t.scalar_type(), false)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": token ids must be a 1-D integer tensor, got ",
                       quantization::internal::DescribeTensor(t)));
    }
    t = t.to(at::kLong).contiguous();
    return std::vector<int64_t>(t.data_ptr<int64_t>(),
                                t.data_ptr<int64_t>() + t.numel());
  }
  if (ids.isList()) {
    std::vector<int64_t> out;
    for (const c10::IValue& e : ids.toListRef()) {
      if (!e.isInt()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": token ", out.size(), " is a ", e.tagKind(),
                         ", expected an int"));
      }
      out.push_back(e.toInt());
    }
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": expected token ids (a tensor or an int list), got ",
      ids.tagKind()));
}

}  // namespace

namespace internal {

absl::StatusOr<std::string> ReadDataFile(const std::string& path) {
  // Reading a directory through a filebuf throws std::ios_base::failure.
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration data '", path, "': is a directory"));
  }
  // The file is held in memory (twice while it is unpickled): refused by
  // its size before any allocation. 4 GiB is 65536 samples of 8192 int64
  // tokens, far past what calibration uses (llm-compressor's default: 512).
  constexpr int64_t kMaxDataBytes = int64_t{4} << 30;
  if (S_ISREG(st.st_mode) && st.st_size > kMaxDataBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration data '", path, "': ", st.st_size, " bytes, more than the ",
        kMaxDataBytes, " tracecut reads; use fewer or shorter samples"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("calibration data '", path, "': cannot open the file"));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("calibration data '", path, "': read error"));
  }
  return bytes;
}

absl::StatusOr<TokenIds> TokenIdsFromJsonLines(const std::string& text,
                                               const std::string& path) {
  std::vector<std::vector<int64_t>> samples;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::string loc = absl::StrCat(path, ":", line_no);
    ASSIGN_OR_RETURN(Json v, util::ParseJson(line, loc));
    ASSIGN_OR_RETURN(std::vector<int64_t> s, SampleFromJson(v, loc));
    samples.push_back(std::move(s));
  }
  return ToTokenIds(samples, path);
}

bool IsTorchSave(const std::string& bytes) {
  const bool zip = bytes.size() >= 4 && bytes.compare(0, 2, "PK") == 0;
  const bool pickle = static_cast<unsigned char>(bytes[0]) == 0x80;
  return zip || pickle;
}

absl::StatusOr<c10::IValue> Unpickle(const std::string& bytes,
                                     const std::string& path) {
  std::vector<char> data(bytes.begin(), bytes.end());
  absl::StatusOr<c10::IValue> value =
      runtime::TorchCall(absl::StrCat("calibration data '", path,
                                      "': cannot read it as a torch.save file"),
                         [&] { return torch::jit::pickle_load(data); });
  if (value.ok()) return value;
  std::string hint;
  if (absl::StrContains(value.status().message(), "Unknown opcode") ||
      absl::StrContains(value.status().message(), "unknown type")) {
    // LibTorch's unpickler implements only what torch.save of tensors,
    // lists, tuples and dicts needs (e.g. no sets, no other classes).
    hint =
        " (LibTorch reads only part of Python's pickle format: save "
        "tensors, or tuples, lists or dicts of them, e.g. torch.save(ids, "
        "path); or a .safetensors file; or token ids as JSON lines)";
  }
  return absl::InvalidArgumentError(
      absl::StrCat(value.status().message(), hint));
}

}  // namespace internal

namespace internal {

absl::StatusOr<TokenIds> TokenIdsFromIValue(const c10::IValue& value,
                                            absl::string_view source) {
  return runtime::TorchCall(
      absl::StrCat("calibration data '", source, "'"),
      [&]() -> absl::StatusOr<TokenIds> {
        const std::string src(source);
        if (value.isTensor()) {
          at::Tensor t = value.toTensor();
          if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "calibration data '", source,
                "': token ids must be an integer tensor [N, seq], got ",
                quantization::internal::DescribeTensor(t)));
          }
          if (t.dim() == 1) t = t.unsqueeze(0);
          if (t.dim() != 2) {
            return absl::InvalidArgumentError(
                absl::StrCat("calibration data '", source,
                             "': token ids must have shape [N, seq], got ",
                             quantization::internal::DescribeTensor(t)));
          }
          TokenIds out;
          out.ids = t.to(at::kLong).contiguous();
          return out;
        }
        if (value.isGenericDict()) {
          auto dict = value.toGenericDict();
          auto it = dict.find(c10::IValue("input_ids"));
          if (it == dict.end()) {
            return absl::InvalidArgumentError(
                absl::StrCat("calibration data '", source,
                             "': a dict without \"input_ids\""));
          }
          return TokenIdsFromIValue(it->value(), source);
        }
        if (value.isList()) {
          std::vector<std::vector<int64_t>> samples;
          size_t i = 0;
          for (const c10::IValue& e : value.toListRef()) {
            std::string loc = absl::StrCat(src, ": sample ", i++);
            ASSIGN_OR_RETURN(std::vector<int64_t> s, SampleFromIValue(e, loc));
            samples.push_back(std::move(s));
          }
          return ToTokenIds(samples, source);
        }
        return absl::InvalidArgumentError(absl::StrCat(
            "calibration data '", source,
            "': expected a tensor of token ids [N, seq], a dict with "
            "\"input_ids\" or a list of samples, got ",
            value.tagKind()));
      });
}

}  // namespace internal

absl::StatusOr<at::Tensor> TokensFromIValue(const c10::IValue& value,
                                            absl::string_view source) {
  ASSIGN_OR_RETURN(TokenIds ids, internal::TokenIdsFromIValue(value, source));
  return Stacked(ids, source);
}

absl::StatusOr<at::Tensor> LoadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, internal::ReadDataFile(path));
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration data '", path, "': the file is empty"));
  }
  if (internal::IsTorchSave(bytes)) {
    ASSIGN_OR_RETURN(c10::IValue value, internal::Unpickle(bytes, path));
    return TokensFromIValue(value, path);
  }
  ASSIGN_OR_RETURN(TokenIds ids, internal::TokenIdsFromJsonLines(bytes, path));
  return Stacked(ids, path);
}

// Batches of calibration data tracecut holds at once.
constexpr int64_t kMaxBatches = 1 << 16;

absl::StatusOr<at::Tensor> SyntheticTokens(int64_t num_samples, int64_t seq_len,
                                           int64_t vocab_size, uint64_t seed) {
  if (num_samples < 1 || seq_len < 1 || vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "synthetic data: need samples, sequence length and vocabulary size "
        ">= 1, got %d, %d, %d",
        num_samples, seq_len, vocab_size));
  }
  if (num_samples > kMaxBatches || seq_len > (int64_t{1} << 24) ||
      num_samples * seq_len > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "synthetic data: %d samples of %d tokens is far more than "
        "calibration needs (at most %d samples and 2^30 tokens)",
        num_samples, seq_len, kMaxBatches));
  }
  return runtime::TorchCall(
      "synthetic data", [&]() -> absl::StatusOr<at::Tensor> {
        at::Generator gen = at::detail::createCPUGenerator(seed);
        return at::randint(0, vocab_size, {num_samples, seq_len}, gen,
                           at::TensorOptions().dtype(at::kLong));
      });
}

namespace {

absl::Status CheckLength(int64_t length, const TokenLimits& limits,
                         absl::string_view source) {
  if (limits.seq_lens.empty()) return absl::OkStatus();
  std::vector<std::string> ranges;
  for (const tracer::hf::LengthRange& r : limits.seq_lens) {
    if (length >= r.min && (!r.max || length <= *r.max)) {
      return absl::OkStatus();
    }
    // A scan valid at every multiple of its chunk has hundreds.
    if (ranges.size() == 8) {
      ranges.push_back(
          absl::StrCat("... (", limits.seq_lens.size(), " ranges in all)"));
    }
    if (ranges.size() > 8) continue;
    ranges.push_back(r.max
                         ? (r.min == *r.max ? absl::StrCat(r.min)
                                            : absl::StrCat(r.min, "-", *r.max))
                         : absl::StrCat(r.min, " and more"));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "calibration data '%s': samples of %d tokens, but %s is valid for "
      "sequence lengths %s only (torch.export unrolled the model's code for "
      "its example's length, and would compute wrong values for others); "
      "export it again with --seq-len=%d, and calibrate on samples of "
      "lengths that export allows",
      source, length, limits.program.empty() ? "the program" : limits.program,
      absl::StrJoin(ranges, ", "), length));
}

}  // namespace

absl::Status CheckTokens(const at::Tensor& tokens, const TokenLimits& limits,
                         absl::string_view source) {
  return runtime::TorchCall(
      absl::StrCat("calibration data '", source, "'"), [&]() -> absl::Status {
        if (!tokens.defined() ||
            !at::isIntegralType(tokens.scalar_type(), false) ||
            tokens.dim() != 2 || tokens.size(0) < 1 || tokens.size(1) < 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "calibration data '", source,
              "': token ids must be a non-empty integer tensor [N, seq], got ",
              tokens.defined() ? quantization::internal::DescribeTensor(tokens)
                               : "nothing"));
        }
        if (limits.max_seq_len && tokens.size(1) > *limits.max_seq_len) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "calibration data '%s': sequence length %d exceeds the model's "
              "max_position_embeddings %d",
              source, tokens.size(1), *limits.max_seq_len));
        }
        RETURN_IF_ERROR(CheckLength(tokens.size(1), limits, source));
        at::Tensor t = tokens.to(at::kLong);
        at::Tensor bad = t < 0;
        if (limits.vocab_size) bad = bad.logical_or(t >= *limits.vocab_size);
        if (bad.any().item<bool>()) {
          at::Tensor where = bad.nonzero()[0];
          int64_t i = where[0].item<int64_t>();
          int64_t j = where[1].item<int64_t>();
          return absl::InvalidArgumentError(absl::StrFormat(
              "calibration data '%s': token id %d at sample %d, position %d "
              "is out of range [0, %s) (%d ids out of range in all)",
              source, t[i][j].item<int64_t>(), i, j,
              limits.vocab_size ? absl::StrCat(*limits.vocab_size) : "inf",
              bad.sum().item<int64_t>()));
        }
        return absl::OkStatus();
      });
}

namespace {

absl::Status CheckBatchingAndNames(int64_t batch_size,
                                   const std::vector<std::string>& names) {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be >= 1, got ", batch_size));
  }
  for (const std::string& name : names) {
    if (name != "input_ids" && name != "decoder_input_ids" &&
        name != "attention_mask" && name != "token_type_ids" &&
        name != "position_ids") {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model takes an input '", name,
          "' that cannot be made from token ids (known: input_ids, "
          "decoder_input_ids, attention_mask, token_type_ids, position_ids)"));
    }
  }
  return absl::OkStatus();
}

// Each batch is kept (and cached between subgraphs): far more than
// calibration needs (llm-compressor's default is 512 samples) only exhausts
// memory before the first progress line.
absl::Status CheckBatchCount(int64_t samples, int64_t batches,
                             absl::string_view source) {
  if (batches <= kMaxBatches) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "calibration data '", source, "': ", samples, " samples in ", batches,
      " batches, more than the ", kMaxBatches,
      " tracecut takes; use fewer samples or a larger --batch-size"));
}

// One value per model input, made from token ids [batch, seq].
std::vector<c10::IValue> BatchFromIds(const at::Tensor& ids,
                                      const std::vector<std::string>& names) {
  std::vector<c10::IValue> values;
  for (const std::string& name : names) {
    if (name == "input_ids" || name == "decoder_input_ids") {
      values.emplace_back(ids);
    } else if (name == "attention_mask") {
      values.emplace_back(at::ones_like(ids));
    } else if (name == "token_type_ids") {
      values.emplace_back(at::zeros_like(ids));
    } else {
      values.emplace_back(
          at::arange(ids.size(1), at::kLong).expand_as(ids).clone());
    }
  }
  return values;
}

uint64_t HashIds(const at::Tensor& ids, uint64_t h) {
  return util::Fnv1a64(
      absl::string_view(reinterpret_cast<const char*>(ids.data_ptr<int64_t>()),
                        ids.numel() * sizeof(int64_t)),
      h);
}

}  // namespace

absl::StatusOr<CalibrationData> MakeCalibrationData(
    const at::Tensor& tokens, const std::vector<std::string>& input_names,
    int64_t batch_size, std::string source) {
  RETURN_IF_ERROR(CheckBatchingAndNames(batch_size, input_names));
  RETURN_IF_ERROR(CheckTokens(tokens, TokenLimits(), source));
  return runtime::TorchCall(
      "calibration data", [&]() -> absl::StatusOr<CalibrationData> {
        CalibrationData data;
        data.input_names = input_names;
        data.tokens = tokens.to(at::kLong).contiguous();
        data.num_samples = data.tokens.size(0);
        data.seq_len = data.min_seq_len = data.tokens.size(1);
        data.source = std::move(source);
        const int64_t n = data.num_samples;
        RETURN_IF_ERROR(
            CheckBatchCount(n, (n + batch_size - 1) / batch_size, data.source));
        for (int64_t start = 0; start < n; start += batch_size) {
          // SIGINT / SIGTERM are honoured here too, not only between
          // calibration batches.
          if (start % 1024 == 0) RETURN_IF_ERROR(CheckInterrupt());
          int64_t len = std::min(batch_size, n - start);
          data.batches.push_back(BatchFromIds(
              data.tokens.narrow(0, start, len).clone(), input_names));
        }
        std::string layout =
            absl::StrCat(n, "x", data.seq_len, "/", batch_size);
        data.fingerprint = HashIds(data.tokens, util::Fnv1a64(layout));
        return data;
      });
}

std::string SeqLenText(const CalibrationData& data) {
  if (data.min_seq_len == 0 || data.min_seq_len == data.seq_len) {
    return absl::StrCat(data.seq_len);
  }
  return absl::StrCat(data.min_seq_len, "-", data.seq_len);
}

absl::StatusOr<CalibrationData> MakeRaggedCalibrationData(
    const std::vector<at::Tensor>& samples, const TokenLimits& limits,
    const std::vector<std::string>& input_names, int64_t batch_size,
    std::string source) {
  RETURN_IF_ERROR(CheckBatchingAndNames(batch_size, input_names));
  if (samples.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration data '", source, "': no samples"));
  }
  return runtime::TorchCall(
      absl::StrCat("calibration data '", source, "'"),
      [&]() -> absl::StatusOr<CalibrationData> {
        CalibrationData data;
        data.input_names = input_names;
        data.num_samples = static_cast<int64_t>(samples.size());
        data.source = std::move(source);
        data.min_seq_len = samples[0].numel();
        uint64_t h = util::Fnv1a64(
            absl::StrCat("ragged/", samples.size(), "/", batch_size));
        std::vector<at::Tensor> ids;
        for (size_t i = 0; i < samples.size(); ++i) {
          // Each sample checked as a tensor [1, len], its errors renamed.
          at::Tensor t = samples[i].reshape({1, -1}).to(at::kLong).contiguous();
          absl::Status ok = CheckTokens(t, limits, data.source);
          if (!ok.ok()) {
            const std::string at = absl::StrCat("at sample ", i, ",");
            std::string message(ok.message());
            return absl::InvalidArgumentError(
                absl::StrContains(message, "at sample 0,")
                    ? absl::StrReplaceAll(message, {{"at sample 0,", at}})
                    : absl::StrCat(message, " (sample ", i, ")"));
          }
          data.seq_len = std::max(data.seq_len, t.size(1));
          data.min_seq_len = std::min(data.min_seq_len, t.size(1));
          h = HashIds(t, util::Fnv1a64(absl::StrCat("/", t.size(1)), h));
          ids.push_back(std::move(t));
        }
        data.fingerprint = h;
        // A batch holds consecutive samples of one length: no padding, so
        // every token is a real one, as with llm-compressor's batches of 1.
        std::vector<std::pair<size_t, size_t>> runs;
        for (size_t start = 0; start < ids.size();) {
          size_t end = start + 1;
          while (end < ids.size() &&
                 end - start < static_cast<size_t>(batch_size) &&
                 ids[end].size(1) == ids[start].size(1)) {
            ++end;
          }
          runs.emplace_back(start, end);
          start = end;
        }
        RETURN_IF_ERROR(CheckBatchCount(
            data.num_samples, static_cast<int64_t>(runs.size()), data.source));
        for (const auto& [start, end] : runs) {
          if (data.batches.size() % 1024 == 0) {
            RETURN_IF_ERROR(CheckInterrupt());
          }
          std::vector<at::Tensor> rows(ids.begin() + start, ids.begin() + end);
          data.batches.push_back(BatchFromIds(at::cat(rows, 0), input_names));
        }
        return data;
      });
}

absl::StatusOr<CalibrationData> ShardCalibrationData(
    const CalibrationData& data, int rank, int world_size) {
  if (world_size <= 1) return data;
  // samples[j][i]: input i of sample j.
  std::vector<std::vector<at::Tensor>> samples;
  int64_t batch_size = 1;
  for (size_t b = 0; b < data.batches.size(); ++b) {
    const std::vector<c10::IValue>& batch = data.batches[b];
    int64_t n = -1;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t size = batch[i].isTensor() && batch[i].toTensor().dim() > 0
                               ? batch[i].toTensor().size(0)
                               : -1;
      if (size < 0 || (n >= 0 && size != n)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "data-parallel calibration splits the samples of %s along the "
            "first dimension, but input '%s' of batch %d is not a tensor "
            "with the batch's samples there",
            data.source,
            i < data.input_names.size() ? data.input_names[i] : "?", b));
      }
      n = size;
    }
    batch_size = std::max(batch_size, n);
    for (int64_t j = 0; j < n; ++j) {
      std::vector<at::Tensor> sample;
      for (const c10::IValue& v : batch) {
        sample.push_back(v.toTensor().narrow(0, j, 1));
      }
      samples.push_back(std::move(sample));
    }
  }
  std::vector<size_t> mine;
  for (size_t j = rank; j < samples.size(); j += world_size) mine.push_back(j);
  if (mine.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d samples: too few for %d ranks (each needs one)", data.source,
        samples.size(), world_size));
  }
  CalibrationData out;
  out.input_names = data.input_names;
  out.seq_len = data.seq_len;
  out.min_seq_len = data.min_seq_len;
  out.descriptions = data.descriptions;
  out.num_samples = static_cast<int64_t>(mine.size());
  out.source =
      absl::StrFormat("%s, shard %d of %d", data.source, rank, world_size);
  out.fingerprint = data.fingerprint ^ (static_cast<uint64_t>(rank) << 48) ^
                    static_cast<uint64_t>(world_size);
  RETURN_IF_ERROR(runtime::TorchCall("sharding the calibration data", [&] {
    // Samples of different shapes (token ids of different lengths) go to
    // different batches.
    auto same_shapes = [&](size_t a, size_t b) {
      for (size_t i = 0; i < data.input_names.size(); ++i) {
        if (samples[mine[a]][i].sizes() != samples[mine[b]][i].sizes()) {
          return false;
        }
      }
      return true;
    };
    for (size_t start = 0, end = 0; start < mine.size(); start = end) {
      end = start + 1;
      while (end < mine.size() &&
             end - start < static_cast<size_t>(batch_size) &&
             same_shapes(start, end)) {
        ++end;
      }
      std::vector<c10::IValue> batch;
      for (size_t i = 0; i < data.input_names.size(); ++i) {
        std::vector<at::Tensor> parts;
        for (size_t j = start; j < end; ++j) {
          parts.push_back(samples[mine[j]][i]);
        }
        batch.emplace_back(at::cat(parts, 0));
      }
      out.batches.push_back(std::move(batch));
    }
    if (data.tokens.defined() &&
        data.tokens.size(0) == static_cast<int64_t>(samples.size())) {
      std::vector<int64_t> rows(mine.begin(), mine.end());
      out.tokens = data.tokens.index_select(0, at::tensor(rows, at::kLong));
    }
  }));
  return out;
}

}  // namespace tracecut::pipelines
