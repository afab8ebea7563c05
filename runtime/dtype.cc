#include "runtime/dtype.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tracecut::runtime {
namespace {

struct DTypeEntry {
  absl::string_view name;
  c10::ScalarType type;
  bool input = false;  // Listed by InputDTypeNames().
};

// Canonical names first (DTypeName uses the first match).
constexpr DTypeEntry kDTypes[] = {
    {"float32", c10::ScalarType::Float, true},
    {"float64", c10::ScalarType::Double, true},
    {"float16", c10::ScalarType::Half, true},
    {"bfloat16", c10::ScalarType::BFloat16, true},
    {"int64", c10::ScalarType::Long, true},
    {"int32", c10::ScalarType::Int, true},
    {"int16", c10::ScalarType::Short, true},
    {"int8", c10::ScalarType::Char, true},
    {"uint8", c10::ScalarType::Byte, true},
    {"bool", c10::ScalarType::Bool, true},
    {"complex64", c10::ScalarType::ComplexFloat, true},
    {"complex128", c10::ScalarType::ComplexDouble, true},
    {"complex32", c10::ScalarType::ComplexHalf},
    {"qint8", c10::ScalarType::QInt8},
    {"quint8", c10::ScalarType::QUInt8},
    {"qint32", c10::ScalarType::QInt32},
    {"quint4x2", c10::ScalarType::QUInt4x2},
    // PyTorch's aliases.
    {"float", c10::ScalarType::Float},
    {"double", c10::ScalarType::Double},
    {"half", c10::ScalarType::Half},
    {"long", c10::ScalarType::Long},
    {"int", c10::ScalarType::Int},
    {"short", c10::ScalarType::Short},
    {"cfloat", c10::ScalarType::ComplexFloat},
    {"cdouble", c10::ScalarType::ComplexDouble},
};

}  // namespace

absl::StatusOr<c10::ScalarType> ParseDType(absl::string_view name) {
  absl::string_view bare = absl::StripPrefix(name, "torch.");
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == bare) return e.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

std::string DTypeName(c10::ScalarType type) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.type == type) return std::string(e.name);
  }
  return c10::toString(type);
}

absl::Span<const absl::string_view> InputDTypeNames() {
  static const auto* const names = [] {
    auto* out = new std::vector<absl::string_view>();
    for (const DTypeEntry& e : kDTypes) {
      if (e.input) out->push_back(e.name);
    }
    return out;
  }();
  return *names;
}

bool IsInputDType(absl::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.input && e.name == name) return true;
  }
  return false;
}

}  // namespace tracecut::runtime
