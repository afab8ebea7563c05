#include "pipelines/intermediates_cache.h"

#include <ATen/ATen.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {
namespace {

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  ::mkdir(dir.c_str(), 0700);
  return dir;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Regular files in `dir` (-1 if it does not exist).
int CountFiles(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++n;
  }
  ::closedir(d);
  return n;
}

// Lowers this process's address-space limit (RLIMIT_AS) to its current size
// plus `headroom` bytes for one scope, so that allocations past it fail as
// they do on a machine out of memory; restores it on destruction.
class ScopedAddressSpaceLimit {
 public:
  explicit ScopedAddressSpaceLimit(int64_t headroom) {
    ::getrlimit(RLIMIT_AS, &old_);
    std::ifstream status("/proc/self/status");
    std::string line;
    int64_t vm_kib = -1;
    while (std::getline(status, line)) {
      if (line.rfind("VmSize:", 0) == 0) vm_kib = std::atoll(line.c_str() + 7);
    }
    if (vm_kib <= 0) return;
    rlimit limit = old_;
    limit.rlim_cur = static_cast<rlim_t>(vm_kib * 1024 + headroom);
    ok_ = ::setrlimit(RLIMIT_AS, &limit) == 0;
  }
  ~ScopedAddressSpaceLimit() { ::setrlimit(RLIMIT_AS, &old_); }
  bool ok() const { return ok_; }

 private:
  rlimit old_;
  bool ok_ = false;
};

IntermediatesCache MustCreate(IntermediatesCacheOptions options) {
  absl::StatusOr<IntermediatesCache> cache =
      IntermediatesCache::Create(std::move(options));
  EXPECT_OK(cache);
  return *std::move(cache);
}

// Bit-for-bit equality of two values: same structure, dtypes, shapes and
// bytes (so NaN payloads and -0.0 count).
void ExpectBitIdentical(const c10::IValue& a, const c10::IValue& b,
                        const std::string& where = "value") {
  ASSERT_EQ(a.tagKind(), b.tagKind()) << where;
  if (a.isTensor()) {
    const at::Tensor& x = a.toTensor();
    const at::Tensor& y = b.toTensor();
    ASSERT_EQ(x.defined(), y.defined()) << where;
    if (!x.defined()) return;
    ASSERT_EQ(x.scalar_type(), y.scalar_type()) << where;
    ASSERT_EQ(x.sizes(), y.sizes()) << where;
    EXPECT_TRUE(y.is_contiguous()) << where;
    at::Tensor xb = x.contiguous().reshape({-1}).view(at::kByte);
    at::Tensor yb = y.contiguous().reshape({-1}).view(at::kByte);
    EXPECT_TRUE(at::equal(xb, yb)) << where;
  } else if (a.isTuple()) {
    const auto& xs = a.toTupleRef().elements();
    const auto& ys = b.toTupleRef().elements();
    ASSERT_EQ(xs.size(), ys.size()) << where;
    for (size_t i = 0; i < xs.size(); ++i) {
      ExpectBitIdentical(xs[i], ys[i], absl::StrCat(where, "[", i, "]"));
    }
  } else if (a.isList()) {
    c10::List<c10::IValue> xs = a.toList();
    c10::List<c10::IValue> ys = b.toList();
    ASSERT_EQ(xs.size(), ys.size()) << where;
    EXPECT_EQ(xs.elementType()->str(), ys.elementType()->str()) << where;
    for (size_t i = 0; i < xs.size(); ++i) {
      ExpectBitIdentical(xs.get(i), ys.get(i),
                         absl::StrCat(where, "[", i, "]"));
    }
  } else if (a.isGenericDict()) {
    auto xs = a.toGenericDict();
    auto ys = b.toGenericDict();
    ASSERT_EQ(xs.size(), ys.size()) << where;
    for (const auto& item : xs) {
      ASSERT_TRUE(ys.contains(item.key())) << where;
      ExpectBitIdentical(item.value(), ys.at(item.key()),
                         absl::StrCat(where, "{", item.key().tagKind(), "}"));
    }
  } else {
    EXPECT_EQ(a, b) << where;
  }
}

