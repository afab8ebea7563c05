// Example inputs, model files and TraceFile (the parts of tracer.h that are
// not the graph walk itself).

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/graph.h"
#include "runtime/dtype.h"
#include "tracer/tracer.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::tracer {
namespace {

// "input_ids: Tensor, attention_mask: Optional[Tensor]" (without self).
std::string ForwardSignature(const torch::jit::Module& module) {
  std::vector<std::string> out;
  auto method = module.find_method("forward");
  if (!method.has_value()) return "";
  const auto& args = method->function().getSchema().arguments();
  for (size_t i = 1; i < args.size(); ++i) {
    out.push_back(
        absl::StrCat(args[i].name(), ": ", args[i].type()->annotation_str()));
  }
  return absl::StrJoin(out, ", ");
}

std::string Repr(const c10::IValue& v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string ModuleTypeName(const torch::jit::Module& module) {
  return ir::Scope::DemangleType(module.type()->name()->qualifiedName());
}

}  // namespace

absl::StatusOr<torch::Tensor> MakeInputTensor(const hf::InputSpec& spec,
                                              at::Generator& generator) {
  // Example inputs take the canonical names only, as input specs do.
  absl::StatusOr<c10::ScalarType> dtype = runtime::ParseDType(spec.dtype);
  if (!runtime::IsInputDType(spec.dtype) || !dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input '", spec.name, "': unknown dtype \"", spec.dtype, "\""));
  }
  try {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> shape = spec.shape;
    if (spec.kind == "tokens") {
      if (!spec.high.has_value() || *spec.high <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", spec.name, "': kind \"tokens\" needs \"high\" > 0"));
      }
      return torch::randint(0, *spec.high, shape, generator,
                            torch::TensorOptions().dtype(torch::kLong))
          .to(*dtype);
    }
    if (spec.kind == "normal") {
      return torch::randn(shape, generator,
                          torch::TensorOptions().dtype(torch::kFloat32))
          .to(*dtype);
    }
    if (spec.kind == "ones") return torch::ones(shape, torch::dtype(*dtype));
    if (spec.kind == "zeros") return torch::zeros(shape, torch::dtype(*dtype));
    if (spec.kind == "arange") {
      if (shape.empty()) return torch::zeros({}, torch::dtype(*dtype));
      return torch::arange(shape.back(), torch::dtype(torch::kLong))
          .expand(shape)
          .contiguous()
          .to(*dtype);
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", spec.name,
                     "': cannot make it: ", e.what_without_backtrace()));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "input '", spec.name, "': unknown kind \"", spec.kind, "\""));
}

