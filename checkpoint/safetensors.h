#ifndef TRACECUT_CHECKPOINT_SAFETENSORS_H_
#define TRACECUT_CHECKPOINT_SAFETENSORS_H_

// Reading safetensors files and Hugging Face checkpoint directories by
// tensor name, lazily: a file is memory-mapped and only the tensors asked
// for are copied out, in their stored dtype.
//
//   ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open("llama-dir"));
//   ASSIGN_OR_RETURN(torch::Tensor w,
//                    ckpt.Get("model.layers.0.mlp.down_proj.weight"));
//
// Format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data.
// Every way a file can lie is an error naming the file and the tensor
// (safetensors_header.h): a header longer than the file or over 100 MB,
// duplicate names, offsets outside the data, overlapping or leaving gaps, a
// byte length that disagrees with shape x dtype, an unknown dtype.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/closed_dir.h"

namespace tracecut::checkpoint {

// A stored tensor's dtype and shape, from the header alone.
struct TensorInfo {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
};

class SafetensorsFile {
 public:
  // Maps `path`, which must be a regular file (a FIFO or device is
  // refused without blocking); `follow_links` false refuses a symbolic
  // link. `name` stands for the file in errors (default: `path`). `bytes`
  // variant: a safetensors image held in memory (e.g. embedded in an
  // archive). The
  // header is validated as checkpoint/safetensors_header.h says.
  static absl::StatusOr<std::shared_ptr<const SafetensorsFile>> Open(
      const std::string& path, bool follow_links = true, std::string name = "");
  static absl::StatusOr<std::shared_ptr<const SafetensorsFile>> FromBytes(
      std::string bytes, std::string name);
  ~SafetensorsFile();

  const std::string& name() const { return name_; }
  std::vector<std::string> names() const;
  bool Has(const std::string& tensor) const {
    return entries_.contains(tensor);
  }
  absl::StatusOr<TensorInfo> Info(const std::string& tensor) const;
  // A copy of the tensor (contiguous, CPU, stored dtype). The mapped pages
  // it was copied from are dropped from this process afterwards, so reading
  // a whole checkpoint tensor by tensor does not grow the resident set by
  // the file's size.
  absl::StatusOr<torch::Tensor> Get(const std::string& tensor) const;

 private:
  struct Entry {
    c10::ScalarType dtype;
    std::vector<int64_t> shape;
    size_t begin = 0, end = 0;  // Byte offsets into the data section.
  };
  SafetensorsFile() = default;
  absl::Status Parse();

  std::string name_;
  const char* data_ = nullptr;  // The whole file.
  size_t size_ = 0;
  void* mapping_ = nullptr;  // mmap'ed region, or null for owned bytes.
  std::string owned_;
  size_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
};

// A Hugging Face checkpoint directory: model.safetensors, or the shards
// that model.safetensors.index.json's "weight_map" names (opened when a
// tensor in them is first asked for). A closed world (closed_dir.h): every
// file the index names must resolve to a regular file inside the
// directory, checked by Open for all of them.
class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> Open(const std::string& dir);
  // Whether `dir` holds safetensors weights.
  static bool HasWeights(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool Has(const std::string& tensor) const {
    return shard_of_.contains(tensor);
  }
  // Every tensor's name, sorted.
  std::vector<std::string> names() const;
  absl::StatusOr<TensorInfo> Info(const std::string& tensor) const;
  absl::StatusOr<torch::Tensor> Get(const std::string& tensor) const;
  // The file holding `tensor`, for error messages ("DIR/model-00001-of-...").
  std::string FileOf(const std::string& tensor) const;

 private:
  absl::StatusOr<std::shared_ptr<const SafetensorsFile>> Shard(
      const std::string& tensor) const;

  std::string dir_;
  ClosedDir closed_;
  std::map<std::string, std::string> shard_of_;  // Tensor -> file name.
  std::map<std::string, std::string> resolved_;  // File name -> real path.
  mutable std::map<std::string, std::shared_ptr<const SafetensorsFile>> open_;
};

// A safetensors image of `tensors`, in the given order (names must be
// unique), with `metadata` as "__metadata__" (omitted when empty). The header
// is padded with spaces to a multiple of 8 bytes, as the safetensors package
// writes it; the same tensors give the same bytes. Tensors are written
// contiguous, from the CPU, in their own dtype; a dtype safetensors cannot
// store is InvalidArgument naming the tensor.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace tracecut::checkpoint

#endif  // TRACECUT_CHECKPOINT_SAFETENSORS_H_
