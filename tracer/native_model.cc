#include "tracer/native_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "runtime/torch_status.h"
#include "tracer/torchscript_source.h"
#include "util/json.h"
#include "util/status_macros.h"

// Note [Native models]
// ~~~~~~~~~~~~~~~~~~~~
// `tracecut export` pays for Python: importing torch and transformers and
// running torch.export take seconds, more than llm-compressor's whole
// import + load + trace. For the architectures below, the program is known
// from the config alone, so tracecut writes it itself: the module tree
// pt2_import.h rebuilds from an export of the same checkpoint (paths,
// classes named after transformers' and torch.nn's, Linear and Embedding
// leaves, float32 tensors), with each forward written in TorchScript as the
// exported program computes it (RMSNorm as x * rsqrt(mean(x^2) + eps) times
// the weight, rotary tables from inv_freq, a boolean causal mask (and
// sliding-window mask) passed to scaled_dot_product_attention, grouped KV
// heads expanded). native_model_test checks that calibrating a checkpoint
// this way writes the same tensors as calibrating its export.
//
// In bfloat16 or float16 (--dtype) the tensors are converted to that dtype
// and the forwards gain the casts transformers' modules make in it: RMSNorm
// in float32 cast back before the weight (OLMo 2: after it), rotary tables
// computed in float32 and cast (OLMo 2: q and k turned in float32 and
// cast); everything else runs in the narrow dtype, as in transformers.
// tests/hf/native_model_test.py checks the logits against transformers' own
// bfloat16 forward.
//
// Only what the table and NativeSupport accept is built; every other
// config gets a reason and the caller falls back to `tracecut export`.

namespace tracecut::tracer {
namespace {

struct Arch {
  const char* architecture;  // config.json's architectures[0].
  const char* model_type;
  const char* prefix;   // Class names: <prefix>DecoderLayer, ...
  bool qkv_bias;        // q/k/v always biased, o not (Qwen2).
  bool attention_bias;  // config.attention_bias applies (all four).
  bool mlp_bias;        // config.mlp_bias applies.
  bool qk_norm;         // RMSNorm on each head of q and k (Qwen3).
  // Phi-3: q/k/v in one qkv_proj and gate/up in one gate_up_proj, as its
  // checkpoints store them; rotary embeddings on a leading fraction of each
  // head (partial_rotary_factor); a sliding window on every layer when set.
  bool phi3 = false;
  // Granite: embeddings, residual branches and logits scaled by the
  // config's multipliers, attention scaled by attention_multiplier.
  bool granite = false;
  // OLMo 2: q_norm / k_norm over the whole q and k projections, and norms
  // after attention and the MLP (post_attention_layernorm,
  // post_feedforward_layernorm) instead of before them.
  bool olmo2 = false;
};

constexpr Arch kArchs[] = {
    {"LlamaForCausalLM", "llama", "Llama", false, true, true, false},
    {"MistralForCausalLM", "mistral", "Mistral", false, false, false, false},
    {"Qwen2ForCausalLM", "qwen2", "Qwen2", true, false, false, false},
    {"Qwen3ForCausalLM", "qwen3", "Qwen3", false, true, false, true},
    {"Phi3ForCausalLM", "phi3", "Phi3", false, false, false, false, true},
    {"GraniteForCausalLM", "granite", "Granite", false, true, true, false,
     false, true},
    {"Olmo2ForCausalLM", "olmo2", "Olmo2", false, true, false, false, false,
     false, true},
};

// What the forward needs from config.json.
struct Spec {
  const Arch* arch = nullptr;
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0,
          kv_heads = 0, head_dim = 0, max_positions = 0;
  // Dimensions of each head the rotary embedding turns (head_dim unless a
  // partial_rotary_factor says less).
  int64_t rotary_dim = 0;
  double partial = 1.0;
  // Granite's multipliers (GraniteConfig's defaults); attention_scale is
  // head_dim^-0.5 elsewhere.
  double embedding_multiplier = 1.0, residual_multiplier = 1.0,
         logits_scaling = 1.0, attention_scale = 0;
  double eps = 1e-6;
  bool tie = false, attention_bias = false, mlp_bias = false;
  std::string rope_type = "default";
  double theta = 10000.0, factor = 1.0, low_freq = 1.0, high_freq = 4.0;
  int64_t original_max = 0;
  // Per layer: the sliding window, or 0 for full causal attention.
  std::vector<int64_t> window;
};

absl::Status Unsupported(const hf::HfConfig& c, absl::string_view why) {
  return absl::UnimplementedError(absl::StrCat(c.source(), ": ", why));
}

// Sizes beyond any model's, so that a crafted config cannot make tracecut
// allocate per layer or per rotary frequency without bound (tensor shapes
// are checked against the checkpoint's before anything is read).
constexpr int64_t kMaxSize = int64_t{1} << 20;

absl::StatusOr<int64_t> RequiredInt(const hf::HfConfig& c,
                                    absl::string_view key) {
  ASSIGN_OR_RETURN(std::optional<int64_t> v, c.GetInt(key));
  if (!v.has_value() || *v <= 0 || *v > kMaxSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.source(), ": \"", key,
                     "\" must be an integer between 1 and ", kMaxSize));
  }
  return *v;
}

