#include "modifiers/fused_experts.h"

#include <ATen/ATen.h>
#include <torch/script.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {
namespace {

// How closely recomputing an experts module per expert must match it.
constexpr double kCheckTolerance = 1e-4;

std::string ParentOf(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

// A piece that is one expert's rows of a fused [experts, out, in] tensor:
// one expert (dimension 0), all input columns.
bool IsExpertRows(const checkpoint::Piece& p,
                  const std::vector<int64_t>& shape) {
  return shape.size() == 3 && p.sizes.size() == 3 && p.sizes[0] == 1 &&
         p.offsets[2] == 0 && p.sizes[2] == shape[2] &&
         absl::EndsWith(p.name, ".weight");
}

}  // namespace

absl::StatusOr<FusedExperts> FusedExperts::Find(RunContext& ctx,
                                                const ModuleSelector& selector,
                                                absl::string_view owner,
                                                bool all_tokens) {
  FusedExperts out;
  out.all_tokens_ = all_tokens;
  ASSIGN_OR_RETURN(
      checkpoint::Layout layout,
      checkpoint::Layout::FromExtraFiles(ctx.model().extra_files()));
  // Fused parameters of leaf modules, by module.
  std::map<std::string, std::vector<std::string>> by_module;
  for (const auto& [name, pieces] : layout.tensors()) {
    if (pieces.size() < 2) continue;
    const std::string module = ParentOf(name);
    if (ctx.FindLeaf(module) != nullptr) by_module[module].push_back(name);
  }
  for (const auto& [module, tensors] : by_module) {
    // One parameter with two pieces per expert (gate then up, in the
    // order transformers concatenates them) and one with one (down).
    Module m;
    int experts = -1;
    bool ok = tensors.size() == 2;
    for (const std::string& t : tensors) {
      if (!ok) break;
      const std::vector<checkpoint::Piece>& pieces = *layout.Find(t);
      const std::vector<int64_t> shape = checkpoint::ShapeOf(pieces);
      if (shape.size() != 3 || (experts >= 0 && shape[0] != experts)) {
        ok = false;
        break;
      }
      experts = static_cast<int>(shape[0]);
      const int64_t per = static_cast<int64_t>(pieces.size()) / shape[0];
      if (per * shape[0] != static_cast<int64_t>(pieces.size()) || per > 2) {
        ok = false;
        break;
      }
      (per == 2 ? m.gate_up : m.down) = t;
    }
    ok = ok && !m.gate_up.empty() && !m.down.empty();
    if (ok) {
      m.linears.resize(experts);
      m.pieces.resize(experts);
      std::vector<int> seen(experts, 0);
      for (const std::string& t : {m.gate_up, m.down}) {
        const std::vector<checkpoint::Piece>& pieces = *layout.Find(t);
        const std::vector<int64_t> shape = checkpoint::ShapeOf(pieces);
        // Gate rows come before up rows within an expert.
        std::vector<const checkpoint::Piece*> sorted;
        for (const checkpoint::Piece& p : pieces) sorted.push_back(&p);
        std::stable_sort(sorted.begin(), sorted.end(),
                         [](const auto* a, const auto* b) {
                           return a->offsets[1] < b->offsets[1];
                         });
        for (const checkpoint::Piece* p : sorted) {
          if (!IsExpertRows(*p, shape)) {
            ok = false;
            break;
          }
          const int e = static_cast<int>(p->offsets[0]);
          if (t != m.down && seen[e] >= 2) {  // Not two pieces per expert.
            ok = false;
            break;
          }
          const int slot = t == m.down ? 2 : seen[e]++;
          m.pieces[e][slot] = *p;
          m.linears[e][slot] =
              p->name.substr(0, p->name.size() - std::strlen(".weight"));
        }
      }
    }
    if (!ok) {
      ctx.Warn(absl::StrCat(owner, ": ", module, " stores ",
                            absl::StrJoin(tensors, ", "),
                            " fused, not as one gate/up and one down "
                            "projection per expert; left unquantized"));
      continue;
    }
    bool any = false;
    for (int e = 0; e < experts; ++e) {
      for (int slot = 0; slot < 3; ++slot) {
        const std::string& path = m.linears[e][slot];
        if (!selector.Matches(path, kFusedLinearType)) continue;
        const checkpoint::Piece& p = m.pieces[e][slot];
        out.linears_[path] = FusedLinear{slot == 2 ? m.down : m.gate_up,
                                         p,
                                         checkpoint::SqueezedSizes(p),
                                         module,
                                         e,
                                         slot};
        any = true;
      }
    }
    if (any) out.modules_.emplace(module, std::move(m));
  }
  return out;
}

const FusedLinear* FusedExperts::FindLinear(absl::string_view path) const {
  auto it = linears_.find(std::string(path));
  return it == linears_.end() ? nullptr : &it->second;
}

absl::StatusOr<FusedExperts::Routing> FusedExperts::RoutingOf(
    RunContext& ctx, const ModuleCall& call, const Module& m) const {
  ASSIGN_OR_RETURN(at::Tensor gate_up, ctx.model().GetTensor(m.gate_up));
  // Told apart by shape and dtype, whatever the argument order.
  Routing r;
  std::vector<at::Tensor> floats;
  for (const c10::IValue& v : call.inputs) {
    if (!v.isTensor() || v.toTensor().dim() != 2) continue;
    const at::Tensor& t = v.toTensor();
    if (t.is_floating_point()) {
      floats.push_back(t);
    } else if (!r.index.defined()) {
      r.index = t;
    }
  }
  for (const at::Tensor& t : floats) {
    if (t.size(1) == gate_up.size(2) && !r.hidden.defined()) {
      r.hidden = t;
    } else if (r.index.defined() && t.sizes() == r.index.sizes()) {
      r.weights = t;
    }
  }
  if (!r.hidden.defined() || !r.index.defined() || !r.weights.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fused experts ", call.path,
        ": cannot tell its hidden states [tokens, ", gate_up.size(2),
        "], expert indices and routing weights [tokens, k] ",
        "apart among its ", call.inputs.size(), " inputs"));
  }
  return r;
}

