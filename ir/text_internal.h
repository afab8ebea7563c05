#ifndef TRACECUT_IR_TEXT_INTERNAL_H_
#define TRACECUT_IR_TEXT_INTERNAL_H_

// What the text printer (text_printer.cc) and parser (text_parser.cc) share:
// the character classes of the grammar, the NaN spellings, and the scanner
// the parser is built on. Not API; ir/text.h is.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "util/status_macros.h"

namespace tracecut::ir::text_internal {

// The NaNs that print as plain "nan" / "-nan": the quiet NaN that
// std::nan("") gives, and the negative one x86 produces for 0.0 / 0.0.
inline constexpr uint64_t kPositiveNan = 0x7ff8000000000000;
inline constexpr uint64_t kNegativeNan = 0xfff8000000000000;

inline uint64_t DoubleBits(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

inline double BitsToDouble(uint64_t bits) {
  double v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

inline bool IsIdentChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
}
inline bool IsIdentStart(char c) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_';
}
// Characters a target may use unquoted: "aten::add.Tensor", "model.fc".
inline bool IsBareTargetChar(char c) {
  return IsIdentChar(c) || c == '.' || c == ':';
}
// Characters a scope path may use unquoted: "model.layers.0".
inline bool IsBarePathChar(char c) { return IsIdentChar(c) || c == '.'; }

inline bool AllOf(absl::string_view s, bool (*pred)(char)) {
  for (char c : s) {
    if (!pred(c)) return false;
  }
  return true;
}

// An identifier as is, anything else quoted (names of kwargs, meta keys,
// dtypes).
std::string KeyOrQuoted(absl::string_view s);

// The lexical layer of the parser: a position in the text, whitespace and
// comments, words, strings and numbers, and errors that carry line, column
// and the line itself. The grammar (text_parser.cc) derives from it.
class TextScanner {
 public:
  explicit TextScanner(absl::string_view text) : text_(text) {}

  // "line L, column C: what" plus the line and a caret under the column.
  absl::Status Error(size_t at, absl::string_view what) const;

  // "line L" for an offset.
  std::string LineOf(size_t at) const;

 protected:
  bool AtEnd() const { return pos_ >= text_.size(); }

  // Whitespace and '#' comments up to the end of the line.
  void SkipSpace();

  // What stands at the current position, for "expected X, found Y".
  std::string Found() const;

  absl::Status Expected(absl::string_view what) const;

  bool TryConsume(char c);

  absl::Status Expect(char c, absl::string_view what);

  // Consumes `word` when it stands next as a whole word.
  bool TryWord(absl::string_view word);

  // [A-Za-z0-9_]* from the current position (no space skipping).
  absl::string_view ReadWord();

  absl::StatusOr<std::string> ParseIdentifier(absl::string_view what);

  int HexValue(char c) const;

  // A double-quoted string with C escapes; \xNN takes exactly two digits.
  absl::StatusOr<std::string> ParseString(absl::string_view what);

  // An identifier or a quoted string: kwarg names, meta keys, dtypes.
  absl::StatusOr<std::string> ParseKey(absl::string_view what);

  // A number: an int64, or a double when it has '.' or an exponent, or
  // inf / nan / nan(0xBITS), each optionally negative.
  absl::StatusOr<Argument> ParseNumber();

  // After "nan": "(0x" and 1 to 16 hex digits ")", a NaN's bit pattern.
  absl::StatusOr<Argument> ParseNanBits(size_t start);

  absl::StatusOr<int64_t> ParseInt(absl::string_view what);

  // Comma-separated items up to `close`, a trailing comma allowed.
  template <typename ParseItem>
  absl::Status ParseSequence(char close, absl::string_view what,
                             ParseItem parse_item) {
    if (TryConsume(close)) return absl::OkStatus();
    while (true) {
      RETURN_IF_ERROR(parse_item());
      if (TryConsume(',')) {
        if (TryConsume(close)) return absl::OkStatus();
        continue;
      }
      if (TryConsume(close)) return absl::OkStatus();
      return Expected(
          absl::StrCat("',' or '", std::string(1, close), "' after ", what));
    }
  }

  // The grammar reads and moves the position directly, as a hand-written
  // recursive-descent parser does.
  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace tracecut::ir::text_internal

#endif  // TRACECUT_IR_TEXT_INTERNAL_H_
