// ParseArgs over CLI11: the flag forms the subcommands accept, the usage
// errors they print (in today's words), and the help layout.

#include "tools/cli/flags.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::tracecut::util::testing::StatusIs;

std::vector<FlagSpec> Flags() {
  return {
      FlagSpec::Value("leaf", "X", "a leaf module").Repeated(),
      FlagSpec::Value("output", "FILE", "where to write").Short('o'),
      FlagSpec::Value("rtol", "X", "relative tolerance"),
      FlagSpec::Bool("json", "print JSON"),
      FlagSpec::Bool("help", "show this help").Short('h'),
  };
}

TEST(ParseArgsTest, FlagForms) {
  std::vector<FlagSpec> flags = {
      FlagSpec::Value("leaf", "X", "").Repeated(),
      FlagSpec::Value("output", "FILE", "").Short('o'),
      FlagSpec::Bool("json", ""),
  };
  absl::StatusOr<ParsedArgs> a = ParseArgs(
      {"m.pt", "--leaf=a", "--leaf", "b", "-oout", "--json", "--", "--literal"},
      flags);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->positional(), ElementsAre("m.pt", "--literal"));
  EXPECT_THAT(a->GetAll("leaf"), ElementsAre("a", "b"));
  EXPECT_EQ(a->Get("output"), "out");
  EXPECT_TRUE(a->Has("json"));
  EXPECT_FALSE(a->Has("other"));
  absl::StatusOr<ParsedArgs> bad = ParseArgs({"--leaf="}, flags);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(IsUsageError(bad.status()));
}

TEST(ParseArgsTest, ValuesMayLookLikeFlags) {
  absl::StatusOr<ParsedArgs> a =
      ParseArgs({"-", "--rtol", "-1", "-o", "--json", "--output=x=y"},
                {FlagSpec::Value("rtol", "X", ""),
                 FlagSpec::Value("output", "FILE", "").Short('o').Repeated(),
                 FlagSpec::Bool("json", "")});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->positional(), ElementsAre("-"));
  EXPECT_EQ(a->Get("rtol"), "-1");
  EXPECT_THAT(a->GetAll("output"), ElementsAre("--json", "x=y"));
  EXPECT_FALSE(a->Has("json"));
}

TEST(ParseArgsTest, NothingGiven) {
  absl::StatusOr<ParsedArgs> a = ParseArgs({}, Flags());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->positional(), IsEmpty());
  EXPECT_FALSE(a->Has("leaf"));
  EXPECT_EQ(a->Get("output"), std::nullopt);
  EXPECT_THAT(a->GetAll("leaf"), IsEmpty());
}

TEST(ParseArgsTest, UsageErrorsInTheirOwnWords) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"m.pt", "--bogus"}, "unknown flag --bogus"},
      {{"m.pt", "--bogus=1", "x"}, "unknown flag --bogus"},
      {{"-xyz"}, "unknown flag -x"},
      {{"m.pt", "-o"}, "-o needs a value (FILE)"},
      {{"m.pt", "--output"}, "--output needs a value (FILE)"},
      {{"--leaf="}, "--leaf needs a non-empty value (X)"},
      {{"--rtol=", "-o", "out"}, "--rtol needs a non-empty value (X)"},
      {{"-o", ""}, "--output needs a non-empty value (FILE)"},
      {{"--json=yes"}, "--json takes no value"},
      {{"--json=true"}, "--json takes no value"},
      {{"--json="}, "--json takes no value"},
      {{"--output=a", "--output=b"}, "--output given more than once"},
      {{"--json", "--json"}, "--json given more than once"},
  };
  for (const auto& [args, message] : cases) {
    absl::StatusOr<ParsedArgs> a = ParseArgs(args, Flags());
    EXPECT_THAT(a, StatusIs(absl::StatusCode::kInvalidArgument, message))
        << args.front();
    EXPECT_TRUE(IsUsageError(a.status())) << args.front();
  }
}

TEST(ParseArgsTest, HelpFlag) {
  for (const char* help : {"--help", "-h"}) {
    absl::StatusOr<ParsedArgs> a = ParseArgs({"m.pt", help}, Flags());
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->Has("help"));
  }
}

TEST(FlagsHelpTest, Layout) {
  EXPECT_EQ(FlagsHelp("trace", "MODEL.pt [-o FILE]", "One line.",
                      "A paragraph.", Flags()),
            "usage: tracecut trace MODEL.pt [-o FILE]\n"
            "\n"
            "One line.\n"
            "\n"
            "A paragraph.\n"
            "\n"
            "flags:\n"
            "  --leaf=X           a leaf module (repeatable)\n"
            "  -o, --output=FILE  where to write\n"
            "  --rtol=X           relative tolerance\n"
            "  --json             print JSON\n"
            "  -h, --help         show this help\n");
  EXPECT_EQ(FlagsHelp("demo", "[--json]", "One line.", "",
                      {FlagSpec::Bool("json", "print JSON")}),
            "usage: tracecut demo [--json]\n"
            "\n"
            "One line.\n"
            "\n"
            "flags:\n"
            "  --json  print JSON\n");
}

}  // namespace
}  // namespace tracecut::cli
