#include "partition/partitioner.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "ir/names.h"
#include "util/status_macros.h"

namespace tracecut::partition {

// Note [Placement]
// ~~~~~~~~~~~~~~~~
// Nodes are numbered in graph order (a topological order) and get a "slot":
// 0 is the head, slot k >= 1 is the k-th target instance in order of its
// first node. Slots are later grouped, in order, into subgraphs, so any
// placement that is monotone in slots is monotone in subgraphs too.
//
// * Target nodes take their instance's slot.
// * Feasibility: walking forward, need(n) is the earliest slot n could run
//   in (max over inputs, looking through non-target nodes). A target node
//   whose need exceeds its slot reads, through some chain, a value of an
//   instance that starts later: no order of whole instances works, and we
//   say which two instances conflict.
// * Non-target computation before the first target node is the head
//   (slot 0): embedding, mask construction, rotary tables.
// * Any other non-target node goes to the earliest slot among its users
//   (as late as possible), walking backwards. That is the subgraph of its
//   earliest consumer, and never earlier than its inputs: every user u has
//   slot(u) >= need(u) >= need(n) once feasibility holds. So the tail (norm,
//   lm_head) lands in the last slot, and glue computed between layers lands
//   with the layer that first reads it instead of being shipped through the
//   intermediates cache. Nodes without users keep need(n) (next to their
//   inputs).
// * get_attr nodes have no inputs; their home is the earliest slot among
//   their users, and every other subgraph that uses them gets its own read
//   (see Note [Subgraph values] in subgraph.cc).
// * Placeholders (model inputs) live in slot 0; they are available to every
//   subgraph.
//
// Every step is one pass over nodes and their use lists.

namespace {

constexpr absl::string_view kRegexPrefix = "re:";

// ----- Module patterns ------------------------------------------------------

enum class GlobToken { kChar, kStar, kDoubleStar, kQuestion };

struct CompiledPattern {
  enum class Kind { kExact, kGlob, kRegex };

  std::string text;
  Kind kind = Kind::kExact;
  std::vector<std::pair<GlobToken, char>> glob;
  std::shared_ptr<const std::regex> regex;  // Null if it did not compile.
  std::string regex_error;
};

CompiledPattern Compile(absl::string_view text) {
  CompiledPattern p;
  p.text = std::string(text);
  if (absl::StartsWith(text, kRegexPrefix)) {
    p.kind = CompiledPattern::Kind::kRegex;
    std::string body(text.substr(kRegexPrefix.size()));
    try {
      p.regex =
          std::make_shared<const std::regex>(body, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      p.regex_error = e.what();
    }
    return p;
  }
  if (text.find_first_of("*?") == absl::string_view::npos) return p;
  p.kind = CompiledPattern::Kind::kGlob;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '*') {
      if (i + 1 < text.size() && text[i + 1] == '*') {
        p.glob.push_back({GlobToken::kDoubleStar, 0});
        while (i + 1 < text.size() && text[i + 1] == '*') ++i;
      } else {
        p.glob.push_back({GlobToken::kStar, 0});
      }
    } else if (text[i] == '?') {
      p.glob.push_back({GlobToken::kQuestion, 0});
    } else {
      p.glob.push_back({GlobToken::kChar, text[i]});
    }
  }
  return p;
}

// Dynamic programming over pattern tokens: O(|pattern| * |text|). '*' and
// '?' stay within a module path segment (ir/names.h).
bool GlobMatches(const std::vector<std::pair<GlobToken, char>>& glob,
                 absl::string_view text) {
  const size_t n = text.size();
  // prev[j]: the first i tokens match text[0, j).
  std::vector<char> prev(n + 1, 0), cur(n + 1, 0);
  prev[0] = 1;
  for (const auto& [token, c] : glob) {
    std::fill(cur.begin(), cur.end(), 0);
    switch (token) {
      case GlobToken::kChar:
        for (size_t j = 1; j <= n; ++j)
          cur[j] = prev[j - 1] && text[j - 1] == c;
        break;
      case GlobToken::kQuestion:
        for (size_t j = 1; j <= n; ++j) {
          cur[j] = prev[j - 1] && text[j - 1] != ir::kModulePathSeparator;
        }
        break;
      case GlobToken::kStar:
        cur[0] = prev[0];
        for (size_t j = 1; j <= n; ++j) {
          cur[j] = prev[j] ||
                   (cur[j - 1] && text[j - 1] != ir::kModulePathSeparator);
        }
        break;
      case GlobToken::kDoubleStar:
        cur[0] = prev[0];
        for (size_t j = 1; j <= n; ++j) cur[j] = prev[j] || cur[j - 1];
        break;
    }
    std::swap(prev, cur);
  }
  return prev[n];
}

bool Matches(const CompiledPattern& p, absl::string_view path,
             absl::string_view type) {
  std::string short_type = ir::Scope::ShortType(type);
  switch (p.kind) {
    case CompiledPattern::Kind::kExact:
      return path == p.text ||
             (!type.empty() && (type == p.text || short_type == p.text));
    case CompiledPattern::Kind::kGlob:
      return GlobMatches(p.glob, path) ||
             (!type.empty() &&
              (GlobMatches(p.glob, type) || GlobMatches(p.glob, short_type)));
    case CompiledPattern::Kind::kRegex: {
      if (p.regex == nullptr) return false;
      auto full = [&](absl::string_view s) {
        return std::regex_match(s.begin(), s.end(), *p.regex);
      };
      return full(path) || (!type.empty() && (full(type) || full(short_type)));
    }
  }
  return false;
}

absl::StatusOr<std::vector<CompiledPattern>> CompileAll(
    const std::vector<std::string>& patterns, absl::string_view what) {
  std::vector<CompiledPattern> out;
  for (const std::string& text : patterns) {
    if (text.empty() || text == kRegexPrefix) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: empty ", what, " pattern"));
    }
    out.push_back(Compile(text));
    if (out.back().kind == CompiledPattern::Kind::kRegex &&
        out.back().regex == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: invalid regex in ", what, " pattern '", text,
                       "': ", out.back().regex_error));
    }
  }
  return out;
}