// A value of every kind a pipeline passes between subgraphs.
c10::IValue MixedValue() {
  at::manual_seed(21);
  at::Tensor f = at::randn({3, 5});
  f[0][0] = std::numeric_limits<float>::quiet_NaN();
  f[0][1] = -0.0f;
  f[0][2] = std::numeric_limits<float>::infinity();
  at::Tensor bf = at::randn({4, 6}).to(at::kBFloat16);
  at::Tensor half = at::randn({2, 2}).to(at::kHalf);
  at::Tensor ids = at::randint(0, 1 << 30, {2, 7}, at::kLong);
  at::Tensor mask = at::rand({7}) > 0.5;
  at::Tensor bytes = at::randint(0, 255, {9}, at::kByte);
  at::Tensor strided = at::randn({6, 4}).t();  // Not contiguous.
  at::Tensor scalar = at::scalar_tensor(3.5, at::kDouble);
  c10::List<at::Tensor> kv({at::randn({1, 2, 3}), at::randn({1, 2, 3})});
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("attention_mask", mask);
  dict.insert("position_ids", ids);
  return c10::ivalue::Tuple::create(
      {f, bf, half, strided, scalar, bytes, c10::IValue(kv), c10::IValue(dict),
       c10::IValue(), c10::IValue(true), c10::IValue(int64_t{7}),
       c10::IValue(0.25), c10::IValue(std::string("causal")),
       c10::IValue(at::Tensor()), c10::IValue(c10::Device(c10::kCPU))});
}

at::Tensor Bytes(int64_t n, int seed) {
  return at::full({n / 4}, static_cast<float>(seed), at::kFloat);
}

TEST(IntermediatesCacheTest, RoundTripInMemoryIsBitIdentical) {
  IntermediatesCache cache = MustCreate({});
  c10::IValue v = MixedValue();
  absl::Status put = cache.Put(0, "layer0", v);
  ASSERT_OK(put);
  EXPECT_TRUE(cache.Contains(0, "layer0"));
  EXPECT_FALSE(cache.IsSpilled(0, "layer0"));
  absl::StatusOr<c10::IValue> got = cache.Get(0, "layer0");
  ASSERT_OK(got);
  ExpectBitIdentical(v, *got);
  EXPECT_EQ(cache.stats().spill_count, 0);
  EXPECT_EQ(cache.spill_dir(), "");
}

TEST(IntermediatesCacheTest, RoundTripThroughDiskIsBitIdentical) {
  IntermediatesCacheOptions options;
  options.memory_budget_bytes = 0;  // Everything with bytes goes to disk.
  options.spill_dir = TestDir("roundtrip");
  IntermediatesCache cache = MustCreate(options);
  c10::IValue v = MixedValue();
  absl::Status put = cache.Put(4, "hidden", v);
  ASSERT_OK(put);
  EXPECT_TRUE(cache.IsSpilled(4, "hidden"));
  EXPECT_EQ(cache.stats().bytes_held, 0);
  EXPECT_EQ(CountFiles(options.spill_dir), 1);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<c10::IValue> got = cache.Get(4, "hidden");
    ASSERT_OK(got);
    ExpectBitIdentical(v, *got);
  }
  EXPECT_EQ(cache.stats().reload_count, 2);
  EXPECT_EQ(cache.stats().peak_bytes_held, 0);
  // Scalars alone have no bytes and stay in memory even with budget 0.
  ASSERT_OK(cache.Put(4, "flag", c10::IValue(true)));
  EXPECT_FALSE(cache.IsSpilled(4, "flag"));
}

TEST(IntermediatesCacheTest, NamedTuplesKeepTheirType) {
  IntermediatesCacheOptions options;
  options.memory_budget_bytes = 0;
  options.spill_dir = TestDir("named");
  IntermediatesCache cache = MustCreate(options);
  c10::TupleTypePtr type = c10::TupleType::createNamed(
      c10::QualifiedName("__torch__.ModelOutput"),
      std::vector<std::string>{"logits", "past"},
      std::vector<c10::TypePtr>{c10::TensorType::get(),
                                c10::TensorType::get()});
  c10::IValue v = c10::ivalue::Tuple::createNamed(
      {at::randn({2, 3}), at::randn({4}).to(at::kBFloat16)}, type);
  ASSERT_OK(cache.Put(0, "out", v));
  absl::StatusOr<c10::IValue> got = cache.Get(0, "out");
  ASSERT_OK(got);
  ExpectBitIdentical(v, *got);
  c10::TupleTypePtr got_type = got->toTupleRef().type();
  ASSERT_TRUE(got_type->name().has_value());
  EXPECT_EQ(got_type->name()->qualifiedName(), "__torch__.ModelOutput");
}

