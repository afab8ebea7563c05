#ifndef TRACECUT_TRACER_HF_JSON_H_
#define TRACECUT_TRACER_HF_JSON_H_

// A small, strict JSON value with a parser and a deterministic writer, for
// Hugging Face config.json, tracecut_inputs.json and machine-readable
// reports. RFC 8259 only: no comments, no trailing commas, no NaN literals.
// Object keys keep their order; duplicate keys are an error. Integers that
// fit int64 stay integers ("3"), everything else with a fraction or an
// exponent is a double.
//
//   ASSIGN_OR_RETURN(Json config, Json::Parse(text, "config.json"));
//   if (const Json* v = config.Find("vocab_size"); v && v->is_int()) ...
//   std::string out = Json::Object({{"nodes", Json(int64_t{3})}}).Dump();

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::tracer::hf {

class Json {
 public:
  enum class Type { kNull, kBool, kInt, kDouble, kString, kArray, kObject };
  using Array = std::vector<Json>;
  using Members = std::vector<std::pair<std::string, Json>>;

  Json() = default;  // null
  explicit Json(bool v) : type_(Type::kBool), value_(v) {}
  explicit Json(int64_t v) : type_(Type::kInt), value_(v) {}
  explicit Json(int v) : Json(static_cast<int64_t>(v)) {}
  explicit Json(double v) : type_(Type::kDouble), value_(v) {}
  explicit Json(std::string v) : type_(Type::kString), value_(std::move(v)) {}
  explicit Json(const char* v) : Json(std::string(v)) {}
  static Json MakeArray(Array elements = {});
  static Json MakeObject(Members members = {});

  // Parses one JSON document. Errors name `source` (a file name, or what the
  // text is) with line and column: "config.json:3:14: expected ',' or '}'".
  static absl::StatusOr<Json> Parse(absl::string_view text,
                                    absl::string_view source = "JSON");

  Type type() const { return type_; }
  // "null", "bool", "integer", "number", "string", "array", "object".
  static absl::string_view TypeName(Type type);
  absl::string_view type_name() const { return TypeName(type_); }

  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  // Integers count as numbers too.
  bool is_number() const {
    return type_ == Type::kInt || type_ == Type::kDouble;
  }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Accessors; each requires the matching type (as_double accepts ints).
  bool as_bool() const { return std::get<bool>(value_); }
  int64_t as_int() const { return std::get<int64_t>(value_); }
  double as_double() const;
  const std::string& as_string() const { return std::get<std::string>(value_); }
  const Array& elements() const { return std::get<Array>(value_); }
  const Members& members() const { return std::get<Members>(value_); }

  // Object member lookup; nullptr when absent or not an object.
  const Json* Find(absl::string_view key) const;
  // Appends to an array / sets (replacing) a member of an object.
  void Append(Json element);
  void Set(std::string key, Json value);

  // Compact ("{"a":1}") when indent < 0, else pretty with `indent` spaces.
  // Deterministic: members in insertion order, doubles in the shortest form
  // that reads back to the same value (non-finite doubles become null).
  std::string Dump(int indent = -1) const;

  friend bool operator==(const Json& a, const Json& b);
  friend bool operator!=(const Json& a, const Json& b) { return !(a == b); }

 private:
  void DumpTo(std::string& out, int indent, int depth) const;

  Type type_ = Type::kNull;
  std::variant<std::monostate, bool, int64_t, double, std::string, Array,
               Members>
      value_;
};

// A JSON string literal (with quotes) for `s`; non-ASCII UTF-8 passes through,
// control characters are escaped.
std::string JsonQuote(absl::string_view s);

}  // namespace tracecut::tracer::hf

#endif  // TRACECUT_TRACER_HF_JSON_H_
