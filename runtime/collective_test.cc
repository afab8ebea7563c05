#include "runtime/collective.h"

#include <ATen/ATen.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

extern char** environ;

namespace tracecut::runtime {
namespace {

using ::testing::HasSubstr;
using util::testing::StatusIs;

// --- Multi-process harness: the test binary runs itself once per rank with
// --gtest_filter=DistributedWorker.<name> and torchrun's variables set; the
// DistributedWorker tests skip unless RANK is set.

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

struct Exit {
  int code = -1;  // -1: killed by a signal.
  double seconds = 0;
};

// Runs worker test `name` as `world` ranks; extra environment in `env`.
std::vector<Exit> RunRanks(const std::string& name, int world,
                           const std::vector<std::string>& env = {}) {
  const int port = FreePort();
  std::vector<pid_t> pids;
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> e;
    for (char** p = environ; *p != nullptr; ++p) e.emplace_back(*p);
    e.push_back(absl::StrCat("RANK=", r));
    e.push_back(absl::StrCat("WORLD_SIZE=", world));
    e.push_back("MASTER_ADDR=127.0.0.1");
    e.push_back(absl::StrCat("MASTER_PORT=", port));
    e.insert(e.end(), env.begin(), env.end());
    std::vector<char*> envp;
    for (std::string& s : e) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string filter =
        absl::StrCat("--gtest_filter=DistributedWorker.", name);
    std::string self = "/proc/self/exe";
    char* argv[] = {self.data(), filter.data(), nullptr};
    pid_t pid = -1;
    EXPECT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv,
                            envp.data()),
              0);
    pids.push_back(pid);
  }
  std::vector<Exit> out(world);
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    out[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    out[r].seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  }
  return out;
}

bool IsWorker() { return std::getenv("RANK") != nullptr; }

std::unique_ptr<Collective> Join(absl::Duration timeout = absl::Seconds(60)) {
  absl::StatusOr<std::unique_ptr<Collective>> c =
      Collective::FromEnvironment(timeout);
  EXPECT_OK(c.status());
  return c.ok() ? std::move(*c) : nullptr;
}

// The calibration inputs every rank's share is taken from: 7 batches.
std::vector<at::Tensor> Inputs() {
  at::manual_seed(11);
  std::vector<at::Tensor> out;
  for (int b = 0; b < 7; ++b) out.push_back(at::randn({2, 5, 24}) * (b + 1));
  return out;
}

// --- Workers.

TEST(DistributedWorker, Collectives) {
  if (!IsWorker()) GTEST_SKIP() << "runs as a rank of a test below";
  std::unique_ptr<Collective> c = Join();
  ASSERT_NE(c, nullptr);
  const int r = c->rank();
  const int w = c->world_size();
  at::Tensor sum = at::full({3}, static_cast<double>(r + 1), at::kDouble);
  ASSERT_OK(c->AllReduce(sum, ReduceKind::kSum, "sum"));
  EXPECT_EQ(sum[0].item<double>(), w * (w + 1) / 2.0);
  at::Tensor mn = at::tensor({static_cast<double>(r), -1.0 * r});
  ASSERT_OK(c->AllReduce(mn, ReduceKind::kMin, "min"));
  EXPECT_EQ(mn[0].item<double>(), 0);
  EXPECT_EQ(mn[1].item<double>(), -(w - 1));
  at::Tensor mx = at::tensor({static_cast<int64_t>(r)}, at::kLong);
  ASSERT_OK(c->AllReduce(mx, ReduceKind::kMax, "max"));
  EXPECT_EQ(mx.item<int64_t>(), w - 1);
  at::Tensor red = at::full({2, 2}, static_cast<float>(r), at::kFloat);
  ASSERT_OK(c->ReduceSum(red, w - 1, "reduce"));
  if (r == w - 1) {
    EXPECT_EQ(red[1][1].item<float>(), (w - 1) * w / 2.0f);
  }
  at::Tensor b = at::full({4}, static_cast<float>(r), at::kFloat);
  ASSERT_OK(c->Broadcast(b, 1, "broadcast"));
  EXPECT_EQ(b[3].item<float>(), 1.0f);
  c10::IValue v;
  if (r == 0) {
    v = c10::ivalue::Tuple::create(
        {std::string("scale"), at::arange(5, at::kFloat), 2.5});
  }
  ASSERT_OK(c->BroadcastIValue(v, 0, "a record"));
  ASSERT_TRUE(v.isTuple());
  EXPECT_EQ(v.toTupleRef().elements()[0].toStringRef(), "scale");
  EXPECT_TRUE(at::equal(v.toTupleRef().elements()[1].toTensor(),
                        at::arange(5, at::kFloat)));
  EXPECT_EQ(v.toTupleRef().elements()[2].toDouble(), 2.5);
  ASSERT_OK(c->Barrier("the end"));
}