// The rope parameters: transformers 5's "rope_parameters", or the older
// "rope_scaling" with a top-level "rope_theta".
absl::Status ReadRope(const hf::HfConfig& c, Spec& s) {
  const util::Json* p = util::FindMember(c.json(), "rope_parameters");
  if (p == nullptr || p->is_null()) {
    p = util::FindMember(c.json(), "rope_scaling");
  }
  ASSIGN_OR_RETURN(std::optional<double> theta, c.GetDouble("rope_theta"));
  if (theta.has_value()) s.theta = *theta;
  if (p == nullptr || p->is_null()) return absl::OkStatus();
  if (!p->is_object()) {
    return Unsupported(c, "\"rope_parameters\" is not an object");
  }
  auto number = [&](const char* key, double& out) -> absl::Status {
    const util::Json* v = util::FindMember(*p, key);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    if (!v->is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(
          c.source(), ": rope parameter \"", key, "\" must be a number"));
    }
    out = v->get<double>();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(number("rope_theta", s.theta));
  for (const char* key : {"rope_type", "type"}) {
    const util::Json* v = util::FindMember(*p, key);
    if (v != nullptr && v->is_string()) {
      s.rope_type = v->get<std::string>();
      break;
    }
  }
  RETURN_IF_ERROR(number("partial_rotary_factor", s.partial));
  if (s.partial != 1.0 && !s.arch->phi3) {
    return Unsupported(c, "partial rotary embeddings are not built natively");
  }
  if (s.rope_type == "default") return absl::OkStatus();
  if (s.rope_type != "linear" && s.rope_type != "llama3") {
    return Unsupported(c, absl::StrCat("rope type \"", s.rope_type,
                                       "\" is not built natively"));
  }
  RETURN_IF_ERROR(number("factor", s.factor));
  if (!(s.factor > 0) || !std::isfinite(s.factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.source(), ": rope \"factor\" must be positive"));
  }
  if (s.rope_type == "llama3") {
    double original = 0;
    RETURN_IF_ERROR(number("low_freq_factor", s.low_freq));
    RETURN_IF_ERROR(number("high_freq_factor", s.high_freq));
    RETURN_IF_ERROR(number("original_max_position_embeddings", original));
    s.original_max = static_cast<int64_t>(original);
    if (s.original_max <= 0 || s.high_freq == s.low_freq || !(s.low_freq > 0) ||
        !(s.high_freq > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.source(),
                       ": llama3 rope parameters need "
                       "original_max_position_embeddings > 0 and "
                       "distinct positive low_freq_factor and "
                       "high_freq_factor"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Spec> ReadSpec(const hf::HfConfig& c) {
  Spec s;
  if (c.architectures().size() == 1) {
    for (const Arch& a : kArchs) {
      if (c.architectures()[0] == a.architecture &&
          c.model_type() == a.model_type) {
        s.arch = &a;
      }
    }
  }
  if (s.arch == nullptr) {
    std::vector<std::string> known;
    for (const Arch& a : kArchs) known.push_back(a.architecture);
    return Unsupported(c, absl::StrCat("architectures [",
                                       absl::StrJoin(c.architectures(), ", "),
                                       "] is not one built natively (",
                                       absl::StrJoin(known, ", "), ")"));
  }
  for (const char* key : {"quantization_config", "compression_config"}) {
    if (util::FindMember(c.json(), key) != nullptr) {
      return Unsupported(c, absl::StrCat("\"", key,
                                         "\": the checkpoint is "
                                         "already quantized"));
    }
  }
  ASSIGN_OR_RETURN(std::optional<std::string> act, c.GetString("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return Unsupported(c, absl::StrCat("hidden_act \"", *act,
                                       "\" is not built natively (silu is)"));
  }
  ASSIGN_OR_RETURN(s.vocab, RequiredInt(c, "vocab_size"));
  ASSIGN_OR_RETURN(s.hidden, RequiredInt(c, "hidden_size"));
  ASSIGN_OR_RETURN(s.intermediate, RequiredInt(c, "intermediate_size"));
  ASSIGN_OR_RETURN(s.layers, RequiredInt(c, "num_hidden_layers"));
  ASSIGN_OR_RETURN(s.heads, RequiredInt(c, "num_attention_heads"));
  ASSIGN_OR_RETURN(std::optional<int64_t> kv, c.GetInt("num_key_value_heads"));
  s.kv_heads = kv.value_or(s.heads);
  ASSIGN_OR_RETURN(std::optional<int64_t> hd, c.GetInt("head_dim"));
  s.head_dim = hd.value_or(s.hidden / s.heads);
  if (s.kv_heads <= 0 || s.heads % s.kv_heads != 0 || s.head_dim <= 0 ||
      s.head_dim % 2 != 0 || s.head_dim > kMaxSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.source(), ": num_attention_heads (", s.heads,
        ") must be a multiple of num_key_value_heads (", s.kv_heads,
        ") and head_dim (", s.head_dim, ") even and positive"));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> max_pos,
                   c.GetInt("max_position_embeddings"));
  s.max_positions = max_pos.value_or(0);
  ASSIGN_OR_RETURN(std::optional<double> eps, c.GetDouble("rms_norm_eps"));
  s.eps = eps.value_or(1e-6);
  if (!(s.eps >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.source(), ": \"rms_norm_eps\" must be >= 0"));
  }
  ASSIGN_OR_RETURN(std::optional<bool> tie, c.GetBool("tie_word_embeddings"));
  // The default of these models' config classes (LlamaConfig, ...).
  s.tie = tie.value_or(false);
  if (s.arch->attention_bias) {
    ASSIGN_OR_RETURN(std::optional<bool> b, c.GetBool("attention_bias"));
    s.attention_bias = b.value_or(false);
  }
  if (s.arch->mlp_bias) {
    ASSIGN_OR_RETURN(std::optional<bool> b, c.GetBool("mlp_bias"));
    s.mlp_bias = b.value_or(false);
  }
  s.attention_scale = std::pow(static_cast<double>(s.head_dim), -0.5);
  if (s.arch->granite) {
    for (auto [key, out] :
         {std::pair{"embedding_multiplier", &s.embedding_multiplier},
          std::pair{"residual_multiplier", &s.residual_multiplier},
          std::pair{"logits_scaling", &s.logits_scaling},
          std::pair{"attention_multiplier", &s.attention_scale}}) {
      ASSIGN_OR_RETURN(std::optional<double> v, c.GetDouble(key));
      *out = v.value_or(1.0);
      if (!std::isfinite(*out) || *out == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            c.source(), ": \"", key, "\" must be finite and non-zero"));
      }
    }
  }
  if (s.arch->phi3) {
    ASSIGN_OR_RETURN(std::optional<double> partial,
                     c.GetDouble("partial_rotary_factor"));
    s.partial = partial.value_or(1.0);
  }
  RETURN_IF_ERROR(ReadRope(c, s));
  if (!(s.theta > 0) || !std::isfinite(s.theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.source(), ": \"rope_theta\" must be positive"));
  }
  // transformers: int(head_dim * partial_rotary_factor).
  s.rotary_dim =
      static_cast<int64_t>(static_cast<double>(s.head_dim) * s.partial);
  if (!(s.partial > 0 && s.partial <= 1) || s.rotary_dim % 2 != 0 ||
      s.rotary_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.source(), ": partial_rotary_factor ", s.partial,
        " must be in (0, 1] and turn an even number of head_dim's ", s.head_dim,
        " dimensions"));
  }

  // Sliding windows: Mistral's on every layer when set; Qwen's per
  // layer_types. Anything else is full causal attention.
  ASSIGN_OR_RETURN(std::optional<int64_t> window, c.GetInt("sliding_window"));
  s.window.assign(s.layers, 0);
  const std::string type = s.arch->model_type;
  if (type == "mistral" || type == "phi3") {
    if (window.has_value()) s.window.assign(s.layers, *window);
  } else if (type == "qwen2" || type == "qwen3") {
    const util::Json* types = util::FindMember(c.json(), "layer_types");
    ASSIGN_OR_RETURN(std::optional<bool> use, c.GetBool("use_sliding_window"));
    if (types != nullptr && types->is_array()) {
      if (static_cast<int64_t>(types->size()) != s.layers) {
        return absl::InvalidArgumentError(
            absl::StrCat(c.source(), ": \"layer_types\" has ", types->size(),
                         " entries for ", s.layers, " layers"));
      }
      for (int64_t i = 0; i < s.layers; ++i) {
        const util::Json& t = (*types)[i];
        if (t == "sliding_attention" && window.has_value()) {
          s.window[i] = *window;
        } else if (t != "full_attention" && t != "sliding_attention") {
          return Unsupported(c, absl::StrCat("layer type ", t.dump(),
                                             " is not built natively"));
        }
      }
    } else if (use.value_or(false)) {
      return Unsupported(c, "use_sliding_window without layer_types");
    }
  }
  for (int64_t w : s.window) {
    if (w < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.source(), ": \"sliding_window\" must be >= 0"));
    }
  }
  return s;
}

