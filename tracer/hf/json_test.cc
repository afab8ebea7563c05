#include "tracer/hf/json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tracecut::tracer::hf {
namespace {

using ::testing::HasSubstr;

TEST(JsonTest, ParsesEveryKind) {
  absl::StatusOr<Json> j = Json::Parse(
      R"( {"a": 1, "b": -2.5e1, "c": "x\ny\u00e9\ud83d\ude00", "d": [true, false, null],
          "e": {}, "f": [], "g": 9223372036854775807, "h": 1e400} )");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_TRUE(j->Find("a")->is_int());
  EXPECT_EQ(j->Find("a")->as_int(), 1);
  EXPECT_EQ(j->Find("b")->as_double(), -25.0);
  EXPECT_EQ(j->Find("c")->as_string(), "x\ny\xc3\xa9\xf0\x9f\x98\x80");
  ASSERT_EQ(j->Find("d")->elements().size(), 3u);
  EXPECT_TRUE(j->Find("d")->elements()[2].is_null());
  EXPECT_TRUE(j->Find("e")->is_object());
  EXPECT_TRUE(j->Find("f")->is_array());
  EXPECT_EQ(j->Find("g")->as_int(), INT64_MAX);
  EXPECT_EQ(j->Find("missing"), nullptr);
  EXPECT_EQ(j->members()[0].first, "a");  // Order kept.
}

TEST(JsonTest, RejectsNonStrictInputWithLineAndColumn) {
  for (const char* bad :
       {"", "{", "[1,]", "{\"a\":1,}", "{'a':1}", "01", "1.", ".5", "NaN",
        "[1] 2", "\"\\x\"", "\"\\ud800\"", "{\"a\":1,\"a\":2}", "tru",
        "\"tab\there\"", "// c\n1"}) {
    absl::StatusOr<Json> j = Json::Parse(bad, "f.json");
    EXPECT_FALSE(j.ok()) << bad;
    if (!j.ok()) {
      EXPECT_THAT(j.status().message(), HasSubstr("f.json:")) << bad;
    }
  }
  absl::StatusOr<Json> j = Json::Parse("{\n  \"a\": 1\n  \"b\": 2}", "c.json");
  ASSERT_FALSE(j.ok());
  EXPECT_THAT(j.status().message(), HasSubstr("c.json:3:3"));
}

TEST(JsonTest, DeepNestingIsAnErrorNotACrash) {
  std::string deep(100000, '[');
  EXPECT_FALSE(Json::Parse(deep).ok());
}

TEST(JsonTest, DumpsDeterministicallyAndRoundTrips) {
  Json o = Json::MakeObject();
  o.Set("z", Json(int64_t{1}));
  o.Set("a", Json(0.1));
  o.Set("s", Json("q\"\\\n\x01"));
  o.Set("l", Json::MakeArray({Json(true), Json(), Json(2.0)}));
  EXPECT_EQ(o.Dump(),
            R"({"z":1,"a":0.1,"s":"q\"\\\n\u0001","l":[true,null,2.0]})");
  EXPECT_EQ(o.Dump(2),
            "{\n  \"z\": 1,\n  \"a\": 0.1,\n  \"s\": "
            "\"q\\\"\\\\\\n\\u0001\",\n  \"l\": [\n    true,\n    "
            "null,\n    2.0\n  ]\n}");
  absl::StatusOr<Json> back = Json::Parse(o.Dump());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, o);
  o.Set("z", Json("replaced"));
  EXPECT_EQ(o.members().size(), 4u);
  EXPECT_EQ(Json(std::nan("")).Dump(), "null");
}

}  // namespace
}  // namespace tracecut::tracer::hf
