#include "modifiers/weight_quant_modifier.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "quantization/fake_quant.h"
#include "quantization/observers.h"
#include "runtime/torch_status.h"
#include "util/format.h"
#include "util/json.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

using ::tracecut::quantization::HessianAccumulator;
using ::tracecut::quantization::QuantizeRtn;
using ::tracecut::quantization::RtnResult;
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string WeightPath(absl::string_view module) {
  return absl::StrCat(module, ".weight");
}

// Paths of every parameter and buffer of `root`, grouped by storage, so tied
// weights can be named.
absl::flat_hash_map<const void*, std::vector<std::string>> TensorsByStorage(
    const torch::jit::Module& root) {
  absl::flat_hash_map<const void*, std::vector<std::string>> out;
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    if (p.value.defined() && p.value.has_storage()) {
      out[p.value.storage().data()].push_back(p.name);
    }
  }
  for (const auto& b : root.named_buffers(/*recurse=*/true)) {
    if (b.value.defined() && b.value.has_storage()) {
      out[b.value.storage().data()].push_back(b.name);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<double> OutputErrorNumerator(const at::Tensor& weight,
                                            const at::Tensor& quantized,
                                            const at::Tensor& hessian) {
  return runtime::TorchCall("output error", [&] {
    return quantization::SymmetricQuadraticForm(
        weight.detach().to(at::kFloat) - quantized.detach().to(at::kFloat),
        hessian);
  });
}

absl::StatusOr<std::vector<double>> RelativeOutputErrors(
    const at::Tensor& weight, const std::vector<at::Tensor>& quantized,
    const at::Tensor& hessian, const std::vector<double>& known,
    double known_trace) {
  return runtime::TorchCall(
      "output error", [&]() -> absl::StatusOr<std::vector<double>> {
        // Products only for what is not known.
        double den = known_trace;
        if (!std::isfinite(den)) {
          ASSIGN_OR_RETURN(den, quantization::SymmetricQuadraticForm(
                                    weight.detach().to(at::kFloat), hessian));
        }
        std::vector<double> errors;
        for (size_t i = 0; i < quantized.size(); ++i) {
          double num = i < known.size() ? known[i] : kNaN;
          if (!std::isfinite(num)) {
            ASSIGN_OR_RETURN(
                num, OutputErrorNumerator(weight, quantized[i], hessian));
          }
          if (num < 0) num = 0;  // H is PSD; only rounding makes it negative.
          errors.push_back(den <= 0 ? (num <= 0 ? 0.0 : kNaN)
                                    : std::sqrt(num / den));
        }
        return errors;
      });
}

WeightQuantModifier::WeightQuantModifier(WeightQuantOptions options)
    : options_(std::move(options)) {}

bool WeightQuantModifier::WantsModule(absl::string_view path,
                                      absl::string_view type) const {
  return selected_.count(std::string(path)) > 0 || experts_.IsExperts(path);
}

absl::Status WeightQuantModifier::OnRunStart(RunContext& ctx) {
  typed_dtype_.reset();
  if (options_.typed.has_value()) {
    RETURN_IF_ERROR(options_.typed->Resolve(name()));
    if (!options_.typed->weights.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": the scheme quantizes no weight"));
    }
    if (absl::Status runs = quantization::CheckTypedSchemeRuns(*options_.typed);
        !runs.ok()) {
      return util::Annotate(runs, name());
    }
    typed_dtype_ = ConfigDtype(ctx.model());
    static_input_.reset();
    const auto& in = options_.typed->input_activations;
    if (in.has_value() && in->dynamic != quantization::Dynamic::kDynamic) {
      RETURN_IF_ERROR(util::Annotate(
          quantization::ActivationObserver::Create(*in).status(), name()));
      static_input_ = *in;
    }
  } else {
    RETURN_IF_ERROR(options_.scheme.Validate());
  }
  kv_pending_.clear();
  kv_done_.clear();
  if (options_.kv_cache.has_value()) {
    if (!options_.typed.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(),
                       ": kv_cache_scheme needs a compressed-tensors scheme "
                       "(preset or json) for the weights"));
    }
    RETURN_IF_ERROR(util::Annotate(
        quantization::ActivationObserver::CreateForAttention(*options_.kv_cache)
            .status(),
        absl::StrCat(name(), ": kv_cache_scheme")));
    kv_heads_ =
        ConfigInt(ctx.model(), "num_key_value_heads")
            .value_or(
                ConfigInt(ctx.model(), "num_attention_heads").value_or(0));
    kv_attentions_.clear();
    for (const ir::Node* node : ctx.model().graph().nodes()) {
      if (WantsFunction(*node)) {
        kv_attentions_.emplace(node->scope().path(), node->scope().type());
      }
    }
    if (kv_attentions_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(),
                       ": kv_cache_scheme: the model calls no "
                       "scaled_dot_product_attention (export it with "
                       "attn_implementation sdpa), so there is no KV cache to "
                       "calibrate"));
    }
  }
  ASSIGN_OR_RETURN(std::vector<const LeafModule*> leaves,
                   options_.modules.Select(ctx, name()));
  selected_.clear();
  std::vector<std::string> skipped;
  transposed_.clear();
  for (const LeafModule* leaf : leaves) {
    // Hugging Face's Conv1D (GPT-2) is a Linear with its weight stored
    // transposed, [in, out]; it is quantized as the Linear it is.
    const bool conv1d = ShortType(leaf->type) == "Conv1D";
    if (ShortType(leaf->type) != "Linear" && !conv1d) {
      skipped.push_back(
          absl::StrCat(leaf->path, " (", ShortType(leaf->type), ")"));
      continue;
    }
    ASSIGN_OR_RETURN(at::Tensor w,
                     ctx.model().GetTensor(WeightPath(leaf->path)));
    if (w.dim() != 2 || !w.is_floating_point()) {
      skipped.push_back(absl::StrCat(leaf->path, " (weight ",
                                     quantization::internal::DescribeTensor(w),
                                     ")"));
      continue;
    }
    // Groups must tile each row: a partial last group is what
    // compressed-tensors refuses to load (strict group division).
    const int64_t in_features = w.size(conv1d ? 0 : 1);
    const int64_t group = GroupSize();
    if (group > 0 && group < in_features && in_features % group != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name(), ": group_size ", group, " does not divide the ", in_features,
          " input features of ", leaf->path, " (", ShortType(leaf->type),
          "), and a checkpoint with a partial group does not load; use a "
          "group_size that divides it, or add the module to ignore"));
    }
    if (group > in_features && options_.whole_groups) {
      return absl::InvalidArgumentError(absl::StrCat(
          name(), ": group_size ", group, " is larger than the ", in_features,
          " input features of ", leaf->path, " (", ShortType(leaf->type),
          "), which compressed-tensors cannot load; use a group_size that "
          "divides them, add the module to ignore, or --format=torchscript"));
    }
    selected_.insert(leaf->path);
    if (conv1d) transposed_.insert(leaf->path);
  }
  ASSIGN_OR_RETURN(experts_, FusedExperts::Find(ctx, options_.modules, name(),
                                                options_.all_expert_tokens));
  fused_.clear();
  fused_scale_.clear();
  if (options_.typed.has_value() &&
      options_.typed->weights->resolved_strategy() ==
          quantization::Strategy::kTensorGroup) {
    FindFusedGroups(ctx);
  }
  if (!experts_.empty() && Distributed()) {
    return absl::UnimplementedError(absl::StrCat(
        name(), ": fused MoE experts (", experts_.linears().begin()->first,
        ", ...) in a data-parallel run are not supported yet; run them in "
        "one process"));
  }
  if (selected_.empty() && experts_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), ": targets [", absl::StrJoin(options_.modules.targets, ", "),
        "] select no Linear (or Conv1D) module (selected: ",
        absl::StrJoin(skipped, ", "), ")"));
  }
  if (!skipped.empty()) {
    ctx.Warn(absl::StrCat(name(),
                          ": skipping selected modules that are not "
                          "Linear: ",
                          absl::StrJoin(skipped, ", ")));
  }
  auto by_storage = TensorsByStorage(ctx.model().module());
  for (const std::string& path : selected_) {
    ASSIGN_OR_RETURN(at::Tensor w, ctx.model().GetTensor(WeightPath(path)));
    auto it = by_storage.find(w.storage().data());
    if (it == by_storage.end() || it->second.size() < 2) continue;
    std::vector<std::string> others;
    for (const std::string& p : it->second) {
      if (p != WeightPath(path)) others.push_back(p);
    }
    ctx.Warn(absl::StrCat(name(), ": the weight of ", path, " is shared with ",
                          absl::StrJoin(others, ", "),
                          "; quantizing it changes them too"));
  }
  pending_.clear();
  shared_inputs_.clear();
  shared_hessian_reads_ = 0;
  return absl::OkStatus();
}