// Matches scope entries against the target and ignore patterns, once per
// distinct module path.
class ModuleMatcher {
 public:
  struct EntryMatch {
    int target = -1;  // Index of the first target pattern that matches.
    bool ignored = false;
  };

  ModuleMatcher(const std::vector<CompiledPattern>& targets,
                const std::vector<CompiledPattern>& ignore)
      : targets_(targets), ignore_(ignore) {}

  const EntryMatch& Lookup(absl::string_view path, absl::string_view type) {
    auto it = memo_.find(path);
    if (it != memo_.end()) return it->second;
    EntryMatch m;
    for (const CompiledPattern& p : ignore_) {
      if (Matches(p, path, type)) {
        m.ignored = true;
        break;
      }
    }
    for (size_t i = 0; i < targets_.size() && !m.ignored; ++i) {
      if (Matches(targets_[i], path, type)) {
        m.target = static_cast<int>(i);
        break;
      }
    }
    return memo_.emplace(std::string(path), m).first->second;
  }

 private:
  const std::vector<CompiledPattern>& targets_;
  const std::vector<CompiledPattern>& ignore_;
  absl::flat_hash_map<std::string, EntryMatch> memo_;
};

// A module the scope stack of some node mentions.
struct ModuleRef {
  absl::string_view path;
  absl::string_view type;
};

// Calls fn(ModuleRef) for every module of `node`'s stack, outermost first,
// plus the called leaf of a call_module node when its scope does not end
// with it already.
template <typename Fn>
void ForEachModule(const ir::Node* node, Fn&& fn) {
  const auto& stack = node->scope().stack();
  for (const ir::ScopeEntry& e : stack) {
    if (!fn(ModuleRef{e.path, e.type})) return;
  }
  if (node->op() == ir::OpKind::kCallModule &&
      (stack.empty() || stack.back().path != node->target())) {
    fn(ModuleRef{node->target(), ""});
  }
}

// ----- Errors ---------------------------------------------------------------

std::string PatternList(const std::vector<std::string>& patterns) {
  return absl::StrCat("[", absl::StrJoin(patterns, ", "), "]");
}

absl::Status NoTargetError(const ir::Graph& graph,
                           const PartitionOptions& options) {
  // Short type -> distinct paths, to suggest what the layers are called.
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> by_type;
  for (const ir::Node* n : graph.nodes()) {
    ForEachModule(n, [&](const ModuleRef& m) {
      if (!m.type.empty()) {
        by_type[ir::Scope::ShortType(m.type)].insert(std::string(m.path));
      }
      return true;
    });
  }
  std::string msg = absl::StrCat("partition: sequential targets ",
                                 PatternList(options.targets),
                                 " match no module in the graph");
  if (!options.ignore.empty()) {
    absl::StrAppend(&msg, " (outside the ignored ", PatternList(options.ignore),
                    ")");
  }
  if (by_type.empty()) {
    absl::StrAppend(&msg,
                    "; the graph's nodes carry no module scopes (was it traced "
                    "with scopes?)");
    return absl::NotFoundError(msg);
  }
  // Types whose instances sit in numbered containers ("model.layers.3")
  // come first: those are the layers; then by instance count.
  struct TypeCount {
    std::string type;
    size_t count;
    size_t indexed;
  };
  std::vector<TypeCount> types;
  for (const auto& [type, paths] : by_type) {
    size_t indexed = 0;
    for (const std::string& path : paths) {
      absl::string_view last = path;
      if (size_t dot = last.rfind('.'); dot != absl::string_view::npos) {
        last.remove_prefix(dot + 1);
      }
      indexed += !last.empty() &&
                 std::all_of(last.begin(), last.end(),
                             [](char c) { return c >= '0' && c <= '9'; });
    }
    types.push_back({type, paths.size(), indexed});
  }
  std::sort(types.begin(), types.end(), [](const auto& a, const auto& b) {
    if (a.indexed != b.indexed) return a.indexed > b.indexed;
    if (a.count != b.count) return a.count > b.count;
    return a.type < b.type;
  });
  const bool repeated = std::any_of(types.begin(), types.end(),
                                    [](const auto& t) { return t.count > 1; });
  std::vector<std::string> shown;
  for (const TypeCount& t : types) {
    if (repeated && t.count < 2) continue;
    if (shown.size() == 12) {
      shown.push_back("...");
      break;
    }
    shown.push_back(absl::StrCat(t.type, " (", t.count, ")"));
  }
  absl::StrAppend(&msg,
                  repeated ? "; module types with several instances (likely "
                             "layers): "
                           : "; module types present: ",
                  absl::StrJoin(shown, ", "));
  return absl::NotFoundError(msg);
}

