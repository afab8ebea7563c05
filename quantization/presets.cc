// compressed-tensors' PRESET_SCHEMES (quantization/quant_scheme.py, 0.19),
// field for field. quant_args_test checks each against the installed
// compressed-tensors' own model_dump().

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "quantization/quant_args.h"
#include "util/status_macros.h"

namespace tracecut::quantization {
namespace {

constexpr c10::ScalarType kFp8 = c10::ScalarType::Float8_e4m3fn;
constexpr c10::ScalarType kE8m0 = c10::ScalarType::Byte;

QuantizationArgs IntGroupWeights(int bits, bool symmetric) {
  QuantizationArgs a;
  a.num_bits = bits;
  a.type = QuantType::kInt;
  a.strategy = Strategy::kGroup;
  a.group_size = 128;
  a.symmetric = symmetric;
  return a;
}

QuantizationArgs DynamicTokenActs(int bits, QuantType type) {
  QuantizationArgs a;
  a.num_bits = bits;
  a.type = type;
  a.strategy = Strategy::kToken;
  a.dynamic = Dynamic::kDynamic;
  return a;
}

// _int_wnam(weight_bits, act_bits).
QuantizationScheme IntWnAm(int weight_bits, int act_bits) {
  QuantizationScheme s;
  s.weights = IntGroupWeights(weight_bits, /*symmetric=*/true);
  if (act_bits < 16) {
    s.input_activations = DynamicTokenActs(act_bits, QuantType::kInt);
  }
  return s;
}

QuantizationArgs Fp8(Strategy strategy) {
  QuantizationArgs a;
  a.num_bits = 8;
  a.type = QuantType::kFloat;
  a.strategy = strategy;
  return a;
}

QuantizationArgs Nvfp4() {
  QuantizationArgs a;
  a.num_bits = 4;
  a.type = QuantType::kFloat;
  a.strategy = Strategy::kTensorGroup;
  a.group_size = 16;
  a.scale_dtype = kFp8;
  a.zp_dtype = kFp8;
  return a;
}

QuantizationArgs Mx(int bits) {
  QuantizationArgs a;
  a.num_bits = bits;
  a.type = QuantType::kFloat;
  a.strategy = Strategy::kGroup;
  a.group_size = 32;
  a.scale_dtype = kE8m0;
  a.zp_dtype = kE8m0;
  return a;
}

QuantizationScheme MxScheme(int bits, bool with_activations) {
  QuantizationScheme s;
  s.weights = Mx(bits);
  if (with_activations) {
    s.input_activations = Mx(bits);
    s.input_activations->dynamic = Dynamic::kDynamic;
  }
  return s;
}

struct Preset {
  std::string name;
  QuantizationScheme scheme;
};

std::vector<Preset> MakePresets() {
  std::vector<Preset> p;
  p.push_back({"UNQUANTIZED", QuantizationScheme{}});
  p.push_back({"W4A16_ASYM", QuantizationScheme{}});
  p.back().scheme.weights = IntGroupWeights(4, /*symmetric=*/false);
  QuantizationScheme w8a8;
  w8a8.weights = QuantizationArgs{};
  w8a8.weights->strategy = Strategy::kChannel;
  w8a8.input_activations = DynamicTokenActs(8, QuantType::kInt);
  p.push_back({"W8A8", w8a8});
  p.push_back({"INT8", w8a8});
  QuantizationScheme w4afp8;
  w4afp8.weights = IntGroupWeights(4, /*symmetric=*/true);
  w4afp8.input_activations = DynamicTokenActs(8, QuantType::kFloat);
  p.push_back({"W4AFP8", w4afp8});
  QuantizationScheme fp8;
  fp8.weights = Fp8(Strategy::kTensor);
  fp8.input_activations = Fp8(Strategy::kTensor);
  fp8.input_activations->observer = "static_minmax";
  p.push_back({"FP8", fp8});
  QuantizationScheme fp8_dynamic;
  fp8_dynamic.weights = Fp8(Strategy::kChannel);
  fp8_dynamic.input_activations = DynamicTokenActs(8, QuantType::kFloat);
  p.push_back({"FP8_DYNAMIC", fp8_dynamic});
  QuantizationScheme fp8_block;
  fp8_block.weights = Fp8(Strategy::kBlock);
  fp8_block.weights->block_structure = std::vector<int64_t>{128, 128};
  fp8_block.input_activations = Fp8(Strategy::kGroup);
  fp8_block.input_activations->group_size = 128;
  fp8_block.input_activations->dynamic = Dynamic::kDynamic;
  p.push_back({"FP8_BLOCK", fp8_block});
  QuantizationScheme nvfp4a16;
  nvfp4a16.weights = Nvfp4();
  p.push_back({"NVFP4A16", nvfp4a16});
  QuantizationScheme nvfp4 = nvfp4a16;
  nvfp4.input_activations = Nvfp4();
  nvfp4.input_activations->dynamic = Dynamic::kLocal;
  nvfp4.input_activations->observer = "static_minmax";
  p.push_back({"NVFP4", nvfp4});
  p.push_back({"MXFP4A16", MxScheme(4, false)});
  p.push_back({"MXFP4", MxScheme(4, true)});
  p.push_back({"MXFP8A16", MxScheme(8, false)});
  p.push_back({"MXFP8", MxScheme(8, true)});
  for (int w = 2; w <= 8; ++w) {
    for (int a : {4, 8, 16}) {
      if (w > a || (w == 8 && a == 8)) continue;  // W8A8 is the channel one.
      p.push_back({absl::StrCat("W", w, "A", a), IntWnAm(w, a)});
    }
  }
  return p;
}

const std::vector<Preset>& Presets() {
  static const auto* presets = new std::vector<Preset>(MakePresets());
  return *presets;
}

}  // namespace

const std::vector<std::string>& PresetNames() {
  static const auto* names = [] {
    auto* n = new std::vector<std::string>();
    for (const Preset& p : Presets()) n->push_back(p.name);
    return n;
  }();
  return *names;
}

absl::StatusOr<QuantizationScheme> PresetScheme(
    absl::string_view name, std::vector<std::string> targets) {
  const std::string upper = absl::AsciiStrToUpper(name);
  for (const Preset& p : Presets()) {
    if (p.name != upper) continue;
    QuantizationScheme scheme = p.scheme;
    scheme.targets = std::move(targets);
    RETURN_IF_ERROR(scheme.Resolve(absl::StrCat("preset ", p.name)));
    return scheme;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("scheme: unknown preset \"", name,
                   "\" (known: ", absl::StrJoin(PresetNames(), ", "), ")"));
}

}  // namespace tracecut::quantization