// transformers' inverse frequencies (modeling_rope_utils.py), with the same
// operations in the same order, so that the buffer matches its bits.
torch::Tensor InvFreq(const Spec& s) {
  const int64_t dim = s.rotary_dim;
  torch::Tensor exponent =
      torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat) / dim;
  torch::Tensor inv_freq = torch::pow(s.theta, exponent).reciprocal() * 1.0;
  if (s.rope_type == "linear") return inv_freq / s.factor;
  if (s.rope_type != "llama3") return inv_freq;
  const double old_len = static_cast<double>(s.original_max);
  const double low_wavelen = old_len / s.low_freq;
  const double high_wavelen = old_len / s.high_freq;
  torch::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  torch::Tensor llama =
      torch::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
  torch::Tensor smooth = (wavelen.reciprocal() * old_len - s.low_freq) /
                         (s.high_freq - s.low_freq);
  torch::Tensor smoothed = (1 - smooth) * llama / s.factor + smooth * llama;
  torch::Tensor medium = (wavelen < high_wavelen).logical_not() *
                         (wavelen > low_wavelen).logical_not();
  return torch::where(medium, smoothed, llama);
}

class Builder {
 public:
  Builder(const std::string& dir, const Spec& spec, bool defer,
          c10::ScalarType dtype, checkpoint::Checkpoint ckpt)
      : dir_(dir),
        s_(spec),
        defer_(defer),
        dtype_(dtype),
        ckpt_(std::move(ckpt)),
        cu_(std::make_shared<torch::jit::CompilationUnit>()) {}