TEST(IntermediatesCacheTest, ViewsAreStoredCompact) {
  IntermediatesCache cache = MustCreate({});
  at::Tensor base = at::zeros({1000}, at::kFloat);
  ASSERT_OK(cache.Put(0, "slice", base.narrow(0, 10, 5)));
  EXPECT_EQ(cache.stats().bytes_held, 20);
  base.fill_(1);  // The cache copied the 5 elements it keeps.
  absl::StatusOr<c10::IValue> got = cache.Get(0, "slice");
  ASSERT_OK(got);
  EXPECT_TRUE(at::equal(got->toTensor(), at::zeros({5})));
}

TEST(IntermediatesCacheTest, LeastRecentlyUsedValuesSpillAndComeBack) {
  IntermediatesCacheOptions options;
  options.memory_budget_bytes = 3 * 4096;
  options.spill_dir = TestDir("lru");
  IntermediatesCache cache = MustCreate(options);
  for (int b = 0; b < 5; ++b) {
    ASSERT_OK(cache.Put(b, "x", Bytes(4096, b)));
  }
  // Batches 0 and 1 were least recently used.
  EXPECT_TRUE(cache.IsSpilled(0, "x"));
  EXPECT_TRUE(cache.IsSpilled(1, "x"));
  EXPECT_FALSE(cache.IsSpilled(4, "x"));
  IntermediatesCacheStats s = cache.stats();
  EXPECT_EQ(s.values, 5);
  EXPECT_EQ(s.bytes_held, 3 * 4096);
  EXPECT_EQ(s.peak_bytes_held, 3 * 4096);
  EXPECT_EQ(s.spill_count, 2);
  EXPECT_EQ(s.bytes_spilled, 2 * 4096);
  EXPECT_EQ(s.bytes_on_disk, 2 * 4096);
  EXPECT_EQ(CountFiles(options.spill_dir), 2);

  // Reading batch 0 back spills batch 2 (now least recently used).
  absl::StatusOr<c10::IValue> got = cache.Get(0, "x");
  ASSERT_OK(got);
  EXPECT_TRUE(at::equal(got->toTensor(), Bytes(4096, 0)));
  EXPECT_FALSE(cache.IsSpilled(0, "x"));
  EXPECT_TRUE(cache.IsSpilled(2, "x"));
  s = cache.stats();
  EXPECT_EQ(s.reload_count, 1);
  EXPECT_EQ(s.spill_count, 3);
  EXPECT_EQ(s.bytes_held, 3 * 4096);

  // Batch 0 keeps its file: spilling it again costs no write.
  ASSERT_OK(cache.Get(1, "x"));  // Spills 3.
  ASSERT_OK(cache.Get(2, "x"));  // Spills 4.
  ASSERT_OK(cache.Get(3, "x"));  // Spills 0: no write.
  EXPECT_EQ(cache.stats().spill_count, 5);
  EXPECT_TRUE(cache.IsSpilled(0, "x"));

  // Release deletes files; Take is Get + Release.
  absl::StatusOr<c10::IValue> taken = cache.Take(0, "x");
  ASSERT_OK(taken);
  EXPECT_TRUE(at::equal(taken->toTensor(), Bytes(4096, 0)));
  EXPECT_FALSE(cache.Contains(0, "x"));
  for (int b = 1; b < 5; ++b) ASSERT_OK(cache.Release(b, "x"));
  EXPECT_EQ(CountFiles(options.spill_dir), 0);
  s = cache.stats();
  EXPECT_EQ(s.values, 0);
  EXPECT_EQ(s.bytes_held, 0);
  EXPECT_EQ(s.bytes_on_disk, 0);
}

