#include "checkpoint/compressed_tensors.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tracecut::checkpoint {
namespace {

// The codes' bit stream, `num_bits` bits per code, one row at a time.
void PackRows(const int8_t* codes, int64_t rows, int64_t cols, int num_bits,
              int32_t* out, int64_t words) {
  const int offset = 1 << (num_bits - 1);
  const uint32_t mask = (uint32_t{1} << num_bits) - 1;
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t* row = reinterpret_cast<uint32_t*>(out + r * words);
    std::memset(row, 0, words * sizeof(uint32_t));
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t value =
          static_cast<uint32_t>(codes[r * cols + c] + offset) & mask;
      const uint64_t bit = static_cast<uint64_t>(c) * num_bits;
      const uint64_t shifted = value << (bit % 32);
      row[bit / 32] |= static_cast<uint32_t>(shifted);
      if ((bit % 32) + num_bits > 32) {
        row[bit / 32 + 1] |= static_cast<uint32_t>(shifted >> 32);
      }
    }
  }
}

absl::Status CheckArgs(const CtLinear& linear) {
  const CtWeightArgs& a = linear.args;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed-tensors: module ", linear.path, ": ", why));
  };
  if (a.num_bits < 1 || a.num_bits > 8) {
    return bad(absl::StrCat(a.num_bits,
                            "-bit weights (pack-quantized "
                            "stores 1 to 8 bits)"));
  }
  if (!linear.weight.defined() || linear.weight.dim() != 2) {
    return bad("the weight is not a 2-D tensor");
  }
  const int64_t rows = linear.weight.size(0);
  const int64_t cols = linear.weight.size(1);
  const int64_t groups =
      a.group_size > 0 ? (cols + a.group_size - 1) / a.group_size : 1;
  if (!linear.scale.defined() || linear.scale.dim() != 2 ||
      linear.scale.size(0) != rows || linear.scale.size(1) != groups) {
    return bad(absl::StrCat("weight_scale must be [", rows, ", ", groups,
                            "] for this scheme"));
  }
  if (!linear.zero_point.defined() ||
      linear.zero_point.sizes() != linear.scale.sizes()) {
    return bad("weight_zero_point must have weight_scale's shape");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<torch::Tensor> PackToInt32(const torch::Tensor& codes,
                                          int num_bits, int dim) {
  if (num_bits < 1 || num_bits > 8 || codes.dim() != 2 ||
      codes.scalar_type() != torch::kChar || (dim != 0 && dim != 1)) {
    return absl::InvalidArgumentError(
        "PackToInt32 takes int8 [rows, cols] codes of 1 to 8 bits, dim 0 or 1");
  }
  torch::Tensor c = (dim == 1 ? codes : codes.t()).contiguous();
  const int64_t rows = c.size(0), cols = c.size(1);
  const int64_t words = (cols * num_bits + 31) / 32;
  torch::Tensor out = torch::empty({rows, words}, torch::kInt);
  PackRows(c.data_ptr<int8_t>(), rows, cols, num_bits, out.data_ptr<int32_t>(),
           words);
  return dim == 1 ? out : out.t().contiguous();
}

absl::StatusOr<std::vector<std::pair<std::string, torch::Tensor>>>
CompressLinear(const CtLinear& linear) {
  if (absl::Status s = CheckArgs(linear); !s.ok()) return s;
  const CtWeightArgs& a = linear.args;
  const int64_t cols = linear.weight.size(1);
  torch::Tensor scale = linear.scale.to(torch::kFloat);
  torch::Tensor zero = linear.zero_point.to(torch::kInt);
  // Each column's group: consecutive runs of group_size.
  torch::Tensor group =
      a.group_size > 0
          ? torch::arange(cols, torch::kLong).div(a.group_size, "floor")
          : torch::zeros({cols}, torch::kLong);
  torch::Tensor col_scale = scale.index_select(1, group);
  torch::Tensor col_zero = zero.index_select(1, group);
  const int64_t qmin = -(int64_t{1} << (a.num_bits - 1));
  const int64_t qmax = (int64_t{1} << (a.num_bits - 1)) - 1;
  torch::Tensor w = linear.weight.to(torch::kFloat);
  torch::Tensor codes =
      (torch::round(w / col_scale) + col_zero).clamp(qmin, qmax);
  torch::Tensor decoded =
      ((codes - col_zero) * col_scale).to(linear.weight.scalar_type());
  if (!torch::equal(decoded, linear.weight)) {
    torch::Tensor diff = (decoded.to(torch::kFloat) - w).abs();
    const int64_t flat = diff.flatten().argmax().item<int64_t>();
    return absl::FailedPreconditionError(absl::StrCat(
        "compressed-tensors: module ", linear.path,
        ": its weight is not (q - zero_point) * scale for integer codes q "
        "(first differing element at flat index ",
        flat, ", by ", diff.flatten()[flat].item<double>(),
        "); it was changed after quantization or stored in a dtype that "
        "cannot hold the dequantized values"));
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const std::string& p = linear.path;
  auto packed = PackToInt32(codes.to(torch::kChar), a.num_bits, 1);
  if (!packed.ok()) return packed.status();
  out.emplace_back(p + ".weight_packed", *packed);
  out.emplace_back(p + ".weight_scale", scale.contiguous());
  out.emplace_back(p + ".weight_shape",
                   torch::tensor(linear.weight.sizes().vec(), torch::kLong));
  if (!a.symmetric) {
    auto zp = PackToInt32(zero.to(torch::kChar), a.num_bits, 0);
    if (!zp.ok()) return zp.status();
    out.emplace_back(p + ".weight_zero_point", *zp);
  }
  return out;
}

absl::StatusOr<std::string> ConfigWithQuantization(
    const std::string& config_json,
    const std::vector<std::pair<std::string, CtWeightArgs>>& modules) {
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(config_json);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json is not valid JSON: ", e.what()));
  }
  if (!config.is_object()) {
    return absl::InvalidArgumentError("config.json is not a JSON object");
  }
  // Groups in order of first appearance.
  std::vector<std::pair<CtWeightArgs, std::vector<std::string>>> groups;
  for (const auto& [path, args] : modules) {
    auto it = groups.begin();
    while (it != groups.end() && !(it->first == args)) ++it;
    if (it == groups.end()) {
      groups.push_back({args, {}});
      it = groups.end() - 1;
    }
    it->second.push_back(path);
  }
  nlohmann::ordered_json config_groups = nlohmann::ordered_json::object();
  for (size_t i = 0; i < groups.size(); ++i) {
    const CtWeightArgs& a = groups[i].first;
    nlohmann::ordered_json weights = {
        {"num_bits", a.num_bits},
        {"type", "int"},
        {"symmetric", a.symmetric},
        {"strategy", a.group_size > 0 ? "group" : "channel"},
        {"group_size", a.group_size > 0 ? nlohmann::ordered_json(a.group_size)
                                        : nlohmann::ordered_json(nullptr)},
        {"block_structure", nullptr},
        {"dynamic", false},
        {"actorder", nullptr},
        {"observer", "minmax"},
        {"observer_kwargs", nlohmann::ordered_json::object()},
    };
    config_groups[absl::StrCat("group_", i)] = {
        {"targets", groups[i].second},  {"weights", weights},
        {"input_activations", nullptr}, {"output_activations", nullptr},
        {"format", "pack-quantized"},
    };
  }
  config["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"quantization_status", "compressed"},
      {"config_groups", config_groups},
      {"ignore", nlohmann::ordered_json::array()},
      {"kv_cache_scheme", nullptr},
      {"global_compression_ratio", nullptr},
  };
  return config.dump(2) + "\n";
}

}  // namespace tracecut::checkpoint
