#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors_header.h"
#include "util/files.h"
#include "util/path_guard.h"
#include "util/status_macros.h"

namespace tracecut::checkpoint {
namespace {

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
// An index lists every tensor once (DeepSeek-V3's 91k: about 9 MB).
constexpr uint64_t kMaxIndexBytes = 64 << 20;

std::optional<c10::ScalarType> DTypeOf(const std::string& name) {
  static const auto* const kTypes = new std::map<std::string, c10::ScalarType>{
      {"F64", c10::kDouble},
      {"F32", c10::kFloat},
      {"F16", c10::kHalf},
      {"BF16", c10::kBFloat16},
      {"I64", c10::kLong},
      {"I32", c10::kInt},
      {"I16", c10::kShort},
      {"I8", c10::kChar},
      {"U8", c10::kByte},
      {"BOOL", c10::kBool},
      {"U16", c10::kUInt16},
      {"U32", c10::kUInt32},
      {"U64", c10::kUInt64},
      {"F8_E4M3", c10::kFloat8_e4m3fn},
      {"F8_E5M2", c10::kFloat8_e5m2}};
  auto it = kTypes->find(name);
  if (it == kTypes->end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> NameOf(c10::ScalarType dtype) {
  static const auto* const kNames = [] {
    auto* names = new std::map<c10::ScalarType, std::string>;
    for (const char* name :
         {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL",
          "U16", "U32", "U64", "F8_E4M3", "F8_E5M2"}) {
      (*names)[*DTypeOf(name)] = name;
    }
    return names;
  }();
  auto it = kNames->find(dtype);
  if (it == kNames->end()) return std::nullopt;
  return it->second;
}

}  // namespace

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata) {
  // nlohmann::ordered_json keeps the tensors in the order given.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  size_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (header.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", name, "' given twice"));
    }
    std::optional<std::string> dtype = NameOf(tensor.scalar_type());
    if (!dtype.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", name, "' has dtype ",
                       c10::toString(tensor.scalar_type()),
                       ", which safetensors cannot store"));
    }
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const size_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", *dtype},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + offset);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  out += text;
  for (const torch::Tensor& t : data) {
    out.append(static_cast<const char*>(t.data_ptr()),
               t.numel() * t.element_size());
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path, bool follow_links, std::string name) {
  // Not blocking on a FIFO, refusing anything but a regular file, checked
  // on the open descriptor that is then mapped.
  ASSIGN_OR_RETURN(util::RegularFile file,
                   util::OpenRegularFile(path, "", follow_links));
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = name.empty() ? path : std::move(name);
  f->size_ = static_cast<size_t>(file.size);
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, file.fd.get(), 0);
    if (p == MAP_FAILED) {
      return util::ErrnoError(errno, absl::StrCat("cannot map '", path, "'"));
    }
    f->mapping_ = p;
    f->data_ = static_cast<const char*>(p);
  }
  RETURN_IF_ERROR(f->Parse());
  return f;
}

absl::StatusOr<std::shared_ptr<const SafetensorsFile>>
SafetensorsFile::FromBytes(std::string bytes, std::string name) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = std::move(name);
  f->owned_ = std::move(bytes);
  f->data_ = f->owned_.data();
  f->size_ = f->owned_.size();
  RETURN_IF_ERROR(f->Parse());
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, size_);
}

absl::Status SafetensorsFile::Parse() {
  ASSIGN_OR_RETURN(
      SafetensorsHeader header,
      ParseSafetensorsHeader(absl::string_view(data_, size_), name_));
  data_start_ = static_cast<size_t>(header.data_start);
  for (auto& [key, e] : header.tensors) {
    std::optional<c10::ScalarType> dtype = DTypeOf(e.dtype);
    if (!dtype.has_value()) {  // The two dtype tables disagree: our bug.
      return absl::InternalError(absl::StrCat(
          name_, ": tensor '", key, "': no ScalarType for ", e.dtype));
    }
    entries_.emplace(
        key, Entry{*dtype, std::move(e.shape), static_cast<size_t>(e.begin),
                   static_cast<size_t>(e.end)});
  }
  return absl::OkStatus();
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

absl::StatusOr<TensorInfo> SafetensorsFile::Info(
    const std::string& tensor) const {
  auto it = entries_.find(tensor);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat(name_, ": no tensor '", tensor, "'"));
  }
  return TensorInfo{it->second.dtype, it->second.shape};
}