  absl::StatusOr<NativeModel> Build();

 private:
  std::string Transformers(absl::string_view kind) const {
    return absl::StrCat("transformers.models.", s_.arch->model_type,
                        ".modeling_", s_.arch->model_type, ".", s_.arch->prefix,
                        kind);
  }

  // A module of class `type` (one class per type and variant: instances
  // share their forward).
  absl::StatusOr<torch::jit::Module> New(const std::string& type,
                                         int variant = 0) {
    size_t dot = type.rfind('.');
    std::string name = variant == 0
                           ? absl::StrCat("__torch__.", type)
                           : absl::StrCat("__torch__.", type.substr(0, dot + 1),
                                          "___torch_mangle_", variant, ".",
                                          type.substr(dot + 1));
    return runtime::TorchCall(absl::StrCat("creating a ", type), [&] {
      c10::ClassTypePtr cls = cu_->get_class(c10::QualifiedName(name));
      if (cls == nullptr) {
        cls = c10::ClassType::create(c10::QualifiedName(name), cu_,
                                     /*is_module=*/true);
        cu_->register_type(cls);
      }
      return torch::jit::Module(cu_, cls);
    });
  }

  absl::Status Add(torch::jit::Module& parent, const std::string& name,
                   const torch::jit::Module& child) {
    return runtime::TorchCall(absl::StrCat("adding module ", name),
                              [&] { parent.register_module(name, child); });
  }

  // The checkpoint's tensor `fqn` (or `fallback`, for a tied weight the
  // checkpoint stores once) of `shape`, in dtype_ or a stand-in.
  absl::Status AddTensor(torch::jit::Module& m, const std::string& path,
                         const std::string& name,
                         const std::vector<int64_t>& shape,
                         const std::string& fallback = "");

  absl::StatusOr<torch::jit::Module> Linear(const std::string& path, int64_t in,
                                            int64_t out, bool bias);
  absl::StatusOr<torch::jit::Module> Norm(const std::string& path,
                                          int64_t size);
  absl::StatusOr<torch::jit::Module> Layer(int64_t i);

  // Compiles `code` as the forward of `m`'s class (once per class), its
  // source named so that node locations say where the code came from.
  absl::Status Define(torch::jit::Module m, const std::string& code) {
    const std::string& type = m.type()->name()->qualifiedName();
    if (!defined_.insert(type).second) return absl::OkStatus();
    absl::Status s = runtime::TorchCall(absl::StrCat("compiling ", type), [&] {
      DefineMethods(*cu_, m.type(),
                    std::make_shared<torch::jit::Source>(
                        code,
                        absl::StrCat("<tracecut: ", s_.arch->architecture,
                                     " from config.json>"),
                        1));
    });
    if (!s.ok()) {
      return absl::InternalError(
          absl::StrCat(s.message(), "\nTorchScript:\n", code));
    }
    return absl::OkStatus();
  }

  absl::Status DefineForwards(torch::jit::Module& root);

  std::string dir_;
  Spec s_;
  bool defer_;
  c10::ScalarType dtype_;  // Of the tensors and activations.
  checkpoint::Checkpoint ckpt_;
  std::shared_ptr<torch::jit::CompilationUnit> cu_;
  std::set<std::string> defined_;
  std::map<std::string, exported::DeferredTensor> deferred_;
  // One instance of each kind, to define forwards on.
  std::map<std::string, torch::jit::Module> first_;
};

absl::Status Builder::AddTensor(torch::jit::Module& m, const std::string& path,
                                const std::string& name,
                                const std::vector<int64_t>& shape,
                                const std::string& fallback) {
  const std::string fqn = path.empty() ? name : absl::StrCat(path, ".", name);
  std::string stored = fqn;
  if (!ckpt_.Has(stored) && !fallback.empty() && ckpt_.Has(fallback)) {
    stored = fallback;
  }
  if (!ckpt_.Has(stored)) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": the ", s_.arch->architecture,
                     " its config.json describes "
                     "reads '",
                     fqn, "', which the checkpoint's safetensors do not hold"));
  }
  ASSIGN_OR_RETURN(checkpoint::TensorInfo info, ckpt_.Info(stored));
  if (info.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        ckpt_.FileOf(stored), ": tensor '", stored, "' has shape [",
        absl::StrJoin(info.shape, ", "), "], config.json implies [",
        absl::StrJoin(shape, ", "), "]"));
  }
  if (!c10::isFloatingType(info.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ckpt_.FileOf(stored), ": tensor '", stored, "' is ",
                     c10::toString(info.dtype), ", not floating point"));
  }
  torch::Tensor t;
  if (defer_) {
    t = exported::StandIn(dtype_, shape);
    deferred_.emplace(fqn,
                      exported::DeferredTensor{stored, dtype_, info.dtype});
  } else {
    ASSIGN_OR_RETURN(t, ckpt_.Get(stored));
    t = t.to(dtype_);
  }
  return runtime::TorchCall(absl::StrCat("adding tensor '", fqn, "'"), [&] {
    m.register_attribute(name, c10::TensorType::get(),
                         t.detach().set_requires_grad(false),
                         /*is_param=*/true, /*is_buffer=*/false);
  });
}

