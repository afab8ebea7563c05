#include "ir/names.h"

#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace tracecut::ir {
namespace {

bool IsIdentifierChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
}

bool IsUtf8Continuation(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

}  // namespace

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  return std::all_of(s.begin(), s.end(), IsIdentifierChar);
}

bool IsModulePathSegment(absl::string_view segment) {
  return !segment.empty() &&
         segment.find(kModulePathSeparator) == absl::string_view::npos;
}

bool IsModulePath(absl::string_view path) {
  if (path.empty()) return false;
  for (absl::string_view segment : absl::StrSplit(path, kModulePathSeparator)) {
    if (!IsModulePathSegment(segment)) return false;
  }
  return true;
}

bool IsScopePath(absl::string_view path) {
  return path.empty() || IsModulePath(path);
}

std::string SanitizeName(absl::string_view hint) {
  // Most hints (every name a parsed or copied node keeps) already are.
  if (IsIdentifier(hint)) return std::string(hint);
  std::string out;
  out.reserve(hint.size() + 1);
  // A UTF-8 continuation byte after a non-ASCII lead byte belongs to the
  // character that already became '_'.
  bool in_multibyte = false;
  for (char c : hint) {
    if (IsIdentifierChar(c)) {
      out.push_back(c);
      in_multibyte = false;
    } else if (!(in_multibyte && IsUtf8Continuation(c))) {
      out.push_back('_');
      in_multibyte = static_cast<unsigned char>(c) >= 0xC0;
    }
  }
  if (out.empty() || absl::ascii_isdigit(static_cast<unsigned char>(out[0]))) {
    out.insert(out.begin(), '_');
  }
  return out;
}

}  // namespace tracecut::ir