absl::Status WeightQuantModifier::OnModuleCall(RunContext& ctx,
                                               const ModuleCall& call) {
  std::string path(call.path);
  if (experts_.IsExperts(path)) {
    return experts_.ForEachInput(
        ctx, call,
        [&](const std::string& linear, const at::Tensor& x) -> absl::Status {
          if (done_.count(linear) > 0) return absl::OkStatus();
          return AddInput(ctx, linear, x, call);
        });
  }
  if (done_.count(path) > 0) {
    // A module called again in a later subgraph (shared modules): it is
    // quantized already and its later inputs are not used.
    return absl::OkStatus();
  }
  if (call.inputs.empty() || !call.inputs[0].isTensor()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), ": the input of ", path, " (Linear) is not a tensor"));
  }
  return AddInput(ctx, path, call.inputs[0].toTensor(), call);
}

absl::Status WeightQuantModifier::AddInput(RunContext& ctx,
                                           const std::string& path,
                                           const at::Tensor& x,
                                           const ModuleCall& call) {
  Pending& p = pending_[path];
  p.subgraph = call.subgraph;
  if (NeedsHessian() || options_.measure_error) {
    // Note [Shared Hessians].
    SharedInput* shared = nullptr;
    if (!Distributed() && call.path == path && call.node != nullptr &&
        !call.node->args().empty() && call.node->args()[0].is_node()) {
      shared = &shared_inputs_[call.node->args()[0].node()];
      // Joined only from the batch the group started with, so that it holds
      // exactly the inputs this Linear saw.
      if (p.hessian == nullptr && shared->hessian != nullptr &&
          shared->first_batch == call.batch &&
          shared->hessian->columns() == x.size(-1)) {
        p.hessian = shared->hessian;
      }
    }
    if (p.hessian == nullptr) {
      // Input features: the weight's [out, in] (Conv1D's [in, out]).
      int64_t columns;
      if (const FusedLinear* fused = experts_.FindLinear(path)) {
        columns = fused->shape[1];
      } else {
        ASSIGN_OR_RETURN(at::Tensor w, ctx.model().GetTensor(WeightPath(path)));
        columns = w.size(transposed_.count(path) > 0 ? 0 : 1);
      }
      absl::Status made = runtime::TorchCall("", [&]() -> absl::Status {
        p.hessian = std::make_unique<HessianAccumulator>(
            Distributed() ? HessianAccumulator::Summing(columns)
                          : HessianAccumulator(columns));
        return absl::OkStatus();
      });
      if (!made.ok()) {
        return util::Annotate(
            made, absl::StrCat(name(), ": cannot allocate the Hessian of ",
                               path, " (", columns, " x ", columns, " fp32, ",
                               util::HumanBytes(columns * columns * 4), ")"));
      }
      if (shared != nullptr && shared->hessian == nullptr) {
        shared->hessian = p.hessian;
        shared->first_batch = call.batch;
      }
    }
    bool add = true;
    if (shared != nullptr && p.hessian == shared->hessian) {
      if (shared->batch != call.batch) {
        shared->batch = call.batch;
        shared->readers.clear();
      } else if (!shared->readers.contains(path)) {
        add = false;  // A sibling added this batch's inputs.
        ++shared_hessian_reads_;
      } else {
        // Called twice in one batch: its own copy from now on.
        ASSIGN_OR_RETURN(HessianAccumulator own, runtime::TorchCall(path, [&] {
                           return p.hessian->Clone();
                         }));
        p.hessian = std::make_shared<HessianAccumulator>(std::move(own));
      }
      shared->readers.insert(path);
    }
    absl::Status added = add ? p.hessian->Add(x) : absl::OkStatus();
    if (!added.ok()) {
      bool non_finite = absl::StrContains(added.message(), "NaN") ||
                        absl::StrContains(added.message(), "inf");
      return util::Annotate(
          added, absl::StrCat(non_finite ? "non-finite activation: " : "",
                              name(), ": the input of ", path,
                              " (Linear) in calibration batch ", call.batch));
    }
    RETURN_IF_ERROR(AddOutputEnergy(path, call, p));
  }
  if (x.dim() > 0) p.tokens += x.numel() / std::max<int64_t>(1, x.size(-1));
  if (static_input_.has_value()) {
    return ObserveInput(path, x, call.batch, p);
  }
  return absl::OkStatus();
}

