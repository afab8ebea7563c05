#include "pipelines/expert_calibration.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "partition/partitioner.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

// Ops that only reshape the gathered rows on their way into the expert.
bool IsShapeOp(absl::string_view target) {
  for (absl::string_view op :
       {"aten::view", "aten::reshape", "aten::unsqueeze", "aten::squeeze",
        "aten::flatten", "aten::contiguous", "aten::_unsafe_view"}) {
    if (target == op || absl::StartsWith(target, absl::StrCat(op, "."))) {
      return true;
    }
  }
  return false;
}

bool IsRowGather(absl::string_view target) {
  return absl::StartsWith(target, "aten::index.") || target == "aten::index" ||
         absl::StartsWith(target, "aten::index_select");
}

// The outermost module of `node`'s stack matching `pattern`, memoized per
// path; "" when none.
class ExpertMatcher {
 public:
  explicit ExpertMatcher(absl::string_view pattern) : pattern_(pattern) {}

  std::string Of(const ir::Node& node) {
    for (const ir::ScopeEntry& e : node.scope().stack()) {
      if (Matches(e.path, e.type)) return e.path;
    }
    if (node.op() == ir::OpKind::kCallModule && Matches(node.target(), "")) {
      return node.target();
    }
    return "";
  }

 private:
  bool Matches(const std::string& path, absl::string_view type) {
    auto it = memo_.find(path);
    if (it != memo_.end()) return it->second;
    bool m = partition::ModulePatternMatches(pattern_, path, type);
    memo_.emplace(path, m);
    return m;
  }

  std::string pattern_;
  absl::flat_hash_map<std::string, bool> memo_;
};

absl::Status RegionError(absl::string_view path, absl::string_view why) {
  return absl::FailedPreconditionError(
      absl::StrCat("calibrate_all_experts: expert '", path, "' ", why));
}

absl::StatusOr<ExpertRegion> BuildRegion(
    const std::string& path, const std::vector<const ir::Node*>& nodes) {
  absl::flat_hash_set<const ir::Node*> in_region(nodes.begin(), nodes.end());
  const ir::Node* entry = nullptr;
  for (const ir::Node* n : nodes) {
    for (const ir::Node* in : n->inputs()) {
      if (in_region.contains(in) || in->op() == ir::OpKind::kGetAttr) continue;
      if (entry != nullptr && entry != in) {
        return RegionError(
            path, absl::StrCat("reads more than one value from outside it (%",
                               entry->name(), " and %", in->name(),
                               "); only an expert that takes just its tokens "
                               "can run on all tokens"));
      }
      entry = in;
    }
  }
  if (entry == nullptr) {
    return RegionError(path, "reads no value from outside it");
  }
  // Back from the entry through shape ops to the row gather.
  const ir::Node* gather = entry;
  while (gather->op() == ir::OpKind::kCallFunction &&
         IsShapeOp(gather->target()) && !gather->args().empty() &&
         gather->args()[0].is_node()) {
    gather = gather->args()[0].node();
  }
  if (gather->op() != ir::OpKind::kCallFunction ||
      !IsRowGather(gather->target()) || gather->args().empty() ||
      !gather->args()[0].is_node()) {
    return RegionError(
        path, absl::StrCat("takes its tokens from ", gather->Describe(),
                           ", not from a row gather (aten::index / "
                           "index_select) of the block's tokens"));
  }

  ExpertRegion r;
  r.path = path;
  r.gather = gather->name();
  if (!entry->meta().outputs.empty()) {
    r.entry_rank = static_cast<int64_t>(entry->meta().outputs[0].shape.size());
  }
  r.graph = std::make_unique<ir::Graph>();
  ir::Graph& g = *r.graph;
  absl::flat_hash_map<const ir::Node*, ir::Node*> copy;
  ASSIGN_OR_RETURN(ir::Node * tokens, g.Placeholder("tokens"));
  copy[entry] = tokens;
  ir::Node* last = nullptr;
  auto remap = [&](ir::Node* n) -> ir::Node* {
    auto it = copy.find(n);
    return it == copy.end() ? nullptr : it->second;
  };
  for (const ir::Node* n : nodes) {
    for (const ir::Node* in : n->inputs()) {
      if (copy.contains(in) || in->op() != ir::OpKind::kGetAttr) continue;
      ASSIGN_OR_RETURN(
          ir::Node * a,
          g.AddNode(ir::OpKind::kGetAttr, in->target(), {}, {}, in->name()));
      a->set_scope(in->scope());
      a->meta() = in->meta();
      copy[in] = a;
    }
    std::vector<ir::Argument> args;
    for (const ir::Argument& a : n->args()) args.push_back(a.MapNodes(remap));
    ir::Kwargs kwargs;
    for (const auto& [k, v] : n->kwargs()) {
      kwargs.emplace_back(k, v.MapNodes(remap));
    }
    ASSIGN_OR_RETURN(ir::Node * c,
                     g.AddNode(n->op(), n->target(), std::move(args),
                               std::move(kwargs), n->name()));
    c->set_scope(n->scope());
    c->meta() = n->meta();
    copy[n] = c;
    last = c;
  }
  RETURN_IF_ERROR(g.Output(ir::Argument::Ref(last)).status());
  return r;
}

}  // namespace