// Each rank sums X^T X over its share (batch i to rank i % world); the sum
// reduced to rank 0 is the single-process sum within fp32 summation error.
TEST(DistributedWorker, HessianReduce) {
  if (!IsWorker()) GTEST_SKIP() << "runs as a rank of a test below";
  std::unique_ptr<Collective> c = Join();
  ASSERT_NE(c, nullptr);
  std::vector<at::Tensor> inputs = Inputs();
  // Sums of x^T x over the tokens of the batches, as GPTQ's Hessians are.
  at::Tensor mine = at::zeros({24, 24});
  at::Tensor single = at::zeros({24, 24});
  int64_t my_tokens = 0;
  for (size_t b = 0; b < inputs.size(); ++b) {
    at::Tensor x = inputs[b].reshape({-1, 24});
    single += x.t().matmul(x);
    if (static_cast<int>(b) % c->world_size() == c->rank()) {
      mine += x.t().matmul(x);
      my_tokens += x.size(0);
    }
  }
  at::Tensor tokens = at::tensor({my_tokens}, at::kLong);
  ASSERT_OK(c->AllReduce(tokens, ReduceKind::kSum, "token counts"));
  ASSERT_OK(c->ReduceSum(mine, 0, "the Hessian"));
  EXPECT_EQ(tokens.item<int64_t>(), 7 * 2 * 5);
  if (c->rank() != 0) return;
  const double scale = single.abs().max().item<double>();
  const double diff = (mine - single).abs().max().item<double>();
  // fp32: a few ulps of the largest entry per addition.
  EXPECT_LE(diff, 1e-5 * scale) << "max |dH| " << diff << " of " << scale;
  std::cout << "max |H_reduced - H_single| / max |H| = " << diff / scale
            << "\n";
}

// Rank 1 dies (or hangs, with FAULT_HANG) before the collective.
TEST(DistributedWorker, PeerFails) {
  if (!IsWorker()) GTEST_SKIP() << "runs as a rank of a test below";
  std::unique_ptr<Collective> c = Join(absl::Seconds(3));
  ASSERT_NE(c, nullptr);
  // One collective that both finish first: a rank's join can return while
  // its peer is still connecting, and a death then would fail the peer's
  // join (a race under load) instead of the collective under test.
  at::Tensor warm_up = at::ones({1});
  ASSERT_OK(c->AllReduce(warm_up, ReduceKind::kSum, "the warm-up"));
  if (c->rank() == 1) {
    if (std::getenv("FAULT_HANG") != nullptr) {
      ::sleep(8);
    }
    ::_exit(3);
  }
  at::Tensor t = at::ones({1000});
  absl::Status s = c->AllReduce(t, ReduceKind::kSum, "the token counts");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          HasSubstr("distributed rank 0/2: all-reduce of the "
                                    "token counts failed")));
  // The parent checks the exit code: 4 means "failed as expected".
  if (!s.ok()) ::_exit(4);
}

// Data-parallel resume: each rank offers the subgraphs its kept
// checkpoints continue at (RESUME_CASE picks them); all agree on one.
TEST(DistributedWorker, AgreeOnResume) {
  if (!IsWorker()) GTEST_SKIP() << "runs as a rank of a test below";
  std::unique_ptr<Collective> c = Join();
  ASSERT_NE(c, nullptr);
  const std::string which = std::getenv("RESUME_CASE");
  const int r = c->rank();
  std::vector<int> kept;
  if (which == "apart") {
    // Killed while rank 0 was one subgraph behind: all continue at 2.
    kept = r == 0 ? std::vector<int>{1, 2} : std::vector<int>{2, 3};
    absl::StatusOr<int> at = AgreeOnResumePoint(*c, kept);
    ASSERT_OK(at.status());
    EXPECT_EQ(*at, 2);
  } else if (which == "none") {
    // The last rank has no checkpoint: all start afresh.
    if (r != c->world_size() - 1) kept = {4, 5};
    absl::StatusOr<int> at = AgreeOnResumePoint(*c, kept);
    ASSERT_OK(at.status());
    EXPECT_EQ(*at, 0);
  } else if (which == "lost") {
    // Rank 0 no longer keeps the checkpoint all others stop at: one error,
    // naming it, on every rank.
    kept = r == 0 ? std::vector<int>{3, 4} : std::vector<int>{1, 2};
    EXPECT_THAT(
        AgreeOnResumePoint(*c, kept),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 HasSubstr(absl::StrCat(
                     "every rank has checkpointed its first 2 subgraphs, but "
                     "rank 0 of ",
                     c->world_size(), " no longer keeps that checkpoint"))));
  } else {
    FAIL() << "RESUME_CASE " << which;
  }
}

