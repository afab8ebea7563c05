#include "ir/text.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "ir/internal/graph_test_peer.h"
#include "ir/names.h"
#include "ir/testing/test_graphs.h"
#include "ir/verifier.h"
#include "util/testing/status_matchers.h"

namespace tracecut::ir {
namespace {

using test_graphs::ParseOrDie;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

uint64_t Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

double FromBits(uint64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof(v));
  return v;
}

ParseOptions Unverified() {
  ParseOptions options;
  options.verify = false;
  return options;
}

// Parses, checks the result prints back to exactly `text`, and returns it.
std::unique_ptr<Graph> ParseCanonical(const std::string& text,
                                      ParseOptions options = {}) {
  absl::StatusOr<std::unique_ptr<Graph>> g = ParseGraph(text, options);
  EXPECT_OK(g);
  if (!g.ok()) return nullptr;
  EXPECT_EQ(PrintGraph(**g), text);
  return *std::move(g);
}

// The output node's argument after parsing `value` as it.
absl::StatusOr<Argument> ParseValue(const std::string& value) {
  absl::StatusOr<std::unique_ptr<Graph>> g =
      ParseGraph("graph {\n  %output = output[output](" + value + ")\n}\n");
  if (!g.ok()) return g.status();
  return (*g)->output_node()->args()[0];
}

// Print, parse, compare, print again: the round trip the format promises.
void ExpectRoundTrip(const Graph& g, ParseOptions options = {}) {
  std::string text = PrintGraph(g);
  absl::StatusOr<std::unique_ptr<Graph>> parsed = ParseGraph(text, options);
  ASSERT_OK(parsed) << text;
  EXPECT_TRUE(StructurallyEqual(g, **parsed)) << text;
  EXPECT_EQ(PrintGraph(**parsed), text);
}

TEST(TextTest, RoundTripsVariedGraphs) {
  for (const test_graphs::NamedGraph& c : test_graphs::VariedGraphs()) {
    SCOPED_TRACE(c.name);
    ExpectRoundTrip(*c.graph);
    ExpectRoundTrip(*c.graph, Unverified());
  }
}

// Nodes of one module share one stack, as the tracer builds them (what
// the partitioner's stack comparisons and the graph's memory rely on).
TEST(TextTest, EqualScopesShareOneStack) {
  std::unique_ptr<Graph> g = ParseOrDie(R"ir(graph {
  %x = placeholder[x]() scope[:"M", a:"A"]
  %y = call_function[aten::relu](%x) scope[:"M", b:"B"]
  %z = call_function[aten::relu](%y) scope[:"M", a:"A"]
  %output = output[output](%z)
}
)ir");
  const Node* x = g->FindNode("x");
  const Node* y = g->FindNode("y");
  const Node* z = g->FindNode("z");
  EXPECT_EQ(&x->scope().stack(), &z->scope().stack());
  EXPECT_NE(&x->scope().stack(), &y->scope().stack());
  EXPECT_EQ(z->scope().path(), "a");
  EXPECT_EQ(y->scope().path(), "b");
}

TEST(TextTest, PrintsTheDocumentedForm) {
  std::unique_ptr<Graph> g = test_graphs::VariedGraph("mlp");
  EXPECT_EQ(PrintGraph(*g), R"(graph {
  %x = placeholder[x]()
  %mask = placeholder[mask](None)
  %fc1_weight = get_attr[fc1.weight]()
  %fc1_bias = get_attr[fc1.bias]()
  %linear = call_function[aten::linear](%x, %fc1_weight, %fc1_bias)
  %relu = call_method[relu](%linear)
  %fc2 = call_module[fc2](%relu)
  %add = call_function[aten::add.Tensor](%fc2, %x, alpha=1)
  %masked_fill = call_function[aten::masked_fill.Scalar](%add, %mask, 0.0)
  %output = output[output]((%masked_fill, %relu))
}
)");
}