// Note [Output energy]
// ---------------------
// The output error's denominator tr(W H W^T) is, with H = 2/N sum x x^T
// over the N samples a Linear saw, 2/N sum |x W^T|^2 = 2/N sum |y - b|^2:
// the energy of the outputs the calibration pass computed anyway, instead
// of an [out, in] x [in, in] product. It holds for the weight that computed
// them, so Prepare uses it only when the module's weight is still that
// tensor, unmodified (its version counter), and only for the Linear's own
// calls with floating outputs of fp32 or wider (a bf16 output is rounded).
absl::Status WeightQuantModifier::AddOutputEnergy(const std::string& path,
                                                  const ModuleCall& call,
                                                  Pending& p) const {
  if (!p.energy_valid) return absl::OkStatus();
  p.energy_valid = false;  // Until this call's output is added, below.
  if (Distributed() || call.path != path || call.output == nullptr ||
      !call.output->isTensor() || call.module == nullptr ||
      !call.module->hasattr("weight") ||
      !call.module->attr("weight").isTensor()) {
    return absl::OkStatus();
  }
  const at::Tensor& y = call.output->toTensor();
  const at::Tensor weight = call.module->attr("weight").toTensor();
  if (weight.is_inference() ||
      (y.scalar_type() != at::kFloat && y.scalar_type() != at::kDouble)) {
    return absl::OkStatus();
  }
  at::Tensor bias;
  if (call.module->hasattr("bias")) {
    const c10::IValue b = call.module->attr("bias");
    if (b.isTensor()) {
      bias = b.toTensor();
    } else if (!b.isNone()) {
      return absl::OkStatus();
    }
  }
  if (y.dim() < 1 ||
      (bias.defined() && (bias.dim() != 1 || bias.size(0) != y.size(-1)))) {
    return absl::OkStatus();
  }
  if (p.energy_weight != nullptr &&
      (p.energy_weight != weight.unsafeGetTensorImpl() ||
       p.energy_weight_version != weight._version())) {
    return absl::OkStatus();
  }
  return runtime::TorchCall(path, [&]() -> absl::Status {
    at::Tensor e =
        at::sum((bias.defined() ? y - bias : y).square(), at::kDouble);
    p.output_energy = p.output_energy.defined() ? p.output_energy + e : e;
    p.energy_weight = weight.unsafeGetTensorImpl();
    p.energy_weight_version = weight._version();
    p.energy_valid = true;
    return absl::OkStatus();
  });
}

