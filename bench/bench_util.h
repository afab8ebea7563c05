#ifndef TRACECUT_BENCH_BENCH_UTIL_H_
#define TRACECUT_BENCH_BENCH_UTIL_H_

// Small helpers shared by the benchmark binaries of bench/: timing, peak
// RSS, flag parsing and dying on errors (benchmarks print one JSON object on
// stdout; any failure is one line on stderr and exit status 1).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace tracecut::bench {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

[[noreturn]] inline void Die(const char* tool, absl::string_view what,
                             const absl::Status& status) {
  std::fprintf(stderr, "%s: %.*s: %s\n", tool, static_cast<int>(what.size()),
               what.data(), status.ToString().c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* tool, absl::string_view what) {
  if (!v.ok()) Die(tool, what, v.status());
  return *std::move(v);
}

inline void OrDie(const absl::Status& s, const char* tool,
                  absl::string_view what) {
  if (!s.ok()) Die(tool, what, s);
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of `runs` calls of `fn` after `warmup` calls.
template <typename Fn>
double TimeMedian(int runs, int warmup, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    Clock::time_point s = Clock::now();
    fn();
    t.push_back(SecondsSince(s));
  }
  return Median(t);
}

// Peak resident set size of this process so far (VmHWM), in bytes; -1 when
// /proc is unavailable.
inline int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view l = line;
    if (absl::ConsumePrefix(&l, "VmHWM:")) {
      l = absl::StripAsciiWhitespace(l);
      absl::ConsumeSuffix(&l, "kB");
      int64_t kb = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(l), &kb)) {
        return kb * 1024;
      }
    }
  }
  return -1;
}

// `--name=value` flags: Flag(argv[i], "runs", &runs) parses and stores it.
inline bool StringFlag(absl::string_view arg, absl::string_view name,
                       std::string* out) {
  if (!absl::ConsumePrefix(&arg, "--") || !absl::ConsumePrefix(&arg, name) ||
      !absl::ConsumePrefix(&arg, "=")) {
    return false;
  }
  *out = std::string(arg);
  return true;
}

template <typename Int>
bool IntFlag(const char* tool, absl::string_view arg, absl::string_view name,
             Int* out) {
  std::string v;
  if (!StringFlag(arg, name, &v)) return false;
  if (!absl::SimpleAtoi(v, out)) {
    std::fprintf(stderr, "%s: --%.*s needs an integer, got '%s'\n", tool,
                 static_cast<int>(name.size()), name.data(), v.c_str());
    std::exit(2);
  }
  return true;
}

}  // namespace tracecut::bench

#endif  // TRACECUT_BENCH_BENCH_UTIL_H_
