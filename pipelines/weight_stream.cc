#include "pipelines/weight_stream.h"

#include <malloc.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "ir/graph.h"
#include "runtime/finite.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::output::CompressedTensorsWriter;

using tracer::exported::IsStandIn;
using tracer::exported::StandIn;

absl::StatusOr<std::unique_ptr<WeightStream>> WeightStream::Create(
    runtime::GraphModule& model,
    std::map<std::string, tracer::exported::DeferredTensor> deferred,
    const std::string& checkpoint_dir, CompressedTensorsWriter* writer) {
  ASSIGN_OR_RETURN(checkpoint::Checkpoint source,
                   checkpoint::Checkpoint::Open(checkpoint_dir));
  auto stream = std::unique_ptr<WeightStream>(
      new WeightStream(model, std::move(source), writer));
  stream->deferred_ = std::move(deferred);
  for (const auto& b : model.module().named_buffers(/*recurse=*/true)) {
    if (stream->deferred_.contains(b.name)) stream->buffers_.insert(b.name);
  }
  for (const auto& [path, d] : stream->deferred_) {
    ASSIGN_OR_RETURN(at::Tensor t, model.GetTensor(path));
    if (!IsStandIn(t) && t.numel() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("WeightStream: '", path,
                       "' is not a stand-in: the model was not "
                       "loaded with its checkpoint tensors deferred"));
    }
  }
  ASSIGN_OR_RETURN(stream->canonical_, TiedAliases(model, stream->deferred_));
  for (const auto& [alias, path] : stream->canonical_) {
    stream->aliases_[path].push_back(alias);
  }
  return stream;
}

absl::StatusOr<std::map<std::string, std::string>> WeightStream::TiedAliases(
    const runtime::GraphModule& model,
    const std::map<std::string, tracer::exported::DeferredTensor>& deferred) {
  std::map<const c10::StorageImpl*, std::string> by_storage;
  for (const auto& [path, d] : deferred) {
    ASSIGN_OR_RETURN(at::Tensor t, model.GetTensor(path));
    by_storage.emplace(t.storage().unsafeGetStorageImpl(), path);
  }
  std::map<std::string, std::string> aliases;
  auto alias = [&](const std::string& path, const at::Tensor& t) {
    auto it = by_storage.find(t.storage().unsafeGetStorageImpl());
    if (it != by_storage.end() && it->second != path) {
      aliases[path] = it->second;
    }
  };
  for (const auto& p : model.module().named_parameters(/*recurse=*/true)) {
    alias(p.name, p.value);
  }
  for (const auto& b : model.module().named_buffers(/*recurse=*/true)) {
    alias(b.name, b.value);
  }
  return aliases;
}

absl::Status WeightStream::Plan(
    const std::vector<const partition::Subgraph*>& subgraphs) {
  const int n = static_cast<int>(subgraphs.size());
  first_.assign(n, {});
  last_.assign(n, {});
  span_.clear();
  // The deferred tensors at `prefix` itself or under it.
  auto under = [&](const std::string& prefix, int i) {
    auto touch = [&](const std::string& path) {
      auto [it, inserted] = span_.emplace(path, std::make_pair(i, i));
      if (!inserted) it->second.second = i;
    };
    if (deferred_.contains(prefix)) touch(prefix);
    if (auto it = canonical_.find(prefix); it != canonical_.end()) {
      touch(it->second);
    }
    const std::string dotted = prefix + ".";
    for (auto it = deferred_.lower_bound(dotted);
         it != deferred_.end() && absl::StartsWith(it->first, dotted); ++it) {
      touch(it->first);
    }
    for (auto it = canonical_.lower_bound(dotted);
         it != canonical_.end() && absl::StartsWith(it->first, dotted); ++it) {
      touch(it->second);
    }
  };
  for (int i = 0; i < n; ++i) {
    for (const ir::Node* node : subgraphs[i]->graph->nodes()) {
      if (node->op() == ir::OpKind::kGetAttr ||
          node->op() == ir::OpKind::kCallModule) {
        under(node->target(), i);
      }
    }
  }
  for (const auto& [path, span] : span_) {
    first_[span.first].push_back(path);
    last_[span.second].push_back(path);
  }
  return absl::OkStatus();
}