absl::StatusOr<torch::Tensor> SafetensorsFile::Get(
    const std::string& tensor) const {
  auto it = entries_.find(tensor);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat(name_, ": no tensor '", tensor, "'"));
  }
  const Entry& e = it->second;
  torch::Tensor t = torch::empty(e.shape, torch::dtype(e.dtype));
  if (e.end > e.begin) {
    const char* begin = data_ + data_start_ + e.begin;
    std::memcpy(t.data_ptr(), begin, e.end - e.begin);
    if (mapping_ != nullptr) {
      // Whole pages inside the tensor's bytes only: a neighbour sharing a
      // page keeps it. The pages stay in the page cache; only this
      // process's resident set shrinks.
      const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
      const uintptr_t first =
          (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
      const uintptr_t last =
          (reinterpret_cast<uintptr_t>(begin) + (e.end - e.begin)) / page *
          page;
      if (last > first) {
        ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
      }
    }
  }
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, shard] : shard_of_) out.push_back(name);
  return out;
}

bool Checkpoint::HasWeights(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(dir) / kSingleFile,
                                 ec) ||
         std::filesystem::exists(std::filesystem::path(dir) / kIndexFile, ec);
}

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  ASSIGN_OR_RETURN(c.closed_, ClosedDir::Open(dir));
  const std::filesystem::path root(dir);
  std::error_code ec;
  if (std::filesystem::exists(root / kIndexFile, ec)) {
    const std::string index = (root / kIndexFile).string();
    ASSIGN_OR_RETURN(std::string index_path,
                     c.closed_.Resolve(kIndexFile, index));
    ASSIGN_OR_RETURN(std::string text,
                     util::ReadRegularFile(index_path, kMaxIndexBytes, index));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(index, ": not JSON: ", e.what()));
    }
    const auto map = j.is_object() ? j.find("weight_map") : j.end();
    if (map == j.end() || !map->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index,
                       ": not a safetensors index (wants {\"weight_map\": "
                       "{tensor: file}})"));
    }
    // Every file the index names is checked now, before anything is read:
    // a hostile index fails here, naming its entry.
    for (const auto& [tensor, file] : map->items()) {
      const std::string where =
          absl::StrCat(index, ": weight_map entry '", tensor, "'");
      if (!file.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " is not a file name"));
      }
      const std::string name = file.get<std::string>();
      if (!c.resolved_.contains(name)) {
        ASSIGN_OR_RETURN(
            std::string path,
            c.closed_.Resolve(name, absl::StrCat(where, " -> '", name, "'")));
        c.resolved_.emplace(name, std::move(path));
      }
      c.shard_of_[tensor] = name;
    }
    return c;
  }
  if (std::filesystem::exists(root / kSingleFile, ec) ||
      std::filesystem::is_symlink(root / kSingleFile, ec)) {
    ASSIGN_OR_RETURN(
        std::string path,
        c.closed_.Resolve(kSingleFile, (root / kSingleFile).string()));
    ASSIGN_OR_RETURN(std::shared_ptr<const SafetensorsFile> f,
                     SafetensorsFile::Open(path, /*follow_links=*/false,
                                           (root / kSingleFile).string()));
    for (const std::string& name : f->names()) c.shard_of_[name] = kSingleFile;
    c.resolved_.emplace(kSingleFile, path);
    c.open_[kSingleFile] = f;
    return c;
  }
  return absl::NotFoundError(absl::StrCat("checkpoint directory '", dir,
                                          "' has neither ", kSingleFile,
                                          " nor ", kIndexFile));
}

absl::StatusOr<TensorInfo> Checkpoint::Info(const std::string& tensor) const {
  ASSIGN_OR_RETURN(std::shared_ptr<const SafetensorsFile> f, Shard(tensor));
  return f->Info(tensor);
}

absl::StatusOr<torch::Tensor> Checkpoint::Get(const std::string& tensor) const {
  ASSIGN_OR_RETURN(std::shared_ptr<const SafetensorsFile> f, Shard(tensor));
  return f->Get(tensor);
}

std::string Checkpoint::FileOf(const std::string& tensor) const {
  auto it = shard_of_.find(tensor);
  return (std::filesystem::path(dir_) /
          (it == shard_of_.end() ? std::string("?") : it->second))
      .string();
}

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> Checkpoint::Shard(
    const std::string& tensor) const {
  auto it = shard_of_.find(tensor);
  if (it == shard_of_.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", dir_, "' has no tensor '", tensor, "'"));
  }
  auto open = open_.find(it->second);
  if (open == open_.end()) {
    // Resolved when the index was read; not following a link now keeps a
    // file swapped for one since from being read.
    ASSIGN_OR_RETURN(
        std::shared_ptr<const SafetensorsFile> f,
        SafetensorsFile::Open(resolved_.at(it->second),
                              /*follow_links=*/false, FileOf(tensor)));
    open = open_.emplace(it->second, std::move(f)).first;
  }
  if (!open->second->Has(tensor)) {
    return absl::InvalidArgumentError(
        absl::StrCat(open->second->name(), ": no tensor '", tensor,
                     "', which the checkpoint's index places there"));
  }
  return open->second;
}

}  // namespace tracecut::checkpoint
