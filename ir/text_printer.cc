// Printing the IR text form (ir/text.h): canonical, so that parsing it back
// gives a StructurallyEqual graph.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "ir/names.h"
#include "ir/text.h"
#include "ir/text_internal.h"

namespace tracecut::ir {

namespace text_internal {

std::string KeyOrQuoted(absl::string_view s) {
  return IsIdentifier(s) ? std::string(s) : QuoteString(s);
}

}  // namespace text_internal

namespace {

using text_internal::AllOf;
using text_internal::DoubleBits;
using text_internal::IsBarePathChar;
using text_internal::IsBareTargetChar;
using text_internal::KeyOrQuoted;
using text_internal::kNegativeNan;
using text_internal::kPositiveNan;

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

}  // namespace tracecut::ir
