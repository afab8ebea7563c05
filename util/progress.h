#ifndef TRACECUT_UTIL_PROGRESS_H_
#define TRACECUT_UTIL_PROGRESS_H_

// Progress of a calibration run on stderr (or any stream): which subgraph,
// which pass, which batch, time elapsed and an estimate of the time left.
//
//   Progress progress = Progress::ForStderr();
//   progress.Begin(/*total_units=*/120);
//   ProgressPoint point;  // subgraph 2 of 5, "calibrate", batch 3 of 8
//   progress.Update(point);
//   progress.Advance(1);
//   ...
//   progress.Finish("calibrated 5 subgraphs");
//
// On a terminal the status is one line rewritten in place ("\r...\x1b[K");
// otherwise each finished step (a pass over all batches of one subgraph, a
// compression) gets a plain line of its own, so logs stay readable:
//
//   [tracecut] subgraph 2/5 model.layers.0  calibrate  8/8 batches
//   elapsed 1.2s  eta 3.1s
//
// The ETA is the elapsed time scaled by the work left (units: one batch of
// one pass, or one compression step), measured from the first unit done in
// this process (a resumed run does not count the work it skipped).
//
// Thread-compatible.

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tracecut::util {

// Where the run is.
struct ProgressPoint {
  int subgraph = 0;  // 0-based.
  int num_subgraphs = 0;
  std::string label;        // "model.layers.3", "(head)", "(whole model)".
  std::string stage;        // "calibrate", "compress", "propagate", ...
  int64_t batch = 0;        // Batches of this stage done so far.
  int64_t num_batches = 0;  // 0 for stages that are not per batch.
};

class Progress {
 public:
  // Writes to `out`; `live` picks the in-place line (a terminal). `clock`
  // gives the current time (tests pass a fake one).
  Progress(std::ostream* out, bool live,
           std::function<absl::Time()> clock = absl::Now);
  // stderr, live when stderr is a terminal (and TERM is not "dumb").
  static Progress ForStderr();
  // Writes nothing.
  static Progress Silent();

  // Starts the clock; `total_units` is the work the run will do.
  void Begin(int64_t total_units);
  // Shows where the run is (rate-limited redraw on a terminal).
  void Update(const ProgressPoint& point);
  // Counts finished units.
  void Advance(int64_t units);
  // Ends a step: a plain line per step off a terminal, a redraw on one.
  void EndStep(const ProgressPoint& point);
  // A message on a line of its own (clears the live line first).
  void Note(absl::string_view message);
  // Clears the live line and prints `summary` (if not empty) with the total
  // time.
  void Finish(absl::string_view summary);

  int64_t done_units() const { return done_; }
  int64_t total_units() const { return total_; }

  // "0.4s", "12.0s", "3m05s", "1h02m" (for progress lines and reports).
  static std::string FormatDuration(absl::Duration d);
  // The status text for a point (no prefix, no newline).
  std::string Describe(const ProgressPoint& point) const;

 private:
  void Draw(const ProgressPoint& point, bool force);
  void ClearLive();

  std::ostream* out_;
  bool live_;
  std::function<absl::Time()> clock_;
  absl::Time start_;
  absl::Time last_draw_ = absl::InfinitePast();
  int64_t total_ = 0;
  int64_t done_ = 0;
  bool line_open_ = false;
};

}  // namespace tracecut::util

#endif  // TRACECUT_UTIL_PROGRESS_H_
