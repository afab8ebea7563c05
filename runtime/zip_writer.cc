#include "runtime/zip_writer.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <functional>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

// Appends to `out` until an append fails; then keeps nothing and reports
// every write as done, so LibTorch's writer never sees a short write (its
// cue to throw, again, from its destructor).
template <typename Bytes>
class Sink {
 public:
  size_t Write(const void* data, size_t n) noexcept {
    if (failed_) return n;
    try {
      const char* p = static_cast<const char*>(data);
      out_.insert(out_.end(), p, p + n);
    } catch (...) {
      failed_ = true;
      Bytes().swap(out_);
    }
    return n;
  }
  bool failed() const { return failed_; }
  Bytes Take() { return std::move(out_); }

 private:
  Bytes out_;
  bool failed_ = false;
};

absl::Status OutOfMemory(absl::string_view what) {
  return absl::ResourceExhaustedError(
      absl::StrCat(what, ": out of memory while serializing"));
}

}  // namespace

absl::StatusOr<std::vector<char>> PickleSave(const c10::IValue& value,
                                             absl::string_view what) {
  // As torch::jit::pickle_save: the pickle, then an archive of it and its
  // tensors. The pickle is built before any zip writer exists, so its
  // exceptions unwind normally.
  std::vector<char> pickle;
  std::vector<at::Tensor> tensors;
  RETURN_IF_ERROR(TorchCall(what, [&] {
    torch::jit::Pickler pickler([&](const char* buf, size_t size) {
      pickle.insert(pickle.end(), buf, buf + size);
    });
    pickler.protocol();
    pickler.pushIValue(value);
    pickler.stop();
    tensors = pickler.tensorData();
  }));
  Sink<std::vector<char>> sink;
  RETURN_IF_ERROR(TorchCall(what, [&] {
    caffe2::serialize::PyTorchStreamWriter writer(
        [&sink](const void* data, size_t n) { return sink.Write(data, n); });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(),
                                       tensors, writer);
    writer.writeEndOfFile();
  }));
  if (sink.failed()) return OutOfMemory(what);
  return sink.Take();
}

absl::StatusOr<std::string> SaveModuleBytes(
    const torch::jit::Module& module,
    const torch::jit::ExtraFilesMap& extra_files, absl::string_view what) {
  Sink<std::string> sink;
  RETURN_IF_ERROR(TorchCall(what, [&] {
    torch::jit::ExportModule(
        module,
        [&sink](const void* data, size_t n) { return sink.Write(data, n); },
        extra_files);
  }));
  if (sink.failed()) return OutOfMemory(what);
  return sink.Take();
}

}  // namespace tracecut::runtime
