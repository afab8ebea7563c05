#include "partition/test_graphs.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::partition::testing {
namespace {

using ir::Argument;
using ir::Node;

Node* Must(absl::StatusOr<Node*> n) {
  if (!n.ok()) {
    std::fprintf(stderr, "test graph: %s\n", n.status().ToString().c_str());
    std::abort();
  }
  return *n;
}

Argument R(Node* n) { return Argument::Ref(n); }

class Builder {
 public:
  explicit Builder(ir::Graph& g) : g_(g) {}

  Node* Fn(const std::string& name, const std::string& op,
           std::vector<Argument> args, const ir::Scope& scope) {
    Node* n = Must(g_.CallFunction(op, std::move(args), {}, name));
    n->set_scope(scope);
    return n;
  }
  Node* Module(const std::string& name, const std::string& path,
               const std::string& type, std::vector<Argument> args,
               const ir::Scope& parent) {
    Node* n = Must(g_.CallModule(path, std::move(args), {}, name));
    n->set_scope(parent.Push(Entry(path, type)));
    return n;
  }
  Node* Param(const std::string& name, const std::string& target,
              std::vector<int64_t> shape, const ir::Scope& scope) {
    Node* n = Must(g_.GetAttr(target, name));
    n->set_scope(scope);
    n->meta().outputs.push_back({std::move(shape), "float32", "cpu"});
    return n;
  }

 private:
  ir::Graph& g_;
};

}  // namespace

ir::ScopeEntry Entry(const std::string& path, const std::string& type) {
  return ir::ScopeEntry{path, type};
}

ir::Scope RootScope() {
  return ir::Scope({Entry("", absl::StrCat(kLlama, "LlamaForCausalLM"))});
}