TEST(TextTest, ParsesTheDesignExample) {
  const std::string text = R"ir(graph {
  assume "x.dim() == 3 (model.py:12)"
  extra seq_len = 16
  %input_ids = placeholder[input_ids]() meta{out=[tensor([2, 16], int64, "cpu")]}
  %x = placeholder[x]()
  %w = get_attr[model.layers.0.q_proj.weight]() scope[:"LlamaForCausalLM", model:"x.LlamaModel"]
  %linear = call_function[aten::linear](%x, %w, None) scope[:"LlamaForCausalLM", model.layers.0.q_proj:"torch.nn.Linear"] meta{src="m.py":12:"y = self.q(x)", transform=[mark("merge-linears", {"k": "v"})], extra={foo: 1}}
  %a = call_function[getitem](%linear, 0)
  %b = call_function[aten::to.dtype](%a, dtype(float32), device("cuda:0"), non_blocking=False)
  %output = output[output]((%a, %b))
}
)ir";
  std::unique_ptr<Graph> g = ParseCanonical(text);
  ASSERT_NE(g, nullptr);
  EXPECT_OK(Verify(*g));
  EXPECT_THAT(g->meta().assumptions,
              ::testing::ElementsAre("x.dim() == 3 (model.py:12)"));
  EXPECT_EQ(g->meta().extra.at("seq_len"), Argument::Int(16));
  Node* linear = g->FindNode("linear");
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->scope().path(), "model.layers.0.q_proj");
  EXPECT_EQ(linear->scope().stack()[0].path, "");
  EXPECT_EQ(linear->meta().source->line, 12);
  EXPECT_EQ(linear->meta().transforms[0].data.at("k"), "v");
  EXPECT_EQ(linear->args()[1].node(), g->FindNode("w"));
  EXPECT_TRUE(linear->args()[2].is_none());
  EXPECT_EQ(g->FindNode("x")->users()[0], linear);
  Node* b = g->FindNode("b");
  EXPECT_EQ(b->args()[1], Argument::DType("float32"));
  EXPECT_EQ(b->args()[2], Argument::Device("cuda:0"));
  EXPECT_EQ(*b->kwarg("non_blocking"), Argument::Bool(false));
  EXPECT_EQ(g->FindNode("input_ids")->meta().outputs[0],
            (TensorMeta{{2, 16}, "int64", "cpu"}));
}

TEST(TextTest, IsFreeFormWithComments) {
  std::unique_ptr<Graph> g = ParseOrDie(
      "# A comment.\r\n"
      "graph{%x=placeholder[x]()   # trailing comment\r\n"
      "\t%y = call_function[aten::add.Tensor](\n"
      "      %x,\n"
      "      [1, 2,],\n"
      "      (3,),\n"
      "      alpha = 1,\n"
      "  )\n"
      "%output=output[output](%y)}  \n# after\n");
  EXPECT_EQ(PrintGraph(*g),
            "graph {\n"
            "  %x = placeholder[x]()\n"
            "  %y = call_function[aten::add.Tensor](%x, [1, 2], (3,), "
            "alpha=1)\n"
            "  %output = output[output](%y)\n"
            "}\n");
}

// ---------------------------------------------------------------- values

TEST(TextTest, FormatsDoublesShortestAndExact) {
  EXPECT_EQ(FormatDouble(0.1), "0.1");
  EXPECT_EQ(FormatDouble(1.0), "1.0");
  EXPECT_EQ(FormatDouble(-0.0), "-0.0");
  EXPECT_EQ(FormatDouble(0.0), "0.0");
  EXPECT_EQ(FormatDouble(1e300), "1e+300");
  EXPECT_EQ(FormatDouble(1e16), "1e+16");
  EXPECT_EQ(FormatDouble(123456789012345680.0), "123456789012345680.0");
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::denorm_min()), "5e-324");
  EXPECT_EQ(FormatDouble(HUGE_VAL), "inf");
  EXPECT_EQ(FormatDouble(-HUGE_VAL), "-inf");
  EXPECT_EQ(FormatDouble(std::nan("")), "nan");
  EXPECT_EQ(FormatDouble(FromBits(0xfff8000000000000)), "-nan");
  EXPECT_EQ(FormatDouble(FromBits(0x7ff0000000000001)),
            "nan(0x7ff0000000000001)");
}

