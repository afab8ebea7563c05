#include "pipelines/intermediates_cache.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "pipelines/intermediates_cache_internal.h"
#include "quantization/quantize.h"
#include "runtime/torch_status.h"
#include "util/files.h"
#include "util/format.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

using internal::Describe;
using internal::TensorMeta;
using util::HumanBytes;

using Key = internal::CacheKey;

constexpr size_t kMaxNotes = 64;

// Rebuilds `v` with every tensor t (undefined ones included, in depth-first
// order) replaced by fn(t). InvalidArgument for IValue kinds a cache value
// may not contain.
absl::StatusOr<c10::IValue> MapTensors(
    const c10::IValue& v,
    const std::function<absl::StatusOr<at::Tensor>(const at::Tensor&)>& fn) {
  if (v.isTensor()) {
    ASSIGN_OR_RETURN(at::Tensor t, fn(v.toTensor()));
    return c10::IValue(std::move(t));
  }
  if (v.isNone() || v.isBool() || v.isInt() || v.isDouble() ||
      v.isComplexDouble() || v.isString() || v.isDevice()) {
    return v;
  }
  if (v.isTuple()) {
    const c10::ivalue::Tuple& tuple = v.toTupleRef();
    std::vector<c10::IValue> elements;
    elements.reserve(tuple.elements().size());
    for (const c10::IValue& e : tuple.elements()) {
      ASSIGN_OR_RETURN(c10::IValue mapped, MapTensors(e, fn));
      elements.push_back(std::move(mapped));
    }
    // Keep NamedTuple types. type() infers the type of an unnamed tuple from
    // its elements and throws on an undefined tensor: such a tuple is not
    // named.
    c10::TupleTypePtr type;
    try {
      type = tuple.type();
    } catch (const c10::Error&) {
    }
    if (type != nullptr && type->name().has_value()) {
      return c10::IValue(
          c10::ivalue::Tuple::createNamed(std::move(elements), type));
    }
    return c10::IValue(c10::ivalue::Tuple::create(std::move(elements)));
  }
  if (v.isList()) {
    c10::List<c10::IValue> list = v.toList();
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    for (const c10::IValue& e : list) {
      ASSIGN_OR_RETURN(c10::IValue mapped, MapTensors(e, fn));
      out.push_back(std::move(mapped));
    }
    return c10::IValue(std::move(out));
  }
  if (v.isGenericDict()) {
    c10::Dict<c10::IValue, c10::IValue> dict = v.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    out.reserve(dict.size());
    for (const auto& item : dict) {
      ASSIGN_OR_RETURN(c10::IValue mapped, MapTensors(item.value(), fn));
      out.insert(item.key(), std::move(mapped));
    }
    return c10::IValue(std::move(out));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("intermediates cache values may hold tensors, tuples, "
                   "lists, dicts and scalars, not ",
                   v.tagKind()));
}

bool IsCompact(const at::Tensor& t) {
  return t.is_contiguous() && t.storage_offset() == 0 &&
         t.storage().nbytes() == t.nbytes();
}

// Tensor bytes of a cache value (allocates nothing: for error messages
// about allocation failures).
int64_t ValueBytes(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  }
  int64_t sum = 0;
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) sum += ValueBytes(e);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) sum += ValueBytes(e);
  } else if (v.isGenericDict()) {
    for (const auto& item : v.toGenericDict()) sum += ValueBytes(item.value());
  }
  return sum;
}

// An allocation failure while the cache handles (batch, name), as one line:
// "intermediates cache: cannot allocate memory to store batch 3 'x' (512.0
// MiB): out of memory: cannot allocate 512.0 MiB". `failed` is the
// ResourceExhausted status of the exception; its message ends with what
// LibTorch said.
absl::Status OutOfMemory(const absl::Status& failed, absl::string_view doing,
                         int64_t batch, absl::string_view name, int64_t bytes) {
  absl::string_view why = failed.message();
  if (size_t at = why.find("out of memory"); at != absl::string_view::npos) {
    why = why.substr(at);
  }
  absl::Status s = absl::ResourceExhaustedError(absl::StrCat(
      "intermediates cache: cannot allocate memory to ", doing, " batch ",
      batch, " '", name, "' (", HumanBytes(bytes), "): ", why,
      "; lower the recipe's cache.memory_budget_bytes to spill more to "
      "disk, or calibrate on fewer samples"));
  failed.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    s.SetPayload(url, payload);
  });
  return s;
}

}  // namespace

