#include "transforms/fold_constants.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "runtime/interpreter.h"
#include "runtime/torch_status.h"
#include "transforms/module_util.h"
#include "transforms/purity.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

// Whether the attribute at `path` is a registered parameter.
bool IsParameter(const runtime::GraphModule& gm, const std::string& path) {
  auto [parent, name] = SplitParentPath(path);
  absl::StatusOr<torch::jit::Module> m = gm.GetSubmodule(parent);
  if (!m.ok()) return false;
  auto slot = m->type()->findAttributeSlot(name);
  return slot && m->type()->is_parameter(*slot);
}

// Evaluates `node`, whose operands are all get_attr nodes or constants,
// against `gm`'s module. nullopt when it does not give a single tensor.
absl::StatusOr<std::optional<torch::Tensor>> Evaluate(
    const runtime::GraphModule& gm, const ir::Node& node) {
  ir::Graph g;
  absl::flat_hash_map<ir::Node*, ir::Node*> map;
  for (ir::Node* in : node.inputs()) {
    ASSIGN_OR_RETURN(map[in], g.GetAttr(in->target(), in->name()));
  }
  auto remap = [&](ir::Node* n) { return map.at(n); };
  std::vector<ir::Argument> args;
  for (const ir::Argument& a : node.args()) args.push_back(a.MapNodes(remap));
  ir::Kwargs kwargs;
  for (const auto& [k, v] : node.kwargs())
    kwargs.emplace_back(k, v.MapNodes(remap));
  ASSIGN_OR_RETURN(ir::Node * copy,
                   g.AddNode(node.op(), node.target(), std::move(args),
                             std::move(kwargs), node.name()));
  RETURN_IF_ERROR(g.Output(ir::Argument::Ref(copy)).status());
  ASSIGN_OR_RETURN(runtime::Interpreter interp,
                   runtime::Interpreter::Create(g, gm.module()));
  ASSIGN_OR_RETURN(c10::IValue v, interp.Run({}));
  if (!v.isTensor()) return std::optional<torch::Tensor>();
  return std::optional<torch::Tensor>(v.toTensor());
}

// Whether anything downstream of `n` (through users, transitively) mutates
// a value: then `n`'s result may be written to, and a folded buffer would
// carry the writes from one run into the next.
bool FeedsMutation(const ir::Node* n) {
  std::vector<const ir::Node*> stack = {n};
  absl::flat_hash_set<const ir::Node*> seen = {n};
  while (!stack.empty()) {
    const ir::Node* cur = stack.back();
    stack.pop_back();
    for (const ir::Node* u : cur->users()) {
      if (u->op() == ir::OpKind::kOutput) continue;
      if (!IsPureNode(*u)) return true;
      if (seen.insert(u).second) stack.push_back(u);
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<bool> FoldConstants::Run(runtime::GraphModule& gm) {
  ir::Graph& graph = gm.graph();
  // get_attr nodes (original or created here) whose value is a constant.
  absl::flat_hash_set<const ir::Node*> constant;
  std::vector<ir::Node*> order;
  for (ir::Node* n : graph.nodes()) order.push_back(n);
  const int64_t app = NextApplicationId(graph);
  bool changed = false;
  for (ir::Node* n : order) {
    if (n->op() == ir::OpKind::kGetAttr) {
      if (options_.fold_parameters || !IsParameter(gm, n->target())) {
        constant.insert(n);
      }
      continue;
    }
    if (n->op() != ir::OpKind::kCallFunction || n->target() == "getitem" ||
        IsImpureOperator(n->target())) {
      continue;
    }
    const std::vector<ir::Node*> inputs = n->inputs();
    bool all_constant = true;
    for (const ir::Node* in : inputs) all_constant &= constant.contains(in);
    if (!all_constant || FeedsMutation(n)) continue;
    absl::StatusOr<std::optional<torch::Tensor>> value = Evaluate(gm, *n);
    if (!value.ok() || !value->has_value()) continue;  // Leave it to runtime.
    torch::Tensor t = **value;
    if (static_cast<int64_t>(t.nbytes()) > options_.max_bytes) continue;
    // Do not let the folded buffer alias a parameter it was computed from.
    for (const ir::Node* in : inputs) {
      absl::StatusOr<torch::Tensor> src = gm.GetTensor(in->target());
      if (src.ok() && src->defined() && t.defined() &&
          src->storage().is_alias_of(t.storage())) {
        t = t.clone();
        break;
      }
    }
    std::string path = absl::StrCat("_folded_constant_", n->name());
    for (int i = 1; gm.module().hasattr(path); ++i) {
      path = absl::StrCat("_folded_constant_", n->name(), "_", i);
    }
    RETURN_IF_ERROR(gm.SetTensor(path, t));
    const std::string name = n->name();
    ir::Node* attr;
    {
      ir::Graph::InsertPointGuard guard(graph, n);
      ASSIGN_OR_RETURN(attr, graph.GetAttr(path, name));
    }
    attr->set_scope(n->scope());
    attr->meta().outputs = n->meta().outputs;
    attr->meta().source = n->meta().source;
    MarkTransformed(attr, kName, app, {{"folded", n->target()}});
    RETURN_IF_ERROR(graph.ReplaceAllUsesWith(n, attr));
    RETURN_IF_ERROR(graph.Erase(n));
    graph.Rename(attr, name);
    constant.insert(attr);
    changed = true;
  }
  return changed;
}

}  // namespace tracecut::transforms