struct Instance {
  std::string path;
  std::string type;
  int pattern = -1;
};

std::string DescribeInstance(const Instance& inst) {
  if (inst.type.empty()) return absl::StrCat("'", inst.path, "'");
  return absl::StrCat("'", inst.path, "' (", ir::Scope::ShortType(inst.type),
                      ")");
}

bool PathContains(absl::string_view outer, absl::string_view inner) {
  if (outer == inner) return false;
  if (outer.empty()) return true;
  return absl::StartsWith(inner, outer) && inner.size() > outer.size() &&
         inner[outer.size()] == '.';
}

absl::Status OrderError(const ir::Node* node, const Instance& reader,
                        const Instance& later) {
  std::string msg = absl::StrCat(
      "partition: cannot order sequential targets: ", node->Describe(),
      " belongs to ", DescribeInstance(reader), " and depends on ",
      DescribeInstance(later), ", which starts after ",
      DescribeInstance(reader), " does");
  const Instance* outer = nullptr;
  const Instance* inner = nullptr;
  if (PathContains(reader.path, later.path)) {
    outer = &reader;
    inner = &later;
  } else if (PathContains(later.path, reader.path)) {
    outer = &later;
    inner = &reader;
  }
  if (outer != nullptr) {
    absl::StrAppend(
        &msg, "; the targets nest ('", inner->path, "' is inside '",
        outer->path,
        "') and the outer one's own nodes come both before and after the "
        "inner one, so they cannot be separate subgraphs: use "
        "nesting=outermost, or target only the inner modules");
  } else {
    absl::StrAppend(
        &msg,
        "; a target instance must run as one step, so a module called "
        "around another target cannot be one: ignore one of them or target "
        "an enclosing module");
  }
  return absl::FailedPreconditionError(msg);
}

// Inputs, users and operand references of every node as indices in graph
// order, computed once: after this, nothing looks a node up by pointer.
struct Adjacency {
  std::vector<int> in_begin, in;
  std::vector<int> use_begin, use;
  // Every node reference in the operands, with repeats, in
  // Argument::ForEachNode order (args, then kwargs): CopyArgument consumes
  // them in the same order.
  std::vector<int> ref_begin, ref;

  absl::Span<const int> Inputs(int i) const {
    return absl::MakeConstSpan(in).subspan(in_begin[i],
                                           in_begin[i + 1] - in_begin[i]);
  }
  // Sorted by index. Callers only take minima, maxima and sets over users,
  // so the IR's use-list order does not matter.
  absl::Span<const int> Users(int i) const {
    return absl::MakeConstSpan(use).subspan(use_begin[i],
                                            use_begin[i + 1] - use_begin[i]);
  }
  const int* Refs(int i) const { return ref.data() + ref_begin[i]; }
};