absl::StatusOr<torch::jit::Module> Builder::Linear(const std::string& path,
                                                   int64_t in, int64_t out,
                                                   bool bias) {
  ASSIGN_OR_RETURN(torch::jit::Module m,
                   New("torch.nn.modules.linear.Linear", bias ? 1 : 0));
  RETURN_IF_ERROR(AddTensor(m, path, "weight", {out, in}));
  if (bias) RETURN_IF_ERROR(AddTensor(m, path, "bias", {out}));
  first_.emplace(bias ? "linear_bias" : "linear", m);
  return m;
}

absl::StatusOr<torch::jit::Module> Builder::Norm(const std::string& path,
                                                 int64_t size) {
  ASSIGN_OR_RETURN(torch::jit::Module m, New(Transformers("RMSNorm")));
  RETURN_IF_ERROR(AddTensor(m, path, "weight", {size}));
  first_.emplace("norm", m);
  return m;
}

absl::StatusOr<torch::jit::Module> Builder::Layer(int64_t i) {
  const std::string path = absl::StrCat("model.layers.", i);
  ASSIGN_OR_RETURN(torch::jit::Module layer, New(Transformers("DecoderLayer")));
  ASSIGN_OR_RETURN(torch::jit::Module attn, New(Transformers("Attention")));
  const std::string a = path + ".self_attn";
  const bool qkv_bias = s_.arch->qkv_bias || s_.attention_bias;
  const int64_t q = s_.heads * s_.head_dim, kv = s_.kv_heads * s_.head_dim;
  struct Proj {
    const char* name;
    int64_t in, out;
    bool bias;
  };
  std::vector<Proj> attn_projs = {
      Proj{"q_proj", s_.hidden, q, qkv_bias},
      Proj{"k_proj", s_.hidden, kv, qkv_bias},
      Proj{"v_proj", s_.hidden, kv, qkv_bias},
      Proj{"o_proj", q, s_.hidden, s_.attention_bias}};
  std::vector<Proj> mlp_projs = {
      Proj{"gate_proj", s_.hidden, s_.intermediate, s_.mlp_bias},
      Proj{"up_proj", s_.hidden, s_.intermediate, s_.mlp_bias},
      Proj{"down_proj", s_.intermediate, s_.hidden, s_.mlp_bias}};
  if (s_.arch->phi3) {
    attn_projs = {Proj{"qkv_proj", s_.hidden, q + 2 * kv, false},
                  Proj{"o_proj", q, s_.hidden, false}};
    mlp_projs = {Proj{"gate_up_proj", s_.hidden, 2 * s_.intermediate, false},
                 Proj{"down_proj", s_.intermediate, s_.hidden, false}};
  }
  for (const Proj& p : attn_projs) {
    ASSIGN_OR_RETURN(torch::jit::Module l,
                     Linear(absl::StrCat(a, ".", p.name), p.in, p.out, p.bias));
    RETURN_IF_ERROR(Add(attn, p.name, l));
  }
  if (s_.arch->qk_norm || s_.arch->olmo2) {
    // Qwen3 normalizes each head, OLMo 2 the whole projection.
    for (auto [n, size] :
         {std::pair{"q_norm", s_.arch->olmo2 ? q : s_.head_dim},
          std::pair{"k_norm", s_.arch->olmo2 ? kv : s_.head_dim}}) {
      ASSIGN_OR_RETURN(torch::jit::Module norm,
                       Norm(absl::StrCat(a, ".", n), size));
      RETURN_IF_ERROR(Add(attn, n, norm));
    }
  }
  ASSIGN_OR_RETURN(torch::jit::Module mlp, New(Transformers("MLP")));
  const std::string m = path + ".mlp";
  for (const Proj& p : mlp_projs) {
    ASSIGN_OR_RETURN(torch::jit::Module l,
                     Linear(absl::StrCat(m, ".", p.name), p.in, p.out, p.bias));
    RETURN_IF_ERROR(Add(mlp, p.name, l));
  }
  RETURN_IF_ERROR(Add(layer, "self_attn", attn));
  RETURN_IF_ERROR(Add(layer, "mlp", mlp));
  for (const char* n :
       s_.arch->olmo2 ? std::vector<const char*>{"post_attention_layernorm",
                                                 "post_feedforward_layernorm"}
                      : std::vector<const char*>{"input_layernorm",
                                                 "post_attention_layernorm"}) {
    ASSIGN_OR_RETURN(torch::jit::Module norm,
                     Norm(absl::StrCat(path, ".", n), s_.hidden));
    RETURN_IF_ERROR(Add(layer, n, norm));
  }
  first_.emplace("attention", attn);
  first_.emplace("mlp", mlp);
  first_.emplace("layer", layer);
  return layer;
}