absl::StatusOr<std::vector<ExpertRegion>> FindExpertRegions(
    const ir::Graph& graph, absl::string_view pattern) {
  ExpertMatcher matcher(pattern);
  std::vector<std::string> order;
  absl::flat_hash_map<std::string, std::vector<const ir::Node*>> nodes;
  for (const ir::Node* n : graph.nodes()) {
    if (n->op() != ir::OpKind::kCallFunction &&
        n->op() != ir::OpKind::kCallMethod &&
        n->op() != ir::OpKind::kCallModule) {
      continue;  // Parameter reads are copied where the region uses them.
    }
    std::string path = matcher.Of(*n);
    if (path.empty()) continue;
    auto [it, inserted] = nodes.try_emplace(path);
    if (inserted) order.push_back(path);
    it->second.push_back(n);
  }
  std::vector<ExpertRegion> regions;
  for (const std::string& path : order) {
    ASSIGN_OR_RETURN(ExpertRegion r, BuildRegion(path, nodes[path]));
    regions.push_back(std::move(r));
  }
  return regions;
}

absl::StatusOr<std::unique_ptr<AllExpertsRunner>> AllExpertsRunner::Create(
    const ir::Graph& graph, const torch::jit::Module& root,
    absl::string_view pattern) {
  std::unique_ptr<AllExpertsRunner> runner(new AllExpertsRunner());
  ASSIGN_OR_RETURN(runner->regions_, FindExpertRegions(graph, pattern));
  for (size_t i = 0; i < runner->regions_.size(); ++i) {
    const ExpertRegion& r = runner->regions_[i];
    absl::StatusOr<runtime::Interpreter> interp =
        runtime::Interpreter::Create(*r.graph, root);
    if (!interp.ok()) {
      return RegionError(r.path, absl::StrCat("cannot run on its own: ",
                                              interp.status().message()));
    }
    runner->interpreters_.push_back(
        std::make_unique<runtime::Interpreter>(std::move(*interp)));
    runner->region_of_gather_[r.gather] = static_cast<int>(i);
    runner->prefixes_.push_back(absl::StrCat(r.path, "."));
  }
  runner->captured_.resize(runner->regions_.size());
  return runner;
}

bool AllExpertsRunner::InExpert(absl::string_view path) const {
  for (const std::string& prefix : prefixes_) {
    if (absl::StartsWith(path, prefix) ||
        path == absl::string_view(prefix).substr(0, prefix.size() - 1)) {
      return true;
    }
  }
  return false;
}

runtime::Interpreter::HookId AllExpertsRunner::AttachCapture(
    runtime::Interpreter& main) {
  return main.AddNodeHook([this](const ir::Node& node,
                                 absl::Span<const c10::IValue> inputs,
                                 const c10::IValue* output) {
    if (output == nullptr || inputs.empty()) return;
    auto it = region_of_gather_.find(node.name());
    if (it != region_of_gather_.end()) captured_[it->second] = inputs[0];
  });
}

std::vector<runtime::Interpreter*> AllExpertsRunner::expert_interpreters() {
  std::vector<runtime::Interpreter*> out;
  for (auto& i : interpreters_) out.push_back(i.get());
  return out;
}

absl::Status AllExpertsRunner::RunOnAllTokens() {
  for (size_t i = 0; i < regions_.size(); ++i) {
    c10::IValue v = std::move(captured_[i]);
    captured_[i] = c10::IValue();
    if (v.isNone()) continue;  // The gather did not run.
    const ExpertRegion& r = regions_[i];
    if (!v.isTensor() || v.toTensor().dim() < 1) {
      return RegionError(r.path, absl::StrCat("is gathered from a value that "
                                              "is not a tensor of tokens"));
    }
    ASSIGN_OR_RETURN(at::Tensor tokens,
                     runtime::TorchCall(
                         absl::StrCat("calibrate_all_experts: ", r.path), [&] {
                           at::Tensor all = v.toTensor();
                           all = all.reshape({-1, all.size(-1)});
                           // The rank the expert's input has: leading
                           // dimensions of 1 (x[None, idx]).
                           for (int64_t d = 2; d < r.entry_rank; ++d) {
                             all = all.unsqueeze(0);
                           }
                           return all;
                         }));
    absl::StatusOr<c10::IValue> out = interpreters_[i]->Run({tokens});
    if (!out.ok()) {
      return RegionError(r.path, absl::StrCat("failed on all tokens: ",
                                              out.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tracecut::pipelines