absl::StatusOr<ExampleInputs> ResolveExampleInputs(
    const torch::jit::Module& module, const TraceOptions& options) {
  auto forward = module.find_method("forward");
  if (!forward.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module ", ModuleTypeName(module), " has no forward method"));
  }
  const c10::FunctionSchema& schema = forward->function().getSchema();
  const std::vector<c10::Argument>& args = schema.arguments();

  auto takes = [&](const std::string& name) {
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i].name() == name) return true;
    }
    return false;
  };
  std::string signature = absl::StrCat(ModuleTypeName(module), ".forward(");
  for (size_t i = 1; i < args.size(); ++i) {
    absl::StrAppend(&signature, i > 1 ? ", " : "", args[i].name());
  }
  signature += ")";
  for (const auto& [name, value] : options.example_inputs) {
    if (!takes(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "example input '", name, "' is not an argument of ", signature));
    }
  }

  at::Generator generator = at::detail::createCPUGenerator(options.seed);
  std::map<std::string, c10::IValue> from_specs;
  for (const hf::InputSpec& spec : options.input_specs) {
    if (!takes(spec.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("example inputs name '", spec.name,
                       "', which is not an argument of ", signature));
    }
    ASSIGN_OR_RETURN(torch::Tensor t, MakeInputTensor(spec, generator));
    from_specs[spec.name] = t;
  }

  ExampleInputs out;
  const hf::HfConfig* config =
      options.config.has_value() ? &*options.config : nullptr;
  for (size_t i = 1; i < args.size(); ++i) {
    const c10::Argument& arg = args[i];
    const std::string& name = arg.name();
    c10::IValue value;
    bool have = false;
    if (auto it = options.example_inputs.find(name);
        it != options.example_inputs.end()) {
      value = it->second;
      have = true;
    } else if (auto it = from_specs.find(name); it != from_specs.end()) {
      value = it->second;
      have = true;
    } else if (arg.default_value().has_value()) {
      value = *arg.default_value();
      have = true;
    } else {
      ASSIGN_OR_RETURN(std::optional<hf::InputSpec> dummy,
                       hf::DummyInputSpec(config, name, options.dummy_shape));
      if (dummy.has_value()) {
        ASSIGN_OR_RETURN(torch::Tensor t, MakeInputTensor(*dummy, generator));
        value = t;
        have = true;
      } else if (arg.type()->kind() == c10::TypeKind::OptionalType) {
        have = true;  // None.
      }
    }
    if (!have) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no example value for argument '", name, "' (",
          arg.type()->annotation_str(), ") of ", ModuleTypeName(module),
          ".forward(", ForwardSignature(module),
          "): describe it with --input=NAME:DTYPE[D0,D1,...] or "
          "--example-inputs=FILE on the command line, in the model's "
          "embedded tracecut_inputs.json (docs/example_inputs.md), or in "
          "TraceOptions::example_inputs"));
    }
    if (!value.isNone() && !value.type()->isSubtypeOf(*arg.type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "example input '", name, "' is a ", value.type()->annotation_str(),
          ", but ", ModuleTypeName(module), ".forward takes ",
          arg.type()->annotation_str()));
    }
    if (value.isNone()) {
      out.assumptions.push_back(absl::StrCat("input ", name, " is None"));
    } else if (!value.isTensor() && !value.isTensorList() && !value.isTuple() &&
               !value.isList()) {
      out.assumptions.push_back(
          absl::StrCat("input ", name, " == ", Repr(value)));
    }
    out.names.push_back(name);
    out.values.push_back(std::move(value));
  }
  return out;
}

absl::StatusOr<TraceOptions> WithModelFiles(const LoadedModel& model,
                                            TraceOptions options) {
  if (!options.config_path.empty()) {
    ASSIGN_OR_RETURN(options.config, hf::HfConfig::Load(options.config_path));
  } else if (!options.config.has_value() && model.config.has_value()) {
    options.config = model.config;
  }
  if (options.input_specs.empty() && model.inputs.has_value()) {
    options.input_specs = model.inputs->inputs;
  }
  for (const std::string& path : model.required_leaves) {
    options.leaf_policy.AddPath(path);
  }
  if (options.input_specs.empty() && options.example_inputs.empty()) {
    options.example_inputs = model.example_inputs;
  }
  return options;
}

absl::Status TraceErrorOf(const std::string& path, const absl::Status& error) {
  if (error.ok() ||
      absl::StartsWith(error.message(), absl::StrCat(path, ":"))) {
    return error;
  }
  return util::Annotate(error, path);
}

absl::StatusOr<runtime::GraphModule> TraceFile(const std::string& path,
                                               const TraceOptions& options) {
  ASSIGN_OR_RETURN(LoadedModel model, LoadModel(path));
  ASSIGN_OR_RETURN(TraceOptions resolved, WithModelFiles(model, options));
  absl::StatusOr<runtime::GraphModule> gm = Trace(model.module, resolved);
  if (!gm.ok()) return TraceErrorOf(path, gm.status());
  gm->mutable_extra_files() = model.extra_files;
  if (!options.config_path.empty() && resolved.config.has_value()) {
    gm->mutable_extra_files()[kConfigJson] = resolved.config->text();
  }
  return gm;
}

}  // namespace tracecut::tracer