Decoder BuildDecoder(const DecoderSpec& spec) {
  Decoder d;
  d.graph = std::make_unique<ir::Graph>();
  ir::Graph& g = *d.graph;
  Builder b(g);
  const int64_t h = spec.hidden;
  const ir::Scope root = RootScope();
  const ir::Scope model =
      root.Push(Entry("model", absl::StrCat(kLlama, "LlamaModel")));
  const std::string nn = "torch.nn.modules.";

  d.input_ids = Must(g.Placeholder("input_ids"));
  d.attention_mask = Must(g.Placeholder("attention_mask"));

  // Head.
  Node* embed_w = nullptr;
  if (spec.no_head) {
    d.embed = d.input_ids;
    d.mask = d.attention_mask;
    d.cos = d.attention_mask;
    d.sin = d.attention_mask;
  } else {
    const ir::Scope embed_scope =
        model.Push(Entry("model.embed_tokens", nn + "sparse.Embedding"));
    if (spec.tied_embedding) {
      embed_w = b.Param("embed_w", "model.embed_tokens.weight", {1000, h},
                        embed_scope);
      d.embed = b.Fn("embed", "aten::embedding",
                     {R(embed_w), R(d.input_ids), Argument::Int(-1),
                      Argument::Bool(false), Argument::Bool(false)},
                     embed_scope);
    } else {
      d.embed = b.Module("embed", "model.embed_tokens", nn + "sparse.Embedding",
                         {R(d.input_ids)}, model);
    }
    Node* expanded = b.Fn("mask_expand", "aten::unsqueeze",
                          {R(d.attention_mask), Argument::Int(1)}, model);
    d.mask = b.Fn("causal_mask", "aten::masked_fill.Scalar",
                  {R(expanded), R(expanded), Argument::Double(-1e9)}, model);
    const ir::Scope rotary = model.Push(Entry(
        "model.rotary_emb", absl::StrCat(kLlama, "LlamaRotaryEmbedding")));
    Node* inv_freq =
        b.Param("inv_freq", "model.rotary_emb.inv_freq", {h / 2}, rotary);
    Node* freqs =
        b.Fn("freqs", "aten::outer", {R(d.input_ids), R(inv_freq)}, rotary);
    d.cos = b.Fn("cos", "aten::cos", {R(freqs)}, rotary);
    d.sin = b.Fn("sin", "aten::sin", {R(freqs)}, rotary);
  }

  Node* hidden = d.embed;
  Node* cos = d.cos;
  for (int i = 0; i < spec.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i);
    const std::string l = absl::StrCat("l", i, "_");
    if (spec.leaf_layers) {
      hidden = b.Module(l + "out", p, absl::StrCat(kLlama, "LlamaDecoderLayer"),
                        {R(hidden), R(d.mask), R(cos), R(d.sin)}, model);
      d.layer_out.push_back(hidden);
      continue;
    }
    const ir::Scope layer =
        model.Push(Entry(p, absl::StrCat(kLlama, "LlamaDecoderLayer")));
    const ir::Scope attn = layer.Push(
        Entry(p + ".self_attn", absl::StrCat(kLlama, "LlamaAttention")));
    const ir::Scope mlp =
        layer.Push(Entry(p + ".mlp", absl::StrCat(kLlama, "LlamaMLP")));
    const std::string rms = absl::StrCat(kLlama, "LlamaRMSNorm");
    const std::string linear = nn + "linear.Linear";

    Node* ln1 =
        b.Module(l + "ln1", p + ".input_layernorm", rms, {R(hidden)}, layer);
    auto proj = [&](const std::string& n, Node* x) {
      Node* w = b.Param(l + n + "_w", p + ".self_attn." + n + "_proj.weight",
                        {h, h}, attn);
      return b.Fn(l + n, "aten::linear", {R(x), R(w), Argument::None()}, attn);
    };
    Node* q = proj("q", ln1);
    Node* k = proj("k", ln1);
    Node* v = proj("v", ln1);
    Node* q_rot = b.Fn(l + "q_rot", "aten::mul.Tensor", {R(q), R(cos)}, attn);
    Node* k_rot = b.Fn(l + "k_rot", "aten::mul.Tensor", {R(k), R(d.sin)}, attn);
    Node* scores =
        b.Fn(l + "scores", "aten::matmul", {R(q_rot), R(k_rot)}, attn);
    Node* masked = b.Fn(l + "masked", "aten::add.Tensor",
                        {R(scores), R(d.mask), Argument::Int(1)}, attn);
    Node* probs = b.Fn(l + "probs", "aten::softmax.int",
                       {R(masked), Argument::Int(-1), Argument::None()}, attn);
    Node* ctx = b.Fn(l + "ctx", "aten::matmul", {R(probs), R(v)}, attn);
    Node* o = proj("o", ctx);
    Node* h2 = b.Fn(l + "res1", "aten::add.Tensor",
                    {R(hidden), R(o), Argument::Int(1)}, layer);
    Node* ln2 = b.Module(l + "ln2", p + ".post_attention_layernorm", rms,
                         {R(h2)}, layer);
    Node* gate =
        b.Module(l + "gate", p + ".mlp.gate_proj", linear, {R(ln2)}, mlp);
    Node* up = b.Module(l + "up", p + ".mlp.up_proj", linear, {R(ln2)}, mlp);
    Node* act = b.Fn(l + "act", "aten::silu", {R(gate)}, mlp);
    Node* prod = b.Fn(l + "prod", "aten::mul.Tensor", {R(act), R(up)}, mlp);
    Node* down =
        b.Module(l + "down", p + ".mlp.down_proj", linear, {R(prod)}, mlp);
    hidden = b.Fn(l + "out", "aten::add.Tensor",
                  {R(h2), R(down), Argument::Int(1)}, layer);
    d.layer_out.push_back(hidden);
    if (i == spec.glue_after_layer) {
      d.glue = b.Fn("glue_cos", "aten::mul.Scalar",
                    {R(d.cos), Argument::Double(0.5)}, model);
      cos = d.glue;
    }
  }

  // Tail.
  Node* normed =
      b.Module("norm", "model.norm", absl::StrCat(kLlama, "LlamaRMSNorm"),
               {R(hidden)}, model);
  if (spec.tied_embedding) {
    const ir::Scope head_scope =
        root.Push(Entry("lm_head", nn + "linear.Linear"));
    // Tied: the embedding's get_attr node is read again here.
    Node* w = embed_w != nullptr
                  ? embed_w
                  : b.Param("lm_head_w", "model.embed_tokens.weight", {1000, h},
                            head_scope);
    d.logits = b.Fn("logits", "aten::linear",
                    {R(normed), R(w), Argument::None()}, head_scope);
  } else {
    d.logits =
        b.Module("logits", "lm_head", nn + "linear.Linear", {R(normed)}, root);
  }
  if (spec.return_embeddings) {
    Must(g.Output(Argument::Tuple({R(d.logits), R(d.embed)})));
  } else {
    Must(g.Output(R(d.logits)));
  }
  return d;
}