TEST(TextTest, DoublesRoundTripBitExactly) {
  std::vector<double> values = {0.1,
                                -0.0,
                                1e300,
                                5e-324,
                                2.2250738585072014e-308,
                                std::numeric_limits<double>::max(),
                                1.0 / 3.0,
                                100.0,
                                1e21,
                                1e22,
                                FromBits(0x000fffffffffffff),
                                FromBits(0xfff00000deadbeef)};
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20000; ++i) values.push_back(FromBits(rng()));
  for (double v : values) {
    std::string text = FormatDouble(v);
    absl::StatusOr<Argument> a = ParseValue(text);
    ASSERT_OK(a) << text;
    ASSERT_EQ(a->kind(), Argument::Kind::kDouble) << text;
    EXPECT_EQ(Bits(a->as_double()), Bits(v)) << text;
  }
}

TEST(TextTest, ParsesNumberSpellings) {
  EXPECT_EQ(*ParseValue("1E5"), Argument::Double(1e5));
  EXPECT_EQ(*ParseValue("2.5e-3"), Argument::Double(2.5e-3));
  EXPECT_EQ(*ParseValue("-7"), Argument::Int(-7));
  EXPECT_EQ(*ParseValue("007"), Argument::Int(7));
  EXPECT_EQ(*ParseValue("-9223372036854775808"),
            Argument::Int(std::numeric_limits<int64_t>::min()));
  EXPECT_EQ(*ParseValue("9223372036854775807"),
            Argument::Int(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(*ParseValue("-nan"),
            Argument::Double(FromBits(0xfff8000000000000)));
  EXPECT_EQ(*ParseValue("nan(0x7ff4000000000000)"),
            Argument::Double(FromBits(0x7ff4000000000000)));
}

TEST(TextTest, StringsRoundTripEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  EXPECT_EQ(QuoteString("a\"b\\c\nd\te\rf\x01\x7f\xff"),
            R"("a\"b\\c\nd\te\rf\x01\x7f\xff")");
  std::mt19937 rng(7);
  std::vector<std::string> strings = {"", all, "\\x41", "%x", "#", "\"\""};
  for (int i = 0; i < 500; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    strings.push_back(s);
  }
  for (const std::string& s : strings) {
    absl::StatusOr<Argument> a = ParseValue(QuoteString(s));
    ASSERT_OK(a) << QuoteString(s);
    EXPECT_EQ(*a, Argument::String(s)) << QuoteString(s);
  }
  EXPECT_EQ(*ParseValue(R"("\0\a\b\f\v\'\x4A\x4a")"),
            Argument::String(std::string("\0\a\b\f\v'JJ", 8)));
}

TEST(TextTest, PrintsSequencesPythonStyle) {
  Argument x = Argument::Int(1);
  EXPECT_EQ(PrintArgument(Argument::Tuple({})), "()");
  EXPECT_EQ(PrintArgument(Argument::Tuple({x})), "(1,)");
  EXPECT_EQ(PrintArgument(Argument::Tuple({x, x})), "(1, 1)");
  EXPECT_EQ(PrintArgument(Argument::List({})), "[]");
  EXPECT_EQ(PrintArgument(Argument::List({Argument::Tuple({x})})), "[(1,)]");
  EXPECT_EQ(PrintArgument(Argument::DType("float32")), "dtype(float32)");
  EXPECT_EQ(PrintArgument(Argument::DType("odd one")), R"(dtype("odd one"))");
  EXPECT_EQ(PrintArgument(Argument::Device("cuda:0")), R"(device("cuda:0"))");
  EXPECT_EQ(*ParseValue("dtype(\"float32\")"), Argument::DType("float32"));
}

TEST(TextTest, NestingUpToTheLimitParses) {
  std::string ok =
      std::string(kMaxTextNesting, '[') + std::string(kMaxTextNesting, ']');
  EXPECT_OK(ParseValue(ok));
  std::string deep = "[" + ok + "]";
  absl::Status s = ParseValue(deep).status();
  EXPECT_THAT(Message(s), HasSubstr("nesting deeper than 256 levels"));
  // Far deeper input fails just as fast, without exhausting the stack.
  std::string huge(1 << 20, '(');
  EXPECT_THAT(Message(ParseValue(huge).status()),
              HasSubstr("nesting deeper than 256 levels"));
}

// ----------------------------------------------------- odd names, verify=off

TEST(TextTest, OddTargetsAndKwargNamesRoundTripUnverified) {
  Graph g;
  Node* x = *g.AddNode(OpKind::kPlaceholder, "odd input!", {}, {}, "x");
  Node* a = *g.AddNode(OpKind::kCallFunction, "<lambda> \"q\"\n",
                       {Argument::Ref(x)}, {{"a b", Argument::Int(1)}}, "a");
  Node* b = *g.AddNode(OpKind::kCallModule, "", {Argument::Ref(a)},
                       {{"", Argument::None()},
                        {"k", Argument::None()},
                        {"k", Argument::Int(2)}},
                       "b");
  ASSERT_OK(g.Output(Argument::Ref(b)));
  ASSERT_OK(g.GetAttr("after.output"));
  std::string text = PrintGraph(g);
  EXPECT_THAT(text, HasSubstr(R"(%x = placeholder["odd input!"]())"));
  EXPECT_THAT(
      text,
      HasSubstr(R"(%a = call_function["<lambda> \"q\"\n"](%x, "a b"=1))"));
  EXPECT_THAT(text,
              HasSubstr(R"(%b = call_module[""](%a, ""=None, k=None, k=2))"));
  ExpectRoundTrip(g, Unverified());
  // Verified parsing refuses the malformed target, pointing at it.
  EXPECT_THAT(Message(ParseGraph(text).status()),
              StartsWith("line 3, column 22: malformed call_function target"));
}

TEST(TextTest, UnverifiedParseAllowsAGraphUnderConstruction) {
  std::unique_ptr<Graph> g =
      ParseCanonical("graph {\n  %x = placeholder[x]()\n}\n", Unverified());
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->output_node(), nullptr);
}

TEST(TextTest, QuotesScopePathsAndTypes) {
  Graph g;
  Node* x = *g.Placeholder("x");
  x->set_scope(Scope(
      {{"", ""}, {"a b", "T\"y\\pe"}, {"model.layers.0", "M"}, {":", "\n"}}));
  ASSERT_OK(g.Output(Argument::Ref(x)));
  EXPECT_THAT(
      PrintGraph(g),
      HasSubstr(
          R"(scope[:"", "a b":"T\"y\\pe", model.layers.0:"M", ":":"\n"])"));
  ExpectRoundTrip(g);
}

// ----------------------------------------------------- module path names

// Module and attribute names PyTorch accepts (any non-empty name without
// '.'), as get_attr/call_module targets and scope paths.
const std::vector<std::string>& OddModulePaths() {
  static const std::vector<std::string>* const kPaths =
      new std::vector<std::string>{
          "trunk_output.block1.block1-0.proj.0",  // torchvision RegNet
          "0.1.2",
          "layers.3d",
          "my block.sub module",
          "bl\xc3\xb6"
          "ck.\xd0\xb1\xd0\xbb\xd0\xbe\xd0\xba.\xf0\x9f\x98\x80",
          "q\"uote.back\\slash.'single'",
          "tab\t.new\nline.cr\r.nul" + std::string(1, '\0') + "byte",
          "x:y.*.?.[0].{a}.%b.#c",
          "\x7f\x01.\xff\xfe",  // Not UTF-8 at all: bytes still round-trip.
      };
  return *kPaths;
}

// x -> get_attr / call_module at `path`, both scoped to it.
std::unique_ptr<Graph> GraphWithModulePath(const std::string& path) {
  auto g = std::make_unique<Graph>();
  Node* x = *g->Placeholder("x");
  Node* w = *g->GetAttr(path + ".weight-0");
  Node* m = *g->CallModule(path, {Argument::Ref(x), Argument::Ref(w)});
  Scope scope(
      {{"", "M"}, {path, "torchvision.models.regnet.ResBottleneckBlock"}});
  w->set_scope(scope);
  m->set_scope(scope);
  EXPECT_OK(g->Output(Argument::Ref(m)));
  return g;
}

TEST(TextTest, ModulePathsRoundTripExactly) {
  for (const std::string& path : OddModulePaths()) {
    SCOPED_TRACE(absl::CEscape(path));
    std::unique_ptr<Graph> g = GraphWithModulePath(path);
    ASSERT_OK(Verify(*g));
    ExpectRoundTrip(*g);
    ExpectRoundTrip(*g, Unverified());
    // Node names derived from the path stay identifiers, so %refs need no
    // quoting.
    for (const Node* n : g->nodes()) {
      EXPECT_TRUE(IsIdentifier(n->name())) << n->name();
    }
    // Printed text is pure ASCII on one line per node.
    std::string text = PrintGraph(*g);
    for (char c : text) {
      EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f))
          << "byte " << static_cast<int>(static_cast<unsigned char>(c));
    }
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 6) << text;
  }
}

