// Laying out the TorchScript methods of an imported program (Note
// [Importing torch.export programs]): each call's boundary, the schedule of
// its nodes and child calls, and its method defined on its module's type.

#include <torch/csrc/jit/serialization/source_range_serialization.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/torch_status.h"
#include "tracer/export/pt2_import_internal.h"
#include "tracer/torchscript_source.h"
#include "util/status_macros.h"

namespace tracecut::tracer::exported::internal {
namespace {

absl::string_view KindType(ValueKind k) {
  switch (k) {
    case ValueKind::kTensor:
      return "Tensor";
    case ValueKind::kInt:
      return "int";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kFloat:
      return "float";
  }
  return "Tensor";
}

// Maps lines of generated TorchScript back to the model source, so that the
// tracer's source locations (ir::SourceLocation) name the model's file and
// line, as they do for scripted models.
class GeneratedLines : public torch::jit::SourceRangeUnpickler {
 public:
  explicit GeneratedLines(const std::vector<std::optional<Frame>>& origins) {
    for (size_t i = 0; i < origins.size(); ++i) {
      if (!origins[i].has_value()) continue;
      const Frame& f = *origins[i];
      std::string text = f.code.empty() ? std::string(" ") : f.code;
      auto source = std::make_shared<torch::jit::Source>(
          text, f.file, static_cast<size_t>(f.line));
      ranges_.emplace(i, torch::jit::SourceRange(source, 0, text.size()));
    }
  }
  std::optional<torch::jit::SourceRange> findSourceRangeThatGenerated(
      const torch::jit::SourceRange& range) override {
    auto it = ranges_.find(range.source()->lineno_for_offset(range.start()));
    if (it == ranges_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::map<size_t, torch::jit::SourceRange> ranges_;
};

// `base` followed by the attribute path `rel` ("layers.0.mlp").
std::string AttrExpr(std::string base, absl::string_view rel) {
  if (rel.empty()) return base;
  for (absl::string_view seg : absl::StrSplit(rel, '.')) {
    if (IsIdentifier(seg)) {
      absl::StrAppend(&base, ".", seg);
    } else {
      base = absl::StrCat("getattr(", base, ", ", Quote(seg), ")");
    }
  }
  return base;
}

// `path` relative to module `owner`, when it lies under it.
std::optional<std::string> Relative(absl::string_view owner,
                                    absl::string_view path) {
  if (owner.empty()) return std::string(path);
  if (path.size() > owner.size() && absl::StartsWith(path, owner) &&
      path[owner.size()] == '.') {
    return std::string(path.substr(owner.size() + 1));
  }
  return std::nullopt;
}

// transformers' grouped_mm_fallback (integrations/moe.py) in TorchScript:
// rows of `input` sorted by expert, `offs` the cumulative row counts.
constexpr char kGroupedMmFallback[] = R"(
def _grouped_mm_fallback(self, input: Tensor, weight: Tensor, offs: Tensor):
    output = torch.zeros([input.size(0), weight.size(2)], dtype=input.dtype, device=input.device)
    ends: List[int] = offs.long().tolist()
    start = 0
    for i in range(len(ends)):
        end = ends[i]
        if start != end:
            output[start:end] = torch.mm(input[start:end], weight[i])
        start = end
    return output
)";

}  // namespace

FunctionCode Importer::Boundary(const Call& c) const {
  FunctionCode f;
  absl::flat_hash_set<std::string> seen;
  for (int i : c.region) {
    for (const std::string& u : uses_[i]) {
      const ValueInfo& v = values_.at(u);
      if (!v.fqn.empty()) continue;
      if (v.producer >= 0 && c.in_region.contains(v.producer)) continue;
      if (seen.insert(u).second) f.inputs.push_back(u);
    }
  }
  for (int i : c.region) {
    for (const std::string& d : Defined(i)) {
      const ValueInfo& v = values_.at(d);
      bool outside = v.graph_output;
      for (int u : v.users) outside |= !c.in_region.contains(u);
      if (outside) f.outputs.push_back(d);
    }
  }
  return f;
}

std::vector<std::string> Importer::Defined(int node) const {
  std::vector<std::string> out;
  auto it = defined_cache_.find(node);
  if (it != defined_cache_.end()) return it->second;
  for (const schema::Argument& a : graph_.get_nodes()[node].get_outputs()) {
    switch (a.tag()) {
      case ArgTag::AS_TENSOR:
        out.push_back(a.get_as_tensor().get_name());
        break;
      case ArgTag::AS_TENSORS:
        for (const auto& t : a.get_as_tensors()) out.push_back(t.get_name());
        break;
      case ArgTag::AS_OPTIONAL_TENSORS:
        for (const auto& t : a.get_as_optional_tensors()) {
          if (t.tag() == schema::OptionalTensorArgument::Tag::AS_TENSOR) {
            out.push_back(t.get_as_tensor().get_name());
          }
        }
        break;
      case ArgTag::AS_SYM_INT:
        if (a.get_as_sym_int().tag() == schema::SymIntArgument::Tag::AS_NAME) {
          out.push_back(a.get_as_sym_int().get_as_name());
        }
        break;
      case ArgTag::AS_SYM_BOOL:
        if (a.get_as_sym_bool().tag() ==
            schema::SymBoolArgument::Tag::AS_NAME) {
          out.push_back(a.get_as_sym_bool().get_as_name());
        }
        break;
      case ArgTag::AS_SYM_FLOAT:
        if (a.get_as_sym_float().tag() ==
            schema::SymFloatArgument::Tag::AS_NAME) {
          out.push_back(a.get_as_sym_float().get_as_name());
        }
        break;
      default:
        break;
    }
  }
  defined_cache_[node] = out;
  return out;
}

absl::StatusOr<FunctionCode> Importer::EmitFunction(Call& c) {
  FunctionCode f = Boundary(c);
  Method m;
  m.owner = c.path;
  std::vector<std::string> params;
  for (size_t i = 0; i < f.inputs.size(); ++i) {
    std::string local =
        &c == root_ ? LocalName(f.inputs[i]) : absl::StrCat("x", i);
    m.env[f.inputs[i]] = local;
    params.push_back(
        absl::StrCat(local, ": ", KindType(values_.at(f.inputs[i]).kind)));
  }
  if (&c == root_) {
    // The root takes exactly the user inputs, in signature order.
    params.clear();
    f.inputs = user_inputs_;
    for (const std::string& in : user_inputs_) {
      std::string local = LocalName(in);
      m.env[in] = local;
      params.push_back(
          absl::StrCat(local, ": ", KindType(values_.at(in).kind)));
    }
    f.outputs = user_outputs_;
  }

  std::vector<Item> items;
  for (int n : c.own) items.push_back({n, nullptr, n});
  for (Call* child : c.children) {
    if (!child->region.empty()) items.push_back({-1, child, child->first});
  }
  RETURN_IF_ERROR(EmitItems(items, m));

  std::vector<std::string> rets;
  for (const std::string& o : f.outputs) {
    ASSIGN_OR_RETURN(std::string e, Lookup(m, o));
    rets.push_back(e);
  }
  std::string text =
      absl::StrCat("def forward(self", params.empty() ? "" : ", ",
                   absl::StrJoin(params, ", "), "):\n");
  f.origins.push_back(std::nullopt);
  for (size_t k = 0; k < m.lines.size(); ++k) {
    absl::StrAppend(&text, "    ", m.lines[k], "\n");
    f.origins.push_back(m.origins[k]);
  }
  if (rets.empty()) {
    absl::StrAppend(&text, "    return None\n");
  } else if (rets.size() == 1) {
    absl::StrAppend(&text, "    return ", rets[0], "\n");
  } else {
    absl::StrAppend(&text, "    return (", absl::StrJoin(rets, ", "), ")\n");
  }
  if (m.grouped_mm) absl::StrAppend(&text, kGroupedMmFallback);
  f.text = std::move(text);
  return f;
}

absl::Status Importer::EmitItems(std::vector<Item> items, Method& m) {
  for (;;) {
    // Producer item of each value defined by these items.
    absl::flat_hash_map<int, int> item_of_node;
    for (int k = 0; k < static_cast<int>(items.size()); ++k) {
      if (items[k].node >= 0) {
        item_of_node[items[k].node] = k;
      } else {
        for (int n : items[k].call->region) item_of_node[n] = k;
      }
    }
    std::vector<std::vector<int>> succ(items.size());
    std::vector<int> indeg(items.size(), 0);
    for (int k = 0; k < static_cast<int>(items.size()); ++k) {
      std::set<int> deps;
      auto add_uses = [&](int node) {
        for (const std::string& u : uses_[node]) {
          int p = values_.at(u).producer;
          auto it = item_of_node.find(p);
          if (p >= 0 && it != item_of_node.end() && it->second != k) {
            deps.insert(it->second);
          }
        }
      };
      if (items[k].node >= 0) {
        add_uses(items[k].node);
      } else {
        for (int n : items[k].call->region) add_uses(n);
      }
      for (int d : deps) {
        succ[d].push_back(k);
        ++indeg[k];
      }
    }
    using Entry = std::pair<int, int>;  // (first node, item).
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
    for (int k = 0; k < static_cast<int>(items.size()); ++k) {
      if (indeg[k] == 0) ready.push({items[k].first, k});
    }
    std::vector<int> order;
    while (!ready.empty()) {
      int k = ready.top().second;
      ready.pop();
      order.push_back(k);
      for (int s : succ[k]) {
        if (--indeg[s] == 0) ready.push({items[s].first, s});
      }
    }
    if (order.size() == items.size()) {
      for (int k : order) {
        if (items[k].node >= 0) {
          RETURN_IF_ERROR(EmitNode(items[k].node, m));
        } else {
          ASSIGN_OR_RETURN(bool called, EmitCall(*items[k].call, m));
          if (!called) {
            // Inline: emit the child's items here, in their own order.
            std::vector<Item> inner;
            for (int n : items[k].call->own) inner.push_back({n, nullptr, n});
            for (Call* g : items[k].call->children) {
              if (!g->region.empty()) inner.push_back({-1, g, g->first});
            }
            RETURN_IF_ERROR(EmitItems(std::move(inner), m));
          }
        }
      }
      return absl::OkStatus();
    }
    // A cycle through a child call: inline the earliest such child.
    int victim = -1;
    for (int k = 0; k < static_cast<int>(items.size()); ++k) {
      if (indeg[k] > 0 && items[k].call != nullptr &&
          (victim < 0 || items[k].first < items[victim].first)) {
        victim = k;
      }
    }
    if (victim < 0) {
      return absl::InternalError(
          absl::StrCat(archive_.path, ": the program's nodes form a cycle"));
    }
    Call* inlined = items[victim].call;
    items.erase(items.begin() + victim);
    for (int n : inlined->own) items.push_back({n, nullptr, n});
    for (Call* g : inlined->children) {
      if (!g->region.empty()) items.push_back({-1, g, g->first});
    }
  }
}

absl::StatusOr<bool> Importer::EmitCall(Call& c, Method& m) {
  std::optional<std::string> rel = Relative(m.owner, c.path);
  if (!rel.has_value()) return false;
  ASSIGN_OR_RETURN(FunctionCode f, EmitFunction(c));
  if (f.outputs.empty()) return false;
  ModuleInfo& mod = modules_.at(c.path);
  if (mod.forward.has_value()) {
    if (*mod.forward != f.text) return false;
  } else {
    RETURN_IF_ERROR(Define(c, f, /*is_root=*/false));
  }
  std::vector<std::string> args;
  for (const std::string& in : f.inputs) {
    ASSIGN_OR_RETURN(std::string e, Lookup(m, in));
    args.push_back(e);
  }
  m.origin = CallSite(c);
  std::string call = absl::StrCat(AttrExpr("self", *rel), ".forward(",
                                  absl::StrJoin(args, ", "), ")");
  if (f.outputs.size() == 1) {
    std::string local = m.NewLocal('t');
    m.Add(absl::StrCat(local, " = ", call));
    m.env[f.outputs[0]] = local;
  } else {
    std::string r = m.NewLocal('r');
    m.Add(absl::StrCat(r, " = ", call));
    for (size_t i = 0; i < f.outputs.size(); ++i) {
      std::string local = m.NewLocal('t');
      m.Add(absl::StrCat(local, " = ", r, "[", i, "]"));
      m.env[f.outputs[i]] = local;
    }
  }
  return true;
}

absl::Status Importer::Define(const Call& c, const FunctionCode& f,
                              bool is_root) {
  ModuleInfo& mod = modules_.at(c.path);
  absl::Status s = runtime::TorchCall(
      absl::StrCat("compiling the forward of module '",
                   is_root ? "<root>" : c.path, "' (", mod.type, ")"),
      [&] {
        // Module::define, with a Source that maps lines back to the model.
        DefineMethods(*cu_, mod.module.type(),
                      std::make_shared<torch::jit::Source>(
                          f.text, "<tracecut export>", 1,
                          std::make_shared<GeneratedLines>(f.origins)));
      });
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat(archive_.path, ": ", s.message(),
                                            "\ngenerated TorchScript:\n",
                                            f.text));
  }
  mod.forward = f.text;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Importer::Lookup(Method& m,
                                             const std::string& value) {
  auto it = m.env.find(value);
  if (it != m.env.end()) return it->second;
  const ValueInfo& v = values_.at(value);
  if (v.fqn.empty()) {
    return absl::InternalError(
        absl::StrCat(archive_.path, ": value '", value,
                     "' is read before it is defined in the method of module '",
                     m.owner, "'"));
  }
  if (std::optional<std::string> rel = Relative(m.owner, v.fqn)) {
    return AttrExpr("self", *rel);
  }
  // A tensor of another module (tied weights): the caller's module gets
  // an attribute holding the same tensor.
  auto key = std::make_pair(m.owner, v.fqn);
  auto alias = aliases_.find(key);
  if (alias == aliases_.end()) {
    ModuleInfo& mod = modules_.at(m.owner);
    std::string name = v.fqn.substr(v.fqn.rfind('.') + 1);
    if (mod.attributes.contains(name)) {
      name = absl::StrCat("_tied_", absl::StrReplaceAll(v.fqn, {{".", "_"}}));
    }
    RETURN_IF_ERROR(
        AddTensor(mod, name, archive_.tensors.at(v.fqn), v.is_parameter));
    alias = aliases_.emplace(key, name).first;
  }
  return AttrExpr("self", alias->second);
}

std::optional<Frame> Importer::CallSite(const Call& c) const {
  if (c.region.empty()) return std::nullopt;
  const std::string attr = c.path.substr(c.path.rfind('.') + 1);
  std::vector<Frame> frames = FramesOf(c.region.front());
  for (size_t k = frames.size(); k-- > 0;) {
    if (absl::StrContains(frames[k].code, absl::StrCat(".", attr)) ||
        absl::StrContains(frames[k].code, absl::StrCat("\"", attr, "\""))) {
      return frames[k];
    }
  }
  return std::nullopt;
}

}  // namespace tracecut::tracer::exported::internal
