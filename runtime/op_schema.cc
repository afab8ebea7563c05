#include "runtime/op_schema.h"

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

std::string SchemaString(const c10::FunctionSchema& schema) {
  std::ostringstream os;
  os << schema;
  return os.str();
}

absl::StatusOr<c10::IValue> ListToIValue(const ir::Argument& arg,
                                         const c10::TypePtr& type) {
  c10::TypePtr elem = ListElementType(type);
  if (elem != nullptr && elem->hasFreeVariables()) elem = nullptr;
  std::vector<c10::IValue> values;
  values.reserve(arg.elements().size());
  for (const ir::Argument& e : arg.elements()) {
    ASSIGN_OR_RETURN(c10::IValue v, ConstantToIValue(e, elem));
    values.push_back(std::move(v));
  }
  if (elem == nullptr) {
    ASSIGN_OR_RETURN(elem, UnifiedElementType(values));
  }
  c10::impl::GenericList list(elem);
  list.reserve(values.size());
  for (c10::IValue& v : values) list.push_back(std::move(v));
  return c10::IValue(std::move(list));
}

absl::StatusOr<c10::IValue> TupleToIValue(const ir::Argument& arg,
                                          const c10::TypePtr& type) {
  const auto* tuple_type =
      type == nullptr ? nullptr : type->castRaw<c10::TupleType>();
  std::vector<c10::IValue> values;
  values.reserve(arg.elements().size());
  for (size_t i = 0; i < arg.elements().size(); ++i) {
    c10::TypePtr elem_type;
    if (tuple_type != nullptr && i < tuple_type->elements().size()) {
      elem_type = tuple_type->elements()[i];
    }
    ASSIGN_OR_RETURN(c10::IValue v,
                     ConstantToIValue(arg.elements()[i], elem_type));
    values.push_back(std::move(v));
  }
  return c10::IValue(c10::ivalue::Tuple::create(std::move(values)));
}

}  // namespace

c10::OperatorName ParseOperatorName(absl::string_view target) {
  size_t ns = target.find("::");
  size_t start = ns == absl::string_view::npos ? 0 : ns + 2;
  size_t dot = target.find('.', start);
  if (dot == absl::string_view::npos) {
    return c10::OperatorName(std::string(target), "");
  }
  return c10::OperatorName(std::string(target.substr(0, dot)),
                           std::string(target.substr(dot + 1)));
}

absl::StatusOr<std::shared_ptr<torch::jit::Operator>> ResolveOperator(
    absl::string_view target) {
  c10::OperatorName name = ParseOperatorName(target);
  if (name.name.find("::") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("operator '", target,
                     "' has no namespace (expected e.g. 'aten::add.Tensor')"));
  }
  return TorchCall(
      absl::StrCat("resolving operator '", target, "'"),
      [&]() -> absl::StatusOr<std::shared_ptr<torch::jit::Operator>> {
        std::shared_ptr<torch::jit::Operator> op =
            torch::jit::findOperatorFor(name);
        if (op != nullptr) return op;
        std::vector<std::string> overloads;
        for (const auto& candidate : torch::jit::getAllOperatorsFor(
                 c10::Symbol::fromQualString(name.name))) {
          const c10::FunctionSchema& s = candidate->schema();
          overloads.push_back(
              s.overload_name().empty()
                  ? s.name()
                  : absl::StrCat(s.name(), ".", s.overload_name()));
        }
        if (overloads.empty()) {
          return absl::NotFoundError(
              absl::StrCat("unknown operator '", target, "'"));
        }
        return absl::NotFoundError(absl::StrCat(
            "operator '", name.name, "' has no overload '", name.overload_name,
            "' (known: ", absl::StrJoin(overloads, ", "), ")"));
      });
}

