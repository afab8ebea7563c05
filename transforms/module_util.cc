#include "transforms/module_util.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ir/graph.h"
#include "ir/names.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

using runtime::TorchCall;
using torch::jit::Module;

std::string Shape(const torch::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

// The forward graph of `m` with every call inlined (a copy).
std::shared_ptr<torch::jit::Graph> InlinedForward(const Module& m) {
  std::shared_ptr<torch::jit::Graph> g =
      m.get_method("forward").graph()->copy();
  torch::jit::Inline(*g);
  // Folds constant lists (stride, padding, ...) into single constants.
  torch::jit::ConstantPropagation(g);
  return g;
}

// The only node of `g` whose kind is one of `kinds`, or nullptr when there
// are none or several.
torch::jit::Node* SingleNode(torch::jit::Graph& g,
                             std::initializer_list<const char*> kinds) {
  torch::jit::Node* found = nullptr;
  std::vector<torch::jit::Block*> blocks = {g.block()};
  while (!blocks.empty()) {
    torch::jit::Block* b = blocks.back();
    blocks.pop_back();
    for (torch::jit::Node* n : b->nodes()) {
      for (torch::jit::Block* sub : n->blocks()) blocks.push_back(sub);
      for (const char* k : kinds) {
        if (n->kind() == c10::Symbol::fromQualString(k)) {
          if (found != nullptr) return nullptr;
          found = n;
        }
      }
    }
  }
  return found;
}

std::optional<std::vector<int64_t>> IntList(const c10::IValue& v,
                                            size_t expand_to) {
  if (v.isInt()) return std::vector<int64_t>(expand_to, v.toInt());
  if (v.isIntList()) {
    std::vector<int64_t> out = v.toIntVector();
    if (out.size() == 1 && expand_to > 1) out.resize(expand_to, out[0]);
    if (out.size() != expand_to) return std::nullopt;
    return out;
  }
  if (v.isTuple()) {
    std::vector<int64_t> out;
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (!e.isInt()) return std::nullopt;
      out.push_back(e.toInt());
    }
    if (out.size() != expand_to) return std::nullopt;
    return out;
  }
  return std::nullopt;
}

// Whether graph value `v` reads attribute `name` of the graph's `self`.
bool IsSelfAttr(const torch::jit::Value* v, const torch::jit::Graph& g,
                const char* name) {
  const torch::jit::Node* n = v->node();
  return n->kind() == c10::prim::GetAttr && n->input(0) == g.inputs()[0] &&
         n->s(c10::attr::name) == name;
}

bool IsNone(const torch::jit::Value* v) {
  return v->type()->kind() == c10::TypeKind::NoneType;
}

std::string ListSource(const std::vector<int64_t>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
}

// A fresh module type named `qualified` (mangled unique) in `root`'s
// compilation unit, with a `training` attribute (LibTorch's Module::train
// expects one on every module).
Module NewModule(const Module& root, absl::string_view qualified) {
  Module m(c10::QualifiedName(absl::StrCat("__torch__.", qualified)),
           root._ivalue()->compilation_unit(), /*shouldMangle=*/true);
  m.register_attribute("training", c10::BoolType::get(), false);
  return m;
}

void SetOptionalTensor(Module& m, const std::string& name,
                       const std::optional<torch::Tensor>& t) {
  if (t) {
    m.register_parameter(name, *t, /*is_buffer=*/false);
  } else {
    m.register_attribute(
        name, c10::OptionalType::create(c10::TensorType::get()), c10::IValue());
  }
}

int CountInstancesOfType(const Module& root, const c10::ClassTypePtr& type) {
  int n = 0;
  for (const Module& sub : root.modules()) {
    if (sub.type() == type) ++n;
  }
  return n;
}

