#include "partition/test_graphs.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
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

}  // namespace tracecut::partition::testing
