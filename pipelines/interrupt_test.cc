#include "pipelines/interrupt.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

TEST(InterruptTest, NoSignalIsOk) {
  SetInterruptForTesting(0);
  EXPECT_EQ(InterruptSignal(), 0);
  EXPECT_OK(CheckInterrupt());
}

TEST(InterruptTest, ARecordedSignalCancelsNamingIt) {
  SetInterruptForTesting(SIGTERM);
  EXPECT_THAT(CheckInterrupt(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("SIGTERM")));
  SetInterruptForTesting(SIGINT);
  EXPECT_THAT(CheckInterrupt(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("SIGINT")));
  SetInterruptForTesting(0);
}

// The handlers run in a child (death test): the first SIGINT is recorded
// and the process goes on; the second ends it the default way.
TEST(InterruptTest, FirstSignalIsRecordedSecondKills) {
  EXPECT_EXIT(
      {
        SetInterruptForTesting(0);
        InstallInterruptHandlers();
        std::raise(SIGINT);
        if (InterruptSignal() != SIGINT || CheckInterrupt().ok()) _exit(3);
        std::raise(SIGINT);
        _exit(4);  // Not reached.
      },
      ::testing::KilledBySignal(SIGINT), "");
}

TEST(InterruptTest, SigtermIsRecordedToo) {
  EXPECT_EXIT(
      {
        SetInterruptForTesting(0);
        InstallInterruptHandlers();
        std::raise(SIGTERM);
        _exit(InterruptSignal() == SIGTERM ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tracecut::pipelines