absl::StatusOr<Module> Walk(const Module& root,
                            const std::vector<std::string>& parts, size_t n) {
  Module m = root;
  for (size_t i = 0; i < n; ++i) {
    std::optional<c10::IValue> v;
    if (m.type()->hasAttribute(parts[i])) v = m.attr(parts[i]);
    if (!v || !v->isObject() || !v->toObjectRef().type()->is_module()) {
      return absl::NotFoundError(absl::StrCat(
          "no submodule '",
          absl::StrJoin(parts.begin(), parts.begin() + i + 1, "."), "'"));
    }
    m = Module(v->toObject());
  }
  return m;
}

// Gives the module at parts[0..n) a ClassType no other module in `root`'s
// tree uses, replacing it (and, as needed, its ancestors) by a copy that
// shares the same tensors.
absl::Status MakeTypePrivate(Module& root,
                             const std::vector<std::string>& parts, size_t n) {
  if (n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(Module m, Walk(root, parts, n));
  if (CountInstancesOfType(root, m.type()) <= 1) return absl::OkStatus();
  RETURN_IF_ERROR(MakeTypePrivate(root, parts, n - 1));
  ASSIGN_OR_RETURN(Module parent, Walk(root, parts, n - 1));
  Module fresh = m.clone(/*inplace=*/true);
  parent.type()->unsafeChangeAttributeType(parts[n - 1], fresh.type());
  parent._ivalue()->setAttr(parts[n - 1], fresh._ivalue());
  return absl::OkStatus();
}

std::vector<std::string> SplitDots(absl::string_view path) {
  if (path.empty()) return {};
  return absl::StrSplit(path, '.');
}

}  // namespace

absl::string_view LeafKindName(LeafKind kind) {
  switch (kind) {
    case LeafKind::kLinear:
      return "Linear";
    case LeafKind::kConv1D:
      return "Conv1D";
    case LeafKind::kConv2d:
      return "Conv2d";
    case LeafKind::kBatchNorm1d:
      return "BatchNorm1d";
    case LeafKind::kBatchNorm2d:
      return "BatchNorm2d";
    case LeafKind::kOther:
      break;
  }
  return "other";
}

std::string ModuleType(const Module& m) {
  return ir::Scope::DemangleType(m.type()->name()->qualifiedName());
}

LeafKind ClassifyLeaf(const Module& m) {
  const std::string type = ModuleType(m);
  if (type == "torch.nn.modules.linear.Linear" ||
      type == "torch.nn.modules.linear.NonDynamicallyQuantizableLinear") {
    return LeafKind::kLinear;
  }
  if (type == "torch.nn.modules.conv.Conv2d") return LeafKind::kConv2d;
  if (type == "torch.nn.modules.batchnorm.BatchNorm1d") {
    return LeafKind::kBatchNorm1d;
  }
  if (type == "torch.nn.modules.batchnorm.BatchNorm2d") {
    return LeafKind::kBatchNorm2d;
  }
  // Hugging Face's Conv1D lives in transformers.pytorch_utils (older:
  // transformers.modeling_utils); mirrors of it keep the class name.
  if (ir::Scope::ShortType(type) == "Conv1D" &&
      !absl::StartsWith(type, "torch.")) {
    return LeafKind::kConv1D;
  }
  return LeafKind::kOther;
}

std::optional<torch::Tensor> TensorAttr(const Module& m,
                                        const std::string& name) {
  if (!m.type()->hasAttribute(name)) return std::nullopt;
  c10::IValue v = m.attr(name);
  if (!v.isTensor()) return std::nullopt;
  return v.toTensor();
}

