#include "util/json.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tracecut::util {
namespace {

// Deep enough for any config; shallow enough that what reads the value
// recursively (dumping, callers) cannot exhaust the stack.
constexpr int kMaxDepth = 512;

// Thrown from the parse callback for what nlohmann accepts and we do not.
struct Rejected {
  std::string what;
};

// nlohmann's messages read "[json.exception.parse_error.101] parse error at
// line 3, column 14: syntax error ..."; keep what follows the position and
// put the source and position first, as compilers do.
std::string Located(absl::string_view source, const Json::exception& e) {
  absl::string_view what = e.what();
  if (size_t id_end = what.find("] "); id_end != absl::string_view::npos) {
    what.remove_prefix(id_end + 2);
  }
  constexpr absl::string_view kAt = "parse error at line ";
  constexpr absl::string_view kColumn = ", column ";
  if (absl::StartsWith(what, kAt)) {
    absl::string_view rest = what.substr(kAt.size());
    size_t comma = rest.find(kColumn);
    size_t colon = rest.find(": ");
    int line, column;
    if (comma < colon && colon != absl::string_view::npos &&
        absl::SimpleAtoi(rest.substr(0, comma), &line) &&
        absl::SimpleAtoi(
            rest.substr(comma + kColumn.size(), colon - comma - kColumn.size()),
            &column)) {
      return absl::StrCat(source, ":", line, ":", column, ": ",
                          rest.substr(colon + 2));
    }
  }
  return absl::StrCat(source, ": ", what);
}

}  // namespace

absl::StatusOr<Json> ParseJson(absl::string_view text,
                               absl::string_view source) {
  // Keys seen in each open object, innermost last.
  std::vector<absl::flat_hash_set<std::string>> keys;
  auto check = [&keys](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        [[fallthrough]];
      case Json::parse_event_t::array_start:
        if (depth >= kMaxDepth) throw Rejected{"nesting too deep"};
        break;
      case Json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case Json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(key).second) {
          throw Rejected{absl::StrCat("duplicate key \"", key, "\"")};
        }
        break;
      }
      case Json::parse_event_t::value:
        // nlohmann keeps non-negative integers unsigned; ours are int64, as
        // in the values callers build, and larger ones doubles.
        if (parsed.is_number_unsigned()) {
          uint64_t u = parsed.get<uint64_t>();
          if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            parsed = static_cast<int64_t>(u);
          } else {
            parsed = static_cast<double>(u);
          }
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), check);
  } catch (const Rejected& r) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", r.what));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(Located(source, e));
  }
}

const Json* FindMember(const Json& object, absl::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

absl::string_view JsonTypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "unknown";
  }
}

std::string DumpJson(const Json& value, int indent) {
  return value.dump(indent, ' ', /*ensure_ascii=*/false,
                    Json::error_handler_t::replace);
}

}  // namespace tracecut::util
