#include <string>

#include "gtest/gtest.h"
#include "util/format.h"
#include "util/hash.h"

namespace tracecut::util {
namespace {

TEST(Fnv1a64Test, KnownValuesAndChaining) {
  // Reference values of FNV-1a 64 (Fowler/Noll/Vo test suite).
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ULL);
  EXPECT_EQ(Fnv1a64("bar", Fnv1a64("foo")), Fnv1a64("foobar"));
}

TEST(HumanBytesTest, Units) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1.0 KiB");
  EXPECT_EQ(HumanBytes(8178892), "7.8 MiB");
  EXPECT_EQ(HumanBytes(int64_t{1} << 30), "1.0 GiB");
  EXPECT_EQ(HumanBytes(int64_t{3} << 50), "3.0 PiB");
}

}  // namespace
}  // namespace tracecut::util