absl::StatusOr<LinearLeaf> ReadLinear(const Module& m) {
  const LeafKind kind = ClassifyLeaf(m);
  if (kind != LeafKind::kLinear && kind != LeafKind::kConv1D) {
    return absl::InvalidArgumentError(
        absl::StrCat(ModuleType(m), " is not a Linear or Conv1D"));
  }
  LinearLeaf leaf;
  leaf.conv1d = kind == LeafKind::kConv1D;
  std::optional<torch::Tensor> w = TensorAttr(m, "weight");
  if (!w || w->dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(ModuleType(m), ": weight must be a 2-D tensor",
                     w ? absl::StrCat(", got ", Shape(*w)) : std::string()));
  }
  leaf.weight = *w;
  leaf.bias = TensorAttr(m, "bias");
  leaf.in_features = w->size(leaf.conv1d ? 0 : 1);
  leaf.out_features = w->size(leaf.out_dim());
  if (leaf.bias &&
      (leaf.bias->dim() != 1 || leaf.bias->size(0) != leaf.out_features)) {
    return absl::InvalidArgumentError(absl::StrCat(
        ModuleType(m), ": bias ", Shape(*leaf.bias), " does not match ",
        leaf.out_features, " output features"));
  }
  return leaf;
}

absl::StatusOr<Conv2dLeaf> ReadConv2d(const Module& m) {
  return TorchCall("reading Conv2d", [&]() -> absl::StatusOr<Conv2dLeaf> {
    Conv2dLeaf conv;
    std::optional<torch::Tensor> w = TensorAttr(m, "weight");
    if (!w || w->dim() != 4) {
      return absl::InvalidArgumentError("Conv2d weight must be a 4-D tensor");
    }
    conv.weight = *w;
    conv.bias = TensorAttr(m, "bias");
    if (m.hasattr("stride")) {
      // torch.jit.script: hyperparameters are class constants.
      if (m.hasattr("padding_mode") &&
          m.attr("padding_mode").toStringRef() != "zeros") {
        return absl::FailedPreconditionError(
            absl::StrCat("padding_mode '", m.attr("padding_mode").toStringRef(),
                         "' is not 'zeros'"));
      }
      if (m.hasattr("transposed") && m.attr("transposed").toBool()) {
        return absl::FailedPreconditionError("transposed convolution");
      }
      auto stride = IntList(m.attr("stride"), 2);
      auto padding = IntList(m.attr("padding"), 2);
      auto dilation = IntList(m.attr("dilation"), 2);
      if (!stride || !padding || !dilation || !m.attr("groups").isInt()) {
        return absl::FailedPreconditionError(
            "Conv2d hyperparameters are not integer lists (string padding?)");
      }
      conv.stride = *stride;
      conv.padding = *padding;
      conv.dilation = *dilation;
      conv.groups = m.attr("groups").toInt();
      return conv;
    }
    // torch.jit.trace: the one convolution in forward holds them.
    std::shared_ptr<torch::jit::Graph> g = InlinedForward(m);
    torch::jit::Node* n =
        SingleNode(*g, {"aten::_convolution", "aten::conv2d"});
    if (n == nullptr) {
      return absl::FailedPreconditionError(
          "forward does not hold exactly one convolution");
    }
    if (!IsSelfAttr(n->input(1), *g, "weight")) {
      return absl::FailedPreconditionError(
          "the convolution does not read self.weight");
    }
    const torch::jit::Value* b = n->input(2);
    if (!(IsNone(b) || IsSelfAttr(b, *g, "bias"))) {
      return absl::FailedPreconditionError(
          "the convolution's bias is neither None nor self.bias");
    }
    if (IsNone(b)) conv.bias.reset();
    auto constant = [&](size_t i) { return torch::jit::toIValue(n->input(i)); };
    auto stride = constant(3), padding = constant(4), dilation = constant(5);
    std::optional<c10::IValue> groups;
    if (n->kind() == c10::Symbol::fromQualString("aten::_convolution")) {
      auto transposed = constant(6);
      if (!transposed || !transposed->isBool() || transposed->toBool()) {
        return absl::FailedPreconditionError(
            "transposed (or non-constant) convolution");
      }
      groups = constant(8);
    } else {
      groups = constant(6);
    }
    if (!stride || !padding || !dilation || !groups || !groups->isInt()) {
      return absl::FailedPreconditionError(
          "convolution hyperparameters are not constants");
    }
    auto s = IntList(*stride, 2), p = IntList(*padding, 2),
         d = IntList(*dilation, 2);
    if (!s || !p || !d) {
      return absl::FailedPreconditionError(
          "convolution hyperparameters are not integer pairs");
    }
    conv.stride = *s;
    conv.padding = *p;
    conv.dilation = *d;
    conv.groups = groups->toInt();
    return conv;
  });
}