struct IntermediatesCache::State {
  struct Entry {
    // Resident: tensors on the offload device. Spilled: the same structure
    // with every tensor replaced by an empty placeholder.
    c10::IValue value;
    std::vector<TensorMeta> tensors;
    int64_t bytes = 0;
    bool resident = true;
    bool oversized = false;
    std::string spill_path;        // Non-empty while a valid file copy exists.
    std::list<Key>::iterator lru;  // Valid when resident and bytes > 0.
  };

  IntermediatesCacheOptions options;
  // std::map, not a swiss table: its insert is all-or-nothing when an
  // allocation fails, where absl::flat_hash_map's growth is not (a throwing
  // resize leaves it with a new capacity over the old slots, and destroying
  // it then crashes). Ordered by (batch, name), which Names() uses.
  std::map<Key, Entry> entries;
  std::list<Key> lru;  // Front: least recently used.
  IntermediatesCacheStats stats;
  std::vector<std::string> notes;
  std::string spill_dir;
  bool created_spill_dir = false;
  int64_t instance = 0;
  int64_t next_file = 0;

  ~State() {
    for (auto& [key, entry] : entries) {
      if (!entry.spill_path.empty()) ::unlink(entry.spill_path.c_str());
    }
    if (created_spill_dir) ::rmdir(spill_dir.c_str());
  }

  bool OverBudget(int64_t extra) const {
    return options.memory_budget_bytes >= 0 &&
           stats.bytes_held + extra > options.memory_budget_bytes;
  }

  // Best effort: a note that cannot be allocated is dropped.
  void AddNote(std::string note) {
    if (notes.size() >= kMaxNotes) return;
    try {
      notes.push_back(std::move(note));
    } catch (const std::bad_alloc&) {
    }
  }

