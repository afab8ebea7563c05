#include "util/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tracecut::util {
namespace {

// A live line is redrawn at most this often; plain lines are per step.
constexpr absl::Duration kRedrawInterval = absl::Milliseconds(100);

std::ostream& NullStream() {
  static auto* stream = new std::ostream(nullptr);
  return *stream;
}

}  // namespace

Progress::Progress(std::ostream* out, bool live,
                   std::function<absl::Time()> clock)
    : out_(out), live_(live), clock_(std::move(clock)) {
  start_ = clock_();
}

Progress Progress::ForStderr() {
  const char* term = std::getenv("TERM");
  bool dumb = term != nullptr && absl::string_view(term) == "dumb";
  return Progress(&std::cerr, isatty(fileno(stderr)) != 0 && !dumb);
}

Progress Progress::Silent() { return Progress(&NullStream(), false); }

void Progress::Begin(int64_t total_units) {
  total_ = total_units;
  done_ = 0;
  start_ = clock_();
  last_draw_ = absl::InfinitePast();
}

void Progress::Advance(int64_t units) { done_ += units; }

std::string Progress::FormatDuration(absl::Duration d) {
  double seconds = absl::ToDoubleSeconds(d);
  if (seconds < 0) seconds = 0;
  if (seconds < 60) return absl::StrFormat("%.1fs", seconds);
  int64_t s = static_cast<int64_t>(seconds);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
}

std::string Progress::Describe(const ProgressPoint& point) const {
  std::string text = absl::StrFormat("subgraph %d/%d", point.subgraph + 1,
                                     point.num_subgraphs);
  if (!point.label.empty()) absl::StrAppend(&text, " ", point.label);
  absl::StrAppend(&text, "  ", point.stage);
  if (point.num_batches > 0) {
    absl::StrAppend(&text, absl::StrFormat("  batch %d/%d", point.batch,
                                           point.num_batches));
  }
  absl::Duration elapsed = clock_() - start_;
  absl::StrAppend(&text, "  elapsed ", FormatDuration(elapsed));
  if (done_ > 0 && total_ > done_) {
    absl::Duration eta = elapsed * (static_cast<double>(total_ - done_) /
                                    static_cast<double>(done_));
    absl::StrAppend(&text, "  eta ", FormatDuration(eta));
  } else if (total_ > 0 && done_ >= total_) {
    absl::StrAppend(&text, "  eta 0.0s");
  }
  return text;
}

void Progress::ClearLive() {
  if (live_ && line_open_) {
    *out_ << "\r\x1b[K";
    line_open_ = false;
  }
}

void Progress::Draw(const ProgressPoint& point, bool force) {
  absl::Time now = clock_();
  if (!force && now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  *out_ << "\r\x1b[K[tracecut] " << Describe(point) << std::flush;
  line_open_ = true;
}

void Progress::Update(const ProgressPoint& point) {
  if (live_) Draw(point, /*force=*/false);
}

void Progress::EndStep(const ProgressPoint& point) {
  if (live_) {
    Draw(point, /*force=*/true);
  } else {
    *out_ << "[tracecut] " << Describe(point) << "\n" << std::flush;
  }
}

void Progress::Note(absl::string_view message) {
  ClearLive();
  *out_ << "[tracecut] " << message << "\n" << std::flush;
}

void Progress::Finish(absl::string_view summary) {
  ClearLive();
  if (!summary.empty()) {
    *out_ << "[tracecut] " << summary << " in "
          << FormatDuration(clock_() - start_) << "\n";
  }
  *out_ << std::flush;
}

}  // namespace tracecut::util
