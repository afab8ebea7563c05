// The lexical layer of the IR text parser (see text_internal.h).

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ir/graph.h"
#include "ir/text_internal.h"
#include "util/status_macros.h"

namespace tracecut::ir::text_internal {

absl::Status TextScanner::Error(size_t at, absl::string_view what) const {
  at = std::min(at, text_.size());
  size_t line_start = 0;
  if (at > 0) {
    size_t newline = text_.rfind('\n', at - 1);
    if (newline != absl::string_view::npos) line_start = newline + 1;
  }
  size_t line_end = text_.find('\n', line_start);
  if (line_end == absl::string_view::npos) line_end = text_.size();
  // Show at most kWindow bytes either side of the column, escaped so
  // binary input cannot garble the message.
  constexpr size_t kWindow = 60;
  size_t from = at - line_start > kWindow ? at - kWindow : line_start;
  size_t to = std::min(line_end, at + kWindow);
  std::string shown = from > line_start ? "..." : "";
  size_t caret = 0;
  for (size_t i = from; i < to; ++i) {
    if (i == at) caret = shown.size();
    unsigned char c = static_cast<unsigned char>(text_[i]);
    if (c == '\t') {
      shown.push_back(' ');
    } else if (c == '\r' && i + 1 == line_end) {
      // A CRLF line end is not part of the line.
    } else if (c < 0x20 || c >= 0x7f) {
      absl::StrAppend(&shown, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      shown.push_back(static_cast<char>(c));
    }
  }
  if (at >= to) caret = shown.size();
  if (to < line_end) shown.append("...");
  return absl::InvalidArgumentError(
      absl::StrCat(LineOf(at), ", column ", at - line_start + 1, ": ", what,
                   "\n  ", shown, "\n  ", std::string(caret, ' '), "^"));
}

std::string TextScanner::LineOf(size_t at) const {
  size_t line = 1;
  for (size_t i = 0; i < at && i < text_.size(); ++i) {
    line += text_[i] == '\n';
  }
  return absl::StrCat("line ", line);
}

void TextScanner::SkipSpace() {
  while (!AtEnd()) {
    char c = text_[pos_];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++pos_;
    } else if (c == '#') {
      while (!AtEnd() && text_[pos_] != '\n') ++pos_;
    } else {
      break;
    }
  }
}

std::string TextScanner::Found() const {
  if (AtEnd()) return "end of input";
  unsigned char c = static_cast<unsigned char>(text_[pos_]);
  if (c == '\n' || c == '\r') return "end of line";
  if (c >= 0x20 && c < 0x7f) {
    if (IsIdentStart(static_cast<char>(c))) {
      size_t end = pos_;
      while (end < text_.size() && IsIdentChar(text_[end]) && end - pos_ < 40) {
        ++end;
      }
      return absl::StrCat("'", text_.substr(pos_, end - pos_), "'");
    }
    return absl::StrCat("'", std::string(1, static_cast<char>(c)), "'");
  }
  return absl::StrCat("byte 0x", absl::Hex(c, absl::kZeroPad2));
}

absl::Status TextScanner::Expected(absl::string_view what) const {
  return Error(pos_, absl::StrCat("expected ", what, ", found ", Found()));
}

bool TextScanner::TryConsume(char c) {
  SkipSpace();
  if (!AtEnd() && text_[pos_] == c) {
    ++pos_;
    return true;
  }
  return false;
}

absl::Status TextScanner::Expect(char c, absl::string_view what) {
  if (TryConsume(c)) return absl::OkStatus();
  return Expected(what);
}

bool TextScanner::TryWord(absl::string_view word) {
  SkipSpace();
  if (text_.substr(pos_, word.size()) != word) return false;
  size_t end = pos_ + word.size();
  if (end < text_.size() && IsIdentChar(text_[end])) return false;
  pos_ = end;
  return true;
}

absl::string_view TextScanner::ReadWord() {
  size_t start = pos_;
  while (!AtEnd() && IsIdentChar(text_[pos_])) ++pos_;
  return text_.substr(start, pos_ - start);
}

absl::StatusOr<std::string> TextScanner::ParseIdentifier(
    absl::string_view what) {
  SkipSpace();
  if (AtEnd() || !IsIdentStart(text_[pos_])) return Expected(what);
  return std::string(ReadWord());
}

int TextScanner::HexValue(char c) const {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

absl::StatusOr<std::string> TextScanner::ParseString(absl::string_view what) {
  SkipSpace();
  if (AtEnd() || text_[pos_] != '"') return Expected(what);
  size_t start = pos_++;
  std::string out;
  while (true) {
    if (AtEnd() || text_[pos_] == '\n') {
      return Error(start,
                   "unterminated string (strings end on the same "
                   "line; write a newline as \\n)");
    }
    char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      return out;
    }
    if (c != '\\') {
      out.push_back(c);
      ++pos_;
      continue;
    }
    size_t escape = pos_++;
    char e = AtEnd() ? '\0' : text_[pos_++];
    switch (e) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case '0':
        out.push_back('\0');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '"':
        out.push_back('"');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case 'x': {
        int hi = pos_ < text_.size() ? HexValue(text_[pos_]) : -1;
        int lo = pos_ + 1 < text_.size() ? HexValue(text_[pos_ + 1]) : -1;
        if (hi < 0 || lo < 0) {
          return Error(escape, "\\x takes exactly two hex digits (\\xNN)");
        }
        out.push_back(static_cast<char>(hi * 16 + lo));
        pos_ += 2;
        break;
      }
      default:
        return Error(escape,
                     "unknown escape; use \\n \\t \\r \\0 \\a \\b \\f \\v "
                     "\\\\ \\\" \\' or \\xNN");
    }
  }
}

