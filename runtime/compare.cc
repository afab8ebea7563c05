#include "runtime/compare.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Tensors are compared this many elements at a time, so that the float64
// temporaries of a large activation stay small.
constexpr int64_t kChunk = int64_t{1} << 18;

std::string Where(const std::string& path) {
  return path.empty() ? std::string("value") : path;
}

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

std::string FormatValue(double v) { return absl::StrFormat("%.9g", v); }
std::string FormatError(double v) { return absl::StrFormat("%.3g", v); }

// "['logits']" for a string key, "[3]" for an int key.
std::string KeyPath(const c10::IValue& key) {
  if (key.isString()) return absl::StrCat("['", key.toStringRef(), "']");
  if (key.isInt()) return absl::StrCat("[", key.toInt(), "]");
  if (key.isBool()) return key.toBool() ? "[True]" : "[False]";
  if (key.isDouble()) return absl::StrCat("[", key.toDouble(), "]");
  return absl::StrCat("[<", key.tagKind(), ">]");
}

std::optional<double> Number(const c10::IValue& v) {
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isDouble()) return v.toDouble();
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  return std::nullopt;
}

std::vector<int64_t> Unravel(int64_t flat, c10::IntArrayRef sizes) {
  std::vector<int64_t> index(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    index[d] = flat % sizes[d];
    flat /= sizes[d];
  }
  return index;
}

// CPU, strided, flat, in its own dtype (converted chunk by chunk).
at::Tensor Flat(const at::Tensor& t) {
  at::Tensor x = t.detach();
  if (x.layout() != at::kStrided) x = x.to_dense();
  return x.to(at::kCPU).reshape({-1});
}

}  // namespace

absl::Status ValidateCompareOptions(const CompareOptions& options) {
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"rtol", options.rtol},
        std::pair<const char*, double>{"atol", options.atol}}) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be a finite number >= 0, not ", FormatValue(value)));
    }
  }
  return absl::OkStatus();
}

std::string ElementDiff::Location() const {
  std::string where = path;
  if (flat_index >= 0) {
    absl::StrAppend(&where, where.empty() ? "" : " ", "element ", flat_index);
    if (index.size() >= 2) {
      absl::StrAppend(&where, " [", absl::StrJoin(index, ", "), "]");
    }
  }
  return where;
}

std::string ElementDiff::Values() const {
  return absl::StrCat(FormatValue(actual), " vs ", FormatValue(expected),
                      " (abs ", FormatError(abs_error), ", rel ",
                      FormatError(rel_error), ")");
}

std::string ElementDiff::ToString() const {
  const std::string where = Location();
  return where.empty() ? Values() : absl::StrCat(where, ": ", Values());
}

std::string CompareResult::ErrorSummary() const {
  return absl::StrCat("max abs error ", FormatError(max_abs_error),
                      ", max rel error ", FormatError(max_rel_error));
}

std::string CompareResult::FailureSummary(absl::string_view what) const {
  std::string out =
      absl::StrCat(violations, " of ", elements, " elements exceed atol ",
                   absl::StrFormat("%g", atol), " + rtol ",
                   absl::StrFormat("%g", rtol), "*|ref|");
  if (worst.has_value()) {
    const std::string where = worst->Location();
    absl::StrAppend(&out, "; worst at ", what, where.empty() ? "" : " ", where,
                    ": ", worst->Values());
  }
  absl::StrAppend(&out, "; ", ErrorSummary());
  return out;
}

Comparator::Comparator(const CompareOptions& options) : options_(options) {
  result_.rtol = options.rtol;
  result_.atol = options.atol;
}

absl::Status Comparator::Add(const c10::IValue& actual,
                             const c10::IValue& expected,
                             absl::string_view path) {
  RETURN_IF_ERROR(ValidateCompareOptions(options_));
  const std::string p(path);
  return TorchCall(absl::StrCat("comparing ", Where(p)),
                   [&] { return AddValue(actual, expected, p); });
}

