#include "transforms/change_truediv_to_mul_by_inverse.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/torch_status.h"
#include "transforms/fusion_math.h"
#include "transforms/module_util.h"
#include "transforms/node_snapshot.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

constexpr char kRole[] = "role";
constexpr char kDiv[] = "div";
constexpr char kReciprocal[] = "reciprocal";
constexpr char kOriginal[] = "original";

bool IsTrueDiv(const ir::Node& n) {
  if (n.op() != ir::OpKind::kCallFunction || n.args().size() != 2 ||
      !n.kwargs().empty()) {
    return false;
  }
  const std::string& t = n.target();
  return t == "aten::div.Tensor" || t == "aten::div.Scalar" || t == "aten::div";
}

// The dtype a Scalar divisor's product is computed in, from the dividend's
// meta: float16 when unknown (the strictest).
int ScalarMaxExponent(const ir::Node& div) {
  const ir::Argument& x = div.args()[0];
  if (x.is_node() && x.node()->meta().outputs.size() == 1) {
    const std::string& dtype = x.node()->meta().outputs[0].dtype;
    if (dtype == "float64") return fusion_math::MaxExactExponent(at::kDouble);
    if (dtype == "float32" || dtype == "bfloat16") {
      return fusion_math::MaxExactExponent(at::kFloat);
    }
  }
  return fusion_math::MaxExactExponent(at::kHalf);
}

// A unique root attribute name starting with `base`.
std::string FreeRootName(const torch::jit::Module& root,
                         const std::string& base) {
  std::string name = base;
  for (int i = 1; root.hasattr(name) || root.find_method(name); ++i) {
    name = absl::StrCat(base, "_", i);
  }
  return name;
}

}  // namespace

absl::StatusOr<bool> ChangeTrueDivToMulByInverse::Run(
    runtime::GraphModule& gm) {
  ir::Graph& graph = gm.graph();
  std::vector<ir::Node*> divs;
  for (ir::Node* n : graph.nodes()) {
    if (IsTrueDiv(*n)) divs.push_back(n);
  }
  const int64_t app = NextApplicationId(graph);
  bool changed = false;
  for (ir::Node* div : divs) {
    const ir::Argument& d = div->args()[1];
    std::map<std::string, std::string> data = {{kRole, kDiv},
                                               {kOriginal, SnapshotNode(*div)}};
    if (d.kind() == ir::Argument::Kind::kDouble ||
        d.kind() == ir::Argument::Kind::kInt) {
      const double value = d.kind() == ir::Argument::Kind::kDouble
                               ? d.as_double()
                               : static_cast<double>(d.as_int());
      std::optional<double> r =
          fusion_math::ExactReciprocal(value, ScalarMaxExponent(*div));
      if (!r && allow_inexact_ && value != 0 && std::isfinite(value)) {
        r = 1.0 / value;
      }
      if (!r) continue;
      RETURN_IF_ERROR(div->SetArg(1, ir::Argument::Double(*r)));
      div->set_target("aten::mul.Scalar");
    } else if (d.is_node() && d.node()->op() == ir::OpKind::kGetAttr) {
      ir::Node* attr = d.node();
      absl::StatusOr<torch::Tensor> t = gm.GetTensor(attr->target());
      if (!t.ok()) continue;
      std::optional<torch::Tensor> r = fusion_math::ExactReciprocalTensor(*t);
      if (!r && allow_inexact_ && at::isFloatingType(t->scalar_type())) {
        ASSIGN_OR_RETURN(
            r, runtime::TorchCall(kName, [&] { return at::reciprocal(*t); }));
      }
      if (!r) continue;
      const std::string path = FreeRootName(
          gm.module(),
          absl::StrCat(SplitParentPath(attr->target()).second, "_reciprocal"));
      RETURN_IF_ERROR(gm.SetTensor(path, *r));
      ir::Node* rattr;
      {
        ir::Graph::InsertPointGuard guard(graph, div);
        ASSIGN_OR_RETURN(rattr, graph.GetAttr(path, path));
      }
      rattr->set_scope(attr->scope());
      rattr->meta().outputs = attr->meta().outputs;
      MarkTransformed(rattr, kName, app, {{kRole, kReciprocal}});
      RETURN_IF_ERROR(div->SetArg(1, ir::Argument::Ref(rattr)));
      div->set_target("aten::mul.Tensor");
    } else {
      continue;
    }
    MarkTransformed(div, kName, app, std::move(data));
    changed = true;
  }
  return changed;
}

absl::StatusOr<bool> ChangeTrueDivToMulByInverse::Reverse(
    runtime::GraphModule& gm) {
  ir::Graph& graph = gm.graph();
  std::optional<int64_t> app = LatestApplicationId(graph, kName);
  if (!app) return false;
  RETURN_IF_ERROR(CheckIsLatestApplication(graph, kName, *app));
  const std::vector<ir::Node*> nodes = GetTransformedNodes(graph, kName, *app);
  for (ir::Node* n : nodes) {
    const ir::TransformMark* m = FindMark(*n, kName, *app);
    RETURN_IF_ERROR(CheckLastMark(*n, *m));
  }
  std::vector<ir::Node*> attrs;
  for (ir::Node* n : nodes) {
    const ir::TransformMark* m = FindMark(*n, kName, *app);
    if (m->data.at(kRole) == kReciprocal) {
      attrs.push_back(n);
      continue;
    }
    RETURN_IF_ERROR(
        ReplaceWithSnapshot(graph, n, m->data.at(kOriginal)).status());
  }
  for (ir::Node* a : attrs) {
    const std::string path = a->target();
    RETURN_IF_ERROR(graph.Erase(a));
    RETURN_IF_ERROR(RemoveAttribute(gm, path));
  }
  return true;
}

}  // namespace tracecut::transforms