absl::StatusOr<at::Tensor> FusedExperts::Hidden(RunContext& ctx,
                                                const ModuleCall& call) const {
  ASSIGN_OR_RETURN(Routing r,
                   RoutingOf(ctx, call, modules_.at(std::string(call.path))));
  return r.hidden;
}

absl::Status FusedExperts::ForEachInput(
    RunContext& ctx, const ModuleCall& call,
    const std::function<absl::Status(const std::string&, const at::Tensor&)>&
        add) {
  Module& m = modules_.at(std::string(call.path));
  const std::string what = absl::StrCat("fused experts ", call.path);
  ASSIGN_OR_RETURN(at::Tensor gate_up, ctx.model().GetTensor(m.gate_up));
  ASSIGN_OR_RETURN(at::Tensor down, ctx.model().GetTensor(m.down));
  ASSIGN_OR_RETURN(Routing routing, RoutingOf(ctx, call, m));
  const at::Tensor& hidden = routing.hidden;
  const at::Tensor& index = routing.index;
  const at::Tensor& weights = routing.weights;
  if (!call.module->hasattr("act_fn") ||
      !call.module->attr("act_fn").isModule()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": has no act_fn module to compute the input of "
                     "its down projections with"));
  }
  torch::jit::Module act = call.module->attr("act_fn").toModule();
  return runtime::TorchCall(what, [&]() -> absl::Status {
    at::Tensor recomputed;
    if (!m.checked) recomputed = at::zeros_like(hidden);
    for (int e = 0; e < static_cast<int>(m.linears.size()); ++e) {
      at::Tensor routed = index.eq(e);
      // The tokens the expert sees: those routed to it, or all of them.
      at::Tensor rows =
          all_tokens_
              ? at::arange(hidden.size(0), index.options().dtype(at::kLong))
              : routed.any(1).nonzero().squeeze(1);
      if (rows.numel() == 0) continue;
      at::Tensor x = hidden.index_select(0, rows);
      auto weight = [&](const at::Tensor& fused, int slot) {
        return checkpoint::BoxOf(fused, m.pieces[e][slot])
            .reshape(checkpoint::SqueezedSizes(m.pieces[e][slot]))
            .to(x.scalar_type());
      };
      at::Tensor gate = x.matmul(weight(gate_up, 0).t());
      at::Tensor up = x.matmul(weight(gate_up, 1).t());
      at::Tensor h = act.forward({gate}).toTensor() * up;
      for (int slot = 0; slot < 3; ++slot) {
        const std::string& path = m.linears[e][slot];
        if (linears_.contains(path)) {
          RETURN_IF_ERROR(add(path, slot == 2 ? h : x));
        }
      }
      if (recomputed.defined()) {
        at::Tensor y = h.matmul(weight(down, 2).t());
        at::Tensor w = (weights * routed.to(weights.scalar_type()))
                           .sum(1)
                           .index_select(0, rows);
        recomputed.index_add_(0, rows, y * w.unsqueeze(1).to(y.scalar_type()));
      }
    }
    if (recomputed.defined()) {
      // The output, or (a module imported from a .pt2 may also return
      // values its caller reads) the output of its shape closest to ours.
      std::vector<at::Tensor> outputs;
      std::vector<c10::IValue> pending = {
          call.output != nullptr ? *call.output : c10::IValue()};
      while (!pending.empty()) {
        c10::IValue v = std::move(pending.back());
        pending.pop_back();
        if (v.isTensor() && v.toTensor().sizes() == hidden.sizes()) {
          outputs.push_back(v.toTensor());
        } else if (v.isTuple()) {
          for (const c10::IValue& e : v.toTupleRef().elements()) {
            pending.push_back(e);
          }
        } else if (v.isList()) {
          for (const c10::IValue& e : v.toListRef()) pending.push_back(e);
        }
      }
      double err = std::numeric_limits<double>::infinity();
      for (const at::Tensor& output : outputs) {
        const at::Tensor actual = output.to(at::kFloat);
        const double scale = std::max(actual.norm().item<double>(), 1e-30);
        err = std::min(
            err,
            (recomputed.to(at::kFloat) - actual).norm().item<double>() / scale);
      }
      if (!(err <= kCheckTolerance)) {
        return absl::FailedPreconditionError(absl::StrCat(
            what,
            ": recomputing it per expert as act(x w1^T) * (x w3^T) w2^T, "
            "weighted by the routing, differs from its output by ",
            err, " (relative; at most ", kCheckTolerance,
            "), so its per-expert Linears' inputs are unknown; leave them "
            "out of the recipe's targets"));
      }
      m.checked = true;
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<at::Tensor> FusedExperts::Weight(RunContext& ctx,
                                                const std::string& path) const {
  const FusedLinear& l = linears_.at(path);
  ASSIGN_OR_RETURN(at::Tensor fused, ctx.model().GetTensor(l.tensor));
  return checkpoint::PieceOf(fused, l.piece, l.shape);
}

absl::Status FusedExperts::StageWeight(RunContext& ctx, const std::string& path,
                                       const at::Tensor& weight) {
  const FusedLinear& l = linears_.at(path);
  return runtime::TorchCall(
      absl::StrCat("updating ", path), [&]() -> absl::Status {
        auto it = staged_.find(l.tensor);
        if (it == staged_.end()) {
          ASSIGN_OR_RETURN(at::Tensor fused, ctx.model().GetTensor(l.tensor));
          it = staged_.emplace(l.tensor, fused.detach().clone()).first;
        }
        checkpoint::BoxOf(it->second, l.piece)
            .copy_(weight.reshape(l.piece.sizes));
        return absl::OkStatus();
      });
}

absl::Status FusedExperts::Commit(RunContext& ctx) {
  for (const auto& [path, value] : staged_) {
    RETURN_IF_ERROR(ctx.UpdateTensor(path, value));
  }
  staged_.clear();
  return absl::OkStatus();
}

}  // namespace tracecut::modifiers
