#include "tracer/export/pt2_import.h"

#include <torch/csrc/jit/frontend/parser.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/csrc/jit/serialization/source_range_serialization.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/torch_status.h"
#include "tracer/export/pt2_import_internal.h"
#include "util/status_macros.h"

// Note [Importing torch.export programs]
//
// torch.export traces through every module, so its graph is flat; the module
// structure survives as each node's `nn_module_stack` (one entry per module
// call on the way from the root: a call key, the module path, its type).
// Those calls nest, so the program is a tree of calls, each owning the
// nodes whose innermost call it is. We emit one TorchScript method per call:
// its own nodes and its children's calls, scheduled in a topological order
// that follows the program's where it can (a child call runs when all its
// inputs are ready). Method text uses canonical local names, so two calls of
// one module instance with the same code share one `forward`; a call whose
// code differs from the module's first call, or whose scheduling would need
// a value it produces itself, is inlined instead (its children are then
// scheduled in the caller). Parameters are read through `self` when they
// belong to the calling module, else through an attribute added to it that
// holds the same tensor (tied weights: lm_head reading embed_tokens.weight).

namespace tracecut::tracer::exported {
namespace internal {
namespace {

// torch.export's own passes, which appear in stack traces of the nodes
// they add (runtime asserts, symbolic sizes).
bool IsTorchMachinery(absl::string_view file) {
  for (absl::string_view dir : {"torch/fx/", "torch/_export/", "torch/export/",
                                "torch/_dynamo/", "torch/_subclasses/"}) {
    if (absl::StartsWith(file, dir) ||
        absl::StrContains(file, absl::StrCat("/", dir))) {
      return true;
    }
  }
  return false;
}

}  // namespace

// The frames of a torch.export `stack_trace`, outermost first, without
// generated code ("<eval_with_key>.3") and torch.export's own passes.
std::vector<Frame> ParseFrames(absl::string_view trace) {
  std::vector<Frame> frames;
  std::vector<absl::string_view> lines = absl::StrSplit(trace, '\n');
  for (size_t k = 0; k < lines.size(); ++k) {
    absl::string_view l = absl::StripAsciiWhitespace(lines[k]);
    if (!absl::ConsumePrefix(&l, "File \"")) continue;
    size_t q = l.find('"');
    if (q == absl::string_view::npos) continue;
    Frame f;
    f.file = std::string(l.substr(0, q));
    if (absl::StartsWith(f.file, "<") || IsTorchMachinery(f.file)) continue;
    size_t ln = l.find("line ");
    if (ln != absl::string_view::npos) {
      absl::string_view rest = l.substr(ln + 5);
      if (!absl::SimpleAtoi(rest.substr(0, rest.find(',')), &f.line)) continue;
    }
    if (k + 1 < lines.size() &&
        !absl::StartsWith(absl::StripLeadingAsciiWhitespace(lines[k + 1]),
                          "File \"")) {
      f.code = std::string(absl::StripAsciiWhitespace(lines[k + 1]));
    }
    frames.push_back(std::move(f));
  }
  return frames;
}

bool IsIdentifier(absl::string_view s) {
  static const auto* const kKeywords = new absl::flat_hash_set<std::string>{
      "False",  "None",     "True",  "and",    "as",       "assert",
      "async",  "await",    "break", "class",  "continue", "def",
      "del",    "elif",     "else",  "except", "finally",  "for",
      "from",   "global",   "if",    "import", "in",       "is",
      "lambda", "nonlocal", "not",   "or",     "pass",     "raise",
      "return", "try",      "while", "with",   "yield",    "print"};
  if (s.empty() || absl::ascii_isdigit(s[0])) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return !kKeywords->contains(std::string(s));
}

// The root forward's parameter name for a program input.
std::string LocalName(const std::string& value) {
  return IsIdentifier(value) && !absl::StartsWith(value, "__")
             ? value
             : absl::StrCat("in_", absl::StrReplaceAll(value, {{".", "_"}}));
}

std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

absl::Status Importer::ReadSignature() {
  const auto& sig = archive_.program.get_graph_module().get_signature();
  for (const schema::InputSpec& spec : sig.get_input_specs()) {
    using Tag = schema::InputSpec::Tag;
    switch (spec.tag()) {
      case Tag::PARAMETER:
        RETURN_IF_ERROR(
            AddTensorInput(spec.get_parameter().get_arg().get_name(),
                           spec.get_parameter().get_parameter_name(), true));
        break;
      case Tag::BUFFER:
        RETURN_IF_ERROR(AddTensorInput(spec.get_buffer().get_arg().get_name(),
                                       spec.get_buffer().get_buffer_name(),
                                       false));
        break;
      case Tag::TENSOR_CONSTANT:
        RETURN_IF_ERROR(AddTensorInput(
            spec.get_tensor_constant().get_arg().get_name(),
            spec.get_tensor_constant().get_tensor_constant_name(), false));
        break;
      case Tag::USER_INPUT: {
        const schema::Argument& arg = spec.get_user_input().get_arg();
        ValueInfo v;
        std::string name;
        if (arg.tag() == ArgTag::AS_TENSOR) {
          name = arg.get_as_tensor().get_name();
        } else if (arg.tag() == ArgTag::AS_SYM_INT &&
                   arg.get_as_sym_int().tag() ==
                       schema::SymIntArgument::Tag::AS_NAME) {
          name = arg.get_as_sym_int().get_as_name();
          v.kind = ValueKind::kInt;
        } else {
          return Unsupported(
              "a user input that is neither a tensor nor a "
              "symbolic int");
        }
        values_[name] = v;
        user_inputs_.push_back(name);
        break;
      }
      case Tag::CONSTANT_INPUT:
        break;  // Baked into the graph by torch.export.
      case Tag::CUSTOM_OBJ:
        return Unsupported("a custom-object input (torchbind)");
      case Tag::TOKEN:
        return Unsupported("an effect token input (side-effecting ops)");
    }
  }
  for (const schema::OutputSpec& spec : sig.get_output_specs()) {
    using Tag = schema::OutputSpec::Tag;
    if (spec.tag() == Tag::USER_OUTPUT) {
      const schema::Argument& arg = spec.get_user_output().get_arg();
      if (arg.tag() != ArgTag::AS_TENSOR) {
        return Unsupported(
            "a user output that is not a tensor (a constant or a symbolic "
            "size)");
      }
      user_outputs_.push_back(arg.get_as_tensor().get_name());
    } else if (spec.tag() == Tag::BUFFER_MUTATION) {
      return Unsupported(
          absl::StrCat("a program that writes buffer '",
                       spec.get_buffer_mutation().get_buffer_name(),
                       "' (re-export in eval mode without caches)"));
    } else if (spec.tag() == Tag::USER_INPUT_MUTATION) {
      return Unsupported("a program that writes into its inputs");
    } else {
      return Unsupported("a training program (loss or gradient outputs)");
    }
  }
  return absl::OkStatus();
}

absl::Status Importer::AddTensorInput(const std::string& name,
                                      const std::string& fqn,
                                      bool is_parameter) {
  if (!archive_.tensors.contains(fqn)) {
    return absl::InvalidArgumentError(absl::StrCat(
        archive_.path, ": the program reads '", fqn,
        "', which the archive does not hold (exported on the meta device "
        "or saved without weights?)"));
  }
  ValueInfo v;
  v.fqn = fqn;
  v.is_parameter = is_parameter;
  values_[name] = v;
  return absl::OkStatus();
}

absl::Status Importer::ReadNodes() {
  const auto& nodes = graph_.get_nodes();
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const schema::Node& n = nodes[i];
    for (const schema::Argument& out : n.get_outputs()) {
      RETURN_IF_ERROR(DefineOutputs(i, out));
    }
    std::vector<std::string> used;
    for (const schema::NamedArgument& in : n.get_inputs()) {
      RETURN_IF_ERROR(CollectUses(i, in.get_arg(), used));
    }
    for (const std::string& u : used) {
      auto it = values_.find(u);
      if (it == values_.end()) {
        return NodeError(i, absl::StrCat("reads '", u,
                                         "', which no earlier node or "
                                         "input defines"));
      }
      if (it->second.users.empty() || it->second.users.back() != i) {
        it->second.users.push_back(i);
      }
    }
    uses_.push_back(std::move(used));
  }
  for (const std::string& o : user_outputs_) {
    auto it = values_.find(o);
    if (it == values_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(archive_.path, ": the program returns '", o,
                       "', which no node defines"));
    }
    it->second.graph_output = true;
  }
  return absl::OkStatus();
}

