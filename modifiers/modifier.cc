#include "modifiers/modifier.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "partition/partitioner.h"
#include "runtime/finite.h"
#include "runtime/torch_status.h"
#include "util/json.h"
#include "util/progress.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

using ::tracecut::util::Progress;
namespace {

using c10::IValue;
using Dict = c10::impl::GenericDict;

Dict NewDict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

IValue TensorOrNone(const at::Tensor& t) {
  return t.defined() ? IValue(t) : IValue();
}

IValue StringList(const std::vector<std::string>& v) {
  c10::List<std::string> list;
  for (const std::string& s : v) list.push_back(s);
  return list;
}

// Typed reads from a checkpoint dict; errors name the field.
class DictReader {
 public:
  DictReader(const IValue& v, std::string what) : what_(std::move(what)) {
    if (v.isGenericDict()) dict_ = v.toGenericDict();
  }
  bool ok() const { return dict_.has_value(); }

  absl::StatusOr<IValue> Get(const std::string& key) const {
    if (!dict_) return Bad(key, "is not a dict");
    auto it = dict_->find(key);
    if (it == dict_->end()) return Bad(key, "is missing");
    return it->value();
  }
  absl::StatusOr<std::string> String(const std::string& key) const {
    ASSIGN_OR_RETURN(IValue v, Get(key));
    if (!v.isString()) return Bad(key, "is not a string");
    return v.toStringRef();
  }
  absl::StatusOr<double> Double(const std::string& key) const {
    ASSIGN_OR_RETURN(IValue v, Get(key));
    if (v.isDouble()) return v.toDouble();
    if (v.isInt()) return static_cast<double>(v.toInt());
    return Bad(key, "is not a number");
  }
  absl::StatusOr<int64_t> Int(const std::string& key) const {
    ASSIGN_OR_RETURN(IValue v, Get(key));
    if (!v.isInt()) return Bad(key, "is not an int");
    return v.toInt();
  }
  absl::StatusOr<at::Tensor> Tensor(const std::string& key) const {
    ASSIGN_OR_RETURN(IValue v, Get(key));
    if (v.isNone()) return at::Tensor();
    if (!v.isTensor()) return Bad(key, "is not a tensor");
    return v.toTensor();
  }
  // Fields added after checkpoints were first written: a checkpoint from an
  // older tracecut lacks them, and reads as their default.
  absl::StatusOr<at::Tensor> OptionalTensor(const std::string& key) const {
    if (dict_ && dict_->find(key) == dict_->end()) return at::Tensor();
    return Tensor(key);
  }
  absl::StatusOr<std::string> OptionalString(const std::string& key) const {
    if (dict_ && dict_->find(key) == dict_->end()) return std::string();
    return String(key);
  }
  absl::StatusOr<std::vector<std::string>> Strings(
      const std::string& key) const {
    ASSIGN_OR_RETURN(IValue v, Get(key));
    if (!v.isList()) return Bad(key, "is not a list");
    std::vector<std::string> out;
    for (const IValue& e : v.toListRef()) {
      if (!e.isString()) return Bad(key, "has a non-string element");
      out.push_back(e.toStringRef());
    }
    return out;
  }