// The position of `node` in `nodes` (a graph's nodes in order), searching
// [0, before) by the graph's order: operands are mostly recent nodes, so it
// gallops back from `before` and then bisects, cheaper than hashing every
// reference. Returns `before` when the node is not there.
int IndexOf(const std::vector<const ir::Node*>& nodes, const ir::Node* node,
            int before) {
  int hi = before;
  int lo = before - 1;
  int step = 1;
  while (lo > 0 && node->IsBefore(nodes[lo])) {
    hi = lo;
    step *= 2;
    lo = std::max(0, hi - step);
  }
  lo = std::max(lo, 0);
  // The first position in [lo, hi) not before `node`.
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (nodes[mid]->IsBefore(node)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < before && nodes[lo] == node ? lo : before;
}

// Appends the positions of the nodes `a` references (operands of node
// `user`, which they must precede).
absl::Status CollectRefs(const ir::Argument& a,
                         const std::vector<const ir::Node*>& nodes, int user,
                         std::vector<int>& out) {
  if (a.is_node()) {
    int j = IndexOf(nodes, a.node(), user);
    if (j == user) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: operand %", a.node()->name(), " of ",
          nodes[user]->Describe(), " is not an earlier node of the graph"));
    }
    out.push_back(j);
  } else if (a.is_sequence()) {
    for (const ir::Argument& e : a.elements()) {
      RETURN_IF_ERROR(CollectRefs(e, nodes, user, out));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Adjacency> BuildAdjacency(
    const std::vector<const ir::Node*>& nodes) {
  const int n = static_cast<int>(nodes.size());
  Adjacency a;
  a.in_begin.reserve(n + 1);
  a.ref_begin.reserve(n + 1);
  a.ref.reserve(2 * n);
  a.in.reserve(2 * n);
  std::vector<int> mark(n, -1);
  std::vector<int> use_count(n, 0);
  for (int i = 0; i < n; ++i) {
    a.ref_begin.push_back(static_cast<int>(a.ref.size()));
    a.in_begin.push_back(static_cast<int>(a.in.size()));
    for (const ir::Argument& arg : nodes[i]->args()) {
      RETURN_IF_ERROR(CollectRefs(arg, nodes, i, a.ref));
    }
    for (const auto& [key, arg] : nodes[i]->kwargs()) {
      RETURN_IF_ERROR(CollectRefs(arg, nodes, i, a.ref));
    }
    for (size_t k = a.ref_begin[i]; k < a.ref.size(); ++k) {
      int j = a.ref[k];
      if (mark[j] != i) {
        mark[j] = i;
        a.in.push_back(j);
        ++use_count[j];
      }
    }
  }
  a.ref_begin.push_back(static_cast<int>(a.ref.size()));
  a.in_begin.push_back(static_cast<int>(a.in.size()));
  // Users by counting sort over the inputs.
  a.use_begin.assign(n + 1, 0);
  for (int j = 0; j < n; ++j)
    a.use_begin[j + 1] = a.use_begin[j] + use_count[j];
  a.use.resize(a.use_begin[n]);
  std::vector<int> fill(a.use_begin.begin(), a.use_begin.end() - 1);
  for (int i = 0; i < n; ++i) {
    for (int j : a.Inputs(i)) a.use[fill[j]++] = i;
  }
  return a;
}

// A copy of `a` whose k-th node reference is replaced by copy[refs[k]],
// advancing `refs` past the references it used.
ir::Argument CopyArgument(const ir::Argument& a, const int*& refs,
                          const std::vector<ir::Node*>& copy) {
  if (a.is_node()) return ir::Argument::Ref(copy[*refs++]);
  if (!a.is_sequence()) return a;
  std::vector<ir::Argument> elements;
  elements.reserve(a.elements().size());
  for (const ir::Argument& e : a.elements()) {
    elements.push_back(CopyArgument(e, refs, copy));
  }
  return a.kind() == ir::Argument::Kind::kTuple
             ? ir::Argument::Tuple(std::move(elements))
             : ir::Argument::List(std::move(elements));
}

bool IsCompute(const ir::Node* n) {
  return n->op() == ir::OpKind::kCallFunction ||
         n->op() == ir::OpKind::kCallMethod ||
         n->op() == ir::OpKind::kCallModule;
}

int64_t ElementBytes(absl::string_view dtype) {
  static const auto* kSizes = new absl::flat_hash_map<std::string, int64_t>{
      {"float32", 4}, {"float64", 8}, {"float16", 2},   {"bfloat16", 2},
      {"int64", 8},   {"int32", 4},   {"int16", 2},     {"int8", 1},
      {"uint8", 1},   {"bool", 1},    {"complex64", 8}, {"complex128", 16},
      {"float", 4},   {"double", 8},  {"half", 2},      {"long", 8},
      {"int", 4},
  };
  auto it = kSizes->find(dtype);
  return it == kSizes->end() ? 0 : it->second;
}

}  // namespace

ParamBytesFn ParamBytesFromMap(absl::flat_hash_map<std::string, int64_t> map) {
  return
      [map = std::move(map)](absl::string_view path) -> std::optional<int64_t> {
        auto it = map.find(path);
        if (it == map.end()) return std::nullopt;
        return it->second;
      };
}

std::optional<int64_t> TensorBytes(const ir::TensorMeta& meta) {
  int64_t element = ElementBytes(meta.dtype);
  if (element == 0) return std::nullopt;
  int64_t n = 1;
  for (int64_t d : meta.shape) {
    if (d < 0) return std::nullopt;
    n *= d;
  }
  return n * element;
}

std::string HumanBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B",   "KiB", "MiB",
                                           "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  // snprintf, not absl::StrFormat: the system Abseil's str_format symbols
  // are weak and get dropped by --as-needed links.
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[u]);
  return buf;
}

absl::string_view NestingName(Nesting nesting) {
  return nesting == Nesting::kOutermost ? "outermost" : "innermost";
}

bool ModulePatternMatches(absl::string_view pattern, absl::string_view path,
                          absl::string_view type) {
  return Matches(Compile(pattern), path, type);
}

