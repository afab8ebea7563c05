#include "checkpoint/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tracecut::checkpoint {
namespace {

using Json = nlohmann::json;

// A JSON value as it appears in the header, shortened for an error line.
std::string Shown(const Json& j) {
  std::string s = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// A non-negative integer (what Rust's usize deserialises), or nullopt.
std::optional<uint64_t> Unsigned(const Json& j) {
  if (!j.is_number_unsigned()) return std::nullopt;
  return j.get<uint64_t>();
}

}  // namespace

int SafetensorsDTypeBits(absl::string_view dtype) {
  static constexpr std::pair<absl::string_view, int> kBits[] = {
      {"F64", 64}, {"F32", 32}, {"F16", 16}, {"BF16", 16},   {"I64", 64},
      {"I32", 32}, {"I16", 16}, {"I8", 8},   {"U8", 8},      {"BOOL", 8},
      {"U16", 16}, {"U32", 32}, {"U64", 64}, {"F8_E4M3", 8}, {"F8_E5M2", 8},
  };
  for (const auto& [name, bits] : kBits) {
    if (name == dtype) return bits;
  }
  return 0;
}

namespace {

// Why the tensors' byte ranges do not tile a data section of `data_size`
// bytes, or "" when they do.
std::string TilingError(const std::map<std::string, SafetensorsEntry>& tensors,
                        uint64_t data_size) {
  // Sorted by their ranges, the tensors must tile the data section: each
  // starts where the one before ends, the last ends at the end of the file.
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> sorted;
  for (const auto& [key, e] : tensors) sorted.emplace_back(&key, &e);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) <
           std::pair(b.second->begin, b.second->end);
  });
  uint64_t cursor = 0;
  const std::string* previous = nullptr;
  for (const auto& [key, e] : sorted) {
    if (e->begin != cursor) {
      return absl::StrCat(
          "tensor '", *key, "' starts at byte ", e->begin, " of the data, ",
          e->begin < cursor ? "inside" : "after a gap after",
          previous == nullptr ? std::string(" the start")
                              : absl::StrCat(" tensor '", *previous, "'"),
          " (which ends at byte ", cursor,
          "); tensors must not overlap or leave gaps");
    }
    cursor = e->end;
    previous = key;
  }
  if (cursor != data_size) {
    return absl::StrCat("the tensors cover ", cursor, " bytes of a ", data_size,
                        "-byte data section (trailing bytes)");
  }
  return "";
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view file, absl::string_view name) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a valid safetensors file: ", what));
  };
  if (file.size() < 8) {
    return bad(absl::StrCat(file.size(), " bytes, no header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>(file[i]);
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return bad(absl::StrCat("the header claims ", n, " bytes, over the ",
                            kMaxSafetensorsHeaderBytes, "-byte limit"));
  }
  if (n > file.size() - 8) {
    return bad(absl::StrCat("the header claims ", n, " bytes but the file has ",
                            file.size() - 8, " after the length (truncated?)"));
  }
  SafetensorsHeader out;
  out.data_start = 8 + n;
  const absl::string_view text = file.substr(8, n);

  // nlohmann keeps the last of two equal keys; safetensors refuses them (two
  // tensors of one name is one tensor read from two places). The callback
  // sees every key with the object it belongs to still open.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  Json header;
  try {
    header = Json::parse(
        text.begin(), text.end(),
        [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
          switch (event) {
            case Json::parse_event_t::object_start:
              open_objects.emplace_back();
              break;
            case Json::parse_event_t::object_end:
              if (!open_objects.empty()) open_objects.pop_back();
              break;
            case Json::parse_event_t::key:
              if (!open_objects.empty() && duplicate.empty() &&
                  !open_objects.back()
                       .insert(parsed.get<std::string>())
                       .second) {
                duplicate = parsed.get<std::string>();
              }
              break;
            default:
              break;
          }
          return true;
        });
  } catch (const Json::exception& e) {
    return bad(absl::StrCat("header is not JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return bad(absl::StrCat("the header names '", duplicate, "' twice"));
  }
  if (!header.is_object()) return bad("header is not a JSON object");

  const uint64_t data_size = file.size() - out.data_start;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return bad("__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) {
          return bad(absl::StrCat("__metadata__ '", k,
                                  "' is not a string: ", Shown(v)));
        }
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor '", key, "'");
    if (!value.is_object()) {
      return bad(absl::StrCat(where, " is not an object: ", Shown(value)));
    }
    SafetensorsEntry e;
    const auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) {
      return bad(absl::StrCat(where, " has no \"dtype\" string"));
    }
    e.dtype = dtype->get<std::string>();
    const int bits = SafetensorsDTypeBits(e.dtype);
    if (bits == 0) {
      return bad(absl::StrCat(where, " has unknown dtype ", Shown(*dtype)));
    }
    const auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) {
      return bad(absl::StrCat(where, " has no \"shape\" array"));
    }
    uint64_t numel = 1;
    bool overflow = false;
    for (const Json& d : *shape) {
      std::optional<uint64_t> v = Unsigned(d);
      if (!v.has_value() ||
          *v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad(absl::StrCat(where, " has dimension ", Shown(d),
                                ", not a non-negative integer"));
      }
      e.shape.push_back(static_cast<int64_t>(*v));
      overflow |= __builtin_mul_overflow(numel, *v, &numel);
    }
    const auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() ||
        offsets->size() != 2 || !Unsigned((*offsets)[0]).has_value() ||
        !Unsigned((*offsets)[1]).has_value()) {
      return bad(
          absl::StrCat(where, ": data_offsets needs 2 non-negative integers"));
    }
    e.begin = (*offsets)[0].get<uint64_t>();
    e.end = (*offsets)[1].get<uint64_t>();
    uint64_t bytes = 0;
    overflow |=
        __builtin_mul_overflow(numel, static_cast<uint64_t>(bits / 8), &bytes);
    if (overflow) {
      return bad(absl::StrCat(where, ": shape x dtype overflows 64 bits"));
    }
    if (e.begin > e.end || e.end > data_size) {
      return bad(absl::StrCat(where, " spans bytes [", e.begin, ", ", e.end,
                              ") of a ", data_size,
                              "-byte data section (truncated?)"));
    }
    if (e.end - e.begin != bytes) {
      return bad(absl::StrCat(where, " has ", e.end - e.begin,
                              " bytes, but its shape and dtype need ", bytes));
    }
    out.tensors.emplace(key, std::move(e));
  }

  if (std::string gap = TilingError(out.tensors, data_size); !gap.empty()) {
    return bad(gap);
  }
  return out;
}

}  // namespace tracecut::checkpoint