absl::Status Importer::DefineOutputs(int node, const schema::Argument& out) {
  auto define = [&](const std::string& name, ValueKind kind) {
    ValueInfo v;
    v.kind = kind;
    v.producer = node;
    values_[name] = v;
  };
  switch (out.tag()) {
    case ArgTag::AS_NONE:
      return absl::OkStatus();
    case ArgTag::AS_TENSOR:
      define(out.get_as_tensor().get_name(), ValueKind::kTensor);
      return absl::OkStatus();
    case ArgTag::AS_TENSORS:
      for (const auto& t : out.get_as_tensors()) {
        define(t.get_name(), ValueKind::kTensor);
      }
      return absl::OkStatus();
    case ArgTag::AS_OPTIONAL_TENSORS:
      for (const auto& t : out.get_as_optional_tensors()) {
        if (t.tag() == schema::OptionalTensorArgument::Tag::AS_TENSOR) {
          define(t.get_as_tensor().get_name(), ValueKind::kTensor);
        }
      }
      return absl::OkStatus();
    case ArgTag::AS_SYM_INT:
      if (out.get_as_sym_int().tag() == schema::SymIntArgument::Tag::AS_NAME) {
        define(out.get_as_sym_int().get_as_name(), ValueKind::kInt);
      }
      return absl::OkStatus();
    case ArgTag::AS_SYM_BOOL:
      if (out.get_as_sym_bool().tag() ==
          schema::SymBoolArgument::Tag::AS_NAME) {
        define(out.get_as_sym_bool().get_as_name(), ValueKind::kBool);
      }
      return absl::OkStatus();
    case ArgTag::AS_SYM_FLOAT:
      if (out.get_as_sym_float().tag() ==
          schema::SymFloatArgument::Tag::AS_NAME) {
        define(out.get_as_sym_float().get_as_name(), ValueKind::kFloat);
      }
      return absl::OkStatus();
    default:
      return NodeError(node,
                       "has an output of a kind tracecut does not "
                       "import");
  }
}