absl::StatusOr<fusion_math::BatchNormParams> ReadBatchNorm(const Module& m) {
  return TorchCall(
      "reading BatchNorm",
      [&]() -> absl::StatusOr<fusion_math::BatchNormParams> {
        fusion_math::BatchNormParams bn;
        std::optional<torch::Tensor> mean = TensorAttr(m, "running_mean");
        std::optional<torch::Tensor> var = TensorAttr(m, "running_var");
        if (!mean || !var) {
          return absl::FailedPreconditionError(
              "BatchNorm has no running statistics "
              "(track_running_stats=False): it normalises with batch "
              "statistics");
        }
        bn.running_mean = *mean;
        bn.running_var = *var;
        bn.weight = TensorAttr(m, "weight");
        bn.bias = TensorAttr(m, "bias");
        if (m.hasattr("eps")) {
          // torch.jit.script: eps is a class constant, training an
          // attribute the forward branches on.
          bn.eps = m.attr("eps").toDouble();
          if (m.hasattr("training") && m.attr("training").toBool()) {
            return absl::FailedPreconditionError(
                "BatchNorm is in training mode");
          }
          return bn;
        }
        std::shared_ptr<torch::jit::Graph> g = InlinedForward(m);
        torch::jit::Node* n = SingleNode(*g, {"aten::batch_norm"});
        if (n == nullptr) {
          return absl::FailedPreconditionError(
              "forward does not hold exactly one batch_norm");
        }
        // batch_norm(input, weight, bias, running_mean, running_var,
        //            training, momentum, eps, cudnn_enabled)
        auto training = torch::jit::toIValue(n->input(5));
        auto eps = torch::jit::toIValue(n->input(7));
        if (!training || !training->isBool() || training->toBool()) {
          return absl::FailedPreconditionError(
              "BatchNorm was traced in training mode");
        }
        if (!eps || !eps->isDouble()) {
          return absl::FailedPreconditionError("BatchNorm eps is not constant");
        }
        if (!IsSelfAttr(n->input(3), *g, "running_mean") ||
            !IsSelfAttr(n->input(4), *g, "running_var")) {
          return absl::FailedPreconditionError(
              "batch_norm does not read self.running_mean/running_var");
        }
        if (!(IsNone(n->input(1)) || IsSelfAttr(n->input(1), *g, "weight")) ||
            !(IsNone(n->input(2)) || IsSelfAttr(n->input(2), *g, "bias"))) {
          return absl::FailedPreconditionError(
              "batch_norm's weight/bias are not self.weight/self.bias");
        }
        if (IsNone(n->input(1))) bn.weight.reset();
        if (IsNone(n->input(2))) bn.bias.reset();
        bn.eps = eps->toDouble();
        return bn;
      });
}

absl::StatusOr<Module> MakeLinearModule(
    const Module& root, const torch::Tensor& weight,
    const std::optional<torch::Tensor>& bias) {
  return TorchCall("creating a Linear module", [&] {
    Module m = NewModule(root, "torch.nn.modules.linear.Linear");
    m.register_parameter("weight", weight, /*is_buffer=*/false);
    SetOptionalTensor(m, "bias", bias);
    m.define(R"(
def forward(self, input: Tensor) -> Tensor:
    return torch.linear(input, self.weight, self.bias)
)");
    return m;
  });
}