absl::Status WeightQuantModifier::OnSubgraphEnd(RunContext& ctx,
                                                const SubgraphInfo& subgraph) {
  if (Distributed()) {
    // Every rank the same list, whichever modules its shard reached.
    std::set<std::string> paths;
    for (const std::string& leaf : subgraph.leaf_modules) {
      if (selected_.count(leaf) > 0 && done_.count(leaf) == 0) {
        paths.insert(leaf);
      }
    }
    RETURN_IF_ERROR(CompressDistributed(
        ctx, std::vector<std::string>(paths.begin(), paths.end()),
        subgraph.index));
    RETURN_IF_ERROR(ReduceKvCache());
    return RecordKvCache(ctx);
  }
  shared_inputs_.clear();  // Only the pending modules hold the Hessians.
  CollectSiblingInputs();
  RETURN_IF_ERROR(CompressPending(ctx));
  RETURN_IF_ERROR(RecordKvCache(ctx));
  // Experts the router sent no token to: round-to-nearest, now, while
  // their weights are loaded.
  std::set<std::string> leaves(subgraph.leaf_modules.begin(),
                               subgraph.leaf_modules.end());
  for (const auto& [path, linear] : experts_.linears()) {
    if (leaves.contains(linear.experts) && done_.count(path) == 0) {
      RETURN_IF_ERROR(Compress(ctx, path, nullptr));
    }
  }
  return experts_.Commit(ctx);
}

absl::Status WeightQuantModifier::OnRunEnd(RunContext& ctx) {
  if (Distributed()) {
    std::vector<std::string> paths;
    for (const std::string& path : selected_) {
      if (done_.count(path) == 0) paths.push_back(path);
    }
    RETURN_IF_ERROR(CompressDistributed(ctx, paths, -1));
    RETURN_IF_ERROR(ReduceKvCache());
    return RecordKvCache(ctx);
  }
  shared_inputs_.clear();
  CollectSiblingInputs();
  RETURN_IF_ERROR(CompressPending(ctx));
  for (const std::string& path : selected_) {
    if (done_.count(path) > 0) continue;
    RETURN_IF_ERROR(Compress(ctx, path, nullptr));
  }
  for (const auto& [path, linear] : experts_.linears()) {
    if (done_.count(path) == 0) RETURN_IF_ERROR(Compress(ctx, path, nullptr));
  }
  RETURN_IF_ERROR(RecordKvCache(ctx));
  return experts_.Commit(ctx);
}

