#include "ir/proto.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "ir/graph.pb.h"
#include "ir/testing/test_graphs.h"
#include "ir/text.h"
#include "util/testing/status_matchers.h"

namespace tracecut::ir {
namespace {

using test_graphs::ParseOrDie;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

const char kSmall[] = R"(graph {
  %x = placeholder[x]()
  %w = get_attr[fc.weight]()
  %linear = call_function[aten::linear](%x, %w, None)
  %output = output[output](%linear)
}
)";

TEST(ProtoTest, RoundTripsVariedGraphs) {
  for (const test_graphs::NamedGraph& c : test_graphs::VariedGraphs()) {
    SCOPED_TRACE(c.name);
    GraphProto proto;
    ToProto(*c.graph, &proto);
    absl::StatusOr<std::unique_ptr<Graph>> back = FromProto(proto);
    ASSERT_OK(back);
    EXPECT_TRUE(StructurallyEqual(*c.graph, **back));
    // Text -> proto -> text is the identity.
    EXPECT_EQ(PrintGraph(**back), PrintGraph(*c.graph));
  }
}

TEST(ProtoTest, BinaryRoundTripIsExactAndDeterministic) {
  for (const test_graphs::NamedGraph& c : test_graphs::VariedGraphs()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::string> bytes = SerializeGraph(*c.graph);
    ASSERT_OK(bytes);
    absl::StatusOr<std::unique_ptr<Graph>> back = DeserializeGraph(*bytes);
    ASSERT_OK(back);
    EXPECT_TRUE(StructurallyEqual(*c.graph, **back));
    // The same graph, rebuilt, serializes to the same bytes.
    EXPECT_EQ(*SerializeGraph(**back), *bytes);
    EXPECT_EQ(*SerializeGraph(*c.graph->Clone()), *bytes);
  }
}

TEST(ProtoTest, DeepNestingWithinTheTextLimitSurvivesTheWire) {
  std::string deep =
      std::string(kMaxTextNesting, '[') + std::string(kMaxTextNesting, ']');
  std::unique_ptr<Graph> g = ParseOrDie(
      "graph {\n  %x = placeholder[x]()\n"
      "  %output = output[output](" +
      deep + ")\n}\n");
  g->FindNode("x")->meta().extra["deep"] = g->output_node()->args()[0];
  absl::StatusOr<std::unique_ptr<Graph>> back =
      DeserializeGraph(*SerializeGraph(*g));
  ASSERT_OK(back);
  EXPECT_TRUE(StructurallyEqual(*g, **back));
}

TEST(ProtoTest, RejectsNestingBeyondTheLimit) {
  GraphProto proto;
  NodeProto* out = proto.add_nodes();
  out->set_name("output");
  out->set_op(OUTPUT);
  out->set_target("output");
  ArgumentProto* a = out->add_args();
  for (int i = 0; i < kMaxTextNesting + 1; ++i) {
    a = a->mutable_list()->add_elements();
  }
  a->mutable_none();
  EXPECT_THAT(Message(FromProto(proto).status()),
              HasSubstr("nest deeper than 256"));
}

TEST(ProtoTest, EmptyMetaIsLeftOut) {
  std::unique_ptr<Graph> g = ParseOrDie(kSmall);
  GraphProto proto;
  ToProto(*g, &proto);
  EXPECT_FALSE(proto.nodes(0).has_meta());
  EXPECT_EQ(proto.nodes(2).args(1).node(), "w");
  EXPECT_TRUE(proto.nodes(2).args(2).has_none());
}

TEST(ProtoTest, ToProtoOverwrites) {
  GraphProto proto;
  ToProto(*ParseOrDie(kSmall), &proto);
  ToProto(*test_graphs::VariedGraph("minimal"), &proto);
  EXPECT_EQ(proto.nodes_size(), 1);
}

// Builds the proto of kSmall, lets `edit` break it, and returns FromProto's
// error.
template <typename Edit>
std::string ErrorAfter(Edit edit, FromProtoOptions options = {}) {
  GraphProto proto;
  ToProto(*ParseOrDie(kSmall), &proto);
  edit(proto);
  absl::StatusOr<std::unique_ptr<Graph>> g = FromProto(proto, options);
  EXPECT_FALSE(g.ok());
  if (!g.ok()) {
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  }
  return g.ok() ? "" : Message(g.status());
}