void Comparator::AddNumber(double a, double b, const std::string& path) {
  ++result_.elements;
  const bool same = a == b || (std::isnan(a) && std::isnan(b));
  double abs_error = 0;
  double rel_error = 0;
  if (!same) {
    abs_error = std::fabs(a - b);
    if (std::isnan(abs_error)) abs_error = kInf;
    rel_error = std::isinf(abs_error) ? kInf : abs_error / std::fabs(b);
  }
  result_.max_abs_error = std::max(result_.max_abs_error, abs_error);
  result_.max_rel_error = std::max(result_.max_rel_error, rel_error);
  const double allowed = options_.atol + options_.rtol * std::fabs(b);
  if (same || (!std::isinf(abs_error) && abs_error <= allowed)) return;
  ++result_.violations;
  result_.passed = false;
  const double excess = std::isinf(abs_error) ? kInf : abs_error - allowed;
  if (!result_.worst.has_value() || excess > worst_excess_) {
    worst_excess_ = excess;
    result_.worst = ElementDiff{path, -1, {}, a, b, abs_error, rel_error};
  }
}

absl::Status Comparator::AddTensor(const at::Tensor& actual,
                                   const at::Tensor& expected,
                                   const std::string& path) {
  if (actual.defined() != expected.defined()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(path), ": ",
        actual.defined() ? "a tensor" : "an undefined tensor", " vs ",
        expected.defined() ? "a tensor" : "an undefined tensor"));
  }
  if (!actual.defined()) return absl::OkStatus();
  if (!actual.sizes().equals(expected.sizes())) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(path), ": shape ", Shape(actual), " vs ", Shape(expected)));
  }
  if (actual.is_complex() || expected.is_complex()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(path), ": complex tensors (", c10::toString(actual.scalar_type()),
        " vs ", c10::toString(expected.scalar_type()), ") are not supported"));
  }
  const int64_t n = actual.numel();
  result_.elements += n;
  if (n == 0) return absl::OkStatus();
  const at::Tensor x = Flat(actual);
  const at::Tensor y = Flat(expected);
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    const at::Tensor a = x.slice(0, start, end).to(at::kDouble);
    const at::Tensor b = y.slice(0, start, end).to(at::kDouble);
    // Equal, equal infinities, or NaN on both sides: error 0.
    const at::Tensor same =
        a.eq(b).logical_or_(a.isnan().logical_and_(b.isnan()));
    at::Tensor abs_error = (a - b).abs_().masked_fill_(same, 0.0);
    // NaN on one side (or inf - inf): infinitely wrong.
    abs_error.masked_fill_(abs_error.isnan(), kInf);
    const at::Tensor ref = b.abs();
    at::Tensor rel_error = abs_error / ref;
    rel_error.masked_fill_(same, 0.0);
    rel_error.masked_fill_(rel_error.isnan(), kInf);
    result_.max_abs_error =
        std::max(result_.max_abs_error, abs_error.max().item<double>());
    result_.max_rel_error =
        std::max(result_.max_rel_error, rel_error.max().item<double>());

    const at::Tensor allowed = ref.mul(options_.rtol).add_(options_.atol);
    const at::Tensor infinite = abs_error.isinf();
    const at::Tensor bad = abs_error.gt(allowed).logical_or_(infinite);
    const int64_t count = bad.sum().item<int64_t>();
    if (count == 0) continue;
    result_.violations += count;
    result_.passed = false;
    at::Tensor excess = abs_error - allowed;
    excess.masked_fill_(infinite, kInf);
    excess.masked_fill_(bad.logical_not(), -kInf);
    // argmax gives the first of equal maxima.
    const int64_t i = excess.argmax().item<int64_t>();
    const double e = excess[i].item<double>();
    if (!result_.worst.has_value() || e > worst_excess_) {
      worst_excess_ = e;
      result_.worst = ElementDiff{path,
                                  start + i,
                                  Unravel(start + i, actual.sizes()),
                                  a[i].item<double>(),
                                  b[i].item<double>(),
                                  abs_error[i].item<double>(),
                                  rel_error[i].item<double>()};
    }
  }
  return absl::OkStatus();
}

