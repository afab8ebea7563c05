#include "ir/dot.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tracecut::ir {
namespace {

// Length of the well-formed UTF-8 sequence (2 to 4 bytes, no overlong
// forms, surrogates or code points past U+10FFFF) at the start of `s`, or
// 0 when there is none.
size_t Utf8SequenceLength(absl::string_view s) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  auto continuation = [&](size_t i) {
    return i < s.size() && (byte(i) & 0xC0) == 0x80;
  };
  const unsigned char c = byte(0);
  if (c >= 0xC2 && c <= 0xDF) return continuation(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!continuation(1) || !continuation(2)) return 0;
    if (c == 0xE0 && byte(1) < 0xA0) return 0;   // Overlong.
    if (c == 0xED && byte(1) >= 0xA0) return 0;  // Surrogate.
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return 0;
    if (c == 0xF0 && byte(1) < 0x90) return 0;   // Overlong.
    if (c == 0xF4 && byte(1) >= 0x90) return 0;  // Past U+10FFFF.
    return 4;
  }
  return 0;
}

// A DOT double-quoted string. Graphviz treats `\` specially in labels
// (\n, \l, \N), so a literal one is doubled. Graphviz reads UTF-8, so
// well-formed UTF-8 (non-ASCII module names) stays as it is; control
// characters and bytes that are not UTF-8 are shown as \xNN text.
std::string DotQuote(absl::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const char ch = s[i];
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"') {
      out.append("\\\"");
    } else if (c == '\\') {
      out.append("\\\\");
    } else if (c >= 0x20 && c < 0x7f) {
      out.push_back(ch);
    } else if (size_t n = c >= 0x80 ? Utf8SequenceLength(s.substr(i)) : 0;
               n > 0) {
      out.append(s.data() + i, n);
      i += n;
      continue;
    } else {
      absl::StrAppend(&out, "\\\\x", absl::Hex(c, absl::kZeroPad2));
    }
    ++i;
  }
  out.push_back('"');
  return out;
}

absl::string_view Shape(OpKind op) {
  switch (op) {
    case OpKind::kPlaceholder:
      return "invhouse";
    case OpKind::kGetAttr:
      return "note";
    case OpKind::kCallModule:
      return "box3d";
    case OpKind::kOutput:
      return "house";
    case OpKind::kCallFunction:
    case OpKind::kCallMethod:
      break;
  }
  return "box";
}

// A label of several lines: each part escaped, joined by DOT's centred
// line break.
std::string Label(const std::vector<std::string>& lines) {
  std::string quoted;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string q = DotQuote(lines[i]);
    if (i > 0) quoted.append("\\n");
    quoted.append(q.substr(1, q.size() - 2));
  }
  return absl::StrCat("\"", quoted, "\"");
}

}  // namespace

const std::vector<std::string>& DefaultDotPalette() {
  static const std::vector<std::string>* const kPalette =
      new std::vector<std::string>{"#8dd3c7", "#ffffb3", "#bebada", "#fb8072",
                                   "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
                                   "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"};
  return *kPalette;
}

std::string ToDot(const Graph& graph, const DotOptions& options) {
  const std::vector<std::string>& palette =
      options.palette.empty() ? DefaultDotPalette() : options.palette;
  // DOT ids are positional ("n0", "n1", ...), so IR names need no escaping
  // there.
  std::map<const Node*, size_t> id;
  std::map<const Node*, int> cluster_of;
  std::map<int, std::vector<const Node*>> members;
  std::vector<const Node*> loose;
  for (const Node* n : graph.nodes()) {
    size_t i = id.size();
    id[n] = i;
    auto it = options.clusters.find(n->name());
    if (it != options.clusters.end() && it->second >= 0) {
      cluster_of[n] = it->second;
      members[it->second].push_back(n);
    } else {
      loose.push_back(n);
    }
  }
  auto colour = [&](int cluster) {
    return palette[static_cast<size_t>(cluster) % palette.size()];
  };
  auto node_line = [&](const Node* n, absl::string_view indent) {
    std::vector<std::string> lines = {
        absl::StrCat("%", n->name()),
        absl::StrCat(OpKindName(n->op()), "[", n->target(), "]")};
    if (options.show_scope && !n->scope().empty()) {
      lines.push_back(n->scope().path().empty() ? "<root>" : n->scope().path());
    }
    auto c = cluster_of.find(n);
    std::string fill = c == cluster_of.end() ? "white" : colour(c->second);
    return absl::StrCat(indent, "n", id.at(n), " [label=", Label(lines),
                        ", shape=", Shape(n->op()),
                        ", fillcolor=", DotQuote(fill), "];\n");
  };

  std::string out =
      absl::StrCat("digraph ", DotQuote(options.graph_name), " {\n",
                   "  node [style=filled, fontname=\"monospace\"];\n");
  for (const auto& [cluster, nodes] : members) {
    std::string label =
        static_cast<size_t>(cluster) < options.cluster_labels.size() &&
                !options.cluster_labels[cluster].empty()
            ? options.cluster_labels[cluster]
            : absl::StrCat("cluster ", cluster);
    absl::StrAppend(&out, "  subgraph cluster_", cluster, " {\n",
                    "    label=", DotQuote(label), ";\n",
                    "    style=rounded;\n", "    penwidth=2;\n",
                    "    color=", DotQuote(colour(cluster)), ";\n");
    for (const Node* n : nodes) out.append(node_line(n, "    "));
    out.append("  }\n");
  }
  for (const Node* n : loose) out.append(node_line(n, "  "));
  // Edges crossing cluster boundaries (a partition's cut) are drawn bold.
  for (const Node* n : graph.nodes()) {
    auto user_cluster = cluster_of.find(n);
    for (const Node* in : n->inputs()) {
      auto it = id.find(in);
      if (it == id.end()) continue;  // A corrupted graph; draw what exists.
      auto in_cluster = cluster_of.find(in);
      bool crosses = (user_cluster == cluster_of.end()) !=
                         (in_cluster == cluster_of.end()) ||
                     (user_cluster != cluster_of.end() &&
                      user_cluster->second != in_cluster->second);
      absl::StrAppend(&out, "  n", it->second, " -> n", id.at(n),
                      crosses ? " [style=bold]" : "", ";\n");
    }
  }
  out.append("}\n");
  return out;
}

}  // namespace tracecut::ir