  absl::Status EnsureSpillDir() {
    if (!spill_dir.empty()) return absl::OkStatus();
    if (options.spill_dir.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string pattern =
          absl::StrCat((tmp != nullptr && *tmp != '\0') ? tmp : "/tmp",
                       "/tracecut-cache-XXXXXX");
      std::vector<char> buf(pattern.begin(), pattern.end());
      buf.push_back('\0');
      if (::mkdtemp(buf.data()) == nullptr) {
        return util::ErrnoError(
            errno, absl::StrCat("intermediates cache: cannot create a spill "
                                "directory ",
                                pattern));
      }
      spill_dir = buf.data();
      created_spill_dir = true;
      return absl::OkStatus();
    }
    const std::string& dir = options.spill_dir;
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "intermediates cache: spill_dir ", dir, " is not a directory"));
      }
    } else if (errno == ENOENT && ::mkdir(dir.c_str(), 0700) == 0) {
      created_spill_dir = true;
    } else {
      return util::ErrnoError(
          errno,
          absl::StrCat("intermediates cache: cannot use spill_dir ", dir));
    }
    spill_dir = dir;
    return absl::OkStatus();
  }

  // Writes `tensors` (any devices) to a new spill file for `key`.
  absl::StatusOr<std::string> WriteSpill(const Key& key,
                                         const std::vector<at::Tensor>& tensors,
                                         const std::vector<TensorMeta>& metas,
                                         int64_t bytes) {
    RETURN_IF_ERROR(EnsureSpillDir());
    // Everything that can throw happens before the file exists.
    std::vector<at::Tensor> cpu;
    for (const at::Tensor& t : tensors) {
      if (t.defined() && t.nbytes() > 0) {
        cpu.push_back(t.to(at::kCPU).contiguous());
      }
    }
    std::string path =
        absl::StrCat(spill_dir, "/tracecut-", ::getpid(), "-", instance, "-",
                     next_file++, "-b", key.first, ".spill");
    RETURN_IF_ERROR(internal::WriteSpillFile(
        path, key, cpu, metas, bytes, options.spill_write_hook_for_testing));
    ++stats.spill_count;
    stats.bytes_spilled += bytes;
    stats.bytes_on_disk += bytes;
    return path;
  }

  // Tensors of `value` in depth-first order.
  static std::vector<at::Tensor> Tensors(const c10::IValue& value) {
    std::vector<at::Tensor> out;
    MapTensors(value, [&](const at::Tensor& t) -> absl::StatusOr<at::Tensor> {
      out.push_back(t);
      return t;
    }).IgnoreError();
    return out;
  }

  static c10::IValue Skeleton(const c10::IValue& value) {
    absl::StatusOr<c10::IValue> s = MapTensors(
        value, [](const at::Tensor& t) -> absl::StatusOr<at::Tensor> {
          if (!t.defined()) return t;
          return at::empty({0}, at::TensorOptions().dtype(t.scalar_type()));
        });
    return s.ok() ? *std::move(s) : c10::IValue();
  }

  // `skeleton` with its tensors taken from `tensors`, in order, each moved by
  // `place(index, tensor)`.
  static absl::StatusOr<c10::IValue> Fill(
      const c10::IValue& skeleton, const std::vector<at::Tensor>& tensors,
      const std::function<at::Tensor(size_t, const at::Tensor&)>& place) {
    size_t i = 0;
    return MapTensors(skeleton,
                      [&](const at::Tensor&) -> absl::StatusOr<at::Tensor> {
                        if (i >= tensors.size()) {
                          return absl::InternalError("tensor count mismatch");
                        }
                        const at::Tensor& t = tensors[i];
                        at::Tensor placed = t.defined() ? place(i, t) : t;
                        ++i;
                        return placed;
                      });
  }

  // Spills one resident value (no write if its file is still valid).
  absl::Status Evict(const Key& key, Entry& e) {
    if (e.spill_path.empty()) {
      ASSIGN_OR_RETURN(e.spill_path,
                       WriteSpill(key, Tensors(e.value), e.tensors, e.bytes));
    }
    e.value = Skeleton(e.value);
    e.resident = false;
    stats.bytes_held -= e.bytes;
    lru.erase(e.lru);
    return absl::OkStatus();
  }

  // Spills least recently used values until `extra` more bytes fit.
  absl::Status MakeRoom(int64_t extra) {
    while (OverBudget(extra) && !lru.empty()) {
      Key victim = lru.front();
      auto it = entries.find(victim);
      if (it == entries.end()) return absl::InternalError("stale LRU entry");
      RETURN_IF_ERROR(Evict(victim, it->second));
    }
    return absl::OkStatus();
  }

  // `node` holds `key` (allocated beforehand, so that this cannot fail).
  void MakeResident(Entry& e, c10::IValue offloaded, std::list<Key>& node) {
    e.value = std::move(offloaded);
    e.resident = true;
    if (e.bytes > 0) {
      e.lru = node.begin();
      lru.splice(lru.end(), node);
    }
    stats.bytes_held += e.bytes;
    stats.peak_bytes_held = std::max(stats.peak_bytes_held, stats.bytes_held);
  }

  void Touch(const Key& key, Entry& e) {
    if (e.resident && e.bytes > 0) lru.splice(lru.end(), lru, e.lru);
  }

  absl::StatusOr<c10::IValue> ToCompute(const Entry& e,
                                        const c10::IValue& value) {
    const std::vector<at::Tensor> tensors = Tensors(value);
    return Fill(value, tensors, [&](size_t i, const at::Tensor& t) {
      const c10::Device device =
          options.compute_device.value_or(e.tensors[i].onload_device);
      return t.to(device);
    });
  }

  absl::Status Remove(const Key& key) {
    auto it = entries.find(key);
    if (it == entries.end()) {
      return absl::NotFoundError(
          absl::StrCat("intermediates cache has no ", Describe(key)));
    }
    Entry& e = it->second;
    if (e.resident) {
      if (e.bytes > 0) lru.erase(e.lru);
      stats.bytes_held -= e.bytes;
    }
    absl::Status status;
    if (!e.spill_path.empty()) {
      stats.bytes_on_disk -= e.bytes;
      if (::unlink(e.spill_path.c_str()) != 0 && errno != ENOENT) {
        status = util::ErrnoError(
            errno,
            absl::StrCat("intermediates cache: cannot delete ", e.spill_path));
      }
    }
    entries.erase(it);
    stats.values = static_cast<int64_t>(entries.size());
    return status;
  }

  absl::Status Put(const Key& key, const c10::IValue& value) {
    if (entries.contains(key)) RETURN_IF_ERROR(Remove(key));
    Entry e;
    // Detached and compact on the offload device; metadata recorded.
    std::vector<at::Tensor> sources;
    ASSIGN_OR_RETURN(
        c10::IValue detached,
        MapTensors(
            value, [&](const at::Tensor& t) -> absl::StatusOr<at::Tensor> {
              if (t.defined() &&
                  (t.layout() != at::kStrided || t.is_quantized())) {
                return absl::InvalidArgumentError(
                    absl::StrCat("intermediates cache stores dense tensors "
                                 "only, got layout ",
                                 c10::str(t.layout()),
                                 t.is_quantized() ? " (quantized)" : ""));
              }
              TensorMeta m;
              m.defined = t.defined();
              if (m.defined) {
                m.dtype = t.scalar_type();
                m.sizes = t.sizes().vec();
                m.onload_device = t.device();
                m.nbytes = static_cast<int64_t>(t.nbytes());
                e.bytes += m.nbytes;
              }
              e.tensors.push_back(std::move(m));
              at::Tensor d = t.defined() ? t.detach() : t;
              sources.push_back(d);
              return d;
            }));
    if (options.memory_budget_bytes >= 0 &&
        e.bytes > options.memory_budget_bytes) {
      e.value = Skeleton(detached);
      e.resident = false;
      e.oversized = true;
      std::string note =
          absl::StrCat(Describe(key), " (", HumanBytes(e.bytes),
                       ") exceeds the whole memory budget of ",
                       HumanBytes(options.memory_budget_bytes),
                       "; kept on disk only and read from disk on every Get");
      ASSIGN_OR_RETURN(std::string path,
                       WriteSpill(key, sources, e.tensors, e.bytes));
      try {
        e.spill_path = path;
        entries.emplace(key, std::move(e));
      } catch (...) {
        // Not stored: its file goes too.
        ::unlink(path.c_str());
        stats.bytes_on_disk -= e.bytes;
        throw;
      }
      ++stats.oversized_count;
      stats.values = static_cast<int64_t>(entries.size());
      AddNote(std::move(note));
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(MakeRoom(e.bytes));
    ASSIGN_OR_RETURN(
        c10::IValue offloaded,
        Fill(detached, sources, [&](size_t, const at::Tensor& t) {
          at::Tensor o = t.to(options.offload_device);
          return IsCompact(o) ? o : o.clone(at::MemoryFormat::Contiguous);
        }));
    // Everything that allocates happens before the cache changes: an
    // allocation failure (an exception) leaves it as it was.
    std::list<Key> node{key};
    auto [it, inserted] = entries.emplace(key, std::move(e));
    MakeResident(it->second, std::move(offloaded), node);
    stats.values = static_cast<int64_t>(entries.size());
    return absl::OkStatus();
  }

  absl::StatusOr<c10::IValue> Get(const Key& key) {
    auto it = entries.find(key);
    if (it == entries.end()) {
      return absl::NotFoundError(
          absl::StrCat("intermediates cache has no ", Describe(key)));
    }
    Entry& e = it->second;
    if (e.resident) {
      Touch(key, e);
      return ToCompute(e, e.value);
    }
    ASSIGN_OR_RETURN(std::vector<at::Tensor> tensors,
                     internal::ReadSpillFile(e.spill_path, key, e.tensors));
    ++stats.reload_count;
    ASSIGN_OR_RETURN(
        c10::IValue loaded,
        Fill(e.value, tensors, [](size_t, const at::Tensor& t) { return t; }));
    if (e.oversized) return ToCompute(e, loaded);
    RETURN_IF_ERROR(MakeRoom(e.bytes));
    ASSIGN_OR_RETURN(c10::IValue offloaded,
                     Fill(loaded, tensors, [&](size_t, const at::Tensor& t) {
                       return t.to(options.offload_device);
                     }));
    std::list<Key> node{key};
    MakeResident(e, std::move(offloaded), node);
    return ToCompute(e, e.value);
  }
};