// --- Tests (the parent side).

TEST(DistributedTest, CollectivesTwoAndThreeRanks) {
  if (IsWorker()) GTEST_SKIP();
  for (int world : {2, 3}) {
    for (const Exit& e : RunRanks("Collectives", world)) {
      EXPECT_EQ(e.code, 0) << world << " ranks";
    }
  }
}

TEST(DistributedTest, ReducedHessianEqualsSingleProcess) {
  if (IsWorker()) GTEST_SKIP();
  for (int world : {2, 3}) {
    for (const Exit& e : RunRanks("HessianReduce", world)) {
      EXPECT_EQ(e.code, 0) << world << " ranks";
    }
  }
}

TEST(DistributedTest, DeadRankFailsTheOthersAtOnce) {
  if (IsWorker()) GTEST_SKIP();
  std::vector<Exit> e = RunRanks("PeerFails", 2);
  EXPECT_EQ(e[0].code, 4);
  EXPECT_EQ(e[1].code, 3);
  EXPECT_LT(e[0].seconds, 3.0);  // Connection reset, not the timeout.
}

TEST(DistributedTest, HungRankFailsTheOthersWithinTheTimeout) {
  if (IsWorker()) GTEST_SKIP();
  std::vector<Exit> e = RunRanks("PeerFails", 2, {"FAULT_HANG=1"});
  EXPECT_EQ(e[0].code, 4);
  EXPECT_LT(e[0].seconds, 3.0 + 10.0);  // The 3 s timeout and start-up.
}

TEST(DistributedTest, RanksAgreeOnTheSubgraphToResumeAt) {
  if (IsWorker()) GTEST_SKIP();
  for (const char* which : {"apart", "none", "lost"}) {
    for (int world : {2, 3}) {
      for (const Exit& e : RunRanks("AgreeOnResume", world,
                                    {absl::StrCat("RESUME_CASE=", which)})) {
        EXPECT_EQ(e.code, 0) << which << ", " << world << " ranks";
      }
    }
  }
}

TEST(DistributedTest, LocalResumesAtItsNewestCheckpoint) {
  std::unique_ptr<Collective> c = Collective::Local();
  absl::StatusOr<int> at = AgreeOnResumePoint(*c, {3, 4});
  ASSERT_OK(at.status());
  EXPECT_EQ(*at, 4);
  at = AgreeOnResumePoint(*c, {});
  ASSERT_OK(at.status());
  EXPECT_EQ(*at, 0);
}

TEST(DistributedTest, LocalDoesNothing) {
  std::unique_ptr<Collective> c = Collective::Local();
  EXPECT_FALSE(c->distributed());
  at::Tensor t = at::ones({2});
  ASSERT_OK(c->AllReduce(t, ReduceKind::kSum, "x"));
  ASSERT_OK(c->ReduceSum(t, 0, "x"));
  ASSERT_OK(c->Barrier("x"));
  EXPECT_TRUE(at::equal(t, at::ones({2})));
}

TEST(DistributedTest, EnvironmentErrorsNameTheVariable) {
  if (IsWorker()) GTEST_SKIP();
  ::setenv("WORLD_SIZE", "two", 1);
  EXPECT_THAT(DistributedOptionsFromEnvironment(absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("WORLD_SIZE='two'")));
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "2", 1);
  EXPECT_THAT(DistributedOptionsFromEnvironment(absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("RANK=2 is not below WORLD_SIZE=2")));
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
}

TEST(DistributedTest, OwnersBalancedAndDeterministic) {
  // Largest first to the least loaded rank, ties to the lower rank.
  std::vector<int> owners = AssignOwners({16, 64, 64, 16, 4, 0}, 2);
  EXPECT_EQ(owners, (std::vector<int>{0, 0, 1, 1, 0, 1}));
  EXPECT_EQ(AssignOwners({5, 5, 5}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(AssignOwners({1, 1, 1}, 3), (std::vector<int>{0, 1, 2}));
}

}  // namespace
}  // namespace tracecut::runtime
