#include "runtime/op_schema.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"

namespace tracecut::runtime {
namespace {

using ir::Argument;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(OpSchemaTest, ParsesOperatorNames) {
  c10::OperatorName a = ParseOperatorName("aten::add.Tensor");
  EXPECT_EQ(a.name, "aten::add");
  EXPECT_EQ(a.overload_name, "Tensor");
  c10::OperatorName b = ParseOperatorName("aten::linear");
  EXPECT_EQ(b.name, "aten::linear");
  EXPECT_EQ(b.overload_name, "");
  c10::OperatorName c = ParseOperatorName("aten::__getitem__.t");
  EXPECT_EQ(c.name, "aten::__getitem__");
  EXPECT_EQ(c.overload_name, "t");
}

TEST(OpSchemaTest, ResolvesOperators) {
  for (const char* target : {"aten::linear", "aten::add.Tensor",
                             "aten::size.int", "prim::NumToTensor.Scalar",
                             "aten::__getitem__.t", "aten::split.Tensor"}) {
    absl::StatusOr<std::shared_ptr<torch::jit::Operator>> op =
        ResolveOperator(target);
    ASSERT_TRUE(op.ok()) << target << ": " << op.status();
    const c10::FunctionSchema& s = (*op)->schema();
    EXPECT_EQ(s.overload_name().empty() ? s.name()
                                        : s.name() + "." + s.overload_name(),
              target);
  }
  EXPECT_EQ(ResolveOperator("aten::nope").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ResolveOperator("aten::relu.Foo").status()),
              HasSubstr("known: aten::relu"));
}

TEST(OpSchemaTest, DTypeNamesRoundTrip) {
  for (const char* name :
       {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16",
        "int8", "uint8", "bool", "complex64", "complex128"}) {
    absl::StatusOr<c10::ScalarType> t = ParseDType(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(DTypeName(*t), name);
  }
  EXPECT_EQ(*ParseDType("torch.float"), c10::ScalarType::Float);
  EXPECT_EQ(*ParseDType("half"), c10::ScalarType::Half);
  EXPECT_FALSE(ParseDType("float8").ok());
}

TEST(OpSchemaTest, ConvertsConstantsForSchemaTypes) {
  c10::IValue v = *ConstantToIValue(Argument::Int(2), c10::FloatType::get());
  EXPECT_TRUE(v.isDouble());
  EXPECT_EQ(v.toDouble(), 2.0);
  v = *ConstantToIValue(Argument::DType("bfloat16"), c10::IntType::get());
  EXPECT_EQ(v.toInt(), static_cast<int64_t>(c10::ScalarType::BFloat16));
  v = *ConstantToIValue(Argument::Device("cpu"), c10::DeviceObjType::get());
  EXPECT_TRUE(v.isDevice());
  v = *ConstantToIValue(Argument::List({Argument::Int(1), Argument::Int(2)}),
                        c10::ListType::ofFloats());
  ASSERT_TRUE(v.isDoubleList());
  EXPECT_EQ(v.toDoubleList().get(1), 2.0);
  v = *ConstantToIValue(Argument::List({Argument::Int(1), Argument::Int(2)}),
                        nullptr);
  EXPECT_TRUE(v.isIntList());
  v = *ConstantToIValue(Argument::None(),
                        c10::OptionalType::create(c10::IntType::get()));
  EXPECT_TRUE(v.isNone());
  v = *ConstantToIValue(
      Argument::Tuple({Argument::Int(1), Argument::String("a")}), nullptr);
  ASSERT_TRUE(v.isTuple());
  EXPECT_EQ(v.toTupleRef().elements()[1].toStringRef(), "a");
  EXPECT_FALSE(ConstantToIValue(Argument::Device("gpu:x"), nullptr).ok());
}

TEST(OpSchemaTest, BindsPositionalKwargsAndDefaults) {
  ir::Graph g;
  ir::Node* x = *g.Placeholder("x");
  ir::Node* n = *g.CallFunction("aten::sum.dim_IntList",
                                {Argument::Ref(x), Argument::List({})},
                                {{"dtype", Argument::DType("float32")}});
  const c10::FunctionSchema& schema =
      (*ResolveOperator("aten::sum.dim_IntList"))->schema();
  absl::StatusOr<std::vector<const ir::Argument*>> bound =
      BindArguments(*n, schema);
  ASSERT_TRUE(bound.ok()) << bound.status();
  ASSERT_EQ(bound->size(), 4u);  // self, dim, keepdim, dtype
  EXPECT_EQ((*bound)[0], &n->args()[0]);
  EXPECT_EQ((*bound)[1], &n->args()[1]);
  EXPECT_EQ((*bound)[2], nullptr);  // keepdim=False by default.
  EXPECT_EQ((*bound)[3], n->kwarg("dtype"));
}

}  // namespace
}  // namespace tracecut::runtime