TEST(ProtoTest, RejectsUndefinedReference) {
  EXPECT_EQ(ErrorAfter([](GraphProto& p) {
              p.mutable_nodes(2)->mutable_args(1)->set_node("nope");
            }),
            "GraphProto node #2 %linear: references undefined node %nope");
}

TEST(ProtoTest, RejectsLaterReference) {
  EXPECT_EQ(ErrorAfter([](GraphProto& p) {
              p.mutable_nodes(2)->mutable_args(0)->set_node("output");
            }),
            "GraphProto node #2 %linear: references %output (node #3), "
            "which does not come before it");
  EXPECT_THAT(ErrorAfter([](GraphProto& p) {
                p.mutable_nodes(2)->mutable_args(0)->set_node("linear");
              }),
              HasSubstr("references %linear (node #2)"));
}

TEST(ProtoTest, RejectsBadOpKind) {
  EXPECT_EQ(ErrorAfter([](GraphProto& p) {
              p.mutable_nodes(1)->set_op(static_cast<OpKindProto>(99));
            }),
            "GraphProto node #1 %w: invalid op kind 99");
  EXPECT_EQ(ErrorAfter([](GraphProto& p) {
              p.mutable_nodes(1)->set_op(OP_KIND_UNSPECIFIED);
            }),
            "GraphProto node #1 %w: invalid op kind 0");
}

TEST(ProtoTest, RejectsDuplicateAndInvalidNames) {
  EXPECT_EQ(
      ErrorAfter([](GraphProto& p) { p.mutable_nodes(1)->set_name("x"); }),
      "GraphProto node #1 %x: duplicate name; node #0 has it too");
  EXPECT_EQ(
      ErrorAfter([](GraphProto& p) { p.mutable_nodes(1)->set_name("9w"); }),
      "GraphProto node #1 %\"9w\": name \"9w\" is not an identifier");
  EXPECT_THAT(
      ErrorAfter([](GraphProto& p) { p.mutable_nodes(1)->set_name(""); }),
      HasSubstr("is not an identifier"));
}

TEST(ProtoTest, RejectsNonUtf8NamesQuietly) {
  // Found by fuzzing: while names were proto3 `string`s, libprotobuf logged
  // an error line to stderr for each non-UTF-8 one it parsed.
  GraphProto proto;
  ToProto(*ParseOrDie(kSmall), &proto);
  proto.mutable_nodes(1)->set_name("w\xff");
  proto.mutable_nodes(2)->mutable_args(1)->set_node("w\xff");
  std::string bytes = proto.SerializeAsString();
  ::testing::internal::CaptureStderr();
  absl::Status s = DeserializeGraph(bytes).status();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(Message(s),
            "GraphProto node #1 %\"w\\377\": name \"w\\377\" is not an "
            "identifier");
}

TEST(ProtoTest, RejectsArgumentWithoutValue) {
  EXPECT_EQ(ErrorAfter([](GraphProto& p) {
              p.mutable_nodes(2)->mutable_args(2)->clear_none();
            }),
            "GraphProto node #2 %linear: an argument has no value (None is "
            "`none`)");
}

TEST(ProtoTest, RejectsReferencesInMeta) {
  EXPECT_EQ(ErrorAfter([](GraphProto& p) {
              MetaEntryProto* e =
                  p.mutable_nodes(2)->mutable_meta()->add_extra();
              e->set_key("k");
              e->mutable_value()->set_node("x");
            }),
            "GraphProto node #2 %linear: meta value references %x; meta "
            "values must be constants");
  EXPECT_EQ(ErrorAfter([](GraphProto& p) {
              MetaEntryProto* e = p.add_extra();
              e->set_key("k");
              e->mutable_value()->set_node("x");
            }),
            "GraphProto graph meta: meta value references %x; meta values "
            "must be constants");
}