// The forwards, leaves first (a caller is compiled against its callees).
absl::Status Builder::DefineForwards(torch::jit::Module& root) {
  for (const char* kind : {"linear", "linear_bias"}) {
    auto it = first_.find(kind);
    if (it == first_.end()) continue;
    RETURN_IF_ERROR(
        Define(it->second,
               absl::StrCat("def forward(self, input: Tensor) -> Tensor:\n"
                            "    return torch.linear(input, self.weight",
                            std::string(kind) == "linear" ? "" : ", self.bias",
                            ")\n")));
  }
  RETURN_IF_ERROR(Define(first_.at("embedding"),
                         "def forward(self, input: Tensor) -> Tensor:\n"
                         "    return torch.embedding(self.weight, input)\n"));
  // In float32 the program is the export's (its casts are no-ops, dropped);
  // in a narrower dtype, transformers' casts: RMSNorm and the rotary tables
  // compute in float32 and return the model's dtype.
  const bool narrow = dtype_ != torch::kFloat;
  const std::string dt = DTypeLiteral(dtype_);
  std::string norm =
      "def forward(self, hidden_states: Tensor) -> Tensor:\n"
      "$UP"
      "    variance = hidden_states.pow(2).mean([-1], True)\n"
      "    hidden_states = hidden_states * torch.rsqrt(variance + $EPS)\n"
      "$OUT";
  RETURN_IF_ERROR(Define(
      first_.at("norm"),
      absl::StrReplaceAll(
          norm,
          {{"$UP", narrow ? absl::StrCat("    hidden_states = "
                                         "hidden_states.to(",
                                         DTypeLiteral(torch::kFloat), ")\n")
                          : ""},
           {"$EPS", FloatLiteral(s_.eps)},
           // OLMo 2 casts after the weight, the others before it.
           {"$OUT", !narrow ? "    return self.weight * hidden_states\n"
                    : s_.arch->olmo2 ? absl::StrCat("    return (self.weight * "
                                                    "hidden_states).to(",
                                                    dt, ")\n")
                                     : absl::StrCat("    return self.weight * "
                                                    "hidden_states.to(",
                                                    dt, ")\n")}})));
  RETURN_IF_ERROR(Define(
      first_.at("rotary"),
      absl::StrCat(
          "def forward(self, position_ids: Tensor):\n"
          "    inv_freq = self.inv_freq.unsqueeze(0).unsqueeze(2).expand("
          "[position_ids.size(0), -1, 1])\n"
          "    position = position_ids.unsqueeze(1).float()\n"
          "    freqs = torch.matmul(inv_freq, position).transpose(1, 2)\n"
          "    emb = torch.cat([freqs, freqs], -1)\n",
          // OLMo 2 keeps the tables in float32 and casts q and k after
          // turning them.
          narrow && !s_.arch->olmo2
              ? absl::StrCat("    return (emb.cos() * 1.0).to(", dt,
                             "), (emb.sin() * 1.0).to(", dt, ")\n")
              : "    return emb.cos() * 1.0, emb.sin() * 1.0\n")));
  RETURN_IF_ERROR(
      Define(first_.at("mlp"),
             s_.arch->phi3
                 ? absl::StrCat("def forward(self, x: Tensor) -> Tensor:\n"
                                "    up_states = self.gate_up_proj.forward(x)\n"
                                "    gate = up_states[:, :, :",
                                s_.intermediate,
                                "]\n"
                                "    up = up_states[:, :, ",
                                s_.intermediate,
                                ":]\n"
                                "    return self.down_proj.forward(up * "
                                "torch.silu(gate))\n")
                 : "def forward(self, x: Tensor) -> Tensor:\n"
                   "    return self.down_proj.forward(torch.silu("
                   "self.gate_proj.forward(x)) * self.up_proj.forward(x))\n"));
  const int64_t half = s_.rotary_dim / 2;
  const int64_t rep = s_.heads / s_.kv_heads;
  std::string attn = absl::StrCat(
      "def forward(self, hidden_states: Tensor, cos: Tensor, sin: Tensor, "
      "mask: Tensor) -> Tensor:\n"
      "    b = hidden_states.size(0)\n"
      "    s = hidden_states.size(1)\n");
  if (s_.arch->phi3) {
    // One projection, sliced as Phi3Attention slices it.
    absl::StrAppend(
        &attn,
        "    qkv = self.qkv_proj.forward(hidden_states)\n"
        "    q = qkv[:, :, :$QP].view([b, s, -1, $HD]).transpose(1, 2)\n"
        "    k = qkv[:, :, $QP:$KP].view([b, s, -1, $HD]).transpose(1, 2)\n"
        "    v = qkv[:, :, $KP:].view([b, s, -1, $HD]).transpose(1, 2)\n");
  } else {
    for (const char* x : {"q", "k"}) {
      if (s_.arch->olmo2) {
        absl::StrAppend(&attn, "    ", x, " = self.", x, "_norm.forward(self.",
                        x,
                        "_proj.forward(hidden_states)).view([b, s, -1, "
                        "$HD]).transpose(1, 2)\n");
        continue;
      }
      absl::StrAppend(&attn, "    ", x, " = self.", x,
                      "_proj.forward(hidden_states).view([b, s, -1, $HD])\n");
      if (s_.arch->qk_norm) {
        absl::StrAppend(&attn, "    ", x, " = self.", x, "_norm.forward(", x,
                        ")\n");
      }
      absl::StrAppend(&attn, "    ", x, " = ", x, ".transpose(1, 2)\n");
    }
    absl::StrAppend(
        &attn,
        "    v = self.v_proj.forward(hidden_states).view([b, s, -1, $HD])."
        "transpose(1, 2)\n");
  }
  absl::StrAppend(&attn,
                  "    cos = cos.unsqueeze(1)\n"
                  "    sin = sin.unsqueeze(1)\n");
  for (const char* x : {"q", "k"}) {
    if (s_.rotary_dim == s_.head_dim) {
      const bool cast = narrow && s_.arch->olmo2;
      absl::StrAppend(&attn, "    ", x, " = ", cast ? "(" : "", x,
                      " * cos + torch.cat([-", x, "[:, :, :, $HALF:], ", x,
                      "[:, :, :, :$HALF]], -1) * sin",
                      cast ? absl::StrCat(").to(", dt, ")") : "", "\n");
    } else {
      // Phi-3's partial rotary: the leading rotary_dim of each head turn.
      absl::StrAppend(&attn, "    r = ", x, "[:, :, :, :$RD]\n", "    ", x,
                      " = torch.cat([r * cos + torch.cat([-r[:, :, :, $HALF:], "
                      "r[:, :, :, :$HALF]], -1) * sin, ",
                      x, "[:, :, :, $RD:]], -1)\n");
    }
  }
  if (rep > 1) {
    absl::StrAppend(&attn,
                    "    k = k.unsqueeze(2).expand([b, $KV, $REP, s, $HD])."
                    "reshape([b, $H, s, $HD])\n"
                    "    v = v.unsqueeze(2).expand([b, $KV, $REP, s, $HD])."
                    "reshape([b, $H, s, $HD])\n");
  }
  absl::StrAppend(
      &attn,
      "    out = torch.scaled_dot_product_attention(q, k, v, mask, 0.0, "
      "False, scale=$SCALE)\n"
      "    out = out.transpose(1, 2).contiguous().reshape([b, s, -1])\n"
      "    return self.o_proj.forward(out)\n");
  RETURN_IF_ERROR(Define(
      first_.at("attention"),
      absl::StrReplaceAll(
          attn, {{"$HD", absl::StrCat(s_.head_dim)},
                 {"$QP", absl::StrCat(s_.heads * s_.head_dim)},
                 {"$KP", absl::StrCat((s_.heads + s_.kv_heads) * s_.head_dim)},
                 {"$RD", absl::StrCat(s_.rotary_dim)},
                 {"$HALF", absl::StrCat(half)},
                 {"$KV", absl::StrCat(s_.kv_heads)},
                 {"$REP", absl::StrCat(rep)},
                 {"$H", absl::StrCat(s_.heads)},
                 {"$SCALE", FloatLiteral(s_.attention_scale)}})));
  // Granite scales each residual branch; the others add it as it is.
  const std::string scaled =
      s_.arch->granite
          ? absl::StrCat(" * ", FloatLiteral(s_.residual_multiplier))
          : "";
  RETURN_IF_ERROR(Define(
      first_.at("layer"),
      s_.arch->olmo2
          ? "def forward(self, hidden_states: Tensor, cos: Tensor, sin: "
            "Tensor, mask: Tensor) -> Tensor:\n"
            "    h = hidden_states + self.post_attention_layernorm.forward("
            "self.self_attn.forward(hidden_states, cos, sin, mask))\n"
            "    return h + self.post_feedforward_layernorm.forward("
            "self.mlp.forward(h))\n"
          : absl::StrCat(
                "def forward(self, hidden_states: Tensor, cos: Tensor, sin: "
                "Tensor, "
                "mask: Tensor) -> Tensor:\n"
                "    h = "
                "self.self_attn.forward(self.input_layernorm.forward(hidden_"
                "states), "
                "cos, sin, mask)\n"
                "    h = hidden_states + h",
                scaled,
                "\n"
                "    return h + "
                "self.mlp.forward(self.post_attention_layernorm.forward(h))",
                scaled, "\n")));
  // The masks: key position <= query position, and within the window
  // (key > query - window) for sliding layers.
  std::string model =
      "def forward(self, input_ids: Tensor) -> Tensor:\n"
      "    b = input_ids.size(0)\n"
      "    s = input_ids.size(1)\n"
      "    h = self.embed_tokens.forward(input_ids)\n"
      "$EMBED"
      "    position_ids = torch.arange(s).unsqueeze(0)\n"
      "    cos, sin = self.rotary_emb.forward(position_ids)\n"
      "    idx = torch.arange(s)\n"
      "    causal = torch.le(idx.unsqueeze(0), idx.unsqueeze(1))\n"
      "    full = causal.unsqueeze(0).unsqueeze(0).expand([b, 1, s, s])\n";
  std::set<int64_t> windows(s_.window.begin(), s_.window.end());
  for (int64_t w : windows) {
    if (w == 0) continue;
    absl::StrAppend(&model, "    sliding_", w,
                    " = torch.logical_and(causal, torch.gt(idx.unsqueeze(0), "
                    "idx.unsqueeze(1) - ",
                    w, ")).unsqueeze(0).unsqueeze(0).expand([b, 1, s, s])\n");
  }
  for (int64_t i = 0; i < s_.layers; ++i) {
    absl::StrAppend(&model, "    h = getattr(self.layers, \"", i,
                    "\").forward(h, cos, sin, ",
                    s_.window[i] == 0 ? std::string("full")
                                      : absl::StrCat("sliding_", s_.window[i]),
                    ")\n");
  }
  absl::StrAppend(&model, "    return self.norm.forward(h)\n");
  RETURN_IF_ERROR(Define(
      first_.at("model"),
      absl::StrReplaceAll(
          model,
          {{"$EMBED",
            s_.arch->granite
                ? absl::StrCat("    h = h * ",
                               FloatLiteral(s_.embedding_multiplier), "\n")
                : ""}})));
  return Define(
      root,
      absl::StrCat(
          "def forward(self, input_ids: Tensor) -> Tensor:\n"
          "    return self.lm_head.forward(self.model.forward(input_ids))",
          s_.arch->granite
              ? absl::StrCat(" / ", FloatLiteral(s_.logits_scaling))
              : "",
          "\n"));
}

