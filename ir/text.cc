#include "ir/text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/names.h"
#include "ir/verifier.h"
#include "util/status_macros.h"

namespace tracecut::ir {
namespace {

// The NaNs that print as plain "nan" / "-nan": the quiet NaN that
// std::nan("") gives, and the negative one x86 produces for 0.0 / 0.0.
constexpr uint64_t kPositiveNan = 0x7ff8000000000000;
constexpr uint64_t kNegativeNan = 0xfff8000000000000;

uint64_t DoubleBits(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

double BitsToDouble(uint64_t bits) {
  double v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

bool IsIdentChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool IsIdentStart(char c) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_';
}
// Characters a target may use unquoted: "aten::add.Tensor", "model.fc".
bool IsBareTargetChar(char c) { return IsIdentChar(c) || c == '.' || c == ':'; }
// Characters a scope path may use unquoted: "model.layers.0".
bool IsBarePathChar(char c) { return IsIdentChar(c) || c == '.'; }

bool AllOf(absl::string_view s, bool (*pred)(char)) {
  for (char c : s) {
    if (!pred(c)) return false;
  }
  return true;
}

// ---------------------------------------------------------------- printing

// An identifier as is, anything else quoted (names of kwargs, meta keys,
// dtypes).
std::string KeyOrQuoted(absl::string_view s) {
  return IsIdentifier(s) ? std::string(s) : QuoteString(s);
}

void AppendArgument(const Argument& arg, std::string* out) {
  switch (arg.kind()) {
    case Argument::Kind::kNone:
      out->append("None");
      return;
    case Argument::Kind::kBool:
      out->append(arg.as_bool() ? "True" : "False");
      return;
    case Argument::Kind::kInt:
      absl::StrAppend(out, arg.as_int());
      return;
    case Argument::Kind::kDouble:
      out->append(FormatDouble(arg.as_double()));
      return;
    case Argument::Kind::kString:
      out->append(QuoteString(arg.as_string()));
      return;
    case Argument::Kind::kDType:
      absl::StrAppend(out, "dtype(", KeyOrQuoted(arg.as_string()), ")");
      return;
    case Argument::Kind::kDevice:
      absl::StrAppend(out, "device(", QuoteString(arg.as_string()), ")");
      return;
    case Argument::Kind::kNode:
      // A null reference only exists in a corrupted graph; print something
      // that cannot parse rather than crash.
      absl::StrAppend(out, "%",
                      arg.node() == nullptr ? "<null>" : arg.node()->name());
      return;
    case Argument::Kind::kList:
    case Argument::Kind::kTuple: {
      bool list = arg.kind() == Argument::Kind::kList;
      out->push_back(list ? '[' : '(');
      const std::vector<Argument>& elements = arg.elements();
      for (size_t i = 0; i < elements.size(); ++i) {
        if (i > 0) out->append(", ");
        AppendArgument(elements[i], out);
      }
      if (!list && elements.size() == 1) out->push_back(',');
      out->push_back(list ? ']' : ')');
      return;
    }
  }
}

void AppendScope(const Scope& scope, std::string* out) {
  out->append(" scope[");
  bool first = true;
  for (const ScopeEntry& e : scope.stack()) {
    if (!first) out->append(", ");
    first = false;
    if (e.path.empty() || AllOf(e.path, IsBarePathChar)) {
      out->append(e.path);
    } else {
      out->append(QuoteString(e.path));
    }
    absl::StrAppend(out, ":", QuoteString(e.type));
  }
  out->push_back(']');
}

void AppendMeta(const NodeMeta& meta, std::string* out) {
  std::vector<std::string> fields;
  if (!meta.outputs.empty()) {
    std::vector<std::string> tensors;
    for (const TensorMeta& t : meta.outputs) {
      tensors.push_back(absl::StrCat("tensor([", absl::StrJoin(t.shape, ", "),
                                     "], ", KeyOrQuoted(t.dtype), ", ",
                                     QuoteString(t.device), ")"));
    }
    fields.push_back(absl::StrCat("out=[", absl::StrJoin(tensors, ", "), "]"));
  }
  if (meta.source.has_value()) {
    fields.push_back(absl::StrCat("src=", QuoteString(meta.source->file), ":",
                                  meta.source->line, ":",
                                  QuoteString(meta.source->text)));
  }
  if (!meta.transforms.empty()) {
    std::vector<std::string> marks;
    for (const TransformMark& m : meta.transforms) {
      std::string s = absl::StrCat("mark(", QuoteString(m.pass));
      if (!m.data.empty()) {
        std::vector<std::string> entries;
        for (const auto& [k, v] : m.data) {
          entries.push_back(absl::StrCat(QuoteString(k), ": ", QuoteString(v)));
        }
        absl::StrAppend(&s, ", {", absl::StrJoin(entries, ", "), "}");
      }
      s.push_back(')');
      marks.push_back(std::move(s));
    }
    fields.push_back(
        absl::StrCat("transform=[", absl::StrJoin(marks, ", "), "]"));
  }
  if (!meta.extra.empty()) {
    std::vector<std::string> entries;
    for (const auto& [k, v] : meta.extra) {
      entries.push_back(absl::StrCat(KeyOrQuoted(k), ": ", PrintArgument(v)));
    }
    fields.push_back(
        absl::StrCat("extra={", absl::StrJoin(entries, ", "), "}"));
  }
  if (fields.empty()) return;
  absl::StrAppend(out, " meta{", absl::StrJoin(fields, ", "), "}");
}

// ----------------------------------------------------------------- parsing

// A parsed operand before node references are resolved.
struct ParsedValue {
  enum class Kind { kConstant, kRef, kList, kTuple };
  Kind kind = Kind::kConstant;
  Argument constant;
  std::string ref;  // kRef: the referenced name.
  size_t pos = 0;   // Offset of the value in the text.
  std::vector<ParsedValue> elements;
};

struct ParsedNode {
  size_t pos = 0;  // Offset of the '%' that starts the definition.
  std::string name;
  OpKind op = OpKind::kPlaceholder;
  std::string target;
  size_t target_pos = 0;
  std::vector<ParsedValue> args;
  std::vector<std::pair<std::string, ParsedValue>> kwargs;
  Scope scope;
  NodeMeta meta;
};

struct ParsedGraph {
  std::vector<ParsedNode> nodes;
  GraphMeta meta;
  size_t close_pos = 0;  // Offset of the closing '}'.
};

// A recursive-descent parser over bytes. Every method that can fail returns
// a Status built by Error(), which carries line, column and the line itself.
class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<ParsedGraph> ParseFile() {
    ParsedGraph graph;
    SkipSpace();
    if (!TryWord("graph")) return Expected("'graph {'");
    RETURN_IF_ERROR(Expect('{', "'{' after 'graph'"));
    while (true) {
      SkipSpace();
      if (AtEnd()) return Expected("'}' closing the graph");
      char c = text_[pos_];
      if (c == '}') {
        graph.close_pos = pos_++;
        break;
      }
      if (c == '%') {
        ASSIGN_OR_RETURN(ParsedNode node, ParseNode());
        graph.nodes.push_back(std::move(node));
      } else if (TryWord("assume")) {
        SkipSpace();
        ASSIGN_OR_RETURN(std::string a, ParseString("a quoted assumption"));
        graph.meta.assumptions.push_back(std::move(a));
      } else if (TryWord("extra")) {
        SkipSpace();
        size_t key_pos = pos_;
        ASSIGN_OR_RETURN(std::string key, ParseKey("a meta key"));
        RETURN_IF_ERROR(Expect('=', "'=' after the graph meta key"));
        ASSIGN_OR_RETURN(Argument value, ParseConstant());
        if (!graph.meta.extra.emplace(key, std::move(value)).second) {
          return Error(key_pos, absl::StrCat("graph meta key ",
                                             KeyOrQuoted(key), " given twice"));
        }
      } else {
        return Expected(
            "a node ('%name = op[target](...)'), 'assume', 'extra' or '}'");
      }
    }
    SkipSpace();
    if (!AtEnd()) {
      return Error(pos_, "unexpected text after the graph's closing '}'");
    }
    return graph;
  }

  // "line L, column C: what" plus the line and a caret under the column.
  absl::Status Error(size_t at, absl::string_view what) const {
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

  // "line L" for an offset.
  std::string LineOf(size_t at) const {
    size_t line = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      line += text_[i] == '\n';
    }
    return absl::StrCat("line ", line);
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }

  // Whitespace and '#' comments up to the end of the line.
  void SkipSpace() {
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

  // What stands at the current position, for "expected X, found Y".
  std::string Found() const {
    if (AtEnd()) return "end of input";
    unsigned char c = static_cast<unsigned char>(text_[pos_]);
    if (c == '\n' || c == '\r') return "end of line";
    if (c >= 0x20 && c < 0x7f) {
      if (IsIdentStart(static_cast<char>(c))) {
        size_t end = pos_;
        while (end < text_.size() && IsIdentChar(text_[end]) &&
               end - pos_ < 40) {
          ++end;
        }
        return absl::StrCat("'", text_.substr(pos_, end - pos_), "'");
      }
      return absl::StrCat("'", std::string(1, static_cast<char>(c)), "'");
    }
    return absl::StrCat("byte 0x", absl::Hex(c, absl::kZeroPad2));
  }

  absl::Status Expected(absl::string_view what) const {
    return Error(pos_, absl::StrCat("expected ", what, ", found ", Found()));
  }

  bool TryConsume(char c) {
    SkipSpace();
    if (!AtEnd() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::Status Expect(char c, absl::string_view what) {
    if (TryConsume(c)) return absl::OkStatus();
    return Expected(what);
  }

  // Consumes `word` when it stands next as a whole word.
  bool TryWord(absl::string_view word) {
    SkipSpace();
    if (text_.substr(pos_, word.size()) != word) return false;
    size_t end = pos_ + word.size();
    if (end < text_.size() && IsIdentChar(text_[end])) return false;
    pos_ = end;
    return true;
  }

  // [A-Za-z0-9_]* from the current position (no space skipping).
  absl::string_view ReadWord() {
    size_t start = pos_;
    while (!AtEnd() && IsIdentChar(text_[pos_])) ++pos_;
    return text_.substr(start, pos_ - start);
  }

  absl::StatusOr<std::string> ParseIdentifier(absl::string_view what) {
    SkipSpace();
    if (AtEnd() || !IsIdentStart(text_[pos_])) return Expected(what);
    return std::string(ReadWord());
  }

  int HexValue(char c) const {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A double-quoted string with C escapes; \xNN takes exactly two digits.
  absl::StatusOr<std::string> ParseString(absl::string_view what) {
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

  // An identifier or a quoted string: kwarg names, meta keys, dtypes.
  absl::StatusOr<std::string> ParseKey(absl::string_view what) {
    SkipSpace();
    if (!AtEnd() && text_[pos_] == '"') return ParseString(what);
    return ParseIdentifier(what);
  }

  // A number: an int64, or a double when it has '.' or an exponent, or
  // inf / nan / nan(0xBITS), each optionally negative.
  absl::StatusOr<Argument> ParseNumber() {
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

  // After "nan": "(0x" and 1 to 16 hex digits ")", a NaN's bit pattern.
  absl::StatusOr<Argument> ParseNanBits(size_t start) {
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

  absl::StatusOr<int64_t> ParseInt(absl::string_view what) {
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

  absl::StatusOr<ParsedValue> ParseValue(int depth, bool allow_refs) {
    SkipSpace();
    ParsedValue v;
    v.pos = pos_;
    if (depth > kMaxTextNesting) {
      return Error(pos_, absl::StrCat("nesting deeper than ", kMaxTextNesting,
                                      " levels"));
    }
    if (AtEnd()) return Expected("a value");
    char c = text_[pos_];
    if (c == '%') {
      if (!allow_refs) {
        return Error(pos_,
                     "meta values must be constants, not node "
                     "references");
      }
      ASSIGN_OR_RETURN(v.ref, ParseNodeName());
      v.kind = ParsedValue::Kind::kRef;
      return v;
    }
    if (c == '"') {
      ASSIGN_OR_RETURN(std::string s, ParseString("a string"));
      v.constant = Argument::String(std::move(s));
      return v;
    }
    if (c == '-' || absl::ascii_isdigit(c)) {
      ASSIGN_OR_RETURN(v.constant, ParseNumber());
      return v;
    }
    if (c == '[') {
      ++pos_;
      v.kind = ParsedValue::Kind::kList;
      RETURN_IF_ERROR(ParseSequence(']', "list element", [&]() -> absl::Status {
        ASSIGN_OR_RETURN(ParsedValue e, ParseValue(depth + 1, allow_refs));
        v.elements.push_back(std::move(e));
        return absl::OkStatus();
      }));
      return v;
    }
    if (c == '(') {
      ++pos_;
      v.kind = ParsedValue::Kind::kTuple;
      if (TryConsume(')')) return v;
      ASSIGN_OR_RETURN(ParsedValue first, ParseValue(depth + 1, allow_refs));
      v.elements.push_back(std::move(first));
      if (TryConsume(')')) {
        return Error(pos_ - 1, "a 1-tuple needs a trailing comma: (x,)");
      }
      RETURN_IF_ERROR(Expect(',', "',' or ')' after tuple element"));
      RETURN_IF_ERROR(
          ParseSequence(')', "tuple element", [&]() -> absl::Status {
            ASSIGN_OR_RETURN(ParsedValue e, ParseValue(depth + 1, allow_refs));
            v.elements.push_back(std::move(e));
            return absl::OkStatus();
          }));
      return v;
    }
    if (IsIdentStart(c)) {
      size_t word_pos = pos_;
      absl::string_view word = ReadWord();
      if (word == "None") return v;
      if (word == "True" || word == "False") {
        v.constant = Argument::Bool(word == "True");
        return v;
      }
      if (word == "inf" || word == "nan") {
        pos_ = word_pos;
        ASSIGN_OR_RETURN(v.constant, ParseNumber());
        return v;
      }
      if (word == "dtype") {
        RETURN_IF_ERROR(Expect('(', "'(' after dtype"));
        ASSIGN_OR_RETURN(std::string name,
                         ParseKey("a dtype name (float32, \"odd name\")"));
        RETURN_IF_ERROR(Expect(')', "')' closing dtype(...)"));
        v.constant = Argument::DType(std::move(name));
        return v;
      }
      if (word == "device") {
        RETURN_IF_ERROR(Expect('(', "'(' after device"));
        ASSIGN_OR_RETURN(std::string name,
                         ParseString("a quoted device (\"cuda:0\")"));
        RETURN_IF_ERROR(Expect(')', "')' closing device(...)"));
        v.constant = Argument::Device(std::move(name));
        return v;
      }
      return Error(word_pos,
                   absl::StrCat("unknown value '", word,
                                "'; expected None, True, False, inf, nan, "
                                "dtype(...), device(...), a number, a "
                                "\"string\", %node, [list] or (tuple)"));
    }
    return Expected(
        "a value (None, True, False, a number, a \"string\", dtype(...), "
        "device(...), %node, [list] or (tuple))");
  }

  // A constant; node references are an error.
  absl::StatusOr<Argument> ParseConstant() {
    ASSIGN_OR_RETURN(ParsedValue v, ParseValue(1, /*allow_refs=*/false));
    return ToConstant(v);
  }

  static Argument ToConstant(const ParsedValue& v) {
    if (v.kind == ParsedValue::Kind::kConstant) return v.constant;
    std::vector<Argument> elements;
    elements.reserve(v.elements.size());
    for (const ParsedValue& e : v.elements) elements.push_back(ToConstant(e));
    return v.kind == ParsedValue::Kind::kList
               ? Argument::List(std::move(elements))
               : Argument::Tuple(std::move(elements));
  }

  // "%name"; names are identifiers.
  absl::StatusOr<std::string> ParseNodeName() {
    SkipSpace();
    size_t start = pos_;
    if (AtEnd() || text_[pos_] != '%') return Expected("'%name'");
    ++pos_;
    absl::string_view name = ReadWord();
    if (name.empty()) return Expected("a node name after '%'");
    if (!IsIdentifier(name)) {
      return Error(start, absl::StrCat("node name '", name,
                                       "' is not an identifier (it must not "
                                       "start with a digit)"));
    }
    return std::string(name);
  }

  absl::StatusOr<ParsedNode> ParseNode() {
    ParsedNode node;
    SkipSpace();
    node.pos = pos_;
    ASSIGN_OR_RETURN(node.name, ParseNodeName());
    RETURN_IF_ERROR(Expect('=', "'=' after the node name"));
    SkipSpace();
    size_t op_pos = pos_;
    absl::string_view op = ReadWord();
    std::optional<OpKind> kind = ParseOpKind(op);
    if (!kind.has_value()) {
      if (op.empty()) {
        return Expected(
            "an op kind (placeholder, get_attr, call_function, "
            "call_method, call_module, output)");
      }
      return Error(op_pos, absl::StrCat("unknown op kind '", op,
                                        "'; expected placeholder, get_attr, "
                                        "call_function, call_method, "
                                        "call_module or output"));
    }
    node.op = *kind;
    RETURN_IF_ERROR(Expect('[', "'[' before the target"));
    SkipSpace();
    node.target_pos = pos_;
    if (!AtEnd() && text_[pos_] == '"') {
      ASSIGN_OR_RETURN(node.target, ParseString("a target"));
    } else {
      while (!AtEnd() && IsBareTargetChar(text_[pos_])) ++pos_;
      if (pos_ == node.target_pos) {
        return Expected("a target (bare [A-Za-z0-9_.:]+ or \"quoted\")");
      }
      node.target =
          std::string(text_.substr(node.target_pos, pos_ - node.target_pos));
    }
    RETURN_IF_ERROR(Expect(']', "']' after the target"));
    RETURN_IF_ERROR(Expect('(', "'(' before the arguments"));
    bool keyword_seen = false;
    RETURN_IF_ERROR(ParseSequence(')', "argument", [&]() -> absl::Status {
      SkipSpace();
      size_t start = pos_;
      std::optional<std::string> key;
      if (!AtEnd() && (IsIdentStart(text_[pos_]) || text_[pos_] == '"')) {
        ASSIGN_OR_RETURN(std::string k, ParseKey("an argument"));
        SkipSpace();
        if (!AtEnd() && text_[pos_] == '=') {
          ++pos_;
          key = std::move(k);
        } else {
          pos_ = start;  // Not a keyword: parse it again as a value.
        }
      }
      ASSIGN_OR_RETURN(ParsedValue v, ParseValue(1, /*allow_refs=*/true));
      if (key.has_value()) {
        keyword_seen = true;
        node.kwargs.emplace_back(std::move(*key), std::move(v));
      } else if (keyword_seen) {
        return Error(start, "positional argument after keyword argument");
      } else {
        node.args.push_back(std::move(v));
      }
      return absl::OkStatus();
    }));
    bool scope_seen = false;
    bool meta_seen = false;
    while (true) {
      SkipSpace();
      size_t clause = pos_;
      if (TryWord("scope")) {
        if (scope_seen) return Error(clause, "scope given twice");
        scope_seen = true;
        RETURN_IF_ERROR(ParseScope(node.scope));
      } else if (TryWord("meta")) {
        if (meta_seen) return Error(clause, "meta given twice");
        meta_seen = true;
        RETURN_IF_ERROR(ParseMeta(node.meta));
      } else {
        break;
      }
    }
    return node;
  }

  absl::Status ParseScope(Scope& scope) {
    RETURN_IF_ERROR(Expect('[', "'[' after scope"));
    std::vector<ScopeEntry> stack;
    RETURN_IF_ERROR(ParseSequence(']', "scope entry", [&]() -> absl::Status {
      SkipSpace();
      ScopeEntry e;
      if (!AtEnd() && text_[pos_] == '"') {
        ASSIGN_OR_RETURN(e.path, ParseString("a module path"));
      } else {
        size_t start = pos_;
        while (!AtEnd() && IsBarePathChar(text_[pos_])) ++pos_;
        e.path = std::string(text_.substr(start, pos_ - start));
      }
      RETURN_IF_ERROR(
          Expect(':', "':' between module path and type (path:\"Type\")"));
      SkipSpace();
      ASSIGN_OR_RETURN(e.type, ParseString("a quoted module type"));
      stack.push_back(std::move(e));
      return absl::OkStatus();
    }));
    scope = Scope(std::move(stack));
    return absl::OkStatus();
  }

  absl::Status ParseMeta(NodeMeta& meta) {
    RETURN_IF_ERROR(Expect('{', "'{' after meta"));
    bool out_seen = false, src_seen = false, transform_seen = false,
         extra_seen = false;
    auto once = [&](bool& seen, size_t at,
                    absl::string_view field) -> absl::Status {
      if (seen) {
        return Error(at, absl::StrCat("meta field '", field, "' given twice"));
      }
      seen = true;
      return absl::OkStatus();
    };
    return ParseSequence('}', "meta field", [&]() -> absl::Status {
      SkipSpace();
      size_t at = pos_;
      if (TryWord("out")) {
        RETURN_IF_ERROR(once(out_seen, at, "out"));
        RETURN_IF_ERROR(Expect('=', "'=' after out"));
        RETURN_IF_ERROR(Expect('[', "'[' starting the tensor list"));
        return ParseSequence(']', "tensor", [&]() -> absl::Status {
          ASSIGN_OR_RETURN(TensorMeta t, ParseTensorMeta());
          meta.outputs.push_back(std::move(t));
          return absl::OkStatus();
        });
      }
      if (TryWord("src")) {
        RETURN_IF_ERROR(once(src_seen, at, "src"));
        RETURN_IF_ERROR(Expect('=', "'=' after src"));
        SourceLocation loc;
        ASSIGN_OR_RETURN(loc.file, ParseString("a quoted file name"));
        RETURN_IF_ERROR(Expect(':', "':' after the file name"));
        ASSIGN_OR_RETURN(loc.line, ParseInt("a line number"));
        RETURN_IF_ERROR(Expect(':', "':' after the line number"));
        ASSIGN_OR_RETURN(loc.text, ParseString("the quoted source text"));
        meta.source = std::move(loc);
        return absl::OkStatus();
      }
      if (TryWord("transform")) {
        RETURN_IF_ERROR(once(transform_seen, at, "transform"));
        RETURN_IF_ERROR(Expect('=', "'=' after transform"));
        RETURN_IF_ERROR(Expect('[', "'[' starting the mark list"));
        return ParseSequence(']', "mark", [&]() -> absl::Status {
          ASSIGN_OR_RETURN(TransformMark m, ParseMark());
          meta.transforms.push_back(std::move(m));
          return absl::OkStatus();
        });
      }
      if (TryWord("extra")) {
        RETURN_IF_ERROR(once(extra_seen, at, "extra"));
        RETURN_IF_ERROR(Expect('=', "'=' after extra"));
        RETURN_IF_ERROR(Expect('{', "'{' starting the extra map"));
        return ParseSequence('}', "extra entry", [&]() -> absl::Status {
          SkipSpace();
          size_t key_pos = pos_;
          ASSIGN_OR_RETURN(std::string key, ParseKey("a meta key"));
          RETURN_IF_ERROR(Expect(':', "':' after the meta key"));
          ASSIGN_OR_RETURN(Argument value, ParseConstant());
          if (!meta.extra.emplace(key, std::move(value)).second) {
            return Error(key_pos, absl::StrCat("meta key ", KeyOrQuoted(key),
                                               " given twice"));
          }
          return absl::OkStatus();
        });
      }
      return Expected("a meta field (out, src, transform or extra)");
    });
  }

  // tensor([2, 16], float32, "cpu")
  absl::StatusOr<TensorMeta> ParseTensorMeta() {
    TensorMeta t;
    if (!TryWord("tensor")) return Expected("tensor(...)");
    RETURN_IF_ERROR(Expect('(', "'(' after tensor"));
    RETURN_IF_ERROR(Expect('[', "'[' starting the shape"));
    RETURN_IF_ERROR(ParseSequence(']', "dimension", [&]() -> absl::Status {
      ASSIGN_OR_RETURN(int64_t d, ParseInt("a dimension"));
      t.shape.push_back(d);
      return absl::OkStatus();
    }));
    RETURN_IF_ERROR(Expect(',', "',' after the shape"));
    ASSIGN_OR_RETURN(t.dtype, ParseKey("a dtype (float32 or \"\")"));
    RETURN_IF_ERROR(Expect(',', "',' after the dtype"));
    ASSIGN_OR_RETURN(t.device, ParseString("a quoted device"));
    RETURN_IF_ERROR(Expect(')', "')' closing tensor(...)"));
    return t;
  }

  // mark("pass") or mark("pass", {"key": "value", ...})
  absl::StatusOr<TransformMark> ParseMark() {
    TransformMark m;
    if (!TryWord("mark")) return Expected("mark(...)");
    RETURN_IF_ERROR(Expect('(', "'(' after mark"));
    ASSIGN_OR_RETURN(m.pass, ParseString("a quoted pass name"));
    if (TryConsume(',')) {
      RETURN_IF_ERROR(Expect('{', "'{' starting the mark's data"));
      RETURN_IF_ERROR(ParseSequence('}', "data entry", [&]() -> absl::Status {
        SkipSpace();
        size_t key_pos = pos_;
        ASSIGN_OR_RETURN(std::string key, ParseString("a quoted key"));
        RETURN_IF_ERROR(Expect(':', "':' after the key"));
        ASSIGN_OR_RETURN(std::string value, ParseString("a quoted value"));
        if (!m.data.emplace(key, std::move(value)).second) {
          return Error(key_pos,
                       absl::StrCat("key ", QuoteString(key), " given twice"));
        }
        return absl::OkStatus();
      }));
    }
    RETURN_IF_ERROR(Expect(')', "')' closing mark(...)"));
    return m;
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

// Turns a parsed graph into a Graph: resolves references, adds nodes with
// their exact names, then verifies when asked.
class Builder {
 public:
  Builder(const Parser& parser, const ParsedGraph& parsed)
      : parser_(parser), parsed_(parsed) {}

  absl::StatusOr<std::unique_ptr<Graph>> Build(const ParseOptions& options) {
    for (size_t i = 0; i < parsed_.nodes.size(); ++i) {
      const ParsedNode& n = parsed_.nodes[i];
      auto [it, inserted] = index_.emplace(n.name, i);
      if (!inserted) {
        return parser_.Error(
            n.pos,
            absl::StrCat("duplicate node name %", n.name, " (first defined on ",
                         parser_.LineOf(parsed_.nodes[it->second].pos), ")"));
      }
    }
    auto graph = std::make_unique<Graph>();
    absl::flat_hash_map<const Node*, size_t> position;
    for (size_t i = 0; i < parsed_.nodes.size(); ++i) {
      const ParsedNode& n = parsed_.nodes[i];
      std::vector<Argument> args;
      for (const ParsedValue& v : n.args) {
        ASSIGN_OR_RETURN(Argument a, Resolve(v, n));
        args.push_back(std::move(a));
      }
      Kwargs kwargs;
      for (const auto& [key, v] : n.kwargs) {
        ASSIGN_OR_RETURN(Argument a, Resolve(v, n));
        kwargs.emplace_back(key, std::move(a));
      }
      if (options.verify) {
        if (absl::Status s = CheckTarget(n.op, n.target); !s.ok()) {
          return parser_.Error(n.target_pos, s.message());
        }
      }
      absl::StatusOr<Node*> node = graph->AddNode(
          n.op, n.target, std::move(args), std::move(kwargs), n.name);
      if (!node.ok()) return parser_.Error(n.pos, node.status().message());
      if ((*node)->name() != n.name) {
        // Names are unique identifiers by now, so AddNode keeps them.
        return parser_.Error(n.pos,
                             absl::StrCat("cannot name a node %", n.name));
      }
      (*node)->set_scope(n.scope);
      (*node)->meta() = n.meta;
      defined_[n.name] = *node;
      position[*node] = n.pos;
    }
    graph->meta() = parsed_.meta;
    if (options.verify) {
      if (graph->output_node() == nullptr) {
        return parser_.Error(parsed_.close_pos,
                             "the graph has no output node; expected "
                             "'%output = output[output](value)' before '}'");
      }
      const Node* culprit = nullptr;
      if (absl::Status s = Verify(*graph, &culprit); !s.ok()) {
        return parser_.Error(
            culprit == nullptr ? parsed_.close_pos : position.at(culprit),
            s.message());
      }
    }
    return graph;
  }

 private:
  absl::StatusOr<Argument> Resolve(const ParsedValue& v,
                                   const ParsedNode& user) {
    switch (v.kind) {
      case ParsedValue::Kind::kConstant:
        return v.constant;
      case ParsedValue::Kind::kRef: {
        auto it = defined_.find(v.ref);
        if (it != defined_.end()) return Argument::Ref(it->second);
        if (v.ref == user.name) {
          return parser_.Error(v.pos,
                               absl::StrCat("%", v.ref, " reads itself"));
        }
        auto later = index_.find(v.ref);
        if (later != index_.end()) {
          return parser_.Error(
              v.pos,
              absl::StrCat("%", v.ref, " is defined later, on ",
                           parser_.LineOf(parsed_.nodes[later->second].pos),
                           "; a node can only read nodes before it"));
        }
        return parser_.Error(v.pos, absl::StrCat("undefined node %", v.ref));
      }
      case ParsedValue::Kind::kList:
      case ParsedValue::Kind::kTuple: {
        std::vector<Argument> elements;
        elements.reserve(v.elements.size());
        for (const ParsedValue& e : v.elements) {
          ASSIGN_OR_RETURN(Argument a, Resolve(e, user));
          elements.push_back(std::move(a));
        }
        return v.kind == ParsedValue::Kind::kList
                   ? Argument::List(std::move(elements))
                   : Argument::Tuple(std::move(elements));
      }
    }
    return absl::InternalError("unreachable");
  }

  const Parser& parser_;
  const ParsedGraph& parsed_;
  absl::flat_hash_map<std::string, size_t> index_;
  absl::flat_hash_map<std::string, Node*> defined_;
};

}  // namespace

std::string FormatDouble(double value) {
  if (std::isnan(value)) {
    uint64_t bits = DoubleBits(value);
    if (bits == kPositiveNan) return "nan";
    if (bits == kNegativeNan) return "-nan";
    return absl::StrCat("nan(0x", absl::Hex(bits, absl::kZeroPad16), ")");
  }
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s.append(".0");
  return s;
}

std::string QuoteString(absl::string_view bytes) {
  std::string out = "\"";
  for (char ch : bytes) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\t':
        out.append("\\t");
        break;
      case '\r':
        out.append("\\r");
        break;
      default:
        if (c >= 0x20 && c < 0x7f) {
          out.push_back(ch);
        } else {
          absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string PrintArgument(const Argument& arg) {
  std::string out;
  AppendArgument(arg, &out);
  return out;
}

std::string PrintNode(const Node& node) {
  std::string out =
      absl::StrCat("%", node.name(), " = ", OpKindName(node.op()), "[");
  if (!node.target().empty() && AllOf(node.target(), IsBareTargetChar)) {
    out.append(node.target());
  } else {
    out.append(QuoteString(node.target()));
  }
  out.append("](");
  bool first = true;
  for (const Argument& a : node.args()) {
    if (!first) out.append(", ");
    first = false;
    AppendArgument(a, &out);
  }
  for (const auto& [key, value] : node.kwargs()) {
    if (!first) out.append(", ");
    first = false;
    absl::StrAppend(&out, KeyOrQuoted(key), "=");
    AppendArgument(value, &out);
  }
  out.push_back(')');
  if (!node.scope().empty()) AppendScope(node.scope(), &out);
  AppendMeta(node.meta(), &out);
  return out;
}

std::string PrintGraph(const Graph& graph) {
  std::string out = "graph {\n";
  for (const std::string& a : graph.meta().assumptions) {
    absl::StrAppend(&out, "  assume ", QuoteString(a), "\n");
  }
  for (const auto& [key, value] : graph.meta().extra) {
    absl::StrAppend(&out, "  extra ", KeyOrQuoted(key), " = ",
                    PrintArgument(value), "\n");
  }
  for (const Node* n : graph.nodes()) {
    absl::StrAppend(&out, "  ", PrintNode(*n), "\n");
  }
  out.append("}\n");
  return out;
}

absl::StatusOr<std::unique_ptr<Graph>> ParseGraph(absl::string_view text,
                                                  const ParseOptions& options) {
  Parser parser(text);
  ASSIGN_OR_RETURN(ParsedGraph parsed, parser.ParseFile());
  return Builder(parser, parsed).Build(options);
}

}  // namespace tracecut::ir
