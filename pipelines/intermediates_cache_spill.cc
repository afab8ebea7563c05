// Spill files of the intermediates cache: a header describing the value's
// tensors, their raw bytes, and a checksum over those bytes.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipelines/intermediates_cache_internal.h"
#include "util/files.h"
#include "util/format.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::pipelines::internal {
namespace {

constexpr char kMagic[8] = {'T', 'C', 'S', 'P', 'I', 'L', 'L', '1'};
constexpr int64_t kWriteChunk = int64_t{8} << 20;

// 64-bit FNV-1a over 8-byte words, then the tail bytes. A checksum against
// truncated or damaged spill files, not a cryptographic hash. Not
// util::Fnv1a64 (byte by byte): word steps hash GiBs of activations several
// times faster, and the checksum never outlives the process that wrote it.
uint64_t Checksum(const char* data, int64_t n, uint64_t h) {
  constexpr uint64_t kPrime = 1099511628211ull;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, data + i, 8);
    h = (h ^ word) * kPrime;
  }
  for (; i < n; ++i) h = (h ^ static_cast<unsigned char>(data[i])) * kPrime;
  return h;
}
constexpr uint64_t kChecksumSeed = 1469598103934665603ull;

void AppendPod(std::string& out, int64_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

std::string Header(const std::vector<TensorMeta>& metas) {
  std::string h(kMagic, sizeof(kMagic));
  AppendPod(h, static_cast<int64_t>(metas.size()));
  for (const TensorMeta& m : metas) {
    AppendPod(h, m.defined ? 1 : 0);
    AppendPod(h, static_cast<int64_t>(m.dtype));
    AppendPod(h, static_cast<int64_t>(m.sizes.size()));
    for (int64_t s : m.sizes) AppendPod(h, s);
    AppendPod(h, m.nbytes);
  }
  return h;
}

class FileCloser {
 public:
  explicit FileCloser(int fd) : fd_(fd) {}
  ~FileCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Closes now; the status of close(2).
  int Close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

}  // namespace

std::string Describe(const CacheKey& key) {
  return absl::StrCat("batch ", key.first, " '", key.second, "'");
}

absl::Status WriteSpillFile(const std::string& path, const CacheKey& key,
                            const std::vector<at::Tensor>& cpu,
                            const std::vector<TensorMeta>& metas, int64_t bytes,
                            const SpillWriteHook& hook) {
  const std::string what_failed =
      absl::StrCat("intermediates cache: cannot spill ", Describe(key), " (",
                   util::HumanBytes(bytes), ")");
  auto fail = [&](int err, absl::string_view what) {
    ::unlink(path.c_str());
    return util::ErrnoError(
        err, absl::StrCat(what_failed, " to ", path, ": ", what));
  };
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return util::ErrnoError(
        errno, absl::StrCat(what_failed, ": cannot create ", path));
  }
  FileCloser closer(fd);
  int64_t offset = 0;
  auto write_all = [&](const char* data, int64_t n) -> absl::Status {
    while (n > 0) {
      const int64_t chunk = std::min(n, kWriteChunk);
      if (hook) {
        absl::Status hooked = hook(path, offset);
        if (!hooked.ok()) {
          ::unlink(path.c_str());
          return util::Annotate(hooked,
                                absl::StrCat(what_failed, " to ", path));
        }
      }
      ssize_t w = ::write(fd, data, static_cast<size_t>(chunk));
      if (w < 0) {
        if (errno == EINTR) continue;
        return fail(errno, "write failed");
      }
      if (w == 0) return fail(EIO, "write made no progress");
      data += w;
      n -= w;
      offset += w;
    }
    return absl::OkStatus();
  };
  const std::string header = Header(metas);
  RETURN_IF_ERROR(
      write_all(header.data(), static_cast<int64_t>(header.size())));
  uint64_t sum = kChecksumSeed;
  for (const at::Tensor& t : cpu) {
    const char* data = static_cast<const char*>(t.data_ptr());
    const int64_t n = static_cast<int64_t>(t.nbytes());
    sum = Checksum(data, n, sum);
    RETURN_IF_ERROR(write_all(data, n));
  }
  RETURN_IF_ERROR(write_all(reinterpret_cast<const char*>(&sum), sizeof(sum)));
  if (closer.Close() != 0) return fail(errno, "close failed");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<at::Tensor>> ReadSpillFile(
    const std::string& path, const CacheKey& key,
    const std::vector<TensorMeta>& metas) {
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("intermediates cache: spill file ",
                                            path, " of ", Describe(key),
                                            " is unreadable: ", what));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return bad(std::strerror(errno));
  FileCloser closer(fd);
  auto read_all = [&](char* data, int64_t n) -> absl::Status {
    while (n > 0) {
      ssize_t r =
          ::read(fd, data, static_cast<size_t>(std::min(n, kWriteChunk)));
      if (r < 0) {
        if (errno == EINTR) continue;
        return bad(std::strerror(errno));
      }
      if (r == 0) return bad("truncated");
      data += r;
      n -= r;
    }
    return absl::OkStatus();
  };
  const std::string want = Header(metas);
  std::string header(want.size(), '\0');
  RETURN_IF_ERROR(read_all(header.data(), static_cast<int64_t>(header.size())));
  if (header != want) return bad("header does not match the cached value");
  std::vector<at::Tensor> tensors;
  tensors.reserve(metas.size());
  uint64_t sum = kChecksumSeed;
  for (const TensorMeta& m : metas) {
    if (!m.defined) {
      tensors.emplace_back();
      continue;
    }
    at::Tensor t = at::empty(m.sizes, at::TensorOptions().dtype(m.dtype));
    char* data = static_cast<char*>(t.data_ptr());
    const int64_t n = static_cast<int64_t>(t.nbytes());
    RETURN_IF_ERROR(read_all(data, n));
    sum = Checksum(data, n, sum);
    tensors.push_back(std::move(t));
  }
  uint64_t stored = 0;
  RETURN_IF_ERROR(read_all(reinterpret_cast<char*>(&stored), sizeof(stored)));
  if (stored != sum) return bad("checksum mismatch");
  char extra;
  if (::read(fd, &extra, 1) != 0) return bad("trailing bytes");
  return tensors;
}

}  // namespace tracecut::pipelines::internal
