#include "tracer/hf/json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tracecut::tracer::hf {
namespace {

// Deep enough for any config; shallow enough that hostile input cannot
// exhaust the stack.
constexpr int kMaxDepth = 512;

class Parser {
 public:
  Parser(absl::string_view text, absl::string_view source)
      : text_(text), source_(source) {}

  absl::StatusOr<Json> ParseDocument() {
    SkipSpace();
    absl::StatusOr<Json> v = ParseValue(0);
    if (!v.ok()) return v;
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the value");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", line, ":", col, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }

  absl::StatusOr<Json> ParseValue(int depth) {
    if (depth > kMaxDepth) return Error("nesting too deep");
    if (pos_ >= text_.size()) return Error("unexpected end of input");
    char c = text_[pos_];
    switch (c) {
      case '{':
        return ParseObject(depth);
      case '[':
        return ParseArray(depth);
      case '"': {
        std::string s;
        if (absl::Status st = ParseString(s); !st.ok()) return st;
        return Json(std::move(s));
      }
      case 't':
        if (Consume("true")) return Json(true);
        break;
      case 'f':
        if (Consume("false")) return Json(false);
        break;
      case 'n':
        if (Consume("null")) return Json();
        break;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber();
    }
    return Error(absl::StrCat("unexpected character '",
                              absl::CHexEscape(absl::string_view(&c, 1)), "'"));
  }

  absl::StatusOr<Json> ParseObject(int depth) {
    ++pos_;  // '{'
    Json obj = Json::MakeObject();
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return obj;
    }
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Error("expected a string key");
      }
      std::string key;
      if (absl::Status st = ParseString(key); !st.ok()) return st;
      if (obj.Find(key) != nullptr) {
        return Error(absl::StrCat("duplicate key \"", key, "\""));
      }
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != ':') {
        return Error("expected ':'");
      }
      ++pos_;
      SkipSpace();
      absl::StatusOr<Json> v = ParseValue(depth + 1);
      if (!v.ok()) return v.status();
      obj.Set(std::move(key), *std::move(v));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return obj;
      }
      return Error("expected ',' or '}'");
    }
  }

  absl::StatusOr<Json> ParseArray(int depth) {
    ++pos_;  // '['
    Json arr = Json::MakeArray();
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return arr;
    }
    while (true) {
      SkipSpace();
      absl::StatusOr<Json> v = ParseValue(depth + 1);
      if (!v.ok()) return v.status();
      arr.Append(*std::move(v));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return arr;
      }
      return Error("expected ',' or ']'");
    }
  }

  static void AppendUtf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  absl::Status ParseHex4(uint32_t& cp) {
    if (pos_ + 4 > text_.size()) return Error("truncated \\u escape");
    cp = 0;
    for (int i = 0; i < 4; ++i) {
      char h = text_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') {
        cp |= h - '0';
      } else if (h >= 'a' && h <= 'f') {
        cp |= h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        cp |= h - 'A' + 10;
      } else {
        --pos_;
        return Error("invalid hex digit in \\u escape");
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string& out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        return Error("control character in string");
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) return Error("unterminated string");
      char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          uint32_t cp;
          if (absl::Status st = ParseHex4(cp); !st.ok()) return st;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!Consume("\\u")) return Error("unpaired surrogate");
            uint32_t lo;
            if (absl::Status st = ParseHex4(lo); !st.ok()) return st;
            if (lo < 0xDC00 || lo > 0xDFFF) return Error("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Error("unpaired surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Error("invalid escape in string");
      }
    }
  }

  absl::StatusOr<Json> ParseNumber() {
    size_t start = pos_;
    bool integral = true;
    if (text_[pos_] == '-') ++pos_;
    auto digits = [&]() {
      size_t s = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        ++pos_;
      }
      return pos_ - s;
    };
    size_t int_start = pos_;
    if (digits() == 0) return Error("invalid number");
    if (text_[int_start] == '0' && pos_ - int_start > 1) {
      pos_ = int_start;
      return Error("leading zero in number");
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (digits() == 0) return Error("expected digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
        ++pos_;
      }
      if (digits() == 0) return Error("expected digits in exponent");
    }
    std::string num(text_.substr(start, pos_ - start));
    if (integral) {
      int64_t v;
      auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
      if (ec == std::errc() && ptr == num.data() + num.size()) return Json(v);
      // Out of int64 range: keep it as a double, as Python's json would not,
      // but without losing the magnitude.
    }
    char* end = nullptr;
    double d = std::strtod(num.c_str(), &end);
    if (end != num.c_str() + num.size()) return Error("invalid number");
    return Json(d);
  }

  absl::string_view text_;
  absl::string_view source_;
  size_t pos_ = 0;
};