namespace {

// Adds nodes the way a trace through a Mixtral model names and annotates
// them: call_function "<op>_<n>" with an output shape and a source line,
// call_module named after its path, scopes shared per module.
class MoeBuilder {
 public:
  explicit MoeBuilder(ir::Graph& g) : g_(g) {}

  // `op` is "aten::name.overload"; the node is named "name_<n>".
  Node* Fn(absl::string_view op, std::vector<Argument> args,
           const ir::Scope& scope, int line) {
    absl::string_view base = op.substr(op.find("::") + 2);
    base = base.substr(0, base.find('.'));
    Node* n = Must(g_.CallFunction(std::string(op), std::move(args), {},
                                   absl::StrCat(base, "_", count_++)));
    Annotate(n, scope, line);
    return n;
  }
  // A leaf module call in `scope` (its parent's), with the leaf's own
  // scope pushed.
  Node* Module(const std::string& path, const std::string& type,
               std::vector<Argument> args, const ir::Scope& scope, int line) {
    std::string name = path;
    for (char& c : name) c = c == '.' ? '_' : c;
    Node* n = Must(g_.CallModule(path, std::move(args), {}, name));
    Annotate(n, scope.Push(Entry(path, type)), line);
    return n;
  }

 private:
  void Annotate(Node* n, const ir::Scope& scope, int line) {
    n->set_scope(scope);
    n->meta().outputs.push_back({{2, 16, 64}, "float32", "cpu"});
    n->meta().source = ir::SourceLocation{
        "transformers/models/mixtral/modeling_mixtral.py", line, ""};
  }

  ir::Graph& g_;
  int64_t count_ = 0;
};

constexpr int kHeadNodes = 8;  // Two inputs and six head nodes.
constexpr int kLayerNodes = 41;
constexpr int kExpertNodes = 15;
constexpr int kTailNodes = 3;  // norm, lm_head, output.

}  // namespace

int64_t MoeNodeCount(const MoeSpec& spec) {
  return kHeadNodes +
         int64_t{spec.layers} *
             (kLayerNodes + int64_t{kExpertNodes} * spec.experts) +
         kTailNodes;
}