absl::Status WeightStream::LoadTensor(const std::string& path) {
  const tracer::exported::DeferredTensor& d = deferred_.at(path);
  at::Tensor t;
  std::string what;
  if (d.pieces.empty()) {
    ASSIGN_OR_RETURN(t, source_.Get(d.name));
    what = absl::StrCat(source_.FileOf(d.name), ": tensor ", d.name);
  } else {
    ASSIGN_OR_RETURN(t, checkpoint::ReadPieces(source_, d.name, d.pieces));
    what =
        absl::StrCat(source_.dir(), ": tensor ", d.name, " (", d.pieces.size(),
                     " pieces from ", d.pieces[0].name, " on)");
  }
  RETURN_IF_ERROR(runtime::CheckFinite(
      t, what, /*allow_infinite=*/buffers_.contains(path)));
  if (t.scalar_type() != d.dtype) {
    RETURN_IF_ERROR(runtime::TorchCall(absl::StrCat("converting ", what),
                                       [&] { t = t.to(d.dtype); }));
  }
  RETURN_IF_ERROR(SetTied(path, t));
  loaded_.insert(path);
  bytes_ += static_cast<int64_t>(t.nbytes());
  peak_bytes_ = std::max(peak_bytes_, bytes_);
  return absl::OkStatus();
}

absl::Status WeightStream::Release(const std::string& path) {
  ASSIGN_OR_RETURN(at::Tensor t, model_.GetTensor(path));
  bytes_ -= static_cast<int64_t>(t.nbytes());
  loaded_.erase(path);
  return SetTied(path, StandIn(deferred_.at(path).dtype, t.sizes().vec()));
}

absl::Status WeightStream::SetTied(const std::string& path,
                                   const at::Tensor& t) {
  RETURN_IF_ERROR(model_.SetTensor(path, t));
  if (auto it = aliases_.find(path); it != aliases_.end()) {
    for (const std::string& alias : it->second) {
      RETURN_IF_ERROR(model_.SetTensor(alias, t));
    }
  }
  return absl::OkStatus();
}

absl::Status WeightStream::Resume(int start) {
  if (start == 0)
    return writer_ != nullptr ? writer_->Clear() : absl::OkStatus();
  for (const auto& [path, span] : span_) {
    if (span.first >= start || span.second < start) continue;
    ASSIGN_OR_RETURN(at::Tensor t, model_.GetTensor(path));
    if (IsStandIn(t)) {
      RETURN_IF_ERROR(LoadTensor(path));
    } else {
      // Restored from the run's checkpoint (a modifier changed it).
      RETURN_IF_ERROR(SetTied(path, t));
      loaded_.insert(path);
      bytes_ += static_cast<int64_t>(t.nbytes());
    }
  }
  return absl::OkStatus();
}

absl::Status WeightStream::Load(int i) {
  for (const std::string& path : first_.at(i)) {
    if (!IsLoaded(path)) RETURN_IF_ERROR(LoadTensor(path));
  }
  return absl::OkStatus();
}

absl::Status WeightStream::WriteAndRelease(
    int index, const std::vector<std::string>& paths,
    const CalibrationResults& results) {
  if (paths.empty()) return absl::OkStatus();
  std::vector<std::pair<std::string, at::Tensor>> finals;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(at::Tensor t, model_.GetTensor(path));
    finals.emplace_back(path, std::move(t));
  }
  if (writer_ != nullptr) {
    RETURN_IF_ERROR(writer_->WriteShard(index, finals, results));
  }
  finals.clear();
  for (const std::string& path : paths) RETURN_IF_ERROR(Release(path));
  // Hand the freed weights back to the system: glibc raises its mmap
  // threshold to the size of freed large blocks, so later tensors of that
  // size come from the heap, whose free space it keeps; without this the
  // resident set grew by about a layer's weights per layer.
  ::malloc_trim(0);
  return absl::OkStatus();
}

absl::Status WeightStream::Done(int i, const CalibrationResults& results) {
  return WriteAndRelease(i, last_.at(i), results);
}

absl::Status WeightStream::LoadRest() {
  for (const auto& [path, d] : deferred_) {
    if (!span_.contains(path) && !IsLoaded(path)) {
      RETURN_IF_ERROR(LoadTensor(path));
    }
  }
  return absl::OkStatus();
}

absl::Status WeightStream::WriteRest(const CalibrationResults& results) {
  std::vector<std::string> rest;
  for (const auto& [path, d] : deferred_) {
    if (!span_.contains(path)) rest.push_back(path);
  }
  return WriteAndRelease(static_cast<int>(first_.size()), rest, results);
}

}  // namespace tracecut::pipelines