absl::Status Importer::CollectUses(int node, const schema::Argument& a,
                                   std::vector<std::string>& used) {
  switch (a.tag()) {
    case ArgTag::AS_TENSOR:
      used.push_back(a.get_as_tensor().get_name());
      break;
    case ArgTag::AS_TENSORS:
      for (const auto& t : a.get_as_tensors()) used.push_back(t.get_name());
      break;
    case ArgTag::AS_OPTIONAL_TENSORS:
      for (const auto& t : a.get_as_optional_tensors()) {
        if (t.tag() == schema::OptionalTensorArgument::Tag::AS_TENSOR) {
          used.push_back(t.get_as_tensor().get_name());
        }
      }
      break;
    case ArgTag::AS_OPTIONAL_TENSOR:
      if (a.get_as_optional_tensor().tag() ==
          schema::OptionalTensorArgument::Tag::AS_TENSOR) {
        used.push_back(a.get_as_optional_tensor().get_as_tensor().get_name());
      }
      break;
    case ArgTag::AS_SYM_INT:
      if (a.get_as_sym_int().tag() == schema::SymIntArgument::Tag::AS_NAME) {
        used.push_back(a.get_as_sym_int().get_as_name());
      }
      break;
    case ArgTag::AS_SYM_INTS:
      for (const auto& s : a.get_as_sym_ints()) {
        if (s.tag() == schema::SymIntArgument::Tag::AS_NAME) {
          used.push_back(s.get_as_name());
        }
      }
      break;
    case ArgTag::AS_SYM_BOOL:
      if (a.get_as_sym_bool().tag() == schema::SymBoolArgument::Tag::AS_NAME) {
        used.push_back(a.get_as_sym_bool().get_as_name());
      }
      break;
    case ArgTag::AS_SYM_FLOAT:
      if (a.get_as_sym_float().tag() ==
          schema::SymFloatArgument::Tag::AS_NAME) {
        used.push_back(a.get_as_sym_float().get_as_name());
      }
      break;
    case ArgTag::AS_GRAPH:
      return NodeError(node,
                       "is a higher-order operator with a subgraph "
                       "(control flow, a grad-mode or autocast region); "
                       "tracecut imports straight-line programs "
                       "(tracecut export runs run_decompositions, which "
                       "removes grad-mode regions)");
    case ArgTag::AS_CUSTOM_OBJ:
      return NodeError(node, "takes a custom object (torchbind)");
    default:
      break;
  }
  return absl::OkStatus();
}