TEST(TextTest, QuotesModulePathsThatAreNotBare) {
  std::unique_ptr<Graph> g =
      GraphWithModulePath("trunk_output.block1.block1-0.proj.0");
  EXPECT_EQ(PrintGraph(*g), R"(graph {
  %x = placeholder[x]()
  %trunk_output_block1_block1_0_proj_0_weight_0 = get_attr["trunk_output.block1.block1-0.proj.0.weight-0"]() scope[:"M", "trunk_output.block1.block1-0.proj.0":"torchvision.models.regnet.ResBottleneckBlock"]
  %trunk_output_block1_block1_0_proj_0 = call_module["trunk_output.block1.block1-0.proj.0"](%x, %trunk_output_block1_block1_0_proj_0_weight_0) scope[:"M", "trunk_output.block1.block1-0.proj.0":"torchvision.models.regnet.ResBottleneckBlock"]
  %output = output[output](%trunk_output_block1_block1_0_proj_0)
}
)");
  std::unique_ptr<Graph> u = GraphWithModulePath("\xc3\xa9t\xc3\xa9 1.0");
  EXPECT_THAT(PrintGraph(*u),
              HasSubstr(R"(%_t__1_0 = call_module["\xc3\xa9t\xc3\xa9 1.0"])"));
}

TEST(TextTest, ParsesQuotedModulePaths) {
  std::unique_ptr<Graph> g = ParseCanonical(R"(graph {
  %x = placeholder[x]()
  %w = get_attr["0.block-1.\xe2\x82\xac weight"]()
  %m = call_module["0.block-1"](%x, %w) scope[:"M", 0:"torch.nn.Sequential", "0.block-1":"B"]
  %output = output[output](%m)
}
)");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->FindNode("w")->target(), "0.block-1.\xe2\x82\xac weight");
  EXPECT_EQ(g->FindNode("m")->scope().path(), "0.block-1");
  // Quoting is a choice of spelling: the quoted form of a bare target is the
  // same target, and prints bare.
  absl::StatusOr<std::unique_ptr<Graph>> q = ParseGraph(R"(graph {
  %x = placeholder["x"]()
  %w = get_attr["fc.weight"]() scope["":"M", "fc":"L"]
  %output = output[output](%w)
}
)");
  ASSERT_OK(q);
  EXPECT_EQ(PrintGraph(**q), R"(graph {
  %x = placeholder[x]()
  %w = get_attr[fc.weight]() scope[:"M", fc:"L"]
  %output = output[output](%w)
}
)");
}

