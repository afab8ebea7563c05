#include "ir/testing/test_graphs.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/text.h"
#include "ir/verifier.h"

namespace tracecut::ir::test_graphs {
namespace {

// Test graphs are built from literals; a failure is a bug in this file.
template <typename T>
T Must(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "test_graphs: %s\n", v.status().ToString().c_str());
    std::abort();
  }
  return *std::move(v);
}

void MustOk(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "test_graphs: %s\n", s.ToString().c_str());
    std::abort();
  }
}

Argument Ref(Node* n) { return Argument::Ref(n); }
Argument I(int64_t v) { return Argument::Int(v); }
Argument D(double v) { return Argument::Double(v); }
Argument S(std::string v) { return Argument::String(std::move(v)); }

double FromBits(uint64_t bits) {
  double v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

std::string AllBytes() {
  std::string s;
  for (int c = 0; c < 256; ++c) s.push_back(static_cast<char>(c));
  return s;
}

const Scope& LlamaLayerScope() {
  static const Scope* const kScope = new Scope({
      {"", "transformers.models.llama.modeling_llama.LlamaForCausalLM"},
      {"model", "transformers.models.llama.modeling_llama.LlamaModel"},
      {"model.layers.0",
       "transformers.models.llama.modeling_llama.LlamaDecoderLayer"},
  });
  return *kScope;
}

std::unique_ptr<Graph> Minimal() {
  auto g = std::make_unique<Graph>();
  Must(g->Output(Argument::None()));
  return g;
}

// The typical traced shape: inputs, parameters, an operator, a method, a
// leaf module, kwargs, a tuple output.
std::unique_ptr<Graph> Mlp() {
  auto g = std::make_unique<Graph>();
  Node* x = Must(g->Placeholder("x"));
  // FX keeps a placeholder's default value as its argument.
  Node* mask =
      Must(g->AddNode(OpKind::kPlaceholder, "mask", {Argument::None()}));
  Node* w = Must(g->GetAttr("fc1.weight"));
  Node* b = Must(g->GetAttr("fc1.bias"));
  Node* linear =
      Must(g->CallFunction("aten::linear", {Ref(x), Ref(w), Ref(b)}));
  Node* relu = Must(g->CallMethod("relu", {Ref(linear)}));
  Node* fc2 = Must(g->CallModule("fc2", {Ref(relu)}));
  Node* add = Must(g->CallFunction("aten::add.Tensor", {Ref(fc2), Ref(x)},
                                   {{"alpha", I(1)}}));
  Node* masked = Must(g->CallFunction("aten::masked_fill.Scalar",
                                      {Ref(add), Ref(mask), D(0.0)}));
  Must(g->Output(Argument::Tuple({Ref(masked), Ref(relu)})));
  return g;
}

// Every constant kind, with the values a printer most easily gets wrong.
std::unique_ptr<Graph> Constants() {
  auto g = std::make_unique<Graph>();
  Node* x = Must(g->Placeholder("x"));
  std::vector<Argument> ints = {I(0),
                                I(1),
                                I(-1),
                                I(int64_t{1} << 53),
                                I(std::numeric_limits<int64_t>::max()),
                                I(std::numeric_limits<int64_t>::min())};
  std::vector<Argument> doubles = {
      D(0.0),
      D(-0.0),
      D(0.1),
      D(1.0),
      D(-2.5),
      D(1.0 / 3.0),
      D(3.141592653589793),
      D(1e300),
      D(-1e-300),
      D(1e16),
      D(1e-7),
      D(123456789012345680.0),
      D(std::numeric_limits<double>::denorm_min()),
      D(FromBits(0x000fffffffffffff)),  // Largest denormal.
      D(std::numeric_limits<double>::min()),
      D(std::numeric_limits<double>::max()),
      D(std::numeric_limits<double>::lowest()),
      D(std::numeric_limits<double>::infinity()),
      D(-std::numeric_limits<double>::infinity()),
      D(std::nan("")),
      D(FromBits(0xfff8000000000000)),  // -nan, what 0.0 / 0.0 gives on x86.
      D(FromBits(0x7ff0000000000001)),  // Signalling NaN.
      D(FromBits(0xfff00000deadbeef)),  // Negative NaN with a payload.
  };
  std::vector<Argument> strings = {
      S(""),
      S("plain"),
      S("quote\" backslash\\ newline\n tab\t cr\r"),
      S(std::string("nul\0inside", 10)),
      S(AllBytes()),
      S("h\xc3\xa9llo \xe2\x9c\x93"),
      S("%not_a_ref"),
      S("# not a comment"),
      S("None"),
      S("\\x41 is not an escape here"),
  };
  std::vector<Argument> other = {
      Argument::None(),
      Argument::Bool(true),
      Argument::Bool(false),
      Argument::DType("float32"),
      Argument::DType("bfloat16"),
      Argument::DType("odd dtype!"),
      Argument::DType(""),
      Argument::Device("cpu"),
      Argument::Device("cuda:0"),
      Argument::Device(""),
  };
  Kwargs kwargs = {
      {"dtype", Argument::DType("int64")},
      {"device", Argument::Device("cuda:1")},
      {"None", Argument::None()},
      {"nan", D(std::nan(""))},
      {"s", S("=")},
  };
  Node* c = Must(
      g->CallFunction("test::constants",
                      {Ref(x), Argument::List(ints), Argument::List(doubles),
                       Argument::Tuple(strings), Argument::List(other)},
                      kwargs));
  // Each double alone too, where it is not inside a list.
  std::vector<Argument> singles;
  for (const Argument& d : doubles) singles.push_back(d);
  Node* d = Must(g->CallFunction("test::doubles", singles, {}, "doubles"));
  Must(g->Output(Argument::Tuple({Ref(c), Ref(d)})));
  return g;
}

// Lists and tuples of every arity, nested, holding references.
std::unique_ptr<Graph> Nested() {
  auto g = std::make_unique<Graph>();
  Node* x = Must(g->Placeholder("x"));
  Node* y = Must(g->Placeholder("y"));
  Argument deep = I(7);
  for (int i = 0; i < 40; ++i) {
    deep = i % 2 == 0 ? Argument::List({deep}) : Argument::Tuple({deep});
  }
  Argument mixed = Argument::List(
      {Ref(x),
       Argument::List({Ref(y), Argument::Tuple({Ref(x), Argument::None()})})});
  Node* n = Must(g->CallFunction(
      "test::nested",
      {Argument::List({}), Argument::Tuple({}), Argument::Tuple({I(1)}),
       Argument::Tuple({Argument::Tuple({Ref(x)})}), deep, mixed,
       Argument::Tuple(
           {I(1), D(2.0), S("s"), Argument::List({Argument::Bool(true)})}),
       Argument::List({Argument::List({}), Argument::Tuple({})})},
      {{"refs", Argument::Tuple({Ref(y), Ref(y)})}}));
  Node* cat = Must(g->CallFunction(
      "aten::cat", {Argument::List({Ref(x), Ref(y), Ref(n)}), I(-1)}));
  Must(g->Output(Argument::Tuple({Ref(cat)})));
  return g;
}

// Scope stacks as the tracer writes them, plus paths and types with bytes
// the text form must quote.
std::unique_ptr<Graph> Scopes() {
  auto g = std::make_unique<Graph>();
  Node* h = Must(g->Placeholder("hidden_states"));
  Node* w = Must(g->GetAttr("model.layers.0.self_attn.q_proj.weight"));
  const Scope& layer = LlamaLayerScope();
  Scope attn =
      layer.Push({"model.layers.0.self_attn",
                  "transformers.models.llama.modeling_llama.LlamaAttention"});
  Scope q = attn.Push(
      {"model.layers.0.self_attn.q_proj", "torch.nn.modules.linear.Linear"});
  w->set_scope(q);
  Node* lin =
      Must(g->CallFunction("aten::linear", {Ref(h), Ref(w), Argument::None()}));
  lin->set_scope(q);
  Node* norm =
      Must(g->CallModule("model.layers.0.input_layernorm", {Ref(lin)}));
  norm->set_scope(
      layer.Push({"model.layers.0.input_layernorm",
                  "transformers.models.llama.modeling_llama.LlamaRMSNorm"}));
  Node* odd = Must(g->CallFunction("aten::relu", {Ref(norm)}));
  odd->set_scope(Scope({{"", ""},
                        {"weird path/\"x\"", "type with\nnewline \xe2\x9c\x93"},
                        {"a.b", ":"},
                        {"0.1", "\\"}}));
  Node* root = Must(g->CallFunction("aten::neg", {Ref(odd)}));
  root->set_scope(Scope(std::vector<ScopeEntry>{{"", "M"}}));
  Must(g->Output(Ref(root)));
  return g;
}

// Module paths as PyTorch allows them (any non-empty segment without '.'):
// torchvision RegNet's "block1-0", leading digits, UTF-8, spaces, quotes,
// backslashes, control characters, glob and text-syntax characters; node
// names derived from them stay identifiers.
std::unique_ptr<Graph> ModulePaths() {
  auto g = std::make_unique<Graph>();
  Node* x = Must(g->Placeholder("x"));
  const Scope root(
      std::vector<ScopeEntry>{{"", "torchvision.models.regnet.RegNet"}});
  const Scope stage =
      root.Push({"trunk_output", "torch.nn.Sequential"})
          .Push({"trunk_output.block1", "torchvision.models.regnet.AnyStage"});
  const Scope block =
      stage.Push({"trunk_output.block1.block1-0",
                  "torchvision.models.regnet.ResBottleneckBlock"});
  Node* proj =
      Must(g->CallModule("trunk_output.block1.block1-0.proj.0", {Ref(x)}));
  proj->set_scope(block.Push(
      {"trunk_output.block1.block1-0.proj.0", "torch.nn.modules.conv.Conv2d"}));
  Node* prev = proj;
  for (const std::string& path : {
           std::string("0.1"),
           std::string("3d conv.weight"),
           std::string("bl\xc3\xb6"
                       "ck.\xd0\xb1\xd0\xbb\xd0\xbe\xd0\xba"),
           std::string("q\"uote.back\\slash"),
           std::string("tab\t.new\nline"),
           std::string("x:y.*.?.%z.#c"),
       }) {
    Node* w = Must(g->GetAttr(path));
    w->set_scope(block.Push({path, "torch.nn.modules.linear.Linear"}));
    prev = Must(g->CallFunction("aten::add.Tensor", {Ref(prev), Ref(w)}));
    prev->set_scope(block);
  }
  Must(g->Output(Ref(prev)));
  return g;
}

// Every meta field, with odd keys and values, on nodes and on the graph.
std::unique_ptr<Graph> Meta() {
  auto g = std::make_unique<Graph>();
  g->meta().assumptions = {"x.dim() == 3 (model.py:12)", "",
                           "quote\" and\nnewline"};
  g->meta().extra["seq_len"] = I(16);
  g->meta().extra["odd key"] =
      Argument::List({I(1), Argument::Tuple({D(2.5)})});
  g->meta().extra[""] = Argument::None();
  g->meta().extra["nan"] = D(std::nan(""));
  Node* x = Must(g->Placeholder("input_ids"));
  x->meta().outputs = {{{2, 16}, "int64", "cpu"}};
  Node* y = Must(g->CallFunction("aten::split.Tensor", {Ref(x), I(8), I(-1)}));
  y->meta().outputs = {{{2, 8}, "float32", "cuda:0"},
                       {{-1, 8}, "", ""},
                       {{}, "odd dtype", "dev\"ice"}};
  y->meta().source = SourceLocation{"model.py", 12, "y = torch.split(x, 8)"};
  y->meta().transforms = {
      {"merge-linears", {{"k", "v"}, {"odd key\n", "\xff"}}},
      {"no-data", {}},
  };
  y->meta().extra = {
      {"foo", I(1)},
      {"bar", Argument::List({S("a"), D(-0.0), Argument::DType("float16")})},
      {"with\"quote", Argument::Tuple({Argument::None()})},
  };
  Node* a = Must(g->CallFunction("getitem", {Ref(y), I(0)}));
  a->meta().source = SourceLocation{"", 0, ""};
  Node* b = Must(g->CallFunction("getitem", {Ref(y), I(1)}));
  b->meta().source = SourceLocation{"we\"ird\\file.py", -3, "\t\x01"};
  b->meta().transforms = {{"", {{"", ""}}}};
  Node* out = Must(g->Output(Argument::Tuple({Ref(a), Ref(b)})));
  out->meta().extra["note"] = S("output");
  return g;
}

// Shaped by editing: names with suffixes, order keys no longer evenly
// spaced, erased and moved nodes.
std::unique_ptr<Graph> Edited() {
  auto g = std::make_unique<Graph>();
  Node* x = Must(g->Placeholder("x"));
  Node* relu = Must(g->CallFunction("aten::relu", {Ref(x)}));
  Node* relu_1 = Must(g->CallFunction("aten::relu", {Ref(relu)}));
  Node* out = Must(g->Output(Ref(relu_1)));
  Node* neg = nullptr;
  {
    Graph::InsertPointGuard guard(*g, relu_1);
    Node* prev = relu;
    for (int i = 0; i < 5; ++i) {
      prev = Must(g->CallFunction("aten::neg", {Ref(prev)}));
    }
    neg = prev;
  }
  MustOk(relu_1->ReplaceInput(relu, neg));
  Node* dead = Must(g->CallFunction("aten::abs", {Ref(x)}));
  MustOk(g->MoveBefore(dead, out));
  MustOk(g->Erase(dead));
  Node* c = Must(g->GetAttr("const"));
  MustOk(g->MoveBefore(c, relu));
  g->Rename(relu, "renamed");
  Node* add = nullptr;
  {
    Graph::InsertPointGuard guard(*g, out);
    add = Must(g->CallFunction("aten::add.Tensor", {Ref(relu_1), Ref(c)}));
  }
  MustOk(out->SetArgs({Ref(add)}));
  return g;
}

// Multi-output values read with getitem, and a node with many users.
std::unique_ptr<Graph> Getitem() {
  auto g = std::make_unique<Graph>();
  Node* x = Must(g->Placeholder("x"));
  Node* chunk = Must(g->CallFunction("aten::chunk", {Ref(x), I(4), I(0)}));
  std::vector<Argument> parts;
  for (int i = 0; i < 4; ++i) {
    parts.push_back(Ref(Must(g->CallFunction("getitem", {Ref(chunk), I(i)}))));
  }
  Node* same = Must(g->CallFunction("aten::mul.Tensor", {Ref(x), Ref(x)}));
  Node* cat = Must(g->CallFunction("aten::cat", {Argument::List(parts), I(0)}));
  Must(g->Output(Argument::List({Ref(cat), Ref(same), Ref(x)})));
  return g;
}

std::unique_ptr<Graph> LongChain() {
  auto g = std::make_unique<Graph>();
  Node* prev = Must(g->Placeholder("x"));
  for (int i = 0; i < 300; ++i) {
    prev =
        Must(g->CallFunction(i % 2 ? "aten::sin" : "aten::cos", {Ref(prev)}));
  }
  Must(g->Output(Ref(prev)));
  return g;
}

}  // namespace