std::vector<std::array<std::string, 3>> Importer::ParseStack(
    absl::string_view s) {
  std::vector<std::array<std::string, 3>> out;
  for (absl::string_view e : absl::StrSplit(s, ';', absl::SkipEmpty())) {
    size_t first = e.find(',');
    size_t last = e.rfind(',');
    if (first == absl::string_view::npos || first == last) continue;
    out.push_back({std::string(e.substr(0, first)),
                   std::string(e.substr(first + 1, last - first - 1)),
                   std::string(e.substr(last + 1))});
  }
  return out;
}

absl::Status Importer::BuildCalls() {
  auto root = std::make_unique<Call>();
  root_ = root.get();
  calls_.push_back(std::move(root));
  absl::flat_hash_map<std::string, Call*> by_key;
  const auto& nodes = graph_.get_nodes();
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    Call* call = root_;
    auto meta = nodes[i].get_metadata().find("nn_module_stack");
    if (meta != nodes[i].get_metadata().end()) {
      for (const auto& [key, path, type] : ParseStack(meta->second)) {
        if (path.empty()) {  // The root module itself.
          if (root_->type.empty()) root_->type = type;
          continue;
        }
        auto it = by_key.find(key);
        if (it == by_key.end()) {
          auto c = std::make_unique<Call>();
          c->key = key;
          c->path = path;
          c->type = type;
          c->parent = call;
          call->children.push_back(c.get());
          it = by_key.emplace(key, c.get()).first;
          calls_.push_back(std::move(c));
        }
        call = it->second;
      }
    }
    call->own.push_back(i);
    node_call_.push_back(call);
  }
  if (root_->type.empty()) root_->type = "torch.nn.modules.module.Module";
  FillRegions(*root_);
  return absl::OkStatus();
}

void Importer::FillRegions(Call& c) {
  c.region = c.own;
  for (Call* child : c.children) {
    FillRegions(*child);
    c.region.insert(c.region.end(), child->region.begin(), child->region.end());
  }
  std::sort(c.region.begin(), c.region.end());
  c.in_region.insert(c.region.begin(), c.region.end());
  if (!c.region.empty()) c.first = c.region.front();
}

absl::StatusOr<ModuleInfo*> Importer::GetModule(const std::string& path,
                                                const std::string& type) {
  auto it = modules_.find(path);
  if (it != modules_.end()) return &it->second;
  ModuleInfo* parent = nullptr;
  std::string name = path;
  if (!path.empty()) {
    size_t dot = path.rfind('.');
    std::string parent_path =
        dot == std::string::npos ? "" : path.substr(0, dot);
    name = dot == std::string::npos ? path : path.substr(dot + 1);
    ASSIGN_OR_RETURN(parent, GetModule(parent_path, TypeOf(parent_path)));
    if (parent->attributes.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          archive_.path, ": module path '", path, "' is also a tensor's name"));
    }
  }
  // One class per instance (each gets its own forward), named after the
  // original type with TorchScript's mangling, which ir::Scope removes.
  std::string qualified =
      type.empty() ? "torch.nn.modules.module.Module" : type;
  size_t dot = qualified.rfind('.');
  std::string mangled = absl::StrCat(
      "__torch__.",
      dot == std::string::npos ? "" : qualified.substr(0, dot + 1),
      "___torch_mangle_", class_counter_++, ".",
      dot == std::string::npos ? qualified : qualified.substr(dot + 1));
  ASSIGN_OR_RETURN(
      torch::jit::Module m,
      runtime::TorchCall(absl::StrCat("creating module '", path, "'"), [&] {
        auto cls = c10::ClassType::create(c10::QualifiedName(mangled), cu_,
                                          /*is_module=*/true);
        cu_->register_type(cls);
        return torch::jit::Module(cu_, cls);
      }));
  if (parent != nullptr) {
    RETURN_IF_ERROR(
        runtime::TorchCall(absl::StrCat("adding module '", path, "'"),
                           [&] { parent->module.register_module(name, m); }));
    parent->attributes.insert(name);
  }
  ModuleInfo info;
  info.module = m;
  info.type = qualified;
  return &modules_.emplace(path, std::move(info)).first->second;
}