TEST(TextTest, RejectsEmptyModulePathSegments) {
  for (const std::string& target :
       std::vector<std::string>{"a..b-0", ".block1-0", "block1-0.", "."}) {
    SCOPED_TRACE(target);
    const std::string text = "graph {\n  %w = get_attr[\"" + target +
                             "\"]()\n  %output = output[output](%w)\n}\n";
    EXPECT_THAT(
        Message(ParseGraph(text).status()),
        StartsWith("line 2, column 17: malformed get_attr target \"" + target +
                   "\": expected a dotted path of non-empty "
                   "segments without '.'"));
    // Unverified, it parses and round-trips.
    absl::StatusOr<std::unique_ptr<Graph>> g = ParseGraph(text, Unverified());
    ASSERT_OK(g);
    EXPECT_EQ((*g)->FindNode("w")->target(), target);
    ExpectRoundTrip(**g, Unverified());
  }
  EXPECT_THAT(
      Message(ParseGraph("graph {\n  %x = placeholder[x]() scope[:\"M\", "
                         "\"a..b\":\"T\"]\n  %output = output[output](%x)\n}\n")
                  .status()),
      StartsWith("line 2, column 3: %x (placeholder x in a..b): scope entry 1 "
                 "has a malformed module path \"a..b\""));
}