absl::StatusOr<Partition> PartitionGraph(const ir::Graph& graph,
                                         const PartitionOptions& options) {
  if (options.targets.empty()) {
    return absl::InvalidArgumentError(
        "partition: no sequential targets given (e.g. LlamaDecoderLayer)");
  }
  if (options.targets_per_subgraph < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: targets_per_subgraph must be >= 0, got ",
                     options.targets_per_subgraph));
  }
  if (options.max_param_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: max_param_bytes must be >= 0, got ",
                     options.max_param_bytes));
  }
  ASSIGN_OR_RETURN(std::vector<CompiledPattern> targets,
                   CompileAll(options.targets, "target"));
  ASSIGN_OR_RETURN(std::vector<CompiledPattern> ignore,
                   CompileAll(options.ignore, "ignore"));
  const ir::Node* output = graph.output_node();
  if (output == nullptr) {
    return absl::InvalidArgumentError(
        "partition: the graph has no output node");
  }

  // Number the nodes.
  const int num_nodes = static_cast<int>(graph.size());
  std::vector<const ir::Node*> nodes;
  nodes.reserve(num_nodes);
  for (const ir::Node* n : graph.nodes()) nodes.push_back(n);
  auto op = [&](int i) { return nodes[i]->op(); };
  ASSIGN_OR_RETURN(Adjacency adj, BuildAdjacency(nodes));
  const int out = IndexOf(nodes, output, num_nodes);

  // 1. Target instances.
  ModuleMatcher matcher(targets, ignore);
  std::vector<int> inst(num_nodes, -1);
  std::vector<Instance> instances;
  absl::flat_hash_map<std::string, int> instance_of;
  // Consecutive nodes of one module have the same scope stack (often the
  // same shared one: ir::Scope copies share it), so a run of them is
  // matched once.
  const std::vector<ir::ScopeEntry>* memo_stack = nullptr;
  int memo_inst = -1;
  for (int i = 0; i < num_nodes; ++i) {
    if (!IsCompute(nodes[i])) continue;
    const std::vector<ir::ScopeEntry>* stack = &nodes[i]->scope().stack();
    const bool leaf = op(i) == ir::OpKind::kCallModule;
    if (!leaf && memo_stack != nullptr &&
        (stack == memo_stack || *stack == *memo_stack)) {
      inst[i] = memo_inst;
      continue;
    }
    std::optional<ModuleRef> chosen;
    int pattern = -1;
    ForEachModule(nodes[i], [&](const ModuleRef& m) {
      const ModuleMatcher::EntryMatch& match = matcher.Lookup(m.path, m.type);
      if (match.ignored) return false;
      if (match.target >= 0) {
        chosen = m;
        pattern = match.target;
        return options.nesting == Nesting::kInnermost;
      }
      return true;
    });
    if (!leaf) {
      memo_stack = stack;
      memo_inst = -1;
    }
    if (!chosen) continue;
    auto [it, inserted] = instance_of.try_emplace(
        chosen->path, static_cast<int>(instances.size()));
    if (inserted) {
      instances.push_back(
          {std::string(chosen->path), std::string(chosen->type), pattern});
    } else if (instances[it->second].type.empty() && !chosen->type.empty()) {
      instances[it->second].type = std::string(chosen->type);
    }
    inst[i] = it->second;
    if (!leaf) memo_inst = it->second;
  }
  if (instances.empty()) return NoTargetError(graph, options);
  const int num_slots = static_cast<int>(instances.size()) + 1;
  const int last_slot = num_slots - 1;

  // 2. Feasibility (forward): need[i] is the earliest slot node i can run
  // in; need_from[i] the instance that forces it.
  std::vector<int> slot(num_nodes, -1);
  std::vector<int> need(num_nodes, 0);
  std::vector<int> need_from(num_nodes, -1);
  int first_target = num_nodes;
  for (int i = 0; i < num_nodes; ++i) {
    if (inst[i] >= 0) {
      slot[i] = inst[i] + 1;
      first_target = std::min(first_target, i);
    }
  }
  for (int i = 0; i < num_nodes; ++i) {
    const ir::Node* n = nodes[i];
    if (op(i) == ir::OpKind::kPlaceholder || op(i) == ir::OpKind::kGetAttr) {
      continue;
    }
    int best = 0;
    int from = -1;
    for (int j : adj.Inputs(i)) {
      int v = inst[j] >= 0 ? slot[j] : need[j];
      if (v > best) {
        best = v;
        from = inst[j] >= 0 ? inst[j] : need_from[j];
      }
    }
    if (inst[i] >= 0) {
      if (best > slot[i]) {
        return OrderError(n, instances[inst[i]], instances[from]);
      }
      need[i] = slot[i];
      need_from[i] = inst[i];
    } else {
      need[i] = best;
      need_from[i] = from;
    }
  }

  // 3. Placement (backward), Note [Placement].
  for (int i = num_nodes - 1; i >= 0; --i) {
    const ir::Node* n = nodes[i];
    if (inst[i] >= 0) continue;
    switch (n->op()) {
      case ir::OpKind::kOutput:
        slot[i] = last_slot;
        continue;
      case ir::OpKind::kPlaceholder:
        slot[i] = 0;
        continue;
      default:
        break;
    }
    if (IsCompute(n) && i < first_target) {
      slot[i] = 0;
      continue;
    }
    int earliest = INT_MAX;
    for (int u : adj.Users(i)) {
      earliest = std::min(earliest, slot[u]);
    }
    // Dead nodes stay next to their inputs (never in the head once past the
    // first target).
    slot[i] = earliest != INT_MAX ? earliest
              : i > first_target  ? std::max(need[i], 1)
                                  : need[i];
  }
  for (int i = 0; i < num_nodes; ++i) {
    for (int j : adj.Inputs(i)) {
      if (op(j) == ir::OpKind::kGetAttr || op(j) == ir::OpKind::kPlaceholder) {
        continue;
      }
      if (slot[j] > slot[i]) {
        return absl::InternalError(
            absl::StrCat("partition: placement put ", nodes[i]->Describe(),
                         " before its input ", nodes[j]->Describe()));
      }
    }
  }

  // 4. Parameter reads per slot and their sizes.
  absl::flat_hash_map<absl::string_view, int> param_id;
  std::vector<std::optional<int64_t>> param_size;
  std::vector<int> node_param(num_nodes, -1);
  auto intern = [&](const ir::Node* n) {
    auto [it, inserted] =
        param_id.try_emplace(n->target(), static_cast<int>(param_size.size()));
    if (inserted) {
      std::optional<int64_t> bytes;
      if (options.param_bytes) {
        bytes = options.param_bytes(n->target());
      } else if (n->op() == ir::OpKind::kGetAttr &&
                 n->meta().outputs.size() == 1) {
        bytes = TensorBytes(n->meta().outputs[0]);
      }
      param_size.push_back(bytes);
    }
    return it->second;
  };
  std::vector<std::vector<int>> slot_params(num_slots);
  {
    // (slot, parameter) pairs, deduplicated by sorting: only sums over a
    // slot's parameters are taken, so their order within a slot is free.
    std::vector<std::pair<int, int>> reads;
    for (int i = 0; i < num_nodes; ++i) {
      if (op(i) == ir::OpKind::kGetAttr) {
        int id = node_param[i] = intern(nodes[i]);
        reads.push_back({slot[i], id});
        for (int u : adj.Users(i)) {
          if (u != out) reads.push_back({slot[u], id});
        }
      } else if (op(i) == ir::OpKind::kCallModule) {
        int id = node_param[i] = intern(nodes[i]);
        reads.push_back({slot[i], id});
      }
    }
    std::sort(reads.begin(), reads.end());
    reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
    for (const auto& [s, id] : reads) slot_params[s].push_back(id);
  }
  auto known_bytes = [&](int id) { return param_size[id].value_or(0); };
  int unknown_sizes = 0;
  for (const auto& size : param_size) unknown_sizes += !size.has_value();

  // 5. Group slots into subgraphs.
  std::vector<int> slot_to_sg(num_slots, 0);
  bool head = false;
  for (int i = 0; i < num_nodes; ++i) {
    if (slot[i] == 0 && IsCompute(nodes[i])) {
      head = true;
      break;
    }
  }
  const int64_t budget = options.max_param_bytes;
  const int cap = options.targets_per_subgraph > 0
                      ? options.targets_per_subgraph
                  : budget > 0 ? INT_MAX
                               : 1;
  int num_sg = head ? 1 : 0;
  {
    std::vector<int> stamp(param_size.size(), -1);
    int group = -1;
    int64_t group_bytes = 0;
    int group_count = 0;
    auto add = [&](int s) {
      for (int id : slot_params[s]) {
        if (stamp[id] != group) {
          stamp[id] = group;
          group_bytes += known_bytes(id);
        }
      }
      ++group_count;
      slot_to_sg[s] = group;
    };
    for (int s = 1; s < num_slots; ++s) {
      if (group >= 0 && group_count < cap) {
        if (budget <= 0) {
          add(s);
          continue;
        }
        int64_t delta = 0;
        for (int id : slot_params[s]) {
          if (stamp[id] != group) delta += known_bytes(id);
        }
        if (group_bytes + delta <= budget) {
          add(s);
          continue;
        }
      }
      group = num_sg++;
      group_bytes = 0;
      group_count = 0;
      add(s);
    }
  }
  slot_to_sg[0] = head ? 0 : slot_to_sg[1];

  // 6. Homes, readers and members.
  std::vector<int> home(num_nodes);
  for (int i = 0; i < num_nodes; ++i) home[i] = slot_to_sg[slot[i]];
  std::vector<int> last_reader(num_nodes, -1);
  std::vector<char> read_by_output(num_nodes, 0);
  for (int i = 0; i < num_nodes; ++i) {
    for (int u : adj.Users(i)) {
      if (u == out) {
        read_by_output[i] = 1;
      } else {
        last_reader[i] = std::max(last_reader[i], home[u]);
      }
    }
  }
  std::vector<std::vector<int>> members(num_sg);
  for (int i = 0; i < num_nodes; ++i) {
    const ir::Node* n = nodes[i];
    if (n->op() == ir::OpKind::kPlaceholder || n == output) continue;
    members[home[i]].push_back(i);
    if (n->op() != ir::OpKind::kGetAttr) continue;
    std::vector<int> readers;
    for (int u : adj.Users(i)) {
      if (u != out && home[u] != home[i]) {
        readers.push_back(home[u]);
      }
    }
    std::sort(readers.begin(), readers.end());
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    for (int s : readers) members[s].push_back(i);
  }
  // get_attr copies were appended out of order.
  for (auto& m : members) std::sort(m.begin(), m.end());

  // 7. Build the subgraphs. copy[j] is node j's counterpart in the
  // subgraph being built (valid where copied_in[j] == s).
  Partition partition;
  partition.subgraphs.resize(num_sg);
  std::vector<int> seen(num_nodes, -1);
  std::vector<int> param_stamp(param_size.size(), -1);
  std::vector<ir::Node*> copy(num_nodes, nullptr);
  std::vector<int> copied_in(num_nodes, -1);
  std::vector<int> inputs;
  for (int s = 0; s < num_sg; ++s) {
    Subgraph& sub = partition.subgraphs[s];
    sub.index = s;
    inputs.clear();
    for (int i : members[s]) {
      for (int j : adj.Inputs(i)) {
        if (op(j) == ir::OpKind::kGetAttr) continue;  // Read here too.
        if (op(j) != ir::OpKind::kPlaceholder && home[j] == s) continue;
        if (seen[j] != s) {
          seen[j] = s;
          inputs.push_back(j);
        }
      }
    }
    std::sort(inputs.begin(), inputs.end());

    auto g = std::make_unique<ir::Graph>();
    sub.input_names.reserve(inputs.size());
    for (int j : inputs) {
      const ir::Node* m = nodes[j];
      bool model_input = m->op() == ir::OpKind::kPlaceholder;
      ASSIGN_OR_RETURN(
          ir::Node * p,
          g->AddNode(ir::OpKind::kPlaceholder,
                     model_input ? m->target() : m->name(), {}, {}, m->name()));
      if (model_input) {
        p->set_scope(m->scope());
        p->meta() = m->meta();
      } else {
        p->meta().outputs = m->meta().outputs;
      }
      copy[j] = p;
      copied_in[j] = s;
      sub.input_names.push_back(m->name());
      if (last_reader[j] == s && !read_by_output[j]) {
        sub.last_use.push_back(m->name());
      }
    }
    std::vector<ir::Argument> outs;
    int64_t bytes = 0;
    for (int i : members[s]) {
      const ir::Node* n = nodes[i];
      const int* refs = adj.Refs(i);
      for (const int* r = refs; r != adj.Refs(i + 1); ++r) {
        if (copied_in[*r] != s) {
          return absl::InternalError(absl::StrCat(
              "partition: ", n->Describe(), " reads ", nodes[*r]->Describe(),
              ", which subgraph ", s, " neither computes nor receives"));
        }
      }
      std::vector<ir::Argument> args;
      args.reserve(n->args().size());
      for (const ir::Argument& a : n->args()) {
        args.push_back(CopyArgument(a, refs, copy));
      }
      ir::Kwargs kwargs;
      kwargs.reserve(n->kwargs().size());
      for (const auto& [k, v] : n->kwargs()) {
        kwargs.emplace_back(k, CopyArgument(v, refs, copy));
      }
      absl::StatusOr<ir::Node*> added = g->AddNode(
          n->op(), n->target(), std::move(args), std::move(kwargs), n->name());
      if (!added.ok()) {
        return absl::InternalError(
            absl::StrCat("partition: cannot copy ", n->Describe(),
                         " into subgraph ", s, ": ", added.status().message()));
      }
      ir::Node* c = *added;
      if (c->name() != n->name()) {
        return absl::InternalError(absl::StrCat("partition: ", n->Describe(),
                                                " was renamed to '", c->name(),
                                                "' in subgraph ", s));
      }
      c->set_scope(n->scope());
      c->meta() = n->meta();
      copy[i] = c;
      copied_in[i] = s;
      if (node_param[i] >= 0) {
        int id = node_param[i];
        if (param_stamp[id] != s) {
          param_stamp[id] = s;
          bytes += known_bytes(id);
          (n->op() == ir::OpKind::kGetAttr ? sub.param_targets
                                           : sub.leaf_modules)
              .push_back(n->target());
        }
        if (n->op() == ir::OpKind::kGetAttr) continue;
      }
      bool escapes = false;
      for (int u : adj.Users(i)) {
        if (u == out || home[u] > s) {
          escapes = true;
          break;
        }
      }
      if (escapes) {
        outs.push_back(ir::Argument::Ref(c));
        sub.output_names.push_back(n->name());
      }
    }
    RETURN_IF_ERROR(g->Output(ir::Argument::Tuple(std::move(outs))).status());
    sub.graph = std::move(g);
    sub.param_bytes = bytes;
  }
  partition.home.reserve(num_nodes);
  for (int i = 0; i < num_nodes; ++i) {
    ++partition.subgraphs[home[i]].node_count;
    partition.home[nodes[i]->name()] = home[i];
  }
  for (int s = 1; s < num_slots; ++s) {
    partition.subgraphs[slot_to_sg[s]].module_paths.push_back(
        instances[s - 1].path);
  }

  // 8. The model's inputs and output.
  for (const ir::Node* n : graph.placeholders()) {
    partition.model_inputs.push_back(n->name());
  }
  auto og = std::make_unique<ir::Graph>();
  absl::flat_hash_map<const ir::Node*, ir::Node*> og_map;
  const std::vector<ir::Node*> output_reads = output->inputs();
  for (const ir::Node* m : output_reads) {
    if (m->op() == ir::OpKind::kGetAttr) continue;
    partition.model_outputs.push_back(m->name());
    bool model_input = m->op() == ir::OpKind::kPlaceholder;
    ASSIGN_OR_RETURN(
        ir::Node * p,
        og->AddNode(ir::OpKind::kPlaceholder,
                    model_input ? m->target() : m->name(), {}, {}, m->name()));
    if (model_input) {
      p->set_scope(m->scope());
      p->meta() = m->meta();
    } else {
      p->meta().outputs = m->meta().outputs;
    }
    og_map[m] = p;
  }
  for (const ir::Node* m : output_reads) {
    if (m->op() != ir::OpKind::kGetAttr) continue;
    ASSIGN_OR_RETURN(ir::Node * a, og->AddNode(ir::OpKind::kGetAttr,
                                               m->target(), {}, {}, m->name()));
    a->set_scope(m->scope());
    a->meta() = m->meta();
    og_map[m] = a;
  }
  auto og_remap = [&](ir::Node* n) -> ir::Node* {
    auto it = og_map.find(n);
    return it == og_map.end() ? n : it->second;
  };
  std::vector<ir::Argument> og_args;
  for (const ir::Argument& a : output->args()) {
    og_args.push_back(a.MapNodes(og_remap));
  }
  ir::Kwargs og_kwargs;
  for (const auto& [k, v] : output->kwargs()) {
    og_kwargs.emplace_back(k, v.MapNodes(og_remap));
  }
  ASSIGN_OR_RETURN(
      ir::Node * og_out,
      og->AddNode(ir::OpKind::kOutput, output->target(), std::move(og_args),
                  std::move(og_kwargs), output->name()));
  og_out->set_scope(output->scope());
  og_out->meta() = output->meta();
  og->meta() = graph.meta();
  partition.output_graph = std::move(og);

  // 9. Targets used and warnings.
  std::vector<char> used(options.targets.size(), 0);
  for (const Instance& i : instances) used[i.pattern] = 1;
  for (size_t p = 0; p < options.targets.size(); ++p) {
    if (used[p]) partition.targets_used.push_back(options.targets[p]);
  }
  if (budget > 0 && unknown_sizes > 0) {
    partition.warnings.push_back(absl::StrCat(
        "sizes of ", unknown_sizes,
        " parameter or leaf-module paths are unknown and count as 0 bytes "
        "against max_param_bytes"));
  }
  if (budget > 0) {
    for (Subgraph& sub : partition.subgraphs) {
      if (sub.param_bytes <= budget) continue;
      std::string what =
          sub.module_paths.empty()
              ? std::string("the head")
              : absl::StrCat("a single target (", sub.module_paths[0], ")");
      std::string w = absl::StrCat(
          "subgraph ", sub.index, " reads ", HumanBytes(sub.param_bytes),
          " of parameters, over max_param_bytes (", HumanBytes(budget),
          "): ", what, " cannot be split");
      sub.warnings.push_back(w);
      partition.warnings.push_back(std::move(w));
    }
  }
  RETURN_IF_ERROR(CheckTargetPlacement(graph, partition));
  return partition;
}