absl::StatusOr<std::string> TextScanner::ParseKey(absl::string_view what) {
  SkipSpace();
  if (!AtEnd() && text_[pos_] == '"') return ParseString(what);
  return ParseIdentifier(what);
}

absl::StatusOr<Argument> TextScanner::ParseNumber() {
  size_t start = pos_;
  bool negative = !AtEnd() && text_[pos_] == '-';
  if (negative) ++pos_;
  if (!AtEnd() && IsIdentStart(text_[pos_])) {
    size_t word_pos = pos_;
    absl::string_view word = ReadWord();
    if (word == "inf") {
      return Argument::Double(negative ? -HUGE_VAL : HUGE_VAL);
    }
    if (word == "nan") {
      if (AtEnd() || text_[pos_] != '(') {
        return Argument::Double(
            BitsToDouble(negative ? kNegativeNan : kPositiveNan));
      }
      if (negative) {
        return Error(start,
                     "nan(0x...) gives all 64 bits; write it "
                     "without '-'");
      }
      return ParseNanBits(start);
    }
    pos_ = word_pos;
    return Expected("a number after '-'");
  }
  size_t digits = pos_;
  while (!AtEnd() && absl::ascii_isdigit(text_[pos_])) ++pos_;
  if (pos_ == digits) return Expected("a digit");
  bool is_double = false;
  if (!AtEnd() && text_[pos_] == '.') {
    is_double = true;
    size_t frac = ++pos_;
    while (!AtEnd() && absl::ascii_isdigit(text_[pos_])) ++pos_;
    if (pos_ == frac) return Expected("a digit after '.'");
  }
  if (!AtEnd() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    is_double = true;
    ++pos_;
    if (!AtEnd() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    size_t exp = pos_;
    while (!AtEnd() && absl::ascii_isdigit(text_[pos_])) ++pos_;
    if (pos_ == exp) return Expected("exponent digits");
  }
  if (!AtEnd() && (IsIdentChar(text_[pos_]) || text_[pos_] == '.')) {
    return Error(start, "malformed number");
  }
  absl::string_view token = text_.substr(start, pos_ - start);
  if (is_double) {
    double v = 0;
    auto [end, ec] =
        std::from_chars(token.data(), token.data() + token.size(), v);
    if (ec == std::errc::result_out_of_range) {
      return Error(start, "number out of range for a double");
    }
    if (ec != std::errc() || end != token.data() + token.size()) {
      return Error(start, "malformed number");
    }
    return Argument::Double(v);
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(token, &v)) {
    return Error(start,
                 "integer out of range for int64 (write a double "
                 "with '.0' if that is what you mean)");
  }
  return Argument::Int(v);
}

absl::StatusOr<Argument> TextScanner::ParseNanBits(size_t start) {
  ++pos_;  // '('
  if (text_.substr(pos_, 2) != "0x") return Expected("'0x' in nan(0x...)");
  pos_ += 2;
  uint64_t bits = 0;
  size_t digits = 0;
  while (!AtEnd() && HexValue(text_[pos_]) >= 0) {
    if (++digits > 16)
      return Error(start,
                   "nan(0x...) takes at most 16 "
                   "hex digits");
    bits = bits * 16 + HexValue(text_[pos_++]);
  }
  if (digits == 0) return Expected("hex digits in nan(0x...)");
  if (AtEnd() || text_[pos_] != ')') return Expected("')' closing nan(0x...");
  ++pos_;
  if (!std::isnan(BitsToDouble(bits))) {
    return Error(start, "nan(0x...) bits are not a NaN");
  }
  return Argument::Double(BitsToDouble(bits));
}

absl::StatusOr<int64_t> TextScanner::ParseInt(absl::string_view what) {
  SkipSpace();
  if (AtEnd() || !(absl::ascii_isdigit(text_[pos_]) || text_[pos_] == '-')) {
    return Expected(what);
  }
  size_t start = pos_;
  ASSIGN_OR_RETURN(Argument a, ParseNumber());
  if (a.kind() != Argument::Kind::kInt) {
    return Error(start, absl::StrCat("expected ", what, ", found a double"));
  }
  return a.as_int();
}

}  // namespace tracecut::ir::text_internal
