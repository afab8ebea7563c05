#ifndef TRACECUT_PIPELINES_INTERRUPT_H_
#define TRACECUT_PIPELINES_INTERRUPT_H_

// SIGINT / SIGTERM as a request to stop at the next safe point (between
// calibration batches), instead of dying with temporary and spill files
// behind and no word on how to resume.
//
//   InstallInterruptHandlers();              // once, in the command
//   ...
//   RETURN_IF_ERROR(CheckInterrupt());       // at safe points
//
// The first signal sets a flag that CheckInterrupt turns into a CANCELLED
// status; a second one of the same kind kills the process the default way,
// for a user who does not want to wait for the safe point.

#include "absl/status/status.h"

namespace tracecut::pipelines {

// Handlers for SIGINT and SIGTERM that record the signal (async-signal-safe)
// and restore the default action, so a second signal terminates at once.
void InstallInterruptHandlers();

// The signal received since the handlers were installed (SIGINT, SIGTERM),
// or 0.
int InterruptSignal();

// CANCELLED "interrupted by SIGINT" once a signal was received; OK before.
absl::Status CheckInterrupt();

// For tests: act as if `signal` had been received (0 clears it).
void SetInterruptForTesting(int signal);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_INTERRUPT_H_