absl::Status Comparator::AddValue(const c10::IValue& actual,
                                  const c10::IValue& expected,
                                  const std::string& path) {
  if (actual.isTensor() && expected.isTensor()) {
    return AddTensor(actual.toTensor(), expected.toTensor(), path);
  }
  if ((actual.isTuple() || actual.isList()) &&
      (expected.isTuple() || expected.isList())) {
    c10::ArrayRef<c10::IValue> a =
        actual.isTuple() ? actual.toTupleRef().elements().asArrayRef()
                         : actual.toListRef();
    c10::ArrayRef<c10::IValue> b =
        expected.isTuple() ? expected.toTupleRef().elements().asArrayRef()
                           : expected.toListRef();
    if (a.size() != b.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(path), ": ", a.size(), " elements vs ", b.size()));
    }
    for (size_t i = 0; i < a.size(); ++i) {
      RETURN_IF_ERROR(AddValue(a[i], b[i], absl::StrCat(path, "[", i, "]")));
    }
    return absl::OkStatus();
  }
  if (actual.isGenericDict() && expected.isGenericDict()) {
    const c10::impl::GenericDict a = actual.toGenericDict();
    const c10::impl::GenericDict b = expected.toGenericDict();
    auto keys = [](const c10::impl::GenericDict& d) {
      std::vector<std::string> out;
      for (const auto& entry : d) out.push_back(KeyPath(entry.key()));
      return absl::StrCat("{", absl::StrJoin(out, ", "), "}");
    };
    bool same_keys = a.size() == b.size();
    for (const auto& entry : b) {
      same_keys = same_keys && a.contains(entry.key());
    }
    if (!same_keys) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(path), ": keys ", keys(a), " vs ", keys(b)));
    }
    // In the reference's order.
    for (const auto& entry : b) {
      RETURN_IF_ERROR(AddValue(a.at(entry.key()), entry.value(),
                               absl::StrCat(path, KeyPath(entry.key()))));
    }
    return absl::OkStatus();
  }
  std::optional<double> na = Number(actual);
  std::optional<double> nb = Number(expected);
  if (na && nb) {
    if (actual.isInt() && expected.isInt() &&
        actual.toInt() == expected.toInt()) {
      AddNumber(0.0, 0.0, path);  // Exact, even beyond 2^53.
    } else {
      AddNumber(*na, *nb, path);
    }
    return absl::OkStatus();
  }
  auto mismatch = [&](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat(Where(path), ": ", what));
  };
  if (actual.isNone() && expected.isNone()) return absl::OkStatus();
  if (actual.isString() && expected.isString()) {
    if (actual.toStringRef() == expected.toStringRef()) {
      return absl::OkStatus();
    }
    return mismatch(absl::StrCat("string '", actual.toStringRef(), "' vs '",
                                 expected.toStringRef(), "'"));
  }
  if (actual.isDevice() && expected.isDevice()) {
    if (actual.toDevice() == expected.toDevice()) return absl::OkStatus();
    return mismatch(absl::StrCat("device ", actual.toDevice().str(), " vs ",
                                 expected.toDevice().str()));
  }
  return mismatch(absl::StrCat("cannot compare ", actual.tagKind(), " with ",
                               expected.tagKind()));
}

absl::StatusOr<CompareResult> CompareValues(const c10::IValue& actual,
                                            const c10::IValue& expected,
                                            const CompareOptions& options) {
  Comparator comparator(options);
  RETURN_IF_ERROR(comparator.Add(actual, expected));
  return comparator.result();
}

}  // namespace tracecut::runtime