TEST(IntermediatesCacheTest, ValueLargerThanTheBudgetGoesStraightToDisk) {
  IntermediatesCacheOptions options;
  options.memory_budget_bytes = 1000;
  options.spill_dir = TestDir("oversized");
  IntermediatesCache cache = MustCreate(options);
  ASSERT_OK(cache.Put(0, "small", Bytes(400, 1)));
  ASSERT_OK(cache.Put(0, "big", Bytes(4000, 2)));
  EXPECT_TRUE(cache.IsSpilled(0, "big"));
  EXPECT_FALSE(cache.IsSpilled(0, "small"));  // Not evicted for nothing.
  ASSERT_EQ(cache.notes().size(), 1u);
  EXPECT_NE(cache.notes()[0].find("batch 0 'big'"), std::string::npos)
      << cache.notes()[0];
  EXPECT_NE(cache.notes()[0].find("exceeds the whole memory budget"),
            std::string::npos);
  absl::StatusOr<c10::IValue> got = cache.Get(0, "big");
  ASSERT_OK(got);
  EXPECT_TRUE(at::equal(got->toTensor(), Bytes(4000, 2)));
  EXPECT_TRUE(cache.IsSpilled(0, "big"));  // Still never held.
  EXPECT_EQ(cache.stats().oversized_count, 1);
  EXPECT_EQ(cache.stats().peak_bytes_held, 400);
}

// Budget never exceeded, values always bit-identical, across a random
// sequence of Put / Get / Release with sizes from 0 to past the budget.
TEST(IntermediatesCacheTest, RandomSequenceRespectsTheBudget) {
  IntermediatesCacheOptions options;
  options.memory_budget_bytes = 64 * 1024;
  options.spill_dir = TestDir("random");
  std::map<std::pair<int64_t, std::string>, at::Tensor> model;
  {
    IntermediatesCache cache = MustCreate(options);
    std::mt19937 rng(1234);
    const std::vector<at::ScalarType> dtypes = {
        at::kFloat, at::kBFloat16, at::kHalf,  at::kLong,
        at::kByte,  at::kBool,     at::kDouble};
    at::manual_seed(5);
    for (int step = 0; step < 600; ++step) {
      const int64_t batch = rng() % 6;
      const std::string name = absl::StrCat("v", rng() % 4);
      const auto key = std::make_pair(batch, name);
      const int op = rng() % 10;
      if (op < 4) {
        const int64_t n = (rng() % 20 == 0) ? 20000 : rng() % 4000;
        at::ScalarType dtype = dtypes[rng() % dtypes.size()];
        at::Tensor t = at::randn({n}).mul(1000).to(dtype);
        ASSERT_OK(cache.Put(batch, name, t));
        model[key] = t;
      } else if (op < 8) {
        absl::StatusOr<c10::IValue> got = cache.Get(batch, name);
        if (model.count(key) == 0) {
          EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
        } else {
          ASSERT_OK(got);
          ExpectBitIdentical(c10::IValue(model[key]), *got,
                             absl::StrCat("step ", step));
        }
      } else {
        absl::Status s = cache.Release(batch, name);
        EXPECT_EQ(s.ok(), model.erase(key) == 1) << s;
      }
      const IntermediatesCacheStats& stats = cache.stats();
      ASSERT_LE(stats.bytes_held, options.memory_budget_bytes) << step;
      ASSERT_EQ(stats.values, static_cast<int64_t>(model.size()));
    }
    const IntermediatesCacheStats& stats = cache.stats();
    EXPECT_LE(stats.peak_bytes_held, options.memory_budget_bytes);
    EXPECT_GT(stats.spill_count, 10);
    EXPECT_GT(stats.reload_count, 10);
    EXPECT_GT(stats.oversized_count, 0);
    std::printf("random: %lld spills (%lld bytes), %lld reloads, peak %lld\n",
                static_cast<long long>(stats.spill_count),
                static_cast<long long>(stats.bytes_spilled),
                static_cast<long long>(stats.reload_count),
                static_cast<long long>(stats.peak_bytes_held));
    for (const auto& [key, t] : model) {
      absl::StatusOr<c10::IValue> got = cache.Get(key.first, key.second);
      ASSERT_OK(got);
      ExpectBitIdentical(c10::IValue(t), *got);
    }
    EXPECT_GT(CountFiles(options.spill_dir), 0);
  }
  // Destruction deletes every spill file.
  EXPECT_EQ(CountFiles(options.spill_dir), 0);
}

TEST(IntermediatesCacheTest, AutomaticSpillDirIsRemovedOnDestruction) {
  std::string dir;
  {
    IntermediatesCacheOptions options;
    options.memory_budget_bytes = 0;
    IntermediatesCache cache = MustCreate(options);
    ASSERT_OK(cache.Put(0, "x", Bytes(64, 1)));
    dir = cache.spill_dir();
    ASSERT_FALSE(dir.empty());
    EXPECT_EQ(CountFiles(dir), 1);
    // Moving the cache moves ownership of the files.
    IntermediatesCache moved = std::move(cache);
    EXPECT_EQ(CountFiles(dir), 1);
  }
  EXPECT_FALSE(Exists(dir));
}

