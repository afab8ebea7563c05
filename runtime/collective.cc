#include "runtime/collective.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/torch_status.h"
#include "runtime/zip_writer.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

absl::StatusOr<int> IntFromEnv(const char* name, int fallback, int min) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  int out = 0;
  if (!absl::SimpleAtoi(v, &out) || out < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", v,
                     "': expected an integer >= ", min));
  }
  return out;
}

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

c10d::ReduceOp ToReduceOp(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceKind::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceKind::kSum:
      break;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace

struct Collective::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

absl::StatusOr<DistributedOptions> DistributedOptionsFromEnvironment(
    absl::Duration timeout) {
  DistributedOptions o;
  o.timeout = timeout;
  ASSIGN_OR_RETURN(o.world_size, IntFromEnv("WORLD_SIZE", 1, 1));
  ASSIGN_OR_RETURN(o.rank, IntFromEnv("RANK", 0, 0));
  ASSIGN_OR_RETURN(o.local_rank, IntFromEnv("LOCAL_RANK", o.rank, 0));
  ASSIGN_OR_RETURN(o.master_port, IntFromEnv("MASTER_PORT", 29500, 1));
  if (const char* a = std::getenv("MASTER_ADDR"); a != nullptr && *a != '\0') {
    o.master_addr = a;
  }
  if (o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RANK=%d is not below WORLD_SIZE=%d", o.rank, o.world_size));
  }
  if (o.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT=", o.master_port, " is not a port"));
  }
  return o;
}

Collective::Collective(int rank, int world_size, absl::Duration timeout,
                       std::unique_ptr<Impl> impl)
    : rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      impl_(std::move(impl)) {}

Collective::~Collective() = default;

std::unique_ptr<Collective> Collective::Local() {
  return std::unique_ptr<Collective>(
      new Collective(0, 1, absl::InfiniteDuration(), nullptr));
}

absl::StatusOr<std::unique_ptr<Collective>> Collective::Connect(
    const DistributedOptions& options) {
  if (options.world_size <= 1) return Local();
  auto impl = std::make_unique<Impl>();
  const std::string where = absl::StrFormat(
      "rank %d/%d: joining the process group at %s:%d", options.rank,
      options.world_size, options.master_addr, options.master_port);
  absl::Status joined = runtime::TorchCall(where, [&] {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(options.master_port);
    so.isServer = options.rank == 0;
    so.numWorkers = options.world_size;
    so.waitWorkers = true;
    so.timeout = Millis(options.timeout);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options.master_addr, so);
    impl->store = c10::make_intrusive<c10d::PrefixStore>("tracecut", tcp);
    auto gloo =
        c10d::ProcessGroupGloo::Options::create(Millis(options.timeout));
    // Bind where the peers can reach us: loopback for a one-machine run,
    // else GLOO_SOCKET_IFNAME's interface or the hostname's address (as
    // torch.distributed does).
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (IsLoopback(options.master_addr)) {
      gloo->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else if (ifname != nullptr && *ifname != '\0') {
      gloo->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else {
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    // One thread: collectives run one at a time, in call order.
    gloo->threads = 1;
    impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
        impl->store, options.rank, options.world_size, gloo);
  });
  if (!joined.ok()) {
    return absl::UnavailableError(absl::StrCat(
        joined.message(), " (not every rank arrived within ",
        absl::FormatDuration(options.timeout), ", or the port is taken)"));
  }
  return std::unique_ptr<Collective>(new Collective(
      options.rank, options.world_size, options.timeout, std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Collective>> Collective::FromEnvironment(
    absl::Duration timeout) {
  ASSIGN_OR_RETURN(DistributedOptions o,
                   DistributedOptionsFromEnvironment(timeout));
  return Connect(o);
}

std::string Collective::Describe() const {
  return absl::StrFormat("rank %d/%d", rank_, world_size_);
}

absl::Status Collective::Failed(absl::string_view op, absl::string_view what,
                                const absl::Status& cause) const {
  // Gloo prefixes its messages with its source location, "[.../pair.cc:545]
  // Read error ...": noise for a user.
  absl::string_view message = cause.message();
  if (absl::StartsWith(message, "[")) {
    const size_t end = message.find("] ");
    if (end != absl::string_view::npos) message.remove_prefix(end + 2);
  }
  return absl::UnavailableError(absl::StrFormat(
      "distributed %s: %s of %s failed: %s (another rank died, hangs or took "
      "longer than the %s timeout)",
      Describe(), op, what, message, absl::FormatDuration(timeout_)));
}

absl::Status Collective::AllReduce(at::Tensor& tensor, ReduceKind kind,
                                   absl::string_view what) {
  if (!distributed()) return absl::OkStatus();
  absl::Status s = runtime::TorchCall("", [&] {
    std::vector<at::Tensor> t{tensor};
    c10d::AllreduceOptions o;
    o.reduceOp = ToReduceOp(kind);
    impl_->backend->allreduce(t, o)->wait();
  });
  return s.ok() ? s : Failed("all-reduce", what, s);
}

absl::Status Collective::ReduceSum(at::Tensor& tensor, int root,
                                   absl::string_view what) {
  if (!distributed()) return absl::OkStatus();
  absl::Status s = runtime::TorchCall("", [&] {
    std::vector<at::Tensor> t{tensor};
    c10d::ReduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.rootRank = root;
    impl_->backend->reduce(t, o)->wait();
  });
  return s.ok() ? s : Failed(absl::StrCat("reduce to rank ", root), what, s);
}

absl::Status Collective::Broadcast(at::Tensor& tensor, int root,
                                   absl::string_view what) {
  if (!distributed()) return absl::OkStatus();
  absl::Status s = runtime::TorchCall("", [&] {
    std::vector<at::Tensor> t{tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    impl_->backend->broadcast(t, o)->wait();
  });
  return s.ok() ? s
                : Failed(absl::StrCat("broadcast from rank ", root), what, s);
}

absl::Status Collective::BroadcastIValue(c10::IValue& value, int root,
                                         absl::string_view what) {
  if (!distributed()) return absl::OkStatus();
  std::vector<char> bytes;
  if (rank_ == root) {
    ASSIGN_OR_RETURN(
        bytes, runtime::PickleSave(value, absl::StrCat("pickling ", what)));
  }
  at::Tensor size = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
  RETURN_IF_ERROR(Broadcast(size, root, absl::StrCat("the size of ", what)));
  at::Tensor data = at::empty({size.item<int64_t>()}, at::kByte);
  if (rank_ == root) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  RETURN_IF_ERROR(Broadcast(data, root, what));
  if (rank_ == root) return absl::OkStatus();
  bytes.assign(static_cast<const char*>(data.data_ptr()),
               static_cast<const char*>(data.data_ptr()) + data.numel());
  ASSIGN_OR_RETURN(value,
                   runtime::TorchCall(absl::StrCat("unpickling ", what), [&] {
                     return torch::jit::pickle_load(bytes);
                   }));
  return absl::OkStatus();
}

absl::Status Collective::Barrier(absl::string_view what) {
  if (!distributed()) return absl::OkStatus();
  absl::Status s = runtime::TorchCall("", [&] {
    c10d::BarrierOptions o;
    o.timeout = Millis(timeout_);
    impl_->backend->barrier(o)->wait();
  });
  return s.ok() ? s : Failed("barrier", what, s);
}

void Collective::MaybeInjectFault(int finished_subgraph) const {
  const char* spec = std::getenv("TRACECUT_DIST_FAULT");
  if (spec == nullptr || !distributed()) return;
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  int rank = -1, subgraph = -1;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &rank) ||
      !absl::SimpleAtoi(parts[1], &subgraph) || rank != rank_ ||
      subgraph != finished_subgraph) {
    return;
  }
  if (parts[2] == "hang") {
    while (true) ::pause();
  }
  ::_exit(3);
}

absl::StatusOr<int> AgreeOnResumePoint(Collective& collective,
                                       const std::vector<int>& kept) {
  const int newest = kept.empty() ? 0 : kept.back();
  if (!collective.distributed()) return newest;
  at::Tensor t = at::full({1}, static_cast<int64_t>(newest), at::kLong);
  RETURN_IF_ERROR(
      collective.AllReduce(t, ReduceKind::kMin, "the subgraphs checkpointed"));
  const int at = static_cast<int>(t.item<int64_t>());
  const bool have =
      at == 0 || std::find(kept.begin(), kept.end(), at) != kept.end();
  // The first rank that lacks it (world size: none).
  at::Tensor lacking = at::full(
      {1},
      static_cast<int64_t>(have ? collective.world_size() : collective.rank()),
      at::kLong);
  RETURN_IF_ERROR(collective.AllReduce(lacking, ReduceKind::kMin,
                                       "which ranks keep that checkpoint"));
  const int64_t first = lacking.item<int64_t>();
  if (first < collective.world_size()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot resume the data-parallel run: every rank has checkpointed "
        "its first %d subgraphs, but rank %d of %d no longer keeps that "
        "checkpoint; delete the run directory to start afresh",
        at, first, collective.world_size()));
  }
  return at;
}

std::vector<int> AssignOwners(const std::vector<int64_t>& costs,
                              int world_size) {
  std::vector<int> owner(costs.size(), 0);
  if (world_size <= 1) return owner;
  std::vector<size_t> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return costs[a] > costs[b]; });
  std::vector<int64_t> load(world_size, 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) -
                                   load.begin());
    owner[i] = r;
    load[r] += costs[i];
  }
  return owner;
}

}  // namespace tracecut::runtime