TEST(TextTest, PrintsMetaFieldsInOrder) {
  std::unique_ptr<Graph> g = test_graphs::VariedGraph("meta");
  EXPECT_EQ(
      PrintNode(*g->FindNode("split")),
      R"ir(%split = call_function[aten::split.Tensor](%input_ids, 8, -1) )ir"
      R"ir(meta{out=[tensor([2, 8], float32, "cuda:0"), tensor([-1, 8], "", ""), )ir"
      R"ir(tensor([], "odd dtype", "dev\"ice")], src="model.py":12:"y = torch.split(x, 8)", )ir"
      R"ir(transform=[mark("merge-linears", {"k": "v", "odd key\n": "\xff"}), mark("no-data")], )ir"
      R"ir(extra={bar: ["a", -0.0, dtype(float16)], foo: 1, "with\"quote": (None,)}})ir");
}

TEST(TextTest, PrintsACorruptedGraphWithoutCrashing) {
  Graph g;
  Node* x = *g.Placeholder("x");
  internal::GraphTestPeer::SetArgsUnchecked(x, {Argument::Ref(nullptr)});
  EXPECT_EQ(PrintNode(*x), "%x = placeholder[x](%<null>)");
}

// ---------------------------------------------------------------- errors

struct BadInput {
  std::string text;
  std::string error;  // The message's first line, or its start.
};