absl::StatusOr<c10::IValue> WeightQuantModifier::SaveState() const {
  c10::List<std::string> done;
  for (const std::string& path : done_) done.push_back(path);
  return c10::IValue(done);
}

absl::Status WeightQuantModifier::RestoreState(const c10::IValue& state) {
  if (!state.isList()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint: ", name(), " state is not a list"));
  }
  done_.clear();
  for (const c10::IValue& v : state.toListRef()) {
    if (!v.isString()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint: ", name(), " state has a non-string"));
    }
    done_.insert(v.toStringRef());
  }
  pending_.clear();
  shared_inputs_.clear();
  return absl::OkStatus();
}

std::optional<int64_t> ConfigInt(const runtime::GraphModule& model,
                                 const std::string& key) {
  auto it = model.extra_files().find("config.json");
  if (it == model.extra_files().end()) return std::nullopt;
  absl::StatusOr<util::Json> config = util::ParseJson(it->second);
  if (!config.ok()) return std::nullopt;
  const util::Json* v = util::FindMember(*config, key);
  if (v == nullptr || !v->is_number_integer()) return std::nullopt;
  return v->get<int64_t>();
}

std::optional<c10::ScalarType> ConfigDtype(const runtime::GraphModule& model) {
  auto it = model.extra_files().find("config.json");
  if (it == model.extra_files().end()) return std::nullopt;
  absl::StatusOr<util::Json> config = util::ParseJson(it->second);
  if (!config.ok()) return std::nullopt;
  for (const char* key : {"dtype", "torch_dtype"}) {
    const util::Json* d = util::FindMember(*config, key);
    if (d == nullptr || !d->is_string()) continue;
    const std::string name = d->get<std::string>();
    if (name == "bfloat16") return at::kBFloat16;
    if (name == "float16") return at::kHalf;
    if (name == "float32") return at::kFloat;
  }
  return std::nullopt;
}

void WeightQuantModifier::FindFusedGroups(RunContext& ctx) {
  // llm-compressor's FUSED_LAYER_NAMES: a module holding all of a group's
  // names fuses those of them that are quantized.
  static const std::vector<std::vector<std::string>> kFused = {
      {"gate_proj", "up_proj"},
      {"q_proj", "k_proj", "v_proj"},
      {"q_a_proj", "kv_a_proj_with_mqa"},
      {"w1", "w3"}};
  // Quantized here: selected modules and fused experts' Linears (w1/w3).
  auto quantized = [&](const std::string& p) {
    return selected_.contains(p) || experts_.FindLinear(p) != nullptr;
  };
  std::vector<std::string> paths(selected_.begin(), selected_.end());
  for (const auto& [path, linear] : experts_.linears()) paths.push_back(path);
  for (const std::string& path : paths) {
    const size_t dot = path.rfind('.');
    const std::string parent =
        dot == std::string::npos ? "" : path.substr(0, dot + 1);
    const std::string leaf = path.substr(parent.size());
    for (const std::vector<std::string>& names : kFused) {
      if (std::find(names.begin(), names.end(), leaf) == names.end()) continue;
      std::vector<std::string> members;
      bool all = true;
      for (const std::string& n : names) {
        all = all && (ctx.FindLeaf(parent + n) != nullptr ||
                      experts_.FindLinear(parent + n) != nullptr);
        if (quantized(parent + n)) members.push_back(parent + n);
      }
      if (all && members.size() > 1) {
        std::sort(members.begin(), members.end());
        fused_[path] = std::move(members);
      }
    }
  }
}