std::vector<NamedGraph> VariedGraphs() {
  std::vector<NamedGraph> out;
  out.push_back({"minimal", Minimal()});
  out.push_back({"mlp", Mlp()});
  out.push_back({"constants", Constants()});
  out.push_back({"nested", Nested()});
  out.push_back({"scopes", Scopes()});
  out.push_back({"module_paths", ModulePaths()});
  out.push_back({"meta", Meta()});
  out.push_back({"edited", Edited()});
  out.push_back({"getitem", Getitem()});
  out.push_back({"long_chain", LongChain()});
  for (const NamedGraph& c : out) {
    if (absl::Status s = Verify(*c.graph); !s.ok()) {
      std::fprintf(stderr, "test_graphs: %s does not verify: %s\n",
                   c.name.c_str(), s.ToString().c_str());
      std::abort();
    }
  }
  return out;
}

std::unique_ptr<Graph> VariedGraph(absl::string_view name) {
  for (NamedGraph& c : VariedGraphs()) {
    if (c.name == name) return std::move(c.graph);
  }
  std::fprintf(stderr, "test_graphs: no graph called %.*s\n",
               static_cast<int>(name.size()), name.data());
  std::abort();
}

std::unique_ptr<Graph> ParseOrDie(absl::string_view text) {
  absl::StatusOr<std::unique_ptr<Graph>> g = ParseGraph(text);
  if (!g.ok()) {
    std::fprintf(stderr, "ParseOrDie: %s\n", g.status().ToString().c_str());
    std::abort();
  }
  return *std::move(g);
}

}  // namespace tracecut::ir::test_graphs