absl::StatusOr<IntermediatesCache> IntermediatesCache::Create(
    IntermediatesCacheOptions options) {
  if (options.memory_budget_bytes < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_budget_bytes must be >= 0 or -1 (unlimited), got ",
                     options.memory_budget_bytes));
  }
  static std::atomic<int64_t> next_instance{0};
  auto state = std::make_unique<State>();
  state->options = std::move(options);
  state->instance = next_instance++;
  return IntermediatesCache(std::move(state));
}

IntermediatesCache::IntermediatesCache(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
IntermediatesCache::IntermediatesCache(IntermediatesCache&&) noexcept = default;
IntermediatesCache& IntermediatesCache::operator=(
    IntermediatesCache&&) noexcept = default;
IntermediatesCache::~IntermediatesCache() = default;

// Put and Get: GuardTorch names the call in other errors; the outer
// TorchCall catches an allocation failure in building that name.
absl::Status IntermediatesCache::Put(int64_t batch, absl::string_view name,
                                     const c10::IValue& value) {
  absl::Status s = runtime::TorchCall("", [&] {
    return runtime::TorchCall(
        absl::StrCat("IntermediatesCache::Put(batch ", batch, " '", name, "')"),
        [&] { return state_->Put(Key(batch, std::string(name)), value); });
  });
  if (!absl::IsResourceExhausted(s)) return s;
  return OutOfMemory(s, "store", batch, name, ValueBytes(value));
}

absl::StatusOr<c10::IValue> IntermediatesCache::Get(int64_t batch,
                                                    absl::string_view name) {
  absl::StatusOr<c10::IValue> v = runtime::TorchCall("", [&] {
    return runtime::TorchCall(
        absl::StrCat("IntermediatesCache::Get(batch ", batch, " '", name, "')"),
        [&] { return state_->Get(Key(batch, std::string(name))); });
  });
  if (!absl::IsResourceExhausted(v.status())) return v;
  auto it = state_->entries.find(Key(batch, std::string(name)));
  return OutOfMemory(v.status(),
                     it != state_->entries.end() && !it->second.resident
                         ? "read back from disk"
                         : "return",
                     batch, name,
                     it != state_->entries.end() ? it->second.bytes : 0);
}

absl::StatusOr<c10::IValue> IntermediatesCache::Take(int64_t batch,
                                                     absl::string_view name) {
  ASSIGN_OR_RETURN(c10::IValue value, Get(batch, name));
  RETURN_IF_ERROR(Release(batch, name));
  return value;
}

absl::Status IntermediatesCache::Release(int64_t batch,
                                         absl::string_view name) {
  return runtime::TorchCall("intermediates cache: release", [&] {
    return state_->Remove(Key(batch, std::string(name)));
  });
}

int64_t IntermediatesCache::ReleaseBatch(int64_t batch) {
  std::vector<std::string> names = Names(batch);
  for (const std::string& name : names) {
    state_->Remove(Key(batch, name)).IgnoreError();
  }
  return static_cast<int64_t>(names.size());
}

bool IntermediatesCache::Contains(int64_t batch, absl::string_view name) const {
  return state_->entries.contains(Key(batch, std::string(name)));
}

bool IntermediatesCache::IsSpilled(int64_t batch,
                                   absl::string_view name) const {
  auto it = state_->entries.find(Key(batch, std::string(name)));
  return it != state_->entries.end() && !it->second.resident;
}

std::vector<std::string> IntermediatesCache::Names(int64_t batch) const {
  std::vector<std::string> names;
  for (auto it = state_->entries.lower_bound(Key(batch, std::string()));
       it != state_->entries.end() && it->first.first == batch; ++it) {
    names.push_back(it->first.second);
  }
  return names;
}

const IntermediatesCacheStats& IntermediatesCache::stats() const {
  return state_->stats;
}
const std::vector<std::string>& IntermediatesCache::notes() const {
  return state_->notes;
}
const std::string& IntermediatesCache::spill_dir() const {
  return state_->spill_dir;
}
const IntermediatesCacheOptions& IntermediatesCache::options() const {
  return state_->options;
}

}  // namespace tracecut::pipelines