TEST(IntermediatesCacheTest, CreatedSpillDirIsRemovedOnDestruction) {
  const std::string dir = absl::StrCat(TestDir("parent"), "/made-by-cache");
  {
    IntermediatesCacheOptions options;
    options.memory_budget_bytes = 0;
    options.spill_dir = dir;
    IntermediatesCache cache = MustCreate(options);
    ASSERT_OK(cache.Put(0, "x", Bytes(64, 1)));
    EXPECT_EQ(CountFiles(dir), 1);
  }
  EXPECT_FALSE(Exists(dir));
}

TEST(IntermediatesCacheTest, UnwritableSpillDirIsAStatus) {
  IntermediatesCacheOptions options;
  options.memory_budget_bytes = 100;
  options.spill_dir = "/proc/tracecut-no-such-dir";
  IntermediatesCache cache = MustCreate(options);
  ASSERT_OK(cache.Put(0, "a", Bytes(80, 1)));
  // Needs "a" spilled: fails, stores nothing, keeps "a".
  absl::Status s = cache.Put(0, "b", Bytes(80, 2));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/proc/tracecut-no-such-dir"), std::string::npos)
      << s;
  EXPECT_FALSE(cache.Contains(0, "b"));
  EXPECT_FALSE(cache.IsSpilled(0, "a"));
  EXPECT_EQ(cache.stats().bytes_held, 80);
  // Larger than the budget: also a status.
  EXPECT_FALSE(cache.Put(0, "c", Bytes(400, 3)).ok());
  absl::StatusOr<c10::IValue> a = cache.Get(0, "a");
  ASSERT_OK(a);
  EXPECT_TRUE(at::equal(a->toTensor(), Bytes(80, 1)));

  // A spill_dir that is a file.
  const std::string file = absl::StrCat(TestDir("notadir"), "/file");
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  options.spill_dir = file;
  IntermediatesCache cache2 = MustCreate(options);
  s = cache2.Put(0, "big", Bytes(400, 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("not a directory"), std::string::npos) << s;
}

TEST(IntermediatesCacheTest, WriteFailureMidFileLeavesNoFile) {
  IntermediatesCacheOptions options;
  options.memory_budget_bytes = 1024;
  options.spill_dir = TestDir("diskfull");
  bool disk_full = true;
  options.spill_write_hook_for_testing = [&](const std::string&,
                                             int64_t offset) {
    if (disk_full && offset > 0) {
      return absl::ResourceExhaustedError("No space left on device");
    }
    return absl::OkStatus();
  };
  IntermediatesCache cache = MustCreate(options);
  absl::Status s = cache.Put(0, "big", Bytes(4096, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("batch 0 'big'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("No space left"), std::string::npos) << s;
  EXPECT_EQ(CountFiles(options.spill_dir), 0);
  EXPECT_FALSE(cache.Contains(0, "big"));
  EXPECT_EQ(cache.stats().spill_count, 0);
  EXPECT_EQ(cache.stats().bytes_on_disk, 0);

  disk_full = false;
  ASSERT_OK(cache.Put(0, "big", Bytes(4096, 1)));
  EXPECT_EQ(CountFiles(options.spill_dir), 1);
}

TEST(IntermediatesCacheTest, DamagedSpillFileIsDataLoss) {
  IntermediatesCacheOptions options;
  options.memory_budget_bytes = 0;
  options.spill_dir = TestDir("damaged");
  IntermediatesCache cache = MustCreate(options);
  ASSERT_OK(cache.Put(0, "x", Bytes(4096, 1)));
  DIR* d = ::opendir(options.spill_dir.c_str());
  ASSERT_NE(d, nullptr);
  std::string path;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.')
      path = absl::StrCat(options.spill_dir, "/", e->d_name);
  }
  ::closedir(d);
  ASSERT_FALSE(path.empty());
  // Flip one data byte.
  FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, 200, SEEK_SET);
  std::fputc(0x5a, f);
  std::fclose(f);
  absl::StatusOr<c10::IValue> got = cache.Get(0, "x");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_NE(got.status().message().find("checksum"), std::string::npos)
      << got.status();
  // Truncated.
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  got = cache.Get(0, "x");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
}

TEST(IntermediatesCacheTest, MissingKeysAndBadValues) {
  IntermediatesCache cache = MustCreate({});
  absl::StatusOr<c10::IValue> got = cache.Get(3, "nope");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("batch 3 'nope'"), std::string::npos)
      << got.status();
  EXPECT_EQ(cache.Release(3, "nope").code(), absl::StatusCode::kNotFound);

  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get());
  absl::Status s = cache.Put(
      0, "future", c10::ivalue::Tuple::create({at::ones({2}), future}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("Future"), std::string::npos) << s;
  EXPECT_FALSE(cache.Contains(0, "future"));

  s = cache.Put(0, "sparse", at::eye(3).to_sparse());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  IntermediatesCacheOptions bad;
  bad.memory_budget_bytes = -5;
  EXPECT_EQ(IntermediatesCache::Create(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(IntermediatesCacheTest, PutReplacesAndReleaseBatch) {
  IntermediatesCache cache = MustCreate({});
  ASSERT_OK(cache.Put(1, "a", Bytes(400, 1)));
  ASSERT_OK(cache.Put(1, "a", Bytes(800, 2)));
  EXPECT_EQ(cache.stats().bytes_held, 800);
  ASSERT_OK(cache.Put(1, "b", c10::IValue(int64_t{3})));
  ASSERT_OK(cache.Put(2, "a", Bytes(400, 3)));
  EXPECT_EQ(cache.Names(1), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(cache.ReleaseBatch(1), 2);
  EXPECT_TRUE(cache.Names(1).empty());
  EXPECT_TRUE(cache.Contains(2, "a"));
  EXPECT_EQ(cache.stats().bytes_held, 400);
  EXPECT_EQ(cache.stats().peak_bytes_held, 1200);
}

TEST(IntermediatesCacheTest, ComputeDeviceOverride) {
  IntermediatesCacheOptions options;
  options.compute_device = c10::Device(c10::kCPU);
  options.memory_budget_bytes = 0;
  options.spill_dir = TestDir("device");
  IntermediatesCache cache = MustCreate(options);
  ASSERT_OK(cache.Put(0, "x", at::ones({4})));
  absl::StatusOr<c10::IValue> got = cache.Get(0, "x");
  ASSERT_OK(got);
  EXPECT_TRUE(got->toTensor().device().is_cpu());
}

TEST(IntermediatesCacheTest, AllocationFailureIsResourceExhausted) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the "
                  "limit this test sets";
#endif
  IntermediatesCache cache = MustCreate({});
  // A row of a [2, N] tensor is not compact: Put copies it (32 MiB), so the
  // allocation that fails is the cache's own.
  const int64_t n = int64_t{8} << 20;
  at::Tensor base = at::ones({2, n}, at::kFloat);
  at::Tensor row = base[0];
  // Once without a limit: LibTorch's thread pool starts here, not under it.
  ASSERT_OK(cache.Put(0, "v", row));
  int64_t stored = 1;
  absl::Status failed;
  {
    ScopedAddressSpaceLimit limit(int64_t{256} << 20);
    if (!limit.ok()) GTEST_SKIP() << "cannot set RLIMIT_AS";
    for (int64_t b = 1; b < 64; ++b) {
      failed = cache.Put(b, "v", row);
      if (!failed.ok()) break;
      ++stored;
    }
  }
  ASSERT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
  EXPECT_THAT(
      std::string(failed.message()),
      ::testing::StartsWith(absl::StrCat(
          "intermediates cache: cannot allocate memory to store "
          "batch ",
          stored, " 'v' (32.0 MiB): out of memory: cannot allocate 32.0 MiB")))
      << failed;
  // Nothing half-stored; what was stored is intact and can be released.
  EXPECT_FALSE(cache.Contains(stored, "v"));
  EXPECT_EQ(cache.stats().values, stored);
  EXPECT_EQ(cache.stats().bytes_held, stored * n * 4);
  for (int64_t b = 0; b < stored; ++b) {
    absl::StatusOr<c10::IValue> v = cache.Take(b, "v");
    ASSERT_OK(v);
    EXPECT_TRUE(v->toTensor().equal(row));
  }
  EXPECT_EQ(cache.stats().values, 0);
  EXPECT_EQ(cache.stats().bytes_held, 0);
}

}  // namespace
}  // namespace tracecut::pipelines
