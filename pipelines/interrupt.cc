#include "pipelines/interrupt.h"

#include <atomic>
#include <csignal>

#include "absl/strings/str_cat.h"

namespace tracecut::pipelines {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "the flag is set from a signal handler");

extern "C" void OnInterrupt(int signal) {
  g_signal.store(signal, std::memory_order_relaxed);
  std::signal(signal, SIG_DFL);  // A second signal ends the process.
}

}  // namespace

void InstallInterruptHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int InterruptSignal() { return g_signal.load(std::memory_order_relaxed); }

absl::Status CheckInterrupt() {
  const int signal = InterruptSignal();
  if (signal == 0) return absl::OkStatus();
  return absl::CancelledError(
      absl::StrCat("interrupted by ", signal == SIGINT ? "SIGINT" : "SIGTERM"));
}

void SetInterruptForTesting(int signal) {
  g_signal.store(signal, std::memory_order_relaxed);
}

}  // namespace tracecut::pipelines