TEST(ProtoTest, RejectsDuplicateMetaKeys) {
  EXPECT_THAT(ErrorAfter([](GraphProto& p) {
                for (int i = 0; i < 2; ++i) {
                  MetaEntryProto* e =
                      p.mutable_nodes(0)->mutable_meta()->add_extra();
                  e->set_key("k");
                  e->mutable_value()->set_int_value(i);
                }
              }),
              HasSubstr("node #0 %x: meta key \"k\" given twice"));
  EXPECT_THAT(ErrorAfter([](GraphProto& p) {
                TransformMarkProto* t =
                    p.mutable_nodes(0)->mutable_meta()->add_transforms();
                t->set_pass("p");
                t->add_data()->set_key("k");
                t->add_data()->set_key("k");
              }),
              HasSubstr("transform mark \"p\" has key \"k\" twice"));
  EXPECT_THAT(ErrorAfter([](GraphProto& p) {
                for (int i = 0; i < 2; ++i) p.add_extra()->set_key("k");
                p.mutable_extra(0)->mutable_value()->mutable_none();
                p.mutable_extra(1)->mutable_value()->mutable_none();
              }),
              HasSubstr("graph meta key \"k\" given twice"));
}

TEST(ProtoTest, VerifiesTheResult) {
  EXPECT_EQ(ErrorAfter([](GraphProto& p) {
              p.mutable_nodes(1)->set_target("fc..weight");
            }),
            "GraphProto node #1 %w: %w (get_attr fc..weight): malformed "
            "get_attr target \"fc..weight\": expected a dotted path of "
            "non-empty segments without '.' (any other characters allowed, "
            "as in PyTorch), e.g. \"model.layers.0.mlp\"");
  EXPECT_THAT(ErrorAfter([](GraphProto& p) {
                p.mutable_nodes(1)->add_scope()->set_path("fc.");
              }),
              HasSubstr("scope entry"));
  EXPECT_EQ(ErrorAfter([](GraphProto& p) { p.mutable_nodes()->RemoveLast(); }),
            "GraphProto: graph: graph has no output node");
  // Unverified loading keeps the broken graph, exactly.
  GraphProto proto;
  ToProto(*ParseOrDie(kSmall), &proto);
  proto.mutable_nodes()->RemoveLast();
  FromProtoOptions unverified;
  unverified.verify = false;
  absl::StatusOr<std::unique_ptr<Graph>> g = FromProto(proto, unverified);
  ASSERT_OK(g);
  GraphProto again;
  ToProto(**g, &again);
  EXPECT_EQ(again.SerializeAsString(), proto.SerializeAsString());
}

TEST(ProtoTest, ModulePathsPyTorchAllowsRoundTrip) {
  // Bytes fields: non-ASCII, quotes, control characters and even bytes that
  // are not UTF-8 survive the wire.
  std::unique_ptr<Graph> g = ParseOrDie(R"(graph {
  %x = placeholder[x]()
  %w = get_attr["trunk_output.block1.block1-0.proj.0.weight"]() scope[:"RegNet", "trunk_output.block1.block1-0":"ResBottleneckBlock"]
  %m = call_module["0.bl\xc3\xb6ck 1.q\"\\.\n\xff"](%x, %w) scope[:"RegNet", "0.bl\xc3\xb6ck 1.q\"\\.\n\xff":"T"]
  %output = output[output](%m)
}
)");
  absl::StatusOr<std::string> bytes = SerializeGraph(*g);
  ASSERT_OK(bytes);
  absl::StatusOr<std::unique_ptr<Graph>> back = DeserializeGraph(*bytes);
  ASSERT_OK(back);
  EXPECT_TRUE(StructurallyEqual(*g, **back));
  EXPECT_EQ((*back)->FindNode("m")->target(),
            "0.bl\xc3\xb6"
            "ck 1.q\"\\.\n\xff");
  EXPECT_EQ(PrintGraph(**back), PrintGraph(*g));
}

TEST(ProtoTest, DeserializeRejectsGarbage) {
  EXPECT_THAT(Message(DeserializeGraph("\xff\xff\xff").status()),
              StartsWith("not a serialized GraphProto"));
  std::string bytes = *SerializeGraph(*ParseOrDie(kSmall));
  EXPECT_FALSE(DeserializeGraph(bytes.substr(0, bytes.size() - 3)).ok());
  EXPECT_OK(DeserializeGraph(bytes));
}

}  // namespace
}  // namespace tracecut::ir
