#ifndef TRACECUT_PIPELINES_RUN_DIR_H_
#define TRACECUT_PIPELINES_RUN_DIR_H_

// The run directory of a calibration (OUT.run, or --run-dir): checkpoints
// for --resume, the intermediates cache's spill files, and a streamed run's
// shards, under an advisory lock that allows one run per output.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<RunDir> dir,
//                    RunDir::Open(RunDirFor(out, ""), "", out));
//   ... run the pipeline with checkpoints in dir->path() ...
//   dir->Keep();     // stopped with a checkpoint to resume from, or
//   dir->Remove();   // finished: the run's files go
//
// Destroyed without Keep or Remove (the run failed), it removes what the
// run made: the whole directory when the run created it, else only its lock
// and its spill files.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::pipelines {

// The run directory of `output`: `run_dir` when given, else OUT.run.
std::string RunDirFor(absl::string_view output, absl::string_view run_dir);

class RunDir {
 public:
  // Locks `base` (created if missing) for the run that writes `output`, or,
  // with `rank_dir` (a data-parallel rank's "rank-R-of-N"), base/rank_dir.
  // FAILED_PRECONDITION naming the holder's pid while another process holds
  // the lock. The spill files a killed earlier run left in spill_dir() are
  // removed.
  static absl::StatusOr<std::unique_ptr<RunDir>> Open(
      const std::string& base, absl::string_view rank_dir,
      absl::string_view output);

  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  // Where this run's checkpoints go.
  const std::string& path() const { return path_; }
  // The run directory the user names (path() without a rank's directory).
  const std::string& base() const { return base_; }
  // Where the intermediates cache spills by default.
  std::string spill_dir() const;
  // Where a streamed run writes its shards.
  std::string output_dir() const;
  // The pid an earlier run left in the lock file (0: none); it is dead.
  int64_t previous_pid() const { return previous_pid_; }
  // Whether path() holds a checkpoint to resume from.
  bool HasCheckpoint() const;

  // Leaves everything in place (a checkpoint to resume from).
  void Keep() { done_ = true; }
  // The run finished: removes its files, then path() (and a rank's base)
  // when empty. Files of others in the directory stay.
  void Remove();

 private:
  RunDir(std::string base, std::string path, bool base_existed,
         bool path_existed, int fd, int64_t previous_pid);

  std::string base_;
  std::string path_;
  bool base_existed_;
  bool path_existed_;
  int fd_;  // The locked file.
  int64_t previous_pid_;
  bool done_ = false;
};

// Note [Data-parallel checkpoints]
// Each rank of a data-parallel run checkpoints its own pipeline (its shard
// of the data, its modifiers' state) into RUN_DIR/rank-R-of-N, keeping its
// last two states; before each checkpoint the ranks meet at a barrier, and
// on --resume they all continue after the newest subgraph every one of them
// has checkpointed (AgreeOnResumePoint), so a rank that got further re-runs
// a subgraph and the output is byte-identical to an uninterrupted run of
// the same world size. A checkpoint of another world size (or of one
// process, which keeps state.pt in RUN_DIR itself) is refused: the shards,
// and so every rank's state, depend on the world size.

// Removes the spill files of the process `pid` from `dir` (named
// "tracecut-<pid>-..." by the intermediates cache), all of them when pid is
// 0, then `dir` if that left it empty.
void RemoveSpillFiles(const std::string& dir, int64_t pid);

// "rank-R-of-N".
std::string RankDirName(int rank, int world_size);

// FAILED_PRECONDITION when `base` holds checkpoints of a world size other
// than `world_size` (1: one process), saying how to resume them.
absl::Status CheckResumeWorldSize(const std::string& base, int world_size);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_RUN_DIR_H_