 private:
  absl::Status Bad(const std::string& key, absl::string_view why) const {
    return absl::DataLossError(
        absl::StrCat("checkpoint: ", what_, ".", key, " ", why));
  }
  std::string what_;
  std::optional<Dict> dict_;
};

IValue RangeToIValue(const ActivationRange& r) {
  Dict d = NewDict();
  d.insert("observer", r.observer);
  d.insert("scheme", r.scheme);
  d.insert("min", r.min);
  d.insert("max", r.max);
  d.insert("batches", r.batches);
  d.insert("scale", TensorOrNone(r.scale));
  d.insert("zero_point", TensorOrNone(r.zero_point));
  d.insert("global_scale", TensorOrNone(r.global_scale));
  return d;
}

absl::StatusOr<ActivationRange> RangeFromIValue(const IValue& v,
                                                const std::string& what) {
  DictReader in(v, what);
  ActivationRange r;
  ASSIGN_OR_RETURN(r.observer, in.String("observer"));
  ASSIGN_OR_RETURN(r.scheme, in.String("scheme"));
  ASSIGN_OR_RETURN(r.min, in.Double("min"));
  ASSIGN_OR_RETURN(r.max, in.Double("max"));
  ASSIGN_OR_RETURN(r.batches, in.Int("batches"));
  ASSIGN_OR_RETURN(r.scale, in.Tensor("scale"));
  ASSIGN_OR_RETURN(r.zero_point, in.Tensor("zero_point"));
  ASSIGN_OR_RETURN(r.global_scale, in.OptionalTensor("global_scale"));
  return r;
}

IValue RecordToIValue(const ModuleRecord& r) {
  Dict d = NewDict();
  d.insert("type", r.type);
  d.insert("subgraph", static_cast<int64_t>(r.subgraph));
  d.insert("weight_method", r.weight_method);
  d.insert("weight_scheme", r.weight_scheme);
  d.insert("weight_scale", TensorOrNone(r.weight_scale));
  d.insert("weight_zero_point", TensorOrNone(r.weight_zero_point));
  d.insert("weight_g_idx", TensorOrNone(r.weight_g_idx));
  d.insert("weight_quantization", r.weight_quantization);
  d.insert("weight_global_scale", TensorOrNone(r.weight_global_scale));
  d.insert("weight_error", r.weight_error);
  d.insert("rtn_error", r.rtn_error);
  d.insert("gptq_loss", r.gptq_loss);
  d.insert("calibration_tokens", r.calibration_tokens);
  d.insert("compress_seconds", r.compress_seconds);
  d.insert("input", RangeToIValue(r.input));
  d.insert("output", RangeToIValue(r.output));
  d.insert("k_cache", RangeToIValue(r.k_cache));
  d.insert("v_cache", RangeToIValue(r.v_cache));
  d.insert("kv_cache_scheme", r.kv_cache_scheme);
  d.insert("notes", StringList(r.notes));
  return d;
}

absl::StatusOr<ModuleRecord> RecordFromIValue(const IValue& v,
                                              const std::string& what) {
  DictReader in(v, what);
  ModuleRecord r;
  ASSIGN_OR_RETURN(r.type, in.String("type"));
  ASSIGN_OR_RETURN(int64_t subgraph, in.Int("subgraph"));
  r.subgraph = static_cast<int>(subgraph);
  ASSIGN_OR_RETURN(r.weight_method, in.String("weight_method"));
  ASSIGN_OR_RETURN(r.weight_scheme, in.String("weight_scheme"));
  ASSIGN_OR_RETURN(r.weight_scale, in.Tensor("weight_scale"));
  ASSIGN_OR_RETURN(r.weight_zero_point, in.Tensor("weight_zero_point"));
  ASSIGN_OR_RETURN(r.weight_g_idx, in.Tensor("weight_g_idx"));
  ASSIGN_OR_RETURN(r.weight_quantization,
                   in.OptionalString("weight_quantization"));
  ASSIGN_OR_RETURN(r.weight_global_scale,
                   in.OptionalTensor("weight_global_scale"));
  ASSIGN_OR_RETURN(r.weight_error, in.Double("weight_error"));
  ASSIGN_OR_RETURN(r.rtn_error, in.Double("rtn_error"));
  ASSIGN_OR_RETURN(r.gptq_loss, in.Double("gptq_loss"));
  ASSIGN_OR_RETURN(r.calibration_tokens, in.Int("calibration_tokens"));
  ASSIGN_OR_RETURN(r.compress_seconds, in.Double("compress_seconds"));
  ASSIGN_OR_RETURN(IValue input, in.Get("input"));
  ASSIGN_OR_RETURN(r.input, RangeFromIValue(input, what + ".input"));
  ASSIGN_OR_RETURN(IValue output, in.Get("output"));
  ASSIGN_OR_RETURN(r.output, RangeFromIValue(output, what + ".output"));
  ASSIGN_OR_RETURN(r.kv_cache_scheme, in.OptionalString("kv_cache_scheme"));
  if (!r.kv_cache_scheme.empty()) {
    ASSIGN_OR_RETURN(IValue k, in.Get("k_cache"));
    ASSIGN_OR_RETURN(r.k_cache, RangeFromIValue(k, what + ".k_cache"));
    ASSIGN_OR_RETURN(IValue v, in.Get("v_cache"));
    ASSIGN_OR_RETURN(r.v_cache, RangeFromIValue(v, what + ".v_cache"));
  }
  ASSIGN_OR_RETURN(r.notes, in.Strings("notes"));
  return r;
}

// A valid "re:" pattern, or an error naming it.
absl::Status CheckPattern(absl::string_view pattern, absl::string_view owner,
                          absl::string_view role) {
  if (!absl::StartsWith(pattern, "re:")) return absl::OkStatus();
  try {
    std::regex re(std::string(pattern.substr(3)), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        owner, ": invalid ", role, " regex '", pattern, "': ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShortType(absl::string_view type) {
  return ir::Scope::ShortType(type);
}

const ModuleRecord* CalibrationResults::FindModule(
    absl::string_view path) const {
  auto it = modules.find(std::string(path));
  return it == modules.end() ? nullptr : &it->second;
}

c10::IValue CalibrationResults::ToIValue() const {
  Dict d = NewDict();
  d.insert("pipeline", pipeline);
  Dict mods = NewDict();
  for (const auto& [path, record] : modules) {
    mods.insert(path, RecordToIValue(record));
  }
  d.insert("modules", mods);
  c10::impl::GenericList timings(c10::AnyType::get());
  for (const SubgraphTiming& t : subgraphs) {
    Dict td = NewDict();
    td.insert("index", static_cast<int64_t>(t.index));
    td.insert("label", t.label);
    td.insert("calibrate_seconds", t.calibrate_seconds);
    td.insert("compress_seconds", t.compress_seconds);
    td.insert("propagate_seconds", t.propagate_seconds);
    timings.push_back(td);
  }
  d.insert("subgraphs", timings);
  d.insert("warnings", StringList(warnings));
  return d;
}

absl::StatusOr<CalibrationResults> CalibrationResults::FromIValue(
    const c10::IValue& v) {
  DictReader in(v, "results");
  CalibrationResults r;
  ASSIGN_OR_RETURN(r.pipeline, in.String("pipeline"));
  ASSIGN_OR_RETURN(IValue mods, in.Get("modules"));
  if (!mods.isGenericDict()) {
    return absl::DataLossError("checkpoint: results.modules is not a dict");
  }
  for (const auto& entry : mods.toGenericDict()) {
    if (!entry.key().isString()) {
      return absl::DataLossError("checkpoint: results.modules has a bad key");
    }
    const std::string& path = entry.key().toStringRef();
    ASSIGN_OR_RETURN(r.modules[path],
                     RecordFromIValue(entry.value(), "modules." + path));
  }
  ASSIGN_OR_RETURN(IValue timings, in.Get("subgraphs"));
  if (!timings.isList()) {
    return absl::DataLossError("checkpoint: results.subgraphs is not a list");
  }
  for (const IValue& t : timings.toListRef()) {
    DictReader tin(t, "subgraphs[]");
    SubgraphTiming timing;
    ASSIGN_OR_RETURN(int64_t index, tin.Int("index"));
    timing.index = static_cast<int>(index);
    ASSIGN_OR_RETURN(timing.label, tin.String("label"));
    ASSIGN_OR_RETURN(timing.calibrate_seconds, tin.Double("calibrate_seconds"));
    ASSIGN_OR_RETURN(timing.compress_seconds, tin.Double("compress_seconds"));
    ASSIGN_OR_RETURN(timing.propagate_seconds, tin.Double("propagate_seconds"));
    r.subgraphs.push_back(std::move(timing));
  }
  ASSIGN_OR_RETURN(r.warnings, in.Strings("warnings"));
  return r;
}

RunContext::RunContext(runtime::GraphModule* model, CalibrationResults* results,
                       int64_t num_batches, Progress* progress)
    : model_(model),
      results_(results),
      num_batches_(num_batches),
      progress_(progress) {
  absl::flat_hash_set<std::string> seen;
  for (const ir::Node* node : model_->graph().nodes()) {
    if (node->op() != ir::OpKind::kCallModule) continue;
    if (!seen.insert(node->target()).second) continue;
    LeafModule leaf;
    leaf.path = node->target();
    absl::StatusOr<torch::jit::Module> m = model_->GetSubmodule(leaf.path);
    if (m.ok()) {
      leaf.type = ir::Scope::DemangleType(m->type()->name()->qualifiedName());
    }
    leaves_.push_back(std::move(leaf));
  }
}

const LeafModule* RunContext::FindLeaf(absl::string_view path) const {
  for (const LeafModule& leaf : leaves_) {
    if (leaf.path == path) return &leaf;
  }
  return nullptr;
}

absl::Status RunContext::UpdateTensor(absl::string_view path,
                                      const at::Tensor& value) {
  ASSIGN_OR_RETURN(at::Tensor target, model_->GetTensor(path));
  if (!value.defined() || target.sizes() != value.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("updating '", path, "': new value has shape ",
                     value.defined() ? c10::str(value.sizes()) : "undefined",
                     ", the tensor has ", c10::str(target.sizes())));
  }
  RETURN_IF_ERROR(
      runtime::TorchCall(absl::StrCat("updating '", path, "'"), [&] {
        c10::NoGradGuard no_grad;
        // A new tensor, not a write into `target`: a traced module shares
        // its tensors with the module it was traced from (tracer::Trace).
        // Every attribute holding `target` (tied weights) gets it.
        at::Tensor fresh = at::empty_like(target, at::MemoryFormat::Preserve);
        fresh.copy_(value);
        fresh.set_requires_grad(target.requires_grad());
        for (const torch::jit::Module& m : model_->module().modules()) {
          const c10::intrusive_ptr<c10::ivalue::Object>& object = m._ivalue();
          for (size_t i = 0; i < object->slots().size(); ++i) {
            const c10::IValue& slot = object->getSlot(i);
            if (slot.isTensor() && slot.toTensor().unsafeGetTensorImpl() ==
                                       target.unsafeGetTensorImpl()) {
              object->setSlot(i, fresh);
            }
          }
        }
      }));
  updated_.insert(std::string(path));
  ++update_count_;
  return absl::OkStatus();
}

std::set<std::string> RunContext::TakeUpdatedTensors() {
  std::set<std::string> out;
  out.swap(updated_);
  return out;
}

void RunContext::Warn(std::string message) {
  if (progress_ != nullptr) progress_->Note(absl::StrCat("warning: ", message));
  results_->warnings.push_back(std::move(message));
}

c10::IValue NamesToState(const std::set<std::string>& names) {
  c10::impl::GenericList list(c10::StringType::get());
  for (const std::string& n : names) list.push_back(n);
  return c10::IValue(list);
}

absl::StatusOr<std::set<std::string>> NamesFromState(const c10::IValue& state,
                                                     absl::string_view owner) {
  std::set<std::string> names;
  if (state.isNone()) return names;
  if (!state.isList()) {
    return absl::DataLossError(
        absl::StrCat(owner, ": checkpoint state is not a list"));
  }
  for (const c10::IValue& v : state.toListRef()) {
    if (!v.isString()) {
      return absl::DataLossError(
          absl::StrCat(owner, ": checkpoint state holds a non-string"));
    }
    names.insert(v.toStringRef());
  }
  return names;
}

std::string ParentModulePath(absl::string_view path) {
  const size_t dot = path.rfind('.');
  return dot == absl::string_view::npos ? "" : std::string(path.substr(0, dot));
}

std::string ModelArchitecture(const runtime::GraphModule& model) {
  auto it = model.extra_files().find("config.json");
  if (it == model.extra_files().end()) return "";
  absl::StatusOr<util::Json> config = util::ParseJson(it->second);
  if (!config.ok()) return "";
  const util::Json* archs = util::FindMember(*config, "architectures");
  if (archs == nullptr || !archs->is_array() || archs->empty() ||
      !(*archs)[0].is_string()) {
    return "";
  }
  return (*archs)[0].get<std::string>();
}

absl::Status RunContext::ReplaySubgraph(const CallVisitor& visit) {
  if (!replayer_) {
    return absl::FailedPreconditionError(
        "replaying a subgraph needs a partitioned pipeline (sequential or "
        "layer_sequential), inside OnSubgraphEnd");
  }
  return replayer_(visit);
}

bool ModuleSelector::Matches(absl::string_view path,
                             absl::string_view type) const {
  bool selected = false;
  for (const std::string& t : targets) {
    if (partition::ModulePatternMatches(t, path, type)) {
      selected = true;
      break;
    }
  }
  if (!selected) return false;
  for (const std::string& i : ignore) {
    if (partition::ModulePatternMatches(i, path, type)) return false;
  }
  return true;
}

absl::StatusOr<std::vector<const LeafModule*>> ModuleSelector::Select(
    const RunContext& ctx, absl::string_view owner) const {
  if (targets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, ": no targets given (e.g. \"Linear\")"));
  }
  for (const std::string& t : targets) {
    RETURN_IF_ERROR(CheckPattern(t, owner, "target"));
  }
  for (const std::string& i : ignore) {
    RETURN_IF_ERROR(CheckPattern(i, owner, "ignore"));
  }
  std::vector<const LeafModule*> selected;
  for (const LeafModule& leaf : ctx.leaf_modules()) {
    if (Matches(leaf.path, leaf.type)) selected.push_back(&leaf);
  }
  if (selected.empty()) {
    std::set<std::string> types;
    std::vector<std::string> ignored;  // Targeted, but ignored.
    for (const LeafModule& leaf : ctx.leaf_modules()) {
      types.insert(ShortType(leaf.type));
      if (ModuleSelector{targets, {}}.Matches(leaf.path, leaf.type)) {
        ignored.push_back(leaf.path);
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        owner, ": targets [", absl::StrJoin(targets, ", "), "]",
        ignore.empty()
            ? ""
            : absl::StrCat(" (ignoring [", absl::StrJoin(ignore, ", "), "])"),
        " match no leaf module of the model",
        ignored.empty()
            ? ""
            : absl::StrCat(" but the ignored ", absl::StrJoin(ignored, ", ")),
        "; its leaf module types are: ",
        types.empty() ? "(none)" : absl::StrJoin(types, ", ")));
  }
  return selected;
}