TEST(TextTest, MalformedInputsGiveLineAndColumn) {
  const std::string out = "  %output = output[output](None)\n}\n";
  std::vector<BadInput> cases = {
      {"", "line 1, column 1: expected 'graph {', found end of input"},
      {"grph {}", "line 1, column 1: expected 'graph {', found 'grph'"},
      {"graph",
       "line 1, column 6: expected '{' after 'graph', found end of "
       "input"},
      {"graph {\n",
       "line 2, column 1: expected '}' closing the graph, found "
       "end of input"},
      {"graph {\n  x = placeholder[x]()\n",
       "line 2, column 3: expected a node ('%name = op[target](...)'), "
       "'assume', 'extra' or '}', found 'x'"},
      {"graph {\n  %x placeholder[x]()\n",
       "line 2, column 6: expected '=' after the node name, found "
       "'placeholder'"},
      {"graph {\n  %x = placehold[x]()\n",
       "line 2, column 8: unknown op kind 'placehold'"},
      {"graph {\n  %1x = placeholder[x]()\n",
       "line 2, column 3: node name '1x' is not an identifier"},
      {"graph {\n  % = placeholder[x]()\n",
       "line 2, column 4: expected a node name after '%', found ' '"},
      {"graph {\n  %x = placeholder[]()\n",
       "line 2, column 20: expected a target (bare [A-Za-z0-9_.:]+ or "
       "\"quoted\"), found ']'"},
      {"graph {\n  %x = placeholder[x](\n",
       "line 3, column 1: expected a value"},
      {"graph {\n  %x = placeholder[x](1 2)\n",
       "line 2, column 25: expected ',' or ')' after argument, found '2'"},
      {"graph {\n  %o = output[output](1.2.3)\n",
       "line 2, column 23: malformed number"},
      {"graph {\n  %o = output[output](12abc)\n",
       "line 2, column 23: malformed number"},
      {"graph {\n  %o = output[output](1.)\n",
       "line 2, column 25: expected a digit after '.', found ')'"},
      {"graph {\n  %o = output[output](1e)\n",
       "line 2, column 25: expected exponent digits"},
      {"graph {\n  %o = output[output](9223372036854775808)\n",
       "line 2, column 23: integer out of range for int64"},
      {"graph {\n  %o = output[output](1e999)\n",
       "line 2, column 23: number out of range for a double"},
      {"graph {\n  %o = output[output](-x)\n",
       "line 2, column 24: expected a number after '-', found 'x'"},
      {"graph {\n  %o = output[output](nan(0x1))\n",
       "line 2, column 23: nan(0x...) bits are not a NaN"},
      {"graph {\n  %o = output[output](-nan(0x7ff8000000000001))\n",
       "line 2, column 23: nan(0x...) gives all 64 bits"},
      {"graph {\n  %o = output[output](\"abc)\n",
       "line 2, column 23: unterminated string"},
      {"graph {\n  %o = output[output](\"a\\qb\")\n",
       "line 2, column 25: unknown escape"},
      {"graph {\n  %o = output[output](\"\\x4\")\n",
       "line 2, column 24: \\x takes exactly two hex digits"},
      {"graph {\n  %o = output[output]((1))\n",
       "line 2, column 25: a 1-tuple needs a trailing comma: (x,)"},
      {"graph {\n  %o = output[output](foo)\n",
       "line 2, column 23: unknown value 'foo'"},
      {"graph {\n  %o = output[output](dtype(1))\n",
       "line 2, column 29: expected a dtype name"},
      {"graph {\n  %o = output[output](device(cpu))\n",
       "line 2, column 30: expected a quoted device (\"cuda:0\"), found 'cpu'"},
      {"graph {\n  %o = output[output](a=1, 2)\n",
       "line 2, column 28: positional argument after keyword argument"},
      {"graph {\n  %o = output[output](\x01)\n",
       "line 2, column 23: expected a value (None, True, False, a number, a "
       "\"string\", dtype(...), device(...), %node, [list] or (tuple)), "
       "found byte 0x01"},
      {"graph {\n  %x = placeholder[x]() scope[a \"T\"]\n",
       "line 2, column 33: expected ':' between module path and type"},
      {"graph {\n  %x = placeholder[x]() scope[a:T]\n",
       "line 2, column 33: expected a quoted module type, found 'T'"},
      {"graph {\n  %x = placeholder[x]() scope[] scope[]\n",
       "line 2, column 33: scope given twice"},
      {"graph {\n  %x = placeholder[x]() meta{src=\"f\":1:\"\", "
       "src=\"f\":1:\"\"}\n",
       "line 2, column 44: meta field 'src' given twice"},
      {"graph {\n  %x = placeholder[x]() meta{colour=1}\n",
       "line 2, column 30: expected a meta field (out, src, transform or "
       "extra), found 'colour'"},
      {"graph {\n  %x = placeholder[x]() meta{src=\"f\":1.5:\"\"}\n",
       "line 2, column 38: expected a line number, found a double"},
      {"graph {\n  %x = placeholder[x]() meta{extra={a: 1, a: 2}}\n",
       "line 2, column 43: meta key a given twice"},
      {"graph {\n  %x = placeholder[x]() meta{extra={a: %x}}\n",
       "line 2, column 40: meta values must be constants, not node "
       "references"},
      {"graph {\n  %x = placeholder[x]() meta{transform=[mark(\"p\", "
       "{\"k\": \"1\", \"k\": \"2\"})]}\n",
       "line 2, column 62: key \"k\" given twice"},
      {"graph {\n  %x = placeholder[x]() meta{out=[tensor([2.0], "
       "float32, \"cpu\")]}\n",
       "line 2, column 43: expected a dimension, found a double"},
      {"graph {\n  extra k = 1\n  extra k = 2\n",
       "line 3, column 9: graph meta key k given twice"},
      {"graph {\n  extra k = %x\n",
       "line 2, column 13: meta values must be constants"},
      {"graph {\n  assume x\n",
       "line 2, column 10: expected a quoted assumption, found 'x'"},
      {"graph {\n" + out + "junk",
       "line 4, column 1: unexpected text after "
       "the graph's closing '}'"},
      // Semantic errors, still pointing at a line.
      {"graph {\n  %y = call_function[aten::relu](%x)\n" + out,
       "line 2, column 34: undefined node %x"},
      {"graph {\n  %y = call_function[aten::relu](%x)\n"
       "  %x = placeholder[x]()\n" +
           out,
       "line 2, column 34: %x is defined later, on line 3; a node can only "
       "read nodes before it"},
      {"graph {\n  %y = call_function[aten::relu]([%y])\n" + out,
       "line 2, column 35: %y reads itself"},
      {"graph {\n  %x = placeholder[x]()\n  %x = placeholder[y]()\n" + out,
       "line 3, column 3: duplicate node name %x (first defined on line 2)"},
      {"graph {\n  %x = placeholder[x]()\n}\n",
       "line 3, column 1: the graph has no output node"},
      {"graph {\n" + std::string("  %output = output[output](None)\n") + out,
       "line 3, column 3: duplicate node name %output"},
      {"graph {\n  %o1 = output[output](None)\n  %o2 = output[output](None)\n}",
       "line 3, column 3: %o2 (output output): second output node"},
      {"graph {\n  %o = output[output](None)\n  %w = get_attr[w]()\n}",
       "line 2, column 3: %o (output output): output node is not last"},
      {"graph {\n  %x = call_function[aten::relu]()\n"
       "  %p = placeholder[p]()\n" +
           out,
       "line 3, column 3: %p (placeholder p): placeholder comes after %x"},
      {"graph {\n  %x = get_attr[a..b]()\n" + out,
       "line 2, column 17: malformed get_attr target \"a..b\""},
      {"graph {\n  %x = call_function[aten::relu](a=1, a=2)\n" + out,
       "line 2, column 3: %x (call_function aten::relu): kwarg a is given "
       "twice"},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<std::unique_ptr<Graph>> g = ParseGraph(c.text);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(g.status()), StartsWith(c.error));
  }
}

TEST(TextTest, ErrorShowsTheLineWithACaret) {
  absl::Status s =
      ParseGraph("graph {\n  %x = placeholder[x](1 2)\n}\n").status();
  EXPECT_EQ(Message(s),
            "line 2, column 25: expected ',' or ')' after argument, found '2'\n"
            "    %x = placeholder[x](1 2)\n"
            "                          ^");
}

TEST(TextTest, ErrorEscapesAndTrimsLongLines) {
  std::string line = "  %o = output[output](\"" + std::string(200, 'a') +
                     "\" \x01 " + std::string(200, 'b') + ")";
  absl::Status s = ParseGraph("graph {\n" + line + "\n}\n").status();
  std::string m = Message(s);
  EXPECT_THAT(m, StartsWith("line 2, column 226: expected ',' or ')' after "
                            "argument, found byte 0x01\n  ...aaa"));
  EXPECT_THAT(m, HasSubstr("aaa\" \\x01 bbb"));
  EXPECT_LT(m.size(), 400u);
}

}  // namespace
}  // namespace tracecut::ir