absl::StatusOr<NativeModel> Builder::Build() {
  ASSIGN_OR_RETURN(torch::jit::Module root, New(Transformers("ForCausalLM")));
  ASSIGN_OR_RETURN(torch::jit::Module model, New(Transformers("Model")));
  first_.emplace("model", model);
  ASSIGN_OR_RETURN(torch::jit::Module embed,
                   New("torch.nn.modules.sparse.Embedding"));
  RETURN_IF_ERROR(
      AddTensor(embed, "model.embed_tokens", "weight", {s_.vocab, s_.hidden}));
  first_.emplace("embedding", embed);
  RETURN_IF_ERROR(Add(model, "embed_tokens", embed));
  ASSIGN_OR_RETURN(torch::jit::Module layers,
                   New("torch.nn.modules.container.ModuleList"));
  for (int64_t i = 0; i < s_.layers; ++i) {
    ASSIGN_OR_RETURN(torch::jit::Module layer, Layer(i));
    RETURN_IF_ERROR(Add(layers, absl::StrCat(i), layer));
  }
  RETURN_IF_ERROR(Add(model, "layers", layers));
  ASSIGN_OR_RETURN(torch::jit::Module norm, Norm("model.norm", s_.hidden));
  RETURN_IF_ERROR(Add(model, "norm", norm));
  ASSIGN_OR_RETURN(torch::jit::Module rotary,
                   New(Transformers("RotaryEmbedding")));
  RETURN_IF_ERROR(runtime::TorchCall("computing inv_freq", [&] {
    rotary.register_attribute("inv_freq", c10::TensorType::get(), InvFreq(s_),
                              /*is_param=*/false, /*is_buffer=*/true);
  }));
  first_.emplace("rotary", rotary);
  RETURN_IF_ERROR(Add(model, "rotary_emb", rotary));
  RETURN_IF_ERROR(Add(root, "model", model));
  ASSIGN_OR_RETURN(torch::jit::Module head,
                   New("torch.nn.modules.linear.Linear"));
  RETURN_IF_ERROR(AddTensor(head, "lm_head", "weight", {s_.vocab, s_.hidden},
                            s_.tie ? "model.embed_tokens.weight" : ""));
  first_.emplace("linear", head);
  RETURN_IF_ERROR(Add(root, "lm_head", head));
  RETURN_IF_ERROR(DefineForwards(root));

  NativeModel out;
  out.module = root;
  out.deferred = std::move(deferred_);
  const int64_t seq =
      s_.max_positions > 0 ? std::min<int64_t>(16, s_.max_positions) : 16;
  nlohmann::ordered_json inputs = {{"inputs",
                                    {{{"name", "input_ids"},
                                      {"shape", {2, seq}},
                                      {"dtype", "int64"},
                                      {"kind", "tokens"},
                                      {"high", s_.vocab}}}},
                                   {"outputs", {"logits"}}};
  out.inputs_json = inputs.dump(1);
  nlohmann::ordered_json tied = nlohmann::ordered_json::array();
  if (s_.tie) tied.push_back({"lm_head.weight", "model.embed_tokens.weight"});
  nlohmann::ordered_json model_json = {
      {"model_class", s_.arch->architecture},
      {"no_split_modules", {absl::StrCat(s_.arch->prefix, "DecoderLayer")}},
      {"tied_parameters", tied},
      {"linear_subclasses", nlohmann::ordered_json::array()},
      {"checkpoint_layout", nlohmann::ordered_json::object()},
      {"exporter", "tracecut native (config.json)"}};
  out.model_json = model_json.dump(1);
  return out;
}

}  // namespace

absl::Status NativeSupport(const hf::HfConfig& config) {
  return ReadSpec(config).status();
}

absl::StatusOr<NativeModel> BuildNativeModel(const std::string& dir,
                                             const hf::HfConfig& config,
                                             bool defer,
                                             c10::ScalarType dtype) {
  if (dtype != torch::kFloat && dtype != torch::kBFloat16 &&
      dtype != torch::kHalf) {
    return absl::InvalidArgumentError(
        absl::StrCat("models built from config.json compute in float32, "
                     "bfloat16 or float16, not ",
                     c10::toString(dtype)));
  }
  ASSIGN_OR_RETURN(Spec spec, ReadSpec(config));
  ASSIGN_OR_RETURN(checkpoint::Checkpoint ckpt,
                   checkpoint::Checkpoint::Open(dir));
  Builder b(dir, spec, defer, dtype, std::move(ckpt));
  return b.Build();
}

}  // namespace tracecut::tracer
