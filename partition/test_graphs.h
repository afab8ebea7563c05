#ifndef TRACECUT_PARTITION_TEST_GRAPHS_H_
#define TRACECUT_PARTITION_TEST_GRAPHS_H_

// Decoder-shaped IR graphs for partitioner tests, built programmatically
// the way the tracer scopes a Llama model:
//
//   input_ids, attention_mask
//   head:  embed_tokens (call_module), causal mask, rotary cos/sin
//   layer i (LlamaDecoderLayer at model.layers.i):
//          input_layernorm -> self_attn (q/k/v/o as aten::linear over
//          get_attr weights, rotary, mask) -> residual add ->
//          post_attention_layernorm -> mlp (gate/up/down call_modules,
//          silu) -> residual add
//   tail:  model.norm, lm_head -> output (logits)
//
// Names are explicit ("l3_q", "l3_out") so graphs with thousands of layers
// build in linear time.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace tracecut::partition::testing {

inline constexpr char kLlama[] = "transformers.models.llama.modeling_llama.";

struct DecoderSpec {
  int layers = 4;
  int64_t hidden = 64;  // q/k/v/o weights are hidden x hidden float32.
  // lm_head reads the embedding matrix with get_attr (tied weights) instead
  // of calling a leaf module.
  bool tied_embedding = false;
  // A root-level node computed right after `glue_after_layer` (when >= 0)
  // from cos, read by every later layer's attention.
  int glue_after_layer = -1;
  // The model returns (logits, embeddings) instead of logits.
  bool return_embeddings = false;
  // No head computation: layer 0 reads the model input directly.
  bool no_head = false;
  // Each layer is one call_module leaf ("model.layers.i").
  bool leaf_layers = false;
};

struct Decoder {
  std::unique_ptr<ir::Graph> graph;
  ir::Node* input_ids = nullptr;
  ir::Node* attention_mask = nullptr;
  ir::Node* embed = nullptr;
  ir::Node* mask = nullptr;
  ir::Node* cos = nullptr;
  ir::Node* sin = nullptr;
  ir::Node* glue = nullptr;
  std::vector<ir::Node*> layer_out;  // Each layer's final residual add.
  ir::Node* logits = nullptr;
};

Decoder BuildDecoder(const DecoderSpec& spec);

inline constexpr char kMixtral[] =
    "transformers.models.mixtral.modeling_mixtral.";

// A Mixtral-shaped mixture-of-experts decoder, as tracing through the layers
// scopes it (transformers' MixtralForCausalLM; Qwen-MoE and DeepSeek differ
// only in names): every Linear, norm and activation is a call_module leaf,
// every other node carries an output shape and a source line the way traced
// graphs do, and module scopes are shared per module as the tracer shares
// them.
//
//   head:  embed_tokens, causal mask, rotary cos/sin (model scope)
//   layer i (MixtralDecoderLayer at model.layers.i), 41 + 15 * experts nodes:
//          input_layernorm, self_attn (q/k/v/o leaves, rotary, softmax),
//          residual add, post_attention_layernorm, block_sparse_moe:
//            router (gate leaf, softmax, topk, normalise, one_hot)
//            per expert e, in MixtralSparseMoeBlock's loop: select its
//            tokens (where, index), experts.e (MixtralBlockSparseTop2MLP:
//            w1, act_fn, w3, mul, w2), scale by the routing weight,
//            index_add into the accumulator
//          residual add
//   tail:  model.norm, lm_head -> output (logits)
//
// Node count: MoeNodeCount(spec). Builds in time linear in it.
struct MoeSpec {
  int layers = 2;
  int experts = 4;
};

std::unique_ptr<ir::Graph> BuildMoe(const MoeSpec& spec);
int64_t MoeNodeCount(const MoeSpec& spec);

// Scope helpers.
ir::ScopeEntry Entry(const std::string& path, const std::string& type);
ir::Scope RootScope();

}  // namespace tracecut::partition::testing

#endif  // TRACECUT_PARTITION_TEST_GRAPHS_H_
