#ifndef TRACECUT_TOOLS_CLI_LAUNCH_H_
#define TRACECUT_TOOLS_CLI_LAUNCH_H_

// `--nproc-per-node=N`: runs N copies of this very command line as the
// ranks of a data-parallel run on this machine, with torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
// MASTER_PORT=a free port). Each rank's stderr goes to a temporary log;
// rank 0's is copied to `io.err` when all succeed. When one fails the others
// are stopped (SIGTERM, then SIGKILL), the outputs the run created are
// removed, and the result is one error naming the rank that failed first
// and its last message.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/cli/common.h"

namespace tracecut::cli {

// True when this process is already one rank (RANK in the environment).
bool IsLaunchedRank();

// `outputs`: files or directories the run writes; those that did not exist
// before are removed when it fails. `run_dir` (may be empty): where the
// ranks keep their checkpoints; when a failed run left some there, the
// error says to rerun with --resume, and when it left none the directory
// goes if the run created it.
absl::Status LaunchLocalRanks(int nproc,
                              const std::vector<std::string>& outputs,
                              const std::string& run_dir, Io& io);

}  // namespace tracecut::cli

#endif  // TRACECUT_TOOLS_CLI_LAUNCH_H_