absl::StatusOr<at::Tensor> WeightQuantModifier::FusedGlobalScale(
    RunContext& ctx, const std::string& path) {
  auto it = fused_.find(path);
  if (it == fused_.end()) return at::Tensor();
  const std::vector<std::string>& members = it->second;
  at::Tensor& scale = fused_scale_[members.front()];
  if (scale.defined()) return scale;
  const quantization::QuantizationArgs& args = *options_.typed->weights;
  std::vector<quantization::MinMax> stats;
  for (const std::string& m : members) {
    at::Tensor w;
    if (experts_.FindLinear(m) != nullptr) {
      ASSIGN_OR_RETURN(w, experts_.Weight(ctx, m));
    } else {
      ASSIGN_OR_RETURN(w, ctx.model().GetTensor(WeightPath(m)));
      if (transposed_.contains(m)) w = w.t();
    }
    absl::StatusOr<quantization::MinMax> s =
        quantization::WeightMinMax(TypedWeight(w.detach()), args);
    if (!s.ok()) {
      return util::Annotate(
          s.status(), absl::StrCat(name(), ": ", m, " (fused global scale)"));
    }
    stats.push_back(*std::move(s));
  }
  absl::StatusOr<at::Tensor> gs = quantization::FusedGlobalScale(stats);
  if (!gs.ok()) {
    return util::Annotate(gs.status(),
                          absl::StrCat(name(), ": global scale of ",
                                       absl::StrJoin(members, ", ")));
  }
  scale = *gs;
  return scale;
}

int64_t WeightQuantModifier::GroupSize() const {
  if (!options_.typed.has_value()) return options_.scheme.group_size;
  const quantization::QuantizationArgs& w = *options_.typed->weights;
  const quantization::Strategy s = w.resolved_strategy();
  if (s == quantization::Strategy::kBlock && w.block_structure.has_value()) {
    return (*w.block_structure)[1];
  }
  return (s == quantization::Strategy::kGroup ||
          s == quantization::Strategy::kTensorGroup)
             ? w.group_size.value_or(-1)
             : -1;
}

std::string WeightQuantModifier::TypedRecord() const {
  if (!options_.typed.has_value()) return "";
  util::Json j = util::Json::object();
  j["scheme"] = options_.typed->ToJson();
  j["ignore"] = options_.modules.ignore;
  return util::DumpJson(j);
}

at::Tensor WeightQuantModifier::TypedWeight(const at::Tensor& weight) const {
  return typed_dtype_.has_value() && weight.is_floating_point()
             ? weight.to(*typed_dtype_)
             : weight;
}

absl::StatusOr<WeightQuantOutcome> WeightQuantModifier::QuantizeTyped(
    absl::string_view path, const at::Tensor& weight) {
  const quantization::QuantizationArgs& args = *options_.typed->weights;
  auto annotate = [&](const absl::Status& s) {
    return util::Annotate(
        s, absl::StrCat(name(), ": ", path, " (", args.ToString(), ")"));
  };
  const at::Tensor w = TypedWeight(weight);
  absl::StatusOr<quantization::QParams> q =
      quantization::WeightQParams(w, args, global_scale_);
  if (!q.ok()) return annotate(q.status());
  // The grid values as compressed-tensors computes them (in the
  // checkpoint's dtype), then their real values: in fp32, exactly, when the
  // module holds fp32, so that the output's codes are read back from the
  // module's weight as compressed-tensors computed them (a bf16 int8 weight
  // would lose some); else rounded to the module's dtype, as
  // compressed-tensors' fake_quantize leaves it.
  absl::StatusOr<at::Tensor> codes = quantization::Quantize(w, *q, args);
  if (!codes.ok()) return annotate(codes.status());
  quantization::QParams real = *q;
  const bool exact =
      weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kDouble;
  if (exact) real.scale = q->scale.to(weight.scalar_type());
  absl::StatusOr<at::Tensor> fake =
      quantization::Dequantize(*codes, real, args);
  if (!fake.ok()) return annotate(fake.status());
  WeightQuantOutcome out;
  out.weight = fake->to(weight.scalar_type());
  out.scale = q->scale;
  out.zero_point = q->zero_point;
  out.global_scale = q->global_scale;
  out.loss = kNaN;
  return out;
}

absl::StatusOr<WeightQuantOutcome> WeightQuantModifier::QuantizeWithoutData(
    absl::string_view path, const at::Tensor& weight) {
  if (options_.typed.has_value()) return QuantizeTyped(path, weight);
  absl::StatusOr<RtnResult> rtn = QuantizeRtn(weight, options_.scheme);
  if (!rtn.ok()) {
    return util::Annotate(
        rtn.status(), absl::StrCat(name(), ": ", path, " (round-to-nearest)"));
  }
  WeightQuantOutcome out;
  out.weight = rtn->weight;
  out.scale = rtn->params.scale;
  out.zero_point = rtn->params.zero_point;
  out.loss = kNaN;
  return out;
}

absl::StatusOr<WeightQuantOutcome> RtnModifier::QuantizeWeight(
    absl::string_view path, const at::Tensor& weight,
    const at::Tensor& hessian) {
  return QuantizeWithoutData(path, weight);
}

}  // namespace tracecut::modifiers