absl::Status CheckTargetPlacement(const ir::Graph& graph,
                                  const Partition& partition) {
  absl::flat_hash_map<absl::string_view, int> owner;
  for (const Subgraph& sub : partition.subgraphs) {
    for (const std::string& path : sub.module_paths) {
      auto [it, inserted] = owner.try_emplace(path, sub.index);
      if (!inserted) {
        return absl::InternalError(absl::StrCat(
            "partition: target '", path, "' is in subgraphs ", it->second,
            " and ", sub.index, "; each target must be in exactly one"));
      }
    }
  }
  // Consecutive nodes mostly share one scope stack: look each up once.
  const std::vector<ir::ScopeEntry>* last_stack = nullptr;
  int last_owner = -1;
  std::string last_path;
  for (const ir::Node* n : graph.nodes()) {
    if (n->op() != ir::OpKind::kCallModule &&
        n->op() != ir::OpKind::kCallFunction &&
        n->op() != ir::OpKind::kCallMethod) {
      continue;  // Inputs, parameter reads and the output live anywhere.
    }
    const std::vector<ir::ScopeEntry>* stack = &n->scope().stack();
    if (stack != last_stack || n->op() == ir::OpKind::kCallModule) {
      last_stack = stack;
      last_owner = -1;
      // The innermost instance: with Nesting::kInnermost an outer target
      // keeps only its own nodes (with kOutermost inner ones are no
      // instances at all).
      ForEachModule(n, [&](const ModuleRef& m) {
        auto it = owner.find(m.path);
        if (it != owner.end()) {
          last_owner = it->second;
          last_path = std::string(m.path);
        }
        return true;
      });
    }
    if (last_owner < 0) continue;
    const int home = partition.SubgraphOf(n->name());
    if (home != last_owner) {
      return absl::InternalError(absl::StrCat(
          "partition: ", n->Describe(), " belongs to target '", last_path,
          "' (subgraph ", last_owner, ") but runs in subgraph ", home,
          "; each target must be in exactly one subgraph"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tracecut::partition
