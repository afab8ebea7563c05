#include "checkpoint/safetensors_header.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::checkpoint {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

// A safetensors image: the 8-byte little-endian length, `header`, `data`.
std::string Image(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 255);
  return out + header + data;
}

TEST(SafetensorsHeaderTest, ReadsAValidHeader) {
  // Listed out of order: only the sorted ranges must tile the data.
  const std::string image = Image(
      R"({"__metadata__": {"format": "pt"},
          "b": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 12]},
          "a": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]},
          "empty": {"dtype": "I64", "shape": [0, 3], "data_offsets": [12, 12]}
         })",
      std::string(12, 'x'));
  ASSERT_OK_AND_ASSIGN(SafetensorsHeader h, ParseSafetensorsHeader(image, "f"));
  EXPECT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors.at("a").dtype, "F32");
  EXPECT_THAT(h.tensors.at("a").shape, ElementsAre(1, 2));
  EXPECT_EQ(h.tensors.at("b").begin, 8u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_start, image.size() - 12);
}

// Each malformed header the reference implementation refuses (its error
// name in the comment), refused here naming the file and what is wrong.
TEST(SafetensorsHeaderTest, RefusesWhatTheReferenceRefuses) {
  struct Case {
    const char* what;
    std::string image;
    const char* message;
  };
  const std::string f32x2 = R"("dtype": "F32", "shape": [2])";
  std::string too_large(8, '\0');
  too_large[0] = static_cast<char>(0x01);
  too_large[3] = static_cast<char>(0x10);  // 0x10000001 bytes: > 100 MB.
  const Case cases[] = {
      {"HeaderTooSmall", "abc", "no header length"},
      {"HeaderTooLarge", too_large + "{}", "100000000-byte limit"},
      {"InvalidHeaderLength", Image("{}", "").substr(0, 9), "truncated"},
      {"InvalidHeaderDeserialization", Image("{\"a\": ", ""), "not JSON"},
      {"InvalidHeader (UTF-8)", Image("{\"\xff\": 1}", ""), "not JSON"},
      {"not an object", Image("[1, 2]", ""), "not a JSON object"},
      {"duplicate tensor",
       Image(absl::StrCat(R"({"t": {)", f32x2, R"(, "data_offsets": [0, 8]},)",
                          R"("t": {)", f32x2, R"(, "data_offsets": [8, 16]}})"),
             std::string(16, 'x')),
       "names 't' twice"},
      {"duplicate field",
       Image(absl::StrCat(R"({"t": {)", f32x2,
                          R"(, "shape": [4], "data_offsets": [0, 8]}})"),
             std::string(8, 'x')),
       "names 'shape' twice"},
      {"unknown dtype",
       Image(R"({"t": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})",
             std::string(8, 'x')),
       "unknown dtype \"Q4\""},
      {"negative dimension",
       Image(
           R"({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
           std::string(8, 'x')),
       "dimension -2"},
      {"fractional dimension",
       Image(
           R"({"t": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})",
           std::string(8, 'x')),
       "dimension 2.0"},
      {"negative offset",
       Image(
           absl::StrCat(R"({"t": {)", f32x2, R"(, "data_offsets": [-8, 0]}})"),
           std::string(8, 'x')),
       "data_offsets needs 2"},
      {"three offsets",
       Image(absl::StrCat(R"({"t": {)", f32x2,
                          R"(, "data_offsets": [0, 8, 9]}})"),
             std::string(8, 'x')),
       "data_offsets needs 2"},
      {"ValidationOverflow",
       Image(R"({"t": {"dtype": "F64", "shape": [4294967296, 4294967296],
                 "data_offsets": [0, 8]}})",
             std::string(8, 'x')),
       "overflows"},
      {"TensorInvalidInfo",
       Image(R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
             std::string(8, 'x')),
       "need 12"},
      {"InvalidOffset (overlap)",
       Image(absl::StrCat(R"({"q": {)", f32x2, R"(, "data_offsets": [0, 8]},)",
                          R"("o": {)", f32x2, R"(, "data_offsets": [4, 12]}})"),
             std::string(12, 'x')),
       "tensor 'o' starts at byte 4"},
      {"InvalidOffset (same bytes)",
       Image(absl::StrCat(R"({"q": {)", f32x2, R"(, "data_offsets": [0, 8]},)",
                          R"("o": {)", f32x2, R"(, "data_offsets": [0, 8]}})"),
             std::string(8, 'x')),
       "starts at byte 0"},
      {"InvalidOffset (gap)",
       Image(
           absl::StrCat(R"({"t": {)", f32x2, R"(, "data_offsets": [4, 12]}})"),
           std::string(12, 'x')),
       "starts at byte 4"},
      {"MetadataIncompleteBuffer (trailing)",
       Image(absl::StrCat(R"({"t": {)", f32x2, R"(, "data_offsets": [0, 8]}})"),
             std::string(9, 'x')),
       "trailing"},
      {"past the end",
       Image(absl::StrCat(R"({"t": {)", f32x2, R"(, "data_offsets": [0, 8]}})"),
             std::string(4, 'x')),
       "truncated"},
      {"metadata not strings", Image(R"({"__metadata__": {"n": 1}})", ""),
       "'n' is not a string"},
      {"entry not an object", Image(R"({"t": 3})", ""), "not an object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_THAT(ParseSafetensorsHeader(c.image, "x.safetensors").status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(HasSubstr("x.safetensors"),
                                          HasSubstr(c.message))));
  }
}

TEST(SafetensorsHeaderTest, EmptyFileOfTensorsIsValid) {
  EXPECT_OK(ParseSafetensorsHeader(Image("{}", ""), "f"));
  EXPECT_OK(ParseSafetensorsHeader(Image("{}      ", ""), "f"));
}

TEST(SafetensorsHeaderTest, DTypeBits) {
  EXPECT_EQ(SafetensorsDTypeBits("BF16"), 16);
  EXPECT_EQ(SafetensorsDTypeBits("F8_E4M3"), 8);
  EXPECT_EQ(SafetensorsDTypeBits("f32"), 0);
}

}  // namespace
}  // namespace tracecut::checkpoint