absl::Status ExportQuantParams(const CalibrationResults& results,
                               runtime::GraphModule& model) {
  auto set = [&](const std::string& path, absl::string_view name,
                 const at::Tensor& t) -> absl::Status {
    if (!t.defined()) return absl::OkStatus();
    return model.SetTensor(absl::StrCat(path, ".", name), t);
  };
  for (const auto& [path, r] : results.modules) {
    // A fused MoE expert's Linear (fused_experts.h) is no module of the
    // model: its parameters go to compressed-tensors output only.
    if (!r.weight_method.empty() &&
        !model.GetTensor(absl::StrCat(path, ".weight")).ok()) {
      continue;
    }
    if (!r.weight_method.empty()) {
      RETURN_IF_ERROR(set(path, "weight_scale", r.weight_scale));
      RETURN_IF_ERROR(set(path, "weight_zero_point", r.weight_zero_point));
      RETURN_IF_ERROR(set(path, "weight_g_idx", r.weight_g_idx));
      RETURN_IF_ERROR(set(path, "weight_global_scale", r.weight_global_scale));
    }
    if (!r.input.observer.empty()) {
      RETURN_IF_ERROR(set(path, "input_scale", r.input.scale));
      RETURN_IF_ERROR(set(path, "input_zero_point", r.input.zero_point));
      RETURN_IF_ERROR(set(path, "input_global_scale", r.input.global_scale));
    }
    if (!r.kv_cache_scheme.empty()) {
      RETURN_IF_ERROR(set(path, "k_scale", r.k_cache.scale));
      RETURN_IF_ERROR(set(path, "v_scale", r.v_cache.scale));
    }
    if (!r.output.observer.empty()) {
      RETURN_IF_ERROR(set(path, "output_scale", r.output.scale));
      RETURN_IF_ERROR(set(path, "output_zero_point", r.output.zero_point));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckQuantRecordFinite(const std::string& path,
                                    const ModuleRecord& r,
                                    const at::Tensor& weight) {
  auto check = [&](absl::string_view name, const at::Tensor& t) {
    absl::Status s = runtime::CheckFinite(
        t, absl::StrCat("module ", path, " (", ShortType(r.type), "): ", name));
    if (s.ok()) return s;
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration produced a non-finite value, nothing written: ",
        s.message()));
  };
  RETURN_IF_ERROR(check("weight_scale", r.weight_scale));
  RETURN_IF_ERROR(check("weight_zero_point", r.weight_zero_point));
  RETURN_IF_ERROR(check("weight_global_scale", r.weight_global_scale));
  RETURN_IF_ERROR(check("input_scale", r.input.scale));
  RETURN_IF_ERROR(check("input_zero_point", r.input.zero_point));
  RETURN_IF_ERROR(check("input_global_scale", r.input.global_scale));
  RETURN_IF_ERROR(check("k_scale", r.k_cache.scale));
  RETURN_IF_ERROR(check("v_scale", r.v_cache.scale));
  RETURN_IF_ERROR(check("output_scale", r.output.scale));
  RETURN_IF_ERROR(check("output_zero_point", r.output.zero_point));
  if (!r.weight_method.empty() && r.weight_method != "observer") {
    RETURN_IF_ERROR(check("quantized weight", weight));
  }
  return absl::OkStatus();
}

absl::Status CheckQuantResultsFinite(const CalibrationResults& results,
                                     const runtime::GraphModule& model) {
  for (const auto& [path, r] : results.modules) {
    absl::StatusOr<at::Tensor> w =
        model.GetTensor(absl::StrCat(path, ".weight"));
    RETURN_IF_ERROR(
        CheckQuantRecordFinite(path, r, w.ok() ? *w : at::Tensor()));
  }
  return absl::OkStatus();
}

}  // namespace tracecut::modifiers
