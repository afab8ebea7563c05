#include "util/json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::util {
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::IsOk;
using ::tracecut::util::testing::StatusIs;

TEST(JsonTest, ParsesEveryKind) {
  absl::StatusOr<Json> j = ParseJson(
      R"( {"a": 1, "b": -2.5e1, "c": "x\ny\u00e9\ud83d\ude00", "d": [true, false, null],
          "e": {}, "f": [], "g": 9223372036854775807, "h": 18446744073709551615} )");
  ASSERT_THAT(j, IsOk());
  EXPECT_TRUE(FindMember(*j, "a")->is_number_integer());
  EXPECT_EQ(FindMember(*j, "a")->get<int64_t>(), 1);
  EXPECT_EQ(FindMember(*j, "b")->get<double>(), -25.0);
  EXPECT_EQ(FindMember(*j, "c")->get<std::string>(),
            "x\ny\xc3\xa9\xf0\x9f\x98\x80");
  ASSERT_EQ(FindMember(*j, "d")->size(), 3u);
  EXPECT_TRUE((*FindMember(*j, "d"))[2].is_null());
  EXPECT_TRUE(FindMember(*j, "e")->is_object());
  EXPECT_TRUE(FindMember(*j, "f")->is_array());
  EXPECT_EQ(FindMember(*j, "g")->get<int64_t>(),
            std::numeric_limits<int64_t>::max());
  // Beyond int64: a double, not a wrapped integer.
  EXPECT_EQ(JsonTypeName(*FindMember(*j, "h")), "number");
  EXPECT_EQ(FindMember(*j, "missing"), nullptr);
  EXPECT_EQ(FindMember(Json(1), "a"), nullptr);
  EXPECT_EQ(j->begin().key(), "a");  // Order kept.
}

TEST(JsonTest, IntegersAreSignedLikeTheValuesCallersBuild) {
  absl::StatusOr<Json> j = ParseJson(R"({"n": 3})");
  ASSERT_THAT(j, IsOk());
  EXPECT_TRUE((*j)["n"].is_number_integer());
  EXPECT_FALSE((*j)["n"].is_number_unsigned());
  EXPECT_EQ(*j, Json::object({{"n", int64_t{3}}}));
}

TEST(JsonTest, TypeNames) {
  EXPECT_EQ(JsonTypeName(Json()), "null");
  EXPECT_EQ(JsonTypeName(Json(true)), "bool");
  EXPECT_EQ(JsonTypeName(Json(3)), "integer");
  EXPECT_EQ(JsonTypeName(Json(size_t{3})), "integer");
  EXPECT_EQ(JsonTypeName(Json(2.5)), "number");
  EXPECT_EQ(JsonTypeName(Json("s")), "string");
  EXPECT_EQ(JsonTypeName(Json::array()), "array");
  EXPECT_EQ(JsonTypeName(Json::object()), "object");
}

TEST(JsonTest, RejectsNonStrictInputNamingTheSource) {
  for (const char* bad :
       {"", "{", "[1,]", "{\"a\":1,}", "{'a':1}", "01", "1.", ".5", "NaN",
        "[1] 2", "\"\\x\"", "\"\\ud800\"", "{\"a\":1,\"a\":2}", "tru",
        "\"tab\there\"", "// c\n1", "1e400"}) {
    EXPECT_THAT(
        ParseJson(bad, "f.json"),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("f.json:")))
        << bad;
  }
  // Line and column of where the parser stopped.
  EXPECT_THAT(
      ParseJson("{\n  \"a\": 1\n  \"b\": 2}", "c.json"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("c.json:3:5: syntax error while parsing object")));
  EXPECT_THAT(ParseJson(R"({"a": )", "cfg.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cfg.json:1:7: ")));
  EXPECT_THAT(ParseJson(R"({"a": {"b": 1, "b": 2}})", "d.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("d.json: duplicate key \"b\"")));
  // The same key in sibling objects is fine.
  EXPECT_THAT(ParseJson(R"([{"b": 1}, {"b": 2}])"), IsOk());
}

TEST(JsonTest, DeepNestingIsAnErrorNotACrash) {
  std::string deep(100000, '[');
  EXPECT_THAT(ParseJson(deep, "deep.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("nesting too deep")));
  std::string ok = std::string(100, '[') + std::string(100, ']');
  EXPECT_THAT(ParseJson(ok), IsOk());
}

TEST(JsonTest, DumpsDeterministicallyAndRoundTrips) {
  Json o = Json::object();
  o["z"] = 1;
  o["a"] = 0.1;
  o["s"] = "q\"\\\n\x01";
  o["l"] = Json::array({true, nullptr, 2.0});
  EXPECT_EQ(DumpJson(o),
            R"({"z":1,"a":0.1,"s":"q\"\\\n\u0001","l":[true,null,2.0]})");
  EXPECT_EQ(DumpJson(o, 2),
            "{\n  \"z\": 1,\n  \"a\": 0.1,\n  \"s\": "
            "\"q\\\"\\\\\\n\\u0001\",\n  \"l\": [\n    true,\n    "
            "null,\n    2.0\n  ]\n}");
  absl::StatusOr<Json> back = ParseJson(DumpJson(o));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, o);
  o["z"] = "replaced";
  EXPECT_EQ(o.size(), 4u);
  EXPECT_EQ(o.begin().key(), "z");
  EXPECT_EQ(DumpJson(Json(std::nan(""))), "null");
  EXPECT_EQ(DumpJson(Json(1e-6)), "1e-06");
  EXPECT_EQ(DumpJson(Json::object(), 2), "{}");
  EXPECT_EQ(DumpJson(Json::array(), 2), "[]");
  // Invalid UTF-8 does not throw.
  EXPECT_EQ(DumpJson(Json("a\xff")), "\"a\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace tracecut::util