std::unique_ptr<ir::Graph> BuildMoe(const MoeSpec& spec) {
  auto graph = std::make_unique<ir::Graph>();
  ir::Graph& g = *graph;
  MoeBuilder b(g);
  const std::string nn = "torch.nn.modules.";
  const std::string linear = nn + "linear.Linear";
  const std::string rms = absl::StrCat(kMixtral, "MixtralRMSNorm");
  const ir::Scope root(
      {Entry("", absl::StrCat(kMixtral, "MixtralForCausalLM"))});
  const ir::Scope model =
      root.Push(Entry("model", absl::StrCat(kMixtral, "MixtralModel")));
  auto i = [](int64_t v) { return Argument::Int(v); };

  Node* input_ids = Must(g.Placeholder("input_ids"));
  Node* attention_mask = Must(g.Placeholder("attention_mask"));
  input_ids->set_scope(root);
  attention_mask->set_scope(root);
  Node* hidden = b.Module("model.embed_tokens", nn + "sparse.Embedding",
                          {R(input_ids)}, model, 1061);
  Node* expanded =
      b.Fn("aten::unsqueeze", {R(attention_mask), i(1)}, model, 1090);
  Node* mask =
      b.Fn("aten::masked_fill.Scalar",
           {R(expanded), R(expanded), Argument::Double(-1e9)}, model, 1091);
  Node* freqs = b.Fn("aten::outer", {R(input_ids), R(input_ids)}, model, 1070);
  Node* cos = b.Fn("aten::cos", {R(freqs)}, model, 1071);
  Node* sin = b.Fn("aten::sin", {R(freqs)}, model, 1072);

  for (int l = 0; l < spec.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l);
    const ir::Scope layer =
        model.Push(Entry(p, absl::StrCat(kMixtral, "MixtralDecoderLayer")));
    const ir::Scope attn = layer.Push(
        Entry(p + ".self_attn", absl::StrCat(kMixtral, "MixtralAttention")));
    const std::string moe_path = p + ".block_sparse_moe";
    const ir::Scope moe = layer.Push(
        Entry(moe_path, absl::StrCat(kMixtral, "MixtralSparseMoeBlock")));

    // Attention: 1 + 24 + 1 nodes.
    Node* ln1 = b.Module(p + ".input_layernorm", rms, {R(hidden)}, layer, 930);
    auto head = [&](const char* proj, int line) {
      Node* x = b.Module(absl::StrCat(p, ".self_attn.", proj), linear, {R(ln1)},
                         attn, line);
      Node* v = b.Fn("aten::view", {R(x), i(-1)}, attn, line);
      return b.Fn("aten::transpose.int", {R(v), i(1), i(2)}, attn, line);
    };
    Node* q = head("q_proj", 300);
    Node* k = head("k_proj", 301);
    Node* v = head("v_proj", 302);
    auto rotate = [&](Node* x, int line) {
      Node* c = b.Fn("aten::mul.Tensor", {R(x), R(cos)}, attn, line);
      Node* s = b.Fn("aten::mul.Tensor", {R(x), R(sin)}, attn, line);
      return b.Fn("aten::add.Tensor", {R(c), R(s), i(1)}, attn, line);
    };
    q = rotate(q, 310);
    k = rotate(k, 311);
    Node* kt = b.Fn("aten::transpose.int", {R(k), i(2), i(3)}, attn, 320);
    Node* scores = b.Fn("aten::matmul", {R(q), R(kt)}, attn, 320);
    Node* scaled =
        b.Fn("aten::div.Tensor", {R(scores), Argument::Double(8)}, attn, 320);
    Node* masked =
        b.Fn("aten::add.Tensor", {R(scaled), R(mask), i(1)}, attn, 323);
    Node* probs = b.Fn("aten::softmax.int",
                       {R(masked), i(-1), Argument::None()}, attn, 326);
    Node* ctx = b.Fn("aten::matmul", {R(probs), R(v)}, attn, 328);
    Node* ctx_t = b.Fn("aten::transpose.int", {R(ctx), i(1), i(2)}, attn, 330);
    Node* ctx_r = b.Fn("aten::reshape", {R(ctx_t), i(-1)}, attn, 331);
    Node* o = b.Module(p + ".self_attn.o_proj", linear, {R(ctx_r)}, attn, 332);
    Node* h = b.Fn("aten::add.Tensor", {R(hidden), R(o), i(1)}, layer, 940);
    Node* ln2 =
        b.Module(p + ".post_attention_layernorm", rms, {R(h)}, layer, 943);

    // Router: 12 nodes.
    Node* flat = b.Fn("aten::view", {R(ln2), i(-1)}, moe, 850);
    Node* logits = b.Module(moe_path + ".gate", linear, {R(flat)}, moe, 852);
    Node* weights = b.Fn("aten::softmax.int",
                         {R(logits), i(1), Argument::None()}, moe, 854);
    Node* topk = b.Fn("aten::topk", {R(weights), i(2), i(-1)}, moe, 855);
    Node* top_w = b.Fn("aten::getitem", {R(topk), i(0)}, moe, 855);
    Node* top_i = b.Fn("aten::getitem", {R(topk), i(1)}, moe, 855);
    Node* sum = b.Fn("aten::sum.dim_IntList", {R(top_w), i(-1)}, moe, 856);
    Node* norm = b.Fn("aten::div.Tensor", {R(top_w), R(sum)}, moe, 856);
    Node* route =
        b.Fn("aten::to.dtype", {R(norm), Argument::DType("float32")}, moe, 858);
    Node* acc = b.Fn("aten::zeros_like", {R(flat)}, moe, 860);
    Node* one_hot =
        b.Fn("aten::one_hot", {R(top_i), i(spec.experts)}, moe, 864);
    Node* expert_mask =
        b.Fn("aten::permute", {R(one_hot), i(2), i(1), i(0)}, moe, 864);
    // Per expert: 6 + 5 + 4 nodes.
    for (int e = 0; e < spec.experts; ++e) {
      const std::string ep = absl::StrCat(moe_path, ".experts.", e);
      const ir::Scope expert = moe.Push(
          Entry(ep, absl::StrCat(kMixtral, "MixtralBlockSparseTop2MLP")));
      Node* row =
          b.Fn("aten::select.int", {R(expert_mask), i(0), i(e)}, moe, 869);
      Node* where = b.Fn("aten::where", {R(row)}, moe, 869);
      Node* idx = b.Fn("aten::getitem", {R(where), i(0)}, moe, 869);
      Node* top_x = b.Fn("aten::getitem", {R(where), i(1)}, moe, 869);
      Node* picked = b.Fn("aten::index.Tensor", {R(flat), R(top_x)}, moe, 874);
      Node* state = b.Fn("aten::reshape", {R(picked), i(-1)}, moe, 874);
      Node* w1 = b.Module(ep + ".w1", linear, {R(state)}, expert, 801);
      Node* act = b.Module(ep + ".act_fn", nn + "activation.SiLU", {R(w1)},
                           expert, 801);
      Node* w3 = b.Module(ep + ".w3", linear, {R(state)}, expert, 801);
      Node* prod = b.Fn("aten::mul.Tensor", {R(act), R(w3)}, expert, 801);
      Node* w2 = b.Module(ep + ".w2", linear, {R(prod)}, expert, 802);
      Node* rw = b.Fn("aten::index.Tensor",
                      {R(route), Argument::List({R(top_x), R(idx)})}, moe, 875);
      Node* scaled_out = b.Fn("aten::mul.Tensor", {R(w2), R(rw)}, moe, 875);
      Node* cast = b.Fn("aten::to.dtype",
                        {R(scaled_out), Argument::DType("float32")}, moe, 879);
      acc =
          b.Fn("aten::index_add", {R(acc), i(0), R(top_x), R(cast)}, moe, 879);
    }
    Node* moe_out = b.Fn("aten::reshape", {R(acc), i(-1)}, moe, 880);
    hidden = b.Fn("aten::add.Tensor", {R(h), R(moe_out), i(1)}, layer, 950);
  }

  Node* normed = b.Module("model.norm", rms, {R(hidden)}, model, 1130);
  Node* logits = b.Module("lm_head", linear, {R(normed)}, root, 1260);
  Node* out = Must(g.Output(R(logits)));
  out->set_scope(root);
  return graph;
}

}  // namespace tracecut::partition::testing
