#ifndef TRACECUT_RUNTIME_COLLECTIVE_H_
#define TRACECUT_RUNTIME_COLLECTIVE_H_

// Data-parallel calibration: the collectives ranks use to agree on
// statistics and results, over LibTorch's c10d (ProcessGroupGloo on CPU; a
// CUDA build would create ProcessGroupNCCL here behind the same interface).
// No transport of tracecut's own.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Collective> c,
//                    Collective::FromEnvironment(absl::Seconds(300)));
//   RETURN_IF_ERROR(c->AllReduce(counts, ReduceKind::kSum, "token counts"));
//   RETURN_IF_ERROR(c->Reduce(hessian, owner, "the Hessian of q_proj"));
//   RETURN_IF_ERROR(c->Broadcast(weight, owner, "the weight of q_proj"));
//
// A Collective of world size 1 (Collective::Local, or no WORLD_SIZE in the
// environment) does nothing and never fails. Every operation of a larger
// world is blocking and bounded by the timeout: a rank that died makes the
// others fail at once (connection reset), one that hangs makes them fail
// after the timeout, each with an error naming this rank, the operation and
// what it carried. All ranks must call the same operations in the same
// order, with tensors of one shape and dtype.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tracecut::runtime {

enum class ReduceKind { kSum, kMin, kMax };

// Where a rank finds the others: torchrun's environment variables.
struct DistributedOptions {
  int rank = 0;                           // RANK
  int world_size = 1;                     // WORLD_SIZE
  int local_rank = 0;                     // LOCAL_RANK
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR
  int master_port = 29500;                // MASTER_PORT
  absl::Duration timeout = absl::Seconds(300);
};

// The options torchrun's variables give; world_size 1 when WORLD_SIZE is
// unset. InvalidArgument naming the variable for a malformed value.
absl::StatusOr<DistributedOptions> DistributedOptionsFromEnvironment(
    absl::Duration timeout);

class Collective {
 public:
  // A world of one: every operation returns at once.
  static std::unique_ptr<Collective> Local();
  // Joins the process group described by `options` (rank 0 hosts the
  // TCPStore at master_addr:master_port). Fails after options.timeout when
  // not every rank arrives.
  static absl::StatusOr<std::unique_ptr<Collective>> Connect(
      const DistributedOptions& options);
  // Local() without WORLD_SIZE (or WORLD_SIZE=1), else Connect.
  static absl::StatusOr<std::unique_ptr<Collective>> FromEnvironment(
      absl::Duration timeout);

  ~Collective();
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool distributed() const { return world_size_ > 1; }
  // "rank 1/2".
  std::string Describe() const;

  // `tensor` (contiguous, CPU) becomes the element-wise reduction over all
  // ranks, on every rank.
  absl::Status AllReduce(at::Tensor& tensor, ReduceKind kind,
                         absl::string_view what);
  // The sum over all ranks lands in `tensor` on `root`; elsewhere `tensor`
  // is unspecified afterwards.
  absl::Status ReduceSum(at::Tensor& tensor, int root, absl::string_view what);
  // `tensor` on every rank becomes root's.
  absl::Status Broadcast(at::Tensor& tensor, int root, absl::string_view what);
  // Root's `value` (tensors, scalars, strings, lists, tuples, dicts of them)
  // on every rank, pickled.
  absl::Status BroadcastIValue(c10::IValue& value, int root,
                               absl::string_view what);
  absl::Status Barrier(absl::string_view what);

  // Test hook for fault tests: TRACECUT_DIST_FAULT="RANK:SUBGRAPH:exit" (or
  // ":hang") makes that rank exit with status 3 (or sleep for good) once
  // `finished_subgraph` is SUBGRAPH. Nothing otherwise.
  void MaybeInjectFault(int finished_subgraph) const;

 private:
  struct Impl;
  Collective(int rank, int world_size, absl::Duration timeout,
             std::unique_ptr<Impl> impl);
  absl::Status Failed(absl::string_view op, absl::string_view what,
                      const absl::Status& cause) const;

  int rank_;
  int world_size_;
  absl::Duration timeout_;
  std::unique_ptr<Impl> impl_;
};

// Data-parallel resume: `kept` are the subgraphs this rank's checkpoints
// continue at (ascending; empty: none). Returns the subgraph all ranks
// continue at: the minimum over the ranks of their newest (0 when one has
// none: start afresh), so a rank that got further re-runs. Every rank
// returns the same value, or the same FailedPrecondition naming the first
// rank that does not keep that checkpoint.
absl::StatusOr<int> AgreeOnResumePoint(Collective& collective,
                                       const std::vector<int>& kept);

// Owners of work items: item i (cost costs[i]) goes to the rank with the
// least cost so far, largest items first, ties by lower index and lower rank
// (deterministic: every rank computes the same assignment).
std::vector<int> AssignOwners(const std::vector<int64_t>& costs,
                              int world_size);

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_COLLECTIVE_H_