absl::StatusOr<Module> MakeConv1DModule(
    const Module& root, const torch::Tensor& weight,
    const std::optional<torch::Tensor>& bias, absl::string_view type) {
  return TorchCall("creating a Conv1D module", [&] {
    Module m = NewModule(root, type);
    m.register_parameter("weight", weight, /*is_buffer=*/false);
    SetOptionalTensor(m, "bias", bias);
    // As Hugging Face's Conv1D: addmm on the flattened input.
    if (bias) {
      m.define(R"(
def forward(self, x: Tensor) -> Tensor:
    size_out = x.size()[:-1] + [self.weight.size(1)]
    x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
    return x.view(size_out)
)");
    } else {
      m.define(R"(
def forward(self, x: Tensor) -> Tensor:
    size_out = x.size()[:-1] + [self.weight.size(1)]
    x = torch.mm(x.view(-1, x.size(-1)), self.weight)
    return x.view(size_out)
)");
    }
    return m;
  });
}

absl::StatusOr<Module> MakeConv2dModule(const Module& root,
                                        const Conv2dLeaf& conv) {
  return TorchCall("creating a Conv2d module", [&] {
    Module m = NewModule(root, "torch.nn.modules.conv.Conv2d");
    m.register_parameter("weight", conv.weight, /*is_buffer=*/false);
    SetOptionalTensor(m, "bias", conv.bias);
    m.define(absl::StrCat(R"(
def forward(self, input: Tensor) -> Tensor:
    return torch.conv2d(input, self.weight, self.bias, )",
                          ListSource(conv.stride), ", ",
                          ListSource(conv.padding), ", ",
                          ListSource(conv.dilation), ", ", conv.groups, ")\n"));
    return m;
  });
}

std::pair<std::string, std::string> SplitParentPath(absl::string_view path) {
  const size_t dot = path.rfind('.');
  if (dot == absl::string_view::npos) return {"", std::string(path)};
  return {std::string(path.substr(0, dot)), std::string(path.substr(dot + 1))};
}

std::string JoinPath(absl::string_view parent, absl::string_view name) {
  return parent.empty() ? std::string(name) : absl::StrCat(parent, ".", name);
}

absl::StatusOr<std::string> AddSubmodule(runtime::GraphModule& gm,
                                         absl::string_view parent_path,
                                         absl::string_view name_hint,
                                         const Module& child) {
  return TorchCall(
      absl::StrCat("adding a submodule under '", parent_path, "'"),
      [&]() -> absl::StatusOr<std::string> {
        const std::vector<std::string> parts = SplitDots(parent_path);
        RETURN_IF_ERROR(MakeTypePrivate(gm.module(), parts, parts.size()));
        ASSIGN_OR_RETURN(Module parent, Walk(gm.module(), parts, parts.size()));
        const std::string base = ir::SanitizeName(name_hint);
        std::string name = base;
        for (int i = 1; parent.hasattr(name) || parent.find_method(name); ++i) {
          name = absl::StrCat(base, "_", i);
        }
        parent.register_module(name, child);
        return JoinPath(parent_path, name);
      });
}

absl::Status RemoveAttribute(runtime::GraphModule& gm, absl::string_view path) {
  return TorchCall(
      absl::StrCat("removing '", path, "'"), [&]() -> absl::Status {
        auto [parent_path, name] = SplitParentPath(path);
        const std::vector<std::string> parts = SplitDots(parent_path);
        ASSIGN_OR_RETURN(Module parent, Walk(gm.module(), parts, parts.size()));
        if (!parent.type()->hasAttribute(name)) {
          return absl::NotFoundError(
              absl::StrCat("no attribute '", path, "' to remove"));
        }
        if (CountInstancesOfType(gm.module(), parent.type()) > 1) {
          return absl::FailedPreconditionError(absl::StrCat(
              "cannot remove '", path,
              "': its parent's type is shared with other modules"));
        }
        parent._ivalue()->unsafeRemoveAttr(name);
        parent.type()->unsafeRemoveAttribute(name);
        return absl::OkStatus();
      });
}

absl::flat_hash_map<std::string, int> CallSiteCounts(const ir::Graph& graph) {
  absl::flat_hash_map<std::string, int> counts;
  for (const ir::Node* n : graph.nodes()) {
    if (n->op() == ir::OpKind::kCallModule) ++counts[n->target()];
  }
  return counts;
}

}  // namespace tracecut::transforms
