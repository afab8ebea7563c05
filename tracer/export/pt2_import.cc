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
namespace {

namespace schema = torch::_export;
using ArgTag = schema::Argument::Tag;

enum class ValueKind { kTensor, kInt, kBool, kFloat };

absl::string_view KindType(ValueKind k) {
  switch (k) {
    case ValueKind::kTensor:
      return "Tensor";
    case ValueKind::kInt:
      return "int";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kFloat:
      return "float";
  }
  return "Tensor";
}

struct ValueInfo {
  ValueKind kind = ValueKind::kTensor;
  int producer = -1;          // Node index; -1 for graph inputs.
  std::string fqn;            // Parameters, buffers, constants.
  bool is_parameter = false;  // With fqn: parameter (else buffer).
  std::vector<int> users;     // Node indices, ascending.
  bool graph_output = false;
};

struct Call {
  std::string key, path, type;
  Call* parent = nullptr;
  std::vector<Call*> children;  // In order of first appearance.
  std::vector<int> own;         // Node indices, ascending.
  std::vector<int> region;      // Subtree's node indices, ascending.
  absl::flat_hash_set<int> in_region;
  int first = std::numeric_limits<int>::max();
};

// A frame of a Python stack trace: where a node's code came from.
struct Frame {
  std::string file;
  int64_t line = 0;
  std::string code;
};

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

// Maps lines of generated TorchScript back to the model source, so that the
// tracer's source locations (ir::SourceLocation) name the model's file and
// line, as they do for scripted models.
class GeneratedLines : public torch::jit::SourceRangeUnpickler {
 public:
  explicit GeneratedLines(const std::vector<std::optional<Frame>>& origins) {
    for (size_t i = 0; i < origins.size(); ++i) {
      if (!origins[i].has_value()) continue;
      const Frame& f = *origins[i];
      std::string text = f.code.empty() ? std::string(" ") : f.code;
      auto source = std::make_shared<torch::jit::Source>(
          text, f.file, static_cast<size_t>(f.line));
      ranges_.emplace(i, torch::jit::SourceRange(source, 0, text.size()));
    }
  }
  std::optional<torch::jit::SourceRange> findSourceRangeThatGenerated(
      const torch::jit::SourceRange& range) override {
    auto it = ranges_.find(range.source()->lineno_for_offset(range.start()));
    if (it == ranges_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::map<size_t, torch::jit::SourceRange> ranges_;
};

// A method body in canonical names, with the program values it reads and
// defines at its boundary.
struct FunctionCode {
  std::vector<std::string> inputs;   // Value names, in parameter order.
  std::vector<std::string> outputs;  // Value names, in return order.
  std::string text;                  // "def forward(self, ...):\n ...".
  // Per line of `text`: the model source it comes from, when known.
  std::vector<std::optional<Frame>> origins;
};

struct ModuleInfo {
  torch::jit::Module module;
  std::string type;
  std::optional<std::string> forward;  // Canonical text once defined.
  std::set<std::string> attributes;    // Names taken (for aliases).
};

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

// `base` followed by the attribute path `rel` ("layers.0.mlp").
std::string AttrExpr(std::string base, absl::string_view rel) {
  if (rel.empty()) return base;
  for (absl::string_view seg : absl::StrSplit(rel, '.')) {
    if (IsIdentifier(seg)) {
      absl::StrAppend(&base, ".", seg);
    } else {
      base = absl::StrCat("getattr(", base, ", ", Quote(seg), ")");
    }
  }
  return base;
}

// `path` relative to module `owner`, when it lies under it.
std::optional<std::string> Relative(absl::string_view owner,
                                    absl::string_view path) {
  if (owner.empty()) return std::string(path);
  if (path.size() > owner.size() && absl::StartsWith(path, owner) &&
      path[owner.size()] == '.') {
    return std::string(path.substr(owner.size() + 1));
  }
  return std::nullopt;
}

std::string FloatLiteral(double v) {
  if (std::isnan(v)) return "float(\"nan\")";
  if (std::isinf(v)) return v > 0 ? "float(\"inf\")" : "-float(\"inf\")";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string IntLiteral(int64_t v) {
  if (v == std::numeric_limits<int64_t>::min()) {
    return "(-9223372036854775807 - 1)";
  }
  return absl::StrCat(v);
}

// TorchScript spells dtypes, layouts and memory formats as their c10 enum
// values (as the code in a saved .pt does).
std::optional<std::string> DTypeLiteral(schema::ScalarType t) {
  std::optional<c10::ScalarType> s = ToScalarType(t);
  if (!s.has_value()) return std::nullopt;
  return absl::StrCat(static_cast<int>(*s));
}

// Infix spellings of the Python operators that symbolic shapes use.
const std::map<std::string, std::string>& InfixOperators() {
  static const auto* const kOps = new std::map<std::string, std::string>{
      {"_operator.add", "+"},     {"_operator.sub", "-"},
      {"_operator.mul", "*"},     {"_operator.floordiv", "//"},
      {"_operator.truediv", "/"}, {"_operator.mod", "%"},
      {"_operator.eq", "=="},     {"_operator.ne", "!="},
      {"_operator.lt", "<"},      {"_operator.le", "<="},
      {"_operator.gt", ">"},      {"_operator.ge", ">="},
      {"_operator.and_", "and"},  {"_operator.or_", "or"},
      {"_operator.pow", "**"}};
  return *kOps;
}

// transformers' grouped_mm_fallback (integrations/moe.py) in TorchScript:
// rows of `input` sorted by expert, `offs` the cumulative row counts.
constexpr char kGroupedMmFallback[] = R"(
def _grouped_mm_fallback(self, input: Tensor, weight: Tensor, offs: Tensor):
    output = torch.zeros([input.size(0), weight.size(2)], dtype=input.dtype, device=input.device)
    ends: List[int] = offs.long().tolist()
    start = 0
    for i in range(len(ends)):
        end = ends[i]
        if start != end:
            output[start:end] = torch.mm(input[start:end], weight[i])
        start = end
    return output
)";

bool IsDroppedAssert(absl::string_view target) {
  return absl::StrContains(target, "._assert_tensor_metadata.") ||
         absl::StrContains(target, "._assert_scalar.") ||
         absl::StrContains(target, "._assert_async.") ||
         absl::StrContains(target, ".sym_constrain_range") ||
         absl::StrContains(target, "._assert_tensor_metadata");
}

class Importer {
 public:
  explicit Importer(const Pt2Archive& archive)
      : archive_(archive),
        graph_(archive.program.get_graph_module().get_graph()),
        cu_(std::make_shared<torch::jit::CompilationUnit>()) {}

  absl::StatusOr<ImportedProgram> Run() {
    RETURN_IF_ERROR(ReadSignature());
    RETURN_IF_ERROR(ReadNodes());
    RETURN_IF_ERROR(BuildCalls());
    RETURN_IF_ERROR(BuildModules());
    ASSIGN_OR_RETURN(FunctionCode root, EmitFunction(*root_));
    // The root's method takes the program's user inputs by name and
    // returns its user outputs.
    RETURN_IF_ERROR(Define(*root_, root, /*is_root=*/true));
    ImportedProgram out;
    out.module = modules_.at("").module;
    out.leaf_paths.assign(leaf_paths_.begin(), leaf_paths_.end());
    return out;
  }

 private:
  // ----------------------------------------------------------- reading
  absl::Status ReadSignature() {
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

  absl::Status AddTensorInput(const std::string& name, const std::string& fqn,
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

  absl::Status ReadNodes() {
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

  absl::Status DefineOutputs(int node, const schema::Argument& out) {
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
        if (out.get_as_sym_int().tag() ==
            schema::SymIntArgument::Tag::AS_NAME) {
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

  absl::Status CollectUses(int node, const schema::Argument& a,
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
        if (a.get_as_sym_bool().tag() ==
            schema::SymBoolArgument::Tag::AS_NAME) {
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

  // nn_module_stack: "key,path,type;key,path,type;..." (outermost first).
  static std::vector<std::array<std::string, 3>> ParseStack(
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

  absl::Status BuildCalls() {
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

  void FillRegions(Call& c) {
    c.region = c.own;
    for (Call* child : c.children) {
      FillRegions(*child);
      c.region.insert(c.region.end(), child->region.begin(),
                      child->region.end());
    }
    std::sort(c.region.begin(), c.region.end());
    c.in_region.insert(c.region.begin(), c.region.end());
    if (!c.region.empty()) c.first = c.region.front();
  }

  // ----------------------------------------------------------- modules
  absl::StatusOr<ModuleInfo*> GetModule(const std::string& path,
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
        return absl::InvalidArgumentError(
            absl::StrCat(archive_.path, ": module path '", path,
                         "' is also a tensor's name"));
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

  std::string TypeOf(const std::string& path) const {
    auto it = types_.find(path);
    return it == types_.end() ? "" : it->second;
  }

  absl::Status BuildModules() {
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

  absl::Status AddTensor(ModuleInfo& m, const std::string& name,
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

  // ----------------------------------------------------------- emitting
  // Values the region of `c` reads from outside it (parameters excluded:
  // methods reach those through self), and those it defines that are read
  // outside it, both in first-use / definition order.
  FunctionCode Boundary(const Call& c) const {
    FunctionCode f;
    absl::flat_hash_set<std::string> seen;
    for (int i : c.region) {
      for (const std::string& u : uses_[i]) {
        const ValueInfo& v = values_.at(u);
        if (!v.fqn.empty()) continue;
        if (v.producer >= 0 && c.in_region.contains(v.producer)) continue;
        if (seen.insert(u).second) f.inputs.push_back(u);
      }
    }
    for (int i : c.region) {
      for (const std::string& d : Defined(i)) {
        const ValueInfo& v = values_.at(d);
        bool outside = v.graph_output;
        for (int u : v.users) outside |= !c.in_region.contains(u);
        if (outside) f.outputs.push_back(d);
      }
    }
    return f;
  }

  std::vector<std::string> Defined(int node) const {
    std::vector<std::string> out;
    auto it = defined_cache_.find(node);
    if (it != defined_cache_.end()) return it->second;
    for (const schema::Argument& a : graph_.get_nodes()[node].get_outputs()) {
      switch (a.tag()) {
        case ArgTag::AS_TENSOR:
          out.push_back(a.get_as_tensor().get_name());
          break;
        case ArgTag::AS_TENSORS:
          for (const auto& t : a.get_as_tensors()) out.push_back(t.get_name());
          break;
        case ArgTag::AS_OPTIONAL_TENSORS:
          for (const auto& t : a.get_as_optional_tensors()) {
            if (t.tag() == schema::OptionalTensorArgument::Tag::AS_TENSOR) {
              out.push_back(t.get_as_tensor().get_name());
            }
          }
          break;
        case ArgTag::AS_SYM_INT:
          if (a.get_as_sym_int().tag() ==
              schema::SymIntArgument::Tag::AS_NAME) {
            out.push_back(a.get_as_sym_int().get_as_name());
          }
          break;
        case ArgTag::AS_SYM_BOOL:
          if (a.get_as_sym_bool().tag() ==
              schema::SymBoolArgument::Tag::AS_NAME) {
            out.push_back(a.get_as_sym_bool().get_as_name());
          }
          break;
        case ArgTag::AS_SYM_FLOAT:
          if (a.get_as_sym_float().tag() ==
              schema::SymFloatArgument::Tag::AS_NAME) {
            out.push_back(a.get_as_sym_float().get_as_name());
          }
          break;
        default:
          break;
      }
    }
    defined_cache_[node] = out;
    return out;
  }

  // One schedulable piece of a method: a node, or a child call.
  struct Item {
    int node = -1;
    Call* call = nullptr;
    int first = 0;
  };

  // State of one method being written.
  struct Method {
    std::string owner;  // Module path of `self`.
    absl::flat_hash_map<std::string, std::string> env;  // value -> local.
    std::vector<std::string> lines;
    // The model source each line comes from (torch.export's stack traces).
    std::vector<std::optional<Frame>> origins;
    std::optional<Frame> origin;  // Of the lines being added.
    int temps = 0;
    void Add(std::string line) {
      lines.push_back(std::move(line));
      origins.push_back(origin);
    }
    bool grouped_mm = false;  // Calls self._grouped_mm_fallback.
    std::string NewLocal(char prefix) {
      return absl::StrCat(std::string(1, prefix), temps++);
    }
  };

  absl::StatusOr<FunctionCode> EmitFunction(Call& c) {
    FunctionCode f = Boundary(c);
    Method m;
    m.owner = c.path;
    std::vector<std::string> params;
    for (size_t i = 0; i < f.inputs.size(); ++i) {
      std::string local =
          &c == root_ ? LocalName(f.inputs[i]) : absl::StrCat("x", i);
      m.env[f.inputs[i]] = local;
      params.push_back(
          absl::StrCat(local, ": ", KindType(values_.at(f.inputs[i]).kind)));
    }
    if (&c == root_) {
      // The root takes exactly the user inputs, in signature order.
      params.clear();
      f.inputs = user_inputs_;
      for (const std::string& in : user_inputs_) {
        std::string local = LocalName(in);
        m.env[in] = local;
        params.push_back(
            absl::StrCat(local, ": ", KindType(values_.at(in).kind)));
      }
      f.outputs = user_outputs_;
    }

    std::vector<Item> items;
    for (int n : c.own) items.push_back({n, nullptr, n});
    for (Call* child : c.children) {
      if (!child->region.empty()) items.push_back({-1, child, child->first});
    }
    RETURN_IF_ERROR(EmitItems(items, m));

    std::vector<std::string> rets;
    for (const std::string& o : f.outputs) {
      ASSIGN_OR_RETURN(std::string e, Lookup(m, o));
      rets.push_back(e);
    }
    std::string text =
        absl::StrCat("def forward(self", params.empty() ? "" : ", ",
                     absl::StrJoin(params, ", "), "):\n");
    f.origins.push_back(std::nullopt);
    for (size_t k = 0; k < m.lines.size(); ++k) {
      absl::StrAppend(&text, "    ", m.lines[k], "\n");
      f.origins.push_back(m.origins[k]);
    }
    if (rets.empty()) {
      absl::StrAppend(&text, "    return None\n");
    } else if (rets.size() == 1) {
      absl::StrAppend(&text, "    return ", rets[0], "\n");
    } else {
      absl::StrAppend(&text, "    return (", absl::StrJoin(rets, ", "), ")\n");
    }
    if (m.grouped_mm) absl::StrAppend(&text, kGroupedMmFallback);
    f.text = std::move(text);
    return f;
  }

  // Schedules and writes `items`: nodes in program order where possible,
  // child calls once their inputs are ready; a child that cannot be a call
  // is replaced by its own items.
  absl::Status EmitItems(std::vector<Item> items, Method& m) {
    for (;;) {
      // Producer item of each value defined by these items.
      absl::flat_hash_map<int, int> item_of_node;
      for (int k = 0; k < static_cast<int>(items.size()); ++k) {
        if (items[k].node >= 0) {
          item_of_node[items[k].node] = k;
        } else {
          for (int n : items[k].call->region) item_of_node[n] = k;
        }
      }
      std::vector<std::vector<int>> succ(items.size());
      std::vector<int> indeg(items.size(), 0);
      for (int k = 0; k < static_cast<int>(items.size()); ++k) {
        std::set<int> deps;
        auto add_uses = [&](int node) {
          for (const std::string& u : uses_[node]) {
            int p = values_.at(u).producer;
            auto it = item_of_node.find(p);
            if (p >= 0 && it != item_of_node.end() && it->second != k) {
              deps.insert(it->second);
            }
          }
        };
        if (items[k].node >= 0) {
          add_uses(items[k].node);
        } else {
          for (int n : items[k].call->region) add_uses(n);
        }
        for (int d : deps) {
          succ[d].push_back(k);
          ++indeg[k];
        }
      }
      using Entry = std::pair<int, int>;  // (first node, item).
      std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
      for (int k = 0; k < static_cast<int>(items.size()); ++k) {
        if (indeg[k] == 0) ready.push({items[k].first, k});
      }
      std::vector<int> order;
      while (!ready.empty()) {
        int k = ready.top().second;
        ready.pop();
        order.push_back(k);
        for (int s : succ[k]) {
          if (--indeg[s] == 0) ready.push({items[s].first, s});
        }
      }
      if (order.size() == items.size()) {
        for (int k : order) {
          if (items[k].node >= 0) {
            RETURN_IF_ERROR(EmitNode(items[k].node, m));
          } else {
            ASSIGN_OR_RETURN(bool called, EmitCall(*items[k].call, m));
            if (!called) {
              // Inline: emit the child's items here, in their own order.
              std::vector<Item> inner;
              for (int n : items[k].call->own) inner.push_back({n, nullptr, n});
              for (Call* g : items[k].call->children) {
                if (!g->region.empty()) inner.push_back({-1, g, g->first});
              }
              RETURN_IF_ERROR(EmitItems(std::move(inner), m));
            }
          }
        }
        return absl::OkStatus();
      }
      // A cycle through a child call: inline the earliest such child.
      int victim = -1;
      for (int k = 0; k < static_cast<int>(items.size()); ++k) {
        if (indeg[k] > 0 && items[k].call != nullptr &&
            (victim < 0 || items[k].first < items[victim].first)) {
          victim = k;
        }
      }
      if (victim < 0) {
        return absl::InternalError(
            absl::StrCat(archive_.path, ": the program's nodes form a cycle"));
      }
      Call* inlined = items[victim].call;
      items.erase(items.begin() + victim);
      for (int n : inlined->own) items.push_back({n, nullptr, n});
      for (Call* g : inlined->children) {
        if (!g->region.empty()) items.push_back({-1, g, g->first});
      }
    }
  }

  // Writes a call of `c`'s module; false when `c` must be inlined instead.
  absl::StatusOr<bool> EmitCall(Call& c, Method& m) {
    std::optional<std::string> rel = Relative(m.owner, c.path);
    if (!rel.has_value()) return false;
    ASSIGN_OR_RETURN(FunctionCode f, EmitFunction(c));
    if (f.outputs.empty()) return false;
    ModuleInfo& mod = modules_.at(c.path);
    if (mod.forward.has_value()) {
      if (*mod.forward != f.text) return false;
    } else {
      RETURN_IF_ERROR(Define(c, f, /*is_root=*/false));
    }
    std::vector<std::string> args;
    for (const std::string& in : f.inputs) {
      ASSIGN_OR_RETURN(std::string e, Lookup(m, in));
      args.push_back(e);
    }
    m.origin = CallSite(c);
    std::string call = absl::StrCat(AttrExpr("self", *rel), ".forward(",
                                    absl::StrJoin(args, ", "), ")");
    if (f.outputs.size() == 1) {
      std::string local = m.NewLocal('t');
      m.Add(absl::StrCat(local, " = ", call));
      m.env[f.outputs[0]] = local;
    } else {
      std::string r = m.NewLocal('r');
      m.Add(absl::StrCat(r, " = ", call));
      for (size_t i = 0; i < f.outputs.size(); ++i) {
        std::string local = m.NewLocal('t');
        m.Add(absl::StrCat(local, " = ", r, "[", i, "]"));
        m.env[f.outputs[i]] = local;
      }
    }
    return true;
  }

  absl::Status Define(const Call& c, const FunctionCode& f, bool is_root) {
    ModuleInfo& mod = modules_.at(c.path);
    absl::Status s = runtime::TorchCall(
        absl::StrCat("compiling the forward of module '",
                     is_root ? "<root>" : c.path, "' (", mod.type, ")"),
        [&] {
          // Module::define, with a Source that maps lines back to the model.
          auto source = std::make_shared<torch::jit::Source>(
              f.text, "<tracecut export>", 1,
              std::make_shared<GeneratedLines>(f.origins));
          torch::jit::Parser parser(source);
          std::vector<torch::jit::Def> defs;
          std::vector<torch::jit::ResolverPtr> resolvers;
          while (parser.lexer().cur().kind != torch::jit::TK_EOF) {
            defs.emplace_back(parser.parseFunction(/*is_method=*/true));
            resolvers.push_back(torch::jit::nativeResolver());
          }
          const torch::jit::SimpleSelf self(mod.module.type());
          cu_->define(mod.module.type()->name(), {}, {}, defs, resolvers,
                      &self);
        });
    if (!s.ok()) {
      return absl::InternalError(absl::StrCat(archive_.path, ": ", s.message(),
                                              "\ngenerated TorchScript:\n",
                                              f.text));
    }
    mod.forward = f.text;
    return absl::OkStatus();
  }

  // The expression for `value` inside method `m`.
  absl::StatusOr<std::string> Lookup(Method& m, const std::string& value) {
    auto it = m.env.find(value);
    if (it != m.env.end()) return it->second;
    const ValueInfo& v = values_.at(value);
    if (v.fqn.empty()) {
      return absl::InternalError(absl::StrCat(
          archive_.path, ": value '", value,
          "' is read before it is defined in the method of module '", m.owner,
          "'"));
    }
    if (std::optional<std::string> rel = Relative(m.owner, v.fqn)) {
      return AttrExpr("self", *rel);
    }
    // A tensor of another module (tied weights): the caller's module gets
    // an attribute holding the same tensor.
    auto key = std::make_pair(m.owner, v.fqn);
    auto alias = aliases_.find(key);
    if (alias == aliases_.end()) {
      ModuleInfo& mod = modules_.at(m.owner);
      std::string name = v.fqn.substr(v.fqn.rfind('.') + 1);
      if (mod.attributes.contains(name)) {
        name = absl::StrCat("_tied_", absl::StrReplaceAll(v.fqn, {{".", "_"}}));
      }
      RETURN_IF_ERROR(
          AddTensor(mod, name, archive_.tensors.at(v.fqn), v.is_parameter));
      alias = aliases_.emplace(key, name).first;
    }
    return AttrExpr("self", alias->second);
  }

  absl::StatusOr<std::string> Render(const schema::Argument& a, Method& m,
                                     int node) {
    // A list literal, through an annotated local where TorchScript cannot
    // infer the element type (empty lists, lists with None).
    auto typed = [&m](const std::vector<std::string>& items,
                      absl::string_view type) {
      std::string local = m.NewLocal('l');
      m.Add(absl::StrCat(local, ": List[", type, "] = [",
                         absl::StrJoin(items, ", "), "]"));
      return local;
    };
    auto list = [&typed](const std::vector<std::string>& items,
                         absl::string_view empty_type) {
      if (items.empty()) return typed(items, empty_type);
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    };
    std::vector<std::string> items;
    switch (a.tag()) {
      case ArgTag::AS_NONE:
        return std::string("None");
      case ArgTag::AS_TENSOR:
        return Lookup(m, a.get_as_tensor().get_name());
      case ArgTag::AS_TENSORS:
        for (const auto& t : a.get_as_tensors()) {
          ASSIGN_OR_RETURN(std::string e, Lookup(m, t.get_name()));
          items.push_back(e);
        }
        return list(items, "Tensor");
      case ArgTag::AS_OPTIONAL_TENSOR:
        if (a.get_as_optional_tensor().tag() !=
            schema::OptionalTensorArgument::Tag::AS_TENSOR) {
          return std::string("None");
        }
        return Lookup(m, a.get_as_optional_tensor().get_as_tensor().get_name());
      case ArgTag::AS_OPTIONAL_TENSORS:
        for (const auto& t : a.get_as_optional_tensors()) {
          if (t.tag() == schema::OptionalTensorArgument::Tag::AS_TENSOR) {
            ASSIGN_OR_RETURN(std::string e,
                             Lookup(m, t.get_as_tensor().get_name()));
            items.push_back(e);
          } else {
            items.push_back("None");
          }
        }
        return typed(items, "Optional[Tensor]");
      case ArgTag::AS_INT:
        return IntLiteral(a.get_as_int());
      case ArgTag::AS_INTS:
        for (int64_t v : a.get_as_ints()) items.push_back(IntLiteral(v));
        return list(items, "int");
      case ArgTag::AS_FLOAT:
        return FloatLiteral(a.get_as_float().get());
      case ArgTag::AS_FLOATS:
        for (const auto& v : a.get_as_floats()) {
          items.push_back(FloatLiteral(v.get()));
        }
        return list(items, "float");
      case ArgTag::AS_STRING:
        return Quote(a.get_as_string());
      case ArgTag::AS_STRINGS:
        for (const auto& s : a.get_as_strings()) items.push_back(Quote(s));
        return list(items, "str");
      case ArgTag::AS_BOOL:
        return std::string(a.get_as_bool() ? "True" : "False");
      case ArgTag::AS_BOOLS:
        for (bool b : a.get_as_bools()) items.push_back(b ? "True" : "False");
        return list(items, "bool");
      case ArgTag::AS_SYM_INT: {
        const auto& s = a.get_as_sym_int();
        if (s.tag() == schema::SymIntArgument::Tag::AS_INT) {
          return IntLiteral(s.get_as_int());
        }
        return Lookup(m, s.get_as_name());
      }
      case ArgTag::AS_SYM_INTS:
        for (const auto& s : a.get_as_sym_ints()) {
          if (s.tag() == schema::SymIntArgument::Tag::AS_INT) {
            items.push_back(IntLiteral(s.get_as_int()));
          } else {
            ASSIGN_OR_RETURN(std::string e, Lookup(m, s.get_as_name()));
            items.push_back(e);
          }
        }
        return list(items, "int");
      case ArgTag::AS_SYM_BOOL: {
        const auto& s = a.get_as_sym_bool();
        if (s.tag() == schema::SymBoolArgument::Tag::AS_NAME) {
          return Lookup(m, s.get_as_name());
        }
        return std::string(s.get_as_bool() ? "True" : "False");
      }
      case ArgTag::AS_SYM_FLOAT: {
        const auto& s = a.get_as_sym_float();
        if (s.tag() == schema::SymFloatArgument::Tag::AS_NAME) {
          return Lookup(m, s.get_as_name());
        }
        return FloatLiteral(s.get_as_float().get());
      }
      case ArgTag::AS_SCALAR_TYPE: {
        std::optional<std::string> d = DTypeLiteral(a.get_as_scalar_type());
        if (!d.has_value()) {
          return NodeError(node, "has an argument of unknown dtype");
        }
        return *d;
      }
      case ArgTag::AS_MEMORY_FORMAT:
        switch (a.get_as_memory_format()) {
          case schema::MemoryFormat::ContiguousFormat:
            return absl::StrCat(
                static_cast<int>(c10::MemoryFormat::Contiguous));
          case schema::MemoryFormat::ChannelsLast:
            return absl::StrCat(
                static_cast<int>(c10::MemoryFormat::ChannelsLast));
          case schema::MemoryFormat::ChannelsLast3d:
            return absl::StrCat(
                static_cast<int>(c10::MemoryFormat::ChannelsLast3d));
          case schema::MemoryFormat::PreserveFormat:
            return absl::StrCat(static_cast<int>(c10::MemoryFormat::Preserve));
          default:
            return NodeError(node, "has an unknown memory format");
        }
      case ArgTag::AS_LAYOUT:
        if (a.get_as_layout() != schema::Layout::Strided) {
          return NodeError(node, "asks for a non-strided (sparse) layout");
        }
        return absl::StrCat(static_cast<int>(c10::kStrided));
      case ArgTag::AS_DEVICE: {
        const auto& d = a.get_as_device();
        // A meta-device export runs where its weights are loaded: the CPU.
        std::string s = d.get_type() == "meta" ? "cpu" : d.get_type();
        if (d.get_index().has_value() && d.get_type() != "meta") {
          absl::StrAppend(&s, ":", *d.get_index());
        }
        return absl::StrCat("torch.device(", Quote(s), ")");
      }
      default:
        return NodeError(node,
                         "has an argument kind tracecut does not "
                         "import (graph, custom object, operator, "
                         "complex, nested list)");
    }
  }

  absl::Status EmitNode(int i, Method& m) {
    const schema::Node& n = graph_.get_nodes()[i];
    const std::string& target = n.get_target();
    if (IsDroppedAssert(target)) return absl::OkStatus();
    std::vector<Frame> frames = FramesOf(i);
    m.origin =
        frames.empty() ? std::nullopt : std::optional<Frame>(frames.back());
    if (absl::StartsWith(target, "torch.ops.higher_order.")) {
      return NodeError(i,
                       "is a higher-order operator (control flow or a "
                       "grad-mode/autocast region); tracecut imports "
                       "straight-line programs");
    }
    std::vector<std::string> positional, keyword;
    for (const schema::NamedArgument& in : n.get_inputs()) {
      ASSIGN_OR_RETURN(std::string e, Render(in.get_arg(), m, i));
      bool kw =
          in.get_kind().has_value() &&
          *in.get_kind() == static_cast<int64_t>(schema::ArgumentKind::KEYWORD);
      if (kw || !keyword.empty()) {
        keyword.push_back(absl::StrCat(in.get_name(), "=", e));
      } else {
        positional.push_back(e);
      }
    }
    std::string expr;
    const auto& infix = InfixOperators();
    if (auto op = infix.find(target); op != infix.end()) {
      if (positional.size() != 2) {
        return NodeError(i, "is a binary operator without two operands");
      }
      expr = absl::StrCat("(", positional[0], " ", op->second, " ",
                          positional[1], ")");
    } else if (target == "_operator.neg") {
      expr = absl::StrCat("(-", positional.at(0), ")");
    } else if (target == "torch.sym_max" || target == "torch.sym_min") {
      expr = absl::StrCat(target == "torch.sym_max" ? "max(" : "min(",
                          absl::StrJoin(positional, ", "), ")");
    } else if (target == "torch.sym_float") {
      expr = absl::StrCat("float(", positional.at(0), ")");
    } else if (target == "torch.sym_int") {
      expr = absl::StrCat("int(", positional.at(0), ")");
    } else if (absl::StartsWith(target, "torch.ops.aten.sym_size.") ||
               absl::StartsWith(target, "torch.ops.aten.sym_stride.") ||
               absl::StartsWith(target, "torch.ops.aten.sym_numel.") ||
               absl::StartsWith(target, "torch.ops.aten.sym_storage_offset.")) {
      absl::string_view method = absl::StripPrefix(target, "torch.ops.aten.");
      method = method.substr(0, method.find('.'));
      method.remove_prefix(4);  // "sym_"
      std::vector<std::string> rest(positional.begin() + 1, positional.end());
      expr = absl::StrCat(positional.at(0), ".", method, "(",
                          absl::StrJoin(rest, ", "), ")");
    } else if (target == "torch.ops.transformers.grouped_mm_fallback.default") {
      // transformers' MoE experts: a custom op only Python registers,
      // written out in TorchScript. Its loop depends on the routing, so
      // the module calling it is a leaf (ImportedProgram::leaf_paths).
      std::vector<std::string> args = positional;
      for (const std::string& k : keyword) {
        args.push_back(k.substr(k.find('=') + 1));
      }
      expr = absl::StrCat("self._grouped_mm_fallback(",
                          absl::StrJoin(args, ", "), ")");
      m.grouped_mm = true;
      if (!node_call_[i]->path.empty()) leaf_paths_.insert(node_call_[i]->path);
    } else if (absl::StartsWith(target, "torch.ops.aten.")) {
      // torch.ops.aten.<op>.<overload>: TorchScript's `torch.<op>` is the
      // builtin aten::<op>; it resolves the overload from the argument types.
      std::vector<absl::string_view> parts = absl::StrSplit(target, '.');
      if (parts.size() != 5) {
        return NodeError(i, "has an operator target tracecut cannot parse");
      }
      std::vector<std::string> args = positional;
      args.insert(args.end(), keyword.begin(), keyword.end());
      expr =
          absl::StrCat("torch.", parts[3], "(", absl::StrJoin(args, ", "), ")");
    } else {
      return NodeError(i, absl::StrCat("calls '", target,
                                       "', which tracecut does not import"));
    }

    const auto& outs = n.get_outputs();
    auto bind_list = [&](const std::string& list,
                         const std::vector<std::string>& names) {
      for (size_t k = 0; k < names.size(); ++k) {
        if (names[k].empty()) continue;
        std::string local = m.NewLocal('t');
        m.Add(absl::StrCat(local, " = ", list, "[", k, "]"));
        m.env[names[k]] = local;
      }
    };
    auto names_of = [&](const schema::Argument& a) {
      std::vector<std::string> names;
      if (a.tag() == ArgTag::AS_TENSORS) {
        for (const auto& t : a.get_as_tensors()) names.push_back(t.get_name());
      } else if (a.tag() == ArgTag::AS_OPTIONAL_TENSORS) {
        for (const auto& t : a.get_as_optional_tensors()) {
          names.push_back(t.tag() ==
                                  schema::OptionalTensorArgument::Tag::AS_TENSOR
                              ? t.get_as_tensor().get_name()
                              : "");
        }
      }
      return names;
    };
    auto single_name = [&](const schema::Argument& a) -> std::string {
      switch (a.tag()) {
        case ArgTag::AS_TENSOR:
          return a.get_as_tensor().get_name();
        case ArgTag::AS_SYM_INT:
          return a.get_as_sym_int().tag() ==
                         schema::SymIntArgument::Tag::AS_NAME
                     ? a.get_as_sym_int().get_as_name()
                     : "";
        case ArgTag::AS_SYM_BOOL:
          return a.get_as_sym_bool().tag() ==
                         schema::SymBoolArgument::Tag::AS_NAME
                     ? a.get_as_sym_bool().get_as_name()
                     : "";
        case ArgTag::AS_SYM_FLOAT:
          return a.get_as_sym_float().tag() ==
                         schema::SymFloatArgument::Tag::AS_NAME
                     ? a.get_as_sym_float().get_as_name()
                     : "";
        default:
          return "";
      }
    };
    if (outs.empty()) {
      m.Add(expr);
    } else if (outs.size() == 1 &&
               (outs[0].tag() == ArgTag::AS_TENSORS ||
                outs[0].tag() == ArgTag::AS_OPTIONAL_TENSORS)) {
      std::string r = m.NewLocal('r');
      m.Add(absl::StrCat(r, " = ", expr));
      bind_list(r, names_of(outs[0]));
    } else if (outs.size() == 1) {
      std::string name = single_name(outs[0]);
      std::string local = m.NewLocal('t');
      m.Add(absl::StrCat(local, " = ", expr));
      if (!name.empty()) m.env[name] = local;
    } else {
      std::string r = m.NewLocal('r');
      m.Add(absl::StrCat(r, " = ", expr));
      for (size_t k = 0; k < outs.size(); ++k) {
        if (outs[k].tag() == ArgTag::AS_TENSORS ||
            outs[k].tag() == ArgTag::AS_OPTIONAL_TENSORS) {
          std::string sub = m.NewLocal('r');
          m.Add(absl::StrCat(sub, " = ", r, "[", k, "]"));
          bind_list(sub, names_of(outs[k]));
          continue;
        }
        std::string name = single_name(outs[k]);
        if (name.empty()) continue;
        std::string local = m.NewLocal('t');
        m.Add(absl::StrCat(local, " = ", r, "[", k, "]"));
        m.env[name] = local;
      }
    }
    return absl::OkStatus();
  }

  std::vector<Frame> FramesOf(int node) const {
    const auto& meta = graph_.get_nodes()[node].get_metadata();
    auto it = meta.find("stack_trace");
    return it == meta.end() ? std::vector<Frame>() : ParseFrames(it->second);
  }

  // Where the parent calls `c`: the innermost frame of its first node whose
  // code names the module's attribute ("self.q_proj(x)"); for modules
  // reached by iteration (ModuleList), none.
  std::optional<Frame> CallSite(const Call& c) const {
    if (c.region.empty()) return std::nullopt;
    const std::string attr = c.path.substr(c.path.rfind('.') + 1);
    std::vector<Frame> frames = FramesOf(c.region.front());
    for (size_t k = frames.size(); k-- > 0;) {
      if (absl::StrContains(frames[k].code, absl::StrCat(".", attr)) ||
          absl::StrContains(frames[k].code, absl::StrCat("\"", attr, "\""))) {
        return frames[k];
      }
    }
    return std::nullopt;
  }

  // ----------------------------------------------------------- errors
  absl::Status Unsupported(absl::string_view what) const {
    return absl::UnimplementedError(
        absl::StrCat(archive_.path, ": tracecut cannot import ", what));
  }

  // "<file>: node 'linear_3' (torch.ops.aten.linear.default) at
  // modeling_llama.py:123 `code`: <what>".
  absl::Status NodeError(int i, absl::string_view what) const {
    const schema::Node& n = graph_.get_nodes()[i];
    std::string name = n.get_name().value_or(absl::StrCat("#", i));
    std::string where;
    if (std::vector<Frame> frames = FramesOf(i); !frames.empty()) {
      const Frame& f = frames.back();
      where =
          absl::StrCat(f.file, ":", f.line,
                       f.code.empty() ? "" : absl::StrCat(" `", f.code, "`"));
    }
    return absl::UnimplementedError(
        absl::StrCat(archive_.path, ": node '", name, "' (", n.get_target(),
                     ")", where.empty() ? "" : " at ", where, " ", what));
  }

  const Pt2Archive& archive_;
  const schema::Graph& graph_;
  std::shared_ptr<torch::jit::CompilationUnit> cu_;
  std::map<std::string, ValueInfo> values_;
  std::vector<std::vector<std::string>> uses_;  // Per node.
  mutable std::map<int, std::vector<std::string>> defined_cache_;
  std::vector<std::string> user_inputs_, user_outputs_;
  std::vector<std::unique_ptr<Call>> calls_;
  std::vector<Call*> node_call_;  // Innermost call of each node.
  Call* root_ = nullptr;
  std::set<std::string> leaf_paths_;
  std::map<std::string, std::string> types_;  // Module path -> type.
  std::map<std::string, ModuleInfo> modules_;
  std::map<std::pair<std::string, std::string>, std::string> aliases_;
  int class_counter_ = 0;
};

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
  Importer importer(archive);
  return runtime::TorchCall(absl::StrCat("importing ", archive.path),
                            [&] { return importer.Run(); });
}

}  // namespace tracecut::tracer::exported