absl::StatusOr<std::vector<const ir::Argument*>> BindArguments(
    const ir::Node& node, const c10::FunctionSchema& schema, size_t first) {
  const std::vector<c10::Argument>& formals = schema.arguments();
  const size_t n = formals.size() > first ? formals.size() - first : 0;
  const std::vector<ir::Argument>& args = node.args();
  auto error = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": ", parts...,
                     " (schema: ", SchemaString(schema), ")"));
  };
  if (args.size() > n && !schema.is_vararg()) {
    return error(schema.name(), " takes ", n, " argument", n == 1 ? "" : "s",
                 ", got ", args.size());
  }
  std::vector<const ir::Argument*> bound(std::max(n, args.size()), nullptr);
  for (size_t i = 0; i < args.size(); ++i) bound[i] = &args[i];
  for (const auto& [key, value] : node.kwargs()) {
    size_t index = n;
    for (size_t i = 0; i < n; ++i) {
      if (formals[first + i].name() == key) {
        index = i;
        break;
      }
    }
    if (index == n) {
      return error(schema.name(), " has no argument named '", key, "'");
    }
    if (bound[index] != nullptr) {
      return error("argument '", key, "' given twice");
    }
    bound[index] = &value;
  }
  for (size_t i = 0; i < n; ++i) {
    if (bound[i] == nullptr && !formals[first + i].default_value()) {
      return error("missing argument '", formals[first + i].name(), "'");
    }
  }
  return bound;
}

absl::StatusOr<c10::Device> ParseDevice(absl::string_view name) {
  return TorchCall(absl::StrCat("parsing device '", name, "'"),
                   [&] { return c10::Device(std::string(name)); });
}

c10::TypePtr ListElementType(const c10::TypePtr& type) {
  if (type == nullptr) return nullptr;
  c10::TypePtr t = type;
  if (const auto* opt = t->castRaw<c10::OptionalType>()) {
    t = opt->getElementType();
  }
  if (const auto* list = t->castRaw<c10::ListType>()) {
    return list->getElementType();
  }
  return nullptr;
}

absl::StatusOr<c10::TypePtr> UnifiedElementType(
    const std::vector<c10::IValue>& elements) {
  if (elements.empty()) return c10::AnyType::get();
  bool all_tensors = true;
  for (const c10::IValue& v : elements) all_tensors &= v.isTensor();
  if (all_tensors) return c10::TensorType::get();
  std::vector<c10::TypePtr> types;
  types.reserve(elements.size());
  for (const c10::IValue& v : elements) types.push_back(v.type());
  std::ostringstream why;
  std::optional<c10::TypePtr> unified = c10::unifyTypeList(types, why);
  if (!unified.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("list elements have no common type: ", why.str()));
  }
  return *unified;
}

absl::StatusOr<c10::IValue> ConstantToIValue(const ir::Argument& arg,
                                             const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (t != nullptr) {
    if (const auto* opt = t->castRaw<c10::OptionalType>()) {
      t = opt->getElementType();
    }
  }
  switch (arg.kind()) {
    case ir::Argument::Kind::kNone:
      return c10::IValue();
    case ir::Argument::Kind::kBool:
      return c10::IValue(arg.as_bool());
    case ir::Argument::Kind::kInt:
      if (t != nullptr && t->kind() == c10::TypeKind::FloatType) {
        return c10::IValue(static_cast<double>(arg.as_int()));
      }
      return c10::IValue(arg.as_int());
    case ir::Argument::Kind::kDouble:
      return c10::IValue(arg.as_double());
    case ir::Argument::Kind::kString:
      return c10::IValue(arg.as_string());
    case ir::Argument::Kind::kDType: {
      ASSIGN_OR_RETURN(c10::ScalarType dtype, ParseDType(arg.as_string()));
      return c10::IValue(dtype);
    }
    case ir::Argument::Kind::kDevice: {
      ASSIGN_OR_RETURN(c10::Device device, ParseDevice(arg.as_string()));
      return c10::IValue(device);
    }
    case ir::Argument::Kind::kList:
      return ListToIValue(arg, t);
    case ir::Argument::Kind::kTuple:
      return TupleToIValue(arg, t);
    case ir::Argument::Kind::kNode:
      break;
  }
  return absl::InvalidArgumentError("a node reference is not a constant");
}

}  // namespace tracecut::runtime
