// Parsing the IR text form (ir/text.h): a grammar over the scanner in
// text_scanner.cc, then a builder that resolves references and verifies.

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "ir/names.h"
#include "ir/text.h"
#include "ir/text_internal.h"
#include "ir/verifier.h"
#include "util/status_macros.h"

namespace tracecut::ir {
namespace {

using text_internal::IsBarePathChar;
using text_internal::IsBareTargetChar;
using text_internal::IsIdentStart;
using text_internal::KeyOrQuoted;

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

// The grammar of the text form, a recursive descent over the scanner's
// bytes. Every method that can fail returns a Status built by Error(), which
// carries line, column and the line itself.
class Parser : public text_internal::TextScanner {
 public:
  explicit Parser(absl::string_view text) : TextScanner(text) {}

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

 private:
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
    const size_t start = pos_;
    RETURN_IF_ERROR(ParseStack(scope));
    // Nodes of one module share one stack, as the tracer makes them:
    // memory, and cheap stack comparisons for whoever reads the graph.
    auto [it, inserted] =
        scopes_.try_emplace(text_.substr(start, pos_ - start), scope);
    if (!inserted) scope = it->second;
    return absl::OkStatus();
  }

  absl::Status ParseStack(Scope& scope) {
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

  // Scopes parsed so far, by their text.
  absl::flat_hash_map<absl::string_view, Scope> scopes_;
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

absl::StatusOr<std::unique_ptr<Graph>> ParseGraph(absl::string_view text,
                                                  const ParseOptions& options) {
  Parser parser(text);
  ASSIGN_OR_RETURN(ParsedGraph parsed, parser.ParseFile());
  return Builder(parser, parsed).Build(options);
}

}  // namespace tracecut::ir