void AppendDouble(double d, std::string& out) {
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, ptr);
  // Keep it recognisable as a floating-point number.
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  out += s;
}

void Newline(std::string& out, int indent, int depth) {
  if (indent < 0) return;
  out.push_back('\n');
  out.append(static_cast<size_t>(indent) * depth, ' ');
}

}  // namespace

Json Json::MakeArray(Array elements) {
  Json j;
  j.type_ = Type::kArray;
  j.value_ = std::move(elements);
  return j;
}

Json Json::MakeObject(Members members) {
  Json j;
  j.type_ = Type::kObject;
  j.value_ = std::move(members);
  return j;
}

absl::StatusOr<Json> Json::Parse(absl::string_view text,
                                 absl::string_view source) {
  return Parser(text, source).ParseDocument();
}

absl::string_view Json::TypeName(Type type) {
  switch (type) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "integer";
    case Type::kDouble:
      return "number";
    case Type::kString:
      return "string";
    case Type::kArray:
      return "array";
    case Type::kObject:
      return "object";
  }
  return "unknown";
}

double Json::as_double() const {
  if (type_ == Type::kInt)
    return static_cast<double>(std::get<int64_t>(value_));
  return std::get<double>(value_);
}

const Json* Json::Find(absl::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& [k, v] : std::get<Members>(value_)) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Json::Append(Json element) {
  std::get<Array>(value_).push_back(std::move(element));
}

void Json::Set(std::string key, Json value) {
  Members& members = std::get<Members>(value_);
  for (auto& [k, v] : members) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  members.emplace_back(std::move(key), std::move(value));
}

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

void Json::DumpTo(std::string& out, int indent, int depth) const {
  switch (type_) {
    case Type::kNull:
      out += "null";
      return;
    case Type::kBool:
      out += as_bool() ? "true" : "false";
      return;
    case Type::kInt:
      absl::StrAppend(&out, as_int());
      return;
    case Type::kDouble:
      AppendDouble(std::get<double>(value_), out);
      return;
    case Type::kString:
      out += JsonQuote(as_string());
      return;
    case Type::kArray: {
      const Array& a = elements();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) out.push_back(',');
        Newline(out, indent, depth + 1);
        a[i].DumpTo(out, indent, depth + 1);
      }
      Newline(out, indent, depth);
      out.push_back(']');
      return;
    }
    case Type::kObject: {
      const Members& m = members();
      if (m.empty()) {
        out += "{}";
        return;
      }
      out.push_back('{');
      for (size_t i = 0; i < m.size(); ++i) {
        if (i > 0) out.push_back(',');
        Newline(out, indent, depth + 1);
        out += JsonQuote(m[i].first);
        out += indent < 0 ? ":" : ": ";
        m[i].second.DumpTo(out, indent, depth + 1);
      }
      Newline(out, indent, depth);
      out.push_back('}');
      return;
    }
  }
}

std::string Json::Dump(int indent) const {
  std::string out;
  DumpTo(out, indent, 0);
  return out;
}

bool operator==(const Json& a, const Json& b) {
  return a.type_ == b.type_ && a.value_ == b.value_;
}

}  // namespace tracecut::tracer::hf
