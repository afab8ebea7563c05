#ifndef TRACECUT_UTIL_JSON_H_
#define TRACECUT_UTIL_JSON_H_

// JSON for config.json, tracecut_inputs.json, calibration data and reports:
// nlohmann/json's value type with object members kept in insertion order (so
// a report reads in the order it was built), plus what callers need on top of
// it: a strict parse that returns a Status naming the source with line and
// column, member lookup that never throws, the type names our messages use,
// and dumping that never throws.
//
//   ASSIGN_OR_RETURN(util::Json config, util::ParseJson(text, "config.json"));
//   if (const util::Json* v = util::FindMember(config, "vocab_size");
//       v != nullptr && v->is_number_integer()) {
//     int64_t vocab = v->get<int64_t>();
//   }
//   util::Json report = util::Json::object();
//   report["nodes"] = int64_t{3};
//   std::string text = util::DumpJson(report, 2);

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::util {

using Json = nlohmann::ordered_json;

// Parses one RFC 8259 document: no comments, trailing commas, NaN literals,
// duplicate keys or nesting deeper than 512. Integers become int64 (beyond
// int64, doubles); numbers beyond double's range are errors. Errors are
// InvalidArgument, "config.json:3:14: syntax error while parsing object ...".
absl::StatusOr<Json> ParseJson(absl::string_view text,
                               absl::string_view source = "JSON");

// The member `key` of `object`; nullptr when absent or not an object.
const Json* FindMember(const Json& object, absl::string_view key);

// What error messages call the type of `value`: "null", "bool", "integer",
// "number" (not integral), "string", "array", "object".
absl::string_view JsonTypeName(const Json& value);

// Compact ({"a":1}) when indent < 0, else pretty with `indent` spaces.
// Deterministic: members in insertion order, doubles in the shortest form that
// reads back to the same value ("0.1", "2.0", "1e-06"), non-finite doubles as
// null. Invalid UTF-8 is replaced (U+FFFD) rather than thrown on.
std::string DumpJson(const Json& value, int indent = -1);

}  // namespace tracecut::util

#endif  // TRACECUT_UTIL_JSON_H_
