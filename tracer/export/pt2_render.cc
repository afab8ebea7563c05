// Rendering torch.export nodes and arguments as TorchScript (Note
// [Importing torch.export programs]).

#include <torch/csrc/jit/frontend/parser.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/csrc/jit/serialization/source_range_serialization.h>

#include <algorithm>
#include <array>
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
#include "tracer/torchscript_source.h"
#include "util/status_macros.h"

namespace tracecut::tracer::exported::internal {
namespace {

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
  return tracer::DTypeLiteral(*s);
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

bool IsDroppedAssert(absl::string_view target) {
  return absl::StrContains(target, "._assert_tensor_metadata.") ||
         absl::StrContains(target, "._assert_scalar.") ||
         absl::StrContains(target, "._assert_async.") ||
         absl::StrContains(target, ".sym_constrain_range") ||
         absl::StrContains(target, "._assert_tensor_metadata");
}

// The tensor names a list output binds ("" for a None element).
std::vector<std::string> ListOutputNames(const schema::Argument& a) {
  std::vector<std::string> names;
  if (a.tag() == ArgTag::AS_TENSORS) {
    for (const auto& t : a.get_as_tensors()) names.push_back(t.get_name());
  } else if (a.tag() == ArgTag::AS_OPTIONAL_TENSORS) {
    for (const auto& t : a.get_as_optional_tensors()) {
      names.push_back(t.tag() == schema::OptionalTensorArgument::Tag::AS_TENSOR
                          ? t.get_as_tensor().get_name()
                          : "");
    }
  }
  return names;
}

// The name a single output binds, or "" for a constant.
std::string OutputName(const schema::Argument& a) {
  switch (a.tag()) {
    case ArgTag::AS_TENSOR:
      return a.get_as_tensor().get_name();
    case ArgTag::AS_SYM_INT:
      return a.get_as_sym_int().tag() == schema::SymIntArgument::Tag::AS_NAME
                 ? a.get_as_sym_int().get_as_name()
                 : "";
    case ArgTag::AS_SYM_BOOL:
      return a.get_as_sym_bool().tag() == schema::SymBoolArgument::Tag::AS_NAME
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
}

}  // namespace

absl::StatusOr<std::string> Importer::Render(const schema::Argument& a,
                                             Method& m, int node) {
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
          return absl::StrCat(static_cast<int>(c10::MemoryFormat::Contiguous));
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

absl::Status Importer::EmitNode(int i, Method& m) {
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
    expr = absl::StrCat("(", positional[0], " ", op->second, " ", positional[1],
                        ")");
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
    expr = absl::StrCat("self._grouped_mm_fallback(", absl::StrJoin(args, ", "),
                        ")");
    m.grouped_mm = true;
    if (!node_call_[i]->path.empty()) leaf_paths_.insert(node_call_[i]->path);
  } else if (target == "torch.ops.aten.histc.default" && !positional.empty()) {
    // LibTorch's CPU histc takes floating point only, but a program
    // exported on the meta device (or for CUDA) may pass integers
    // (transformers' MoE expert counts do): count them as doubles, which
    // holds every integer exactly, and keep the dtype the program expects.
    const std::string& x = positional[0];
    std::vector<std::string> args = {absl::StrCat(
        "(", x, " if ", x, ".is_floating_point() else ", x, ".double())")};
    args.insert(args.end(), positional.begin() + 1, positional.end());
    args.insert(args.end(), keyword.begin(), keyword.end());
    expr = absl::StrCat("torch.histc(", absl::StrJoin(args, ", "), ").to(", x,
                        ".dtype)");
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

  return BindOutputs(i, expr, m);
}

absl::Status Importer::BindOutputs(int i, const std::string& expr, Method& m) {
  const auto& outs = graph_.get_nodes()[i].get_outputs();
  auto bind_list = [&](const std::string& list,
                       const std::vector<std::string>& names) {
    for (size_t k = 0; k < names.size(); ++k) {
      if (names[k].empty()) continue;
      std::string local = m.NewLocal('t');
      m.Add(absl::StrCat(local, " = ", list, "[", k, "]"));
      m.env[names[k]] = local;
    }
  };
  if (outs.empty()) {
    m.Add(expr);
  } else if (outs.size() == 1 &&
             (outs[0].tag() == ArgTag::AS_TENSORS ||
              outs[0].tag() == ArgTag::AS_OPTIONAL_TENSORS)) {
    std::string r = m.NewLocal('r');
    m.Add(absl::StrCat(r, " = ", expr));
    bind_list(r, ListOutputNames(outs[0]));
  } else if (outs.size() == 1) {
    std::string name = OutputName(outs[0]);
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
        bind_list(sub, ListOutputNames(outs[k]));
        continue;
      }
      std::string name = OutputName(outs[k]);
      if (name.empty()) continue;
      std::string local = m.NewLocal('t');
      m.Add(absl::StrCat(local, " = ", r, "[", k, "]"));
      m.env[name] = local;
    }
  }
  return absl::OkStatus();
}

}  // namespace tracecut::tracer::exported::internal
