#include "util/progress.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"

namespace tracecut::util {
namespace {

struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::function<absl::Time()> Fn() {
    return [this] { return now; };
  }
};

ProgressPoint Point(int subgraph, const char* stage, int64_t batch,
                    int64_t batches) {
  ProgressPoint p;
  p.subgraph = subgraph;
  p.num_subgraphs = 3;
  p.label = "model.layers.0";
  p.stage = stage;
  p.batch = batch;
  p.num_batches = batches;
  return p;
}

TEST(ProgressTest, PlainLinesPerStepOffATerminal) {
  std::ostringstream out;
  FakeClock clock;
  Progress p(&out, /*live=*/false, clock.Fn());
  p.Begin(10);
  clock.now += absl::Seconds(2);
  p.Advance(4);
  p.Update(Point(1, "calibrate", 4, 4));  // No output off a terminal.
  EXPECT_EQ(out.str(), "");
  p.EndStep(Point(1, "calibrate", 4, 4));
  EXPECT_EQ(out.str(),
            "[tracecut] subgraph 2/3 model.layers.0  calibrate  batch 4/4  "
            "elapsed 2.0s  eta 3.0s\n");
  p.Note("hello");
  EXPECT_TRUE(absl::EndsWith(out.str(), "[tracecut] hello\n"));
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

TEST(ProgressTest, LiveLineIsRewrittenInPlace) {
  std::ostringstream out;
  FakeClock clock;
  Progress p(&out, /*live=*/true, clock.Fn());
  p.Begin(4);
  p.Advance(1);
  clock.now += absl::Seconds(1);
  p.Update(Point(0, "calibrate", 1, 4));
  EXPECT_TRUE(absl::StartsWith(out.str(), "\r\x1b[K[tracecut] subgraph 1/3"))
      << out.str();
  EXPECT_TRUE(absl::StrContains(out.str(), "eta 3.0s")) << out.str();
  // Redraws are rate-limited.
  size_t before = out.str().size();
  p.Update(Point(0, "calibrate", 2, 4));
  EXPECT_EQ(out.str().size(), before);
  clock.now += absl::Seconds(1);
  p.Update(Point(0, "calibrate", 2, 4));
  EXPECT_GT(out.str().size(), before);
  EXPECT_EQ(out.str().find('\n'), std::string::npos);
  p.Finish("done");
  EXPECT_TRUE(absl::EndsWith(out.str(), "\r\x1b[K[tracecut] done in 2.0s\n"))
      << out.str();
}

TEST(ProgressTest, FormatDuration) {
  EXPECT_EQ(Progress::FormatDuration(absl::Milliseconds(400)), "0.4s");
  EXPECT_EQ(Progress::FormatDuration(absl::Seconds(185)), "3m05s");
  EXPECT_EQ(Progress::FormatDuration(absl::Minutes(62)), "1h02m");
  EXPECT_EQ(Progress::FormatDuration(-absl::Seconds(1)), "0.0s");
}

}  // namespace
}  // namespace tracecut::util