absl::Status Importer::BuildModules() {
  for (const auto& c : calls_) {
    if (!types_.contains(c->path)) types_[c->path] = c->type;
  }
  types_[""] = root_->type;
  // Modules first (in path order, so parents precede children), then
  // the tensors, in name order.
  std::set<std::string> paths;
  for (const auto& [path, type] : types_) paths.insert(path);
  for (const auto& [fqn, t] : archive_.tensors) {
    size_t dot = fqn.rfind('.');
    paths.insert(dot == std::string::npos ? "" : fqn.substr(0, dot));
  }
  for (const std::string& p : paths) {
    RETURN_IF_ERROR(GetModule(p, TypeOf(p)).status());
  }
  std::map<std::string, bool> kinds;  // fqn -> is_parameter.
  for (const auto& [name, v] : values_) {
    if (!v.fqn.empty()) kinds[v.fqn] = v.is_parameter;
  }
  for (const auto& [fqn, is_parameter] : kinds) {
    size_t dot = fqn.rfind('.');
    std::string owner = dot == std::string::npos ? "" : fqn.substr(0, dot);
    std::string name = dot == std::string::npos ? fqn : fqn.substr(dot + 1);
    RETURN_IF_ERROR(AddTensor(modules_.at(owner), name,
                              archive_.tensors.at(fqn), is_parameter));
  }
  return absl::OkStatus();
}

absl::Status Importer::AddTensor(ModuleInfo& m, const std::string& name,
                                 const torch::Tensor& t, bool is_parameter) {
  if (m.attributes.contains(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(archive_.path, ": '", name,
                     "' is defined twice in module of type ", m.type));
  }
  m.attributes.insert(name);
  return runtime::TorchCall(absl::StrCat("adding tensor '", name, "'"), [&] {
    m.module.register_attribute(name, c10::TensorType::get(),
                                t.detach().set_requires_grad(false),
                                is_parameter, !is_parameter);
  });
}

absl::Status Importer::NodeError(int i, absl::string_view what) const {
  const schema::Node& n = graph_.get_nodes()[i];
  std::string name = n.get_name().value_or(absl::StrCat("#", i));
  std::string where;
  if (std::vector<Frame> frames = FramesOf(i); !frames.empty()) {
    const Frame& f = frames.back();
    where = absl::StrCat(f.file, ":", f.line,
                         f.code.empty() ? "" : absl::StrCat(" `", f.code, "`"));
  }
  return absl::UnimplementedError(
      absl::StrCat(archive_.path, ": node '", name, "' (", n.get_target(), ")",
                   where.empty() ? "" : " at ", where, " ", what));
}

}  // namespace internal

namespace {

namespace schema = torch::_export;
using internal::ArgTag;
using internal::LocalName;

void Flatten(const c10::IValue& v, std::vector<c10::IValue>& out) {
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) Flatten(e, out);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) Flatten(e, out);
  } else if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) Flatten(e.value(), out);
  } else {
    out.push_back(v);
  }
}

}  // namespace

absl::StatusOr<std::map<std::string, c10::IValue>> SampleInputs(
    const Pt2Archive& archive) {
  std::map<std::string, c10::IValue> out;
  if (archive.sample_inputs.empty()) return out;
  ASSIGN_OR_RETURN(
      c10::IValue value,
      runtime::TorchCall(
          absl::StrCat(archive.path, ": reading its sample inputs"), [&] {
            std::vector<char> bytes(archive.sample_inputs.begin(),
                                    archive.sample_inputs.end());
            return torch::jit::pickle_load(bytes);
          }));
  std::vector<c10::IValue> leaves;
  Flatten(value, leaves);
  // Flattened (args, kwargs) line up with the user and constant inputs.
  size_t k = 0;
  const auto& sig = archive.program.get_graph_module().get_signature();
  for (const schema::InputSpec& spec : sig.get_input_specs()) {
    using Tag = schema::InputSpec::Tag;
    if (spec.tag() == Tag::CONSTANT_INPUT) {
      ++k;
      continue;
    }
    if (spec.tag() != Tag::USER_INPUT) continue;
    if (k >= leaves.size()) return std::map<std::string, c10::IValue>();
    const schema::Argument& arg = spec.get_user_input().get_arg();
    if (arg.tag() == ArgTag::AS_TENSOR) {
      if (!leaves[k].isTensor()) return std::map<std::string, c10::IValue>();
      out[LocalName(arg.get_as_tensor().get_name())] = leaves[k];
    }
    ++k;
  }
  if (k != leaves.size()) return std::map<std::string, c10::IValue>();
  return out;
}

absl::StatusOr<ImportedProgram> ProgramToModule(const Pt2Archive& archive) {
  internal::Importer importer(archive);
  return runtime::TorchCall(absl::StrCat("importing ", archive.path),
                            [&] { return importer.Run(); });
}

}  // namespace tracecut::tracer::exported
