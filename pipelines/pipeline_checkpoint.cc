#include "pipelines/pipeline_checkpoint.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/torch_status.h"
#include "runtime/zip_writer.h"
#include "util/files.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::Modifier;
using ::tracecut::modifiers::RunContext;
namespace {

// ---------------------------------------------------------------------------
// Note [Checkpoints]
// ------------------
// A run directory holds:
//   weights-NNNNN.pt  the tensors modifiers changed while subgraph NNNNN ran
//                     (a pickled dict path -> tensor), written once;
//   state.pt          a pickled dict: format, version, the run's identity
//                     (`identity`, see RunIdentity in pipeline.cc),
//                     next_subgraph, the weight files so far,
//                     CalibrationResults, each modifier's SaveState under
//                     its name, and the cache: one dict name -> value per
//                     batch.
// Both are written to a temporary file, fsync'ed and renamed, weights
// first, so state.pt always describes a complete set of weight files: a
// run killed at any point resumes from the last state.pt. Weights are split
// per subgraph so a checkpoint costs the new weights, not all of them.
// Tensors round-trip bit for bit (pickle keeps raw bytes), the cache gets
// back exactly the values it held, and modifiers continue from the state
// they had, so a resumed run computes exactly what an uninterrupted one
// does.
//
// A rank of a data-parallel run keeps its states as state.pt.NNNNN (NNNNN:
// next_subgraph), the last two of them: ranks synchronise before each
// checkpoint (CheckpointGroup in pipeline.h), so when a run dies their
// newest states are at most one subgraph apart, and every rank still holds
// the older of the two. The weight files a later state added are rewritten
// when the run continues from an earlier one.

constexpr char kCheckpointFormat[] = "tracecut-calibration-checkpoint";
constexpr int64_t kCheckpointVersion = 1;
constexpr char kStateFile[] = "state.pt";

// Modifier states are saved under "<position>:<name>" (a recipe may hold
// two modifiers of one kind).
std::string StateKey(size_t index, const Modifier& m) {
  return absl::StrCat(index, ":", m.name());
}

std::string WeightFileName(int subgraph) {
  return absl::StrFormat("weights-%05d.pt", subgraph);
}

c10::impl::GenericDict NewDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

absl::Status WritePickle(const std::string& path, const std::vector<char>& b) {
  return util::WriteFileAtomically(path, absl::string_view(b.data(), b.size()));
}

}  // namespace

RunCheckpoint::RunCheckpoint(std::string dir, std::string identity,
                             bool keep_previous)
    : dir_(std::move(dir)),
      identity_(std::move(identity)),
      keep_previous_(keep_previous) {}

std::string RunCheckpoint::StatePath(int next) const {
  if (!keep_previous_) return absl::StrCat(dir_, "/", kStateFile);
  return absl::StrFormat("%s/%s.%05d", dir_, kStateFile, next);
}

std::vector<int> RunCheckpoint::Kept() const {
  std::vector<int> out;
  if (!keep_previous_) return out;
  std::error_code ec;
  const std::string prefix = absl::StrCat(kStateFile, ".");
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    std::string name = e.path().filename().string();
    absl::string_view digits(name);
    int next = 0;
    // Not the temporaries of a write that was cut short (".state.pt...").
    if (!absl::ConsumePrefix(&digits, prefix) || digits.size() != 5 ||
        !absl::SimpleAtoi(digits, &next)) {
      continue;
    }
    out.push_back(next);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status RunCheckpoint::DiscardAfter(int start) const {
  for (int next : Kept()) {
    if (next > start && std::remove(StatePath(next).c_str()) != 0) {
      return util::ErrnoError(errno,
                              absl::StrCat("cannot remove ", StatePath(next)));
    }
  }
  return absl::OkStatus();
}

absl::Status RunCheckpoint::CreateDir() const { return util::MakeDirs(dir_); }

absl::Status RunCheckpoint::Write(int next, RunContext& ctx,
                                  absl::Span<Modifier* const> modifiers,
                                  IntermediatesCache& cache) {
  std::set<std::string> updated = ctx.TakeUpdatedTensors();
  if (!updated.empty()) {
    c10::impl::GenericDict weights = NewDict();
    for (const std::string& path : updated) {
      ASSIGN_OR_RETURN(at::Tensor t, ctx.model().GetTensor(path));
      weights.insert(path, t.detach());
    }
    ASSIGN_OR_RETURN(std::vector<char> bytes,
                     runtime::PickleSave(weights, "checkpoint weights"));
    std::string name = WeightFileName(next - 1);
    RETURN_IF_ERROR(WritePickle(absl::StrCat(dir_, "/", name), bytes));
    weight_files_.push_back(name);
  }
  c10::impl::GenericDict state = NewDict();
  state.insert("format", std::string(kCheckpointFormat));
  state.insert("version", kCheckpointVersion);
  state.insert("identity", identity_);
  state.insert("next_subgraph", static_cast<int64_t>(next));
  c10::List<std::string> files;
  for (const std::string& f : weight_files_) files.push_back(f);
  state.insert("weight_files", files);
  state.insert("results", ctx.results().ToIValue());
  c10::impl::GenericDict mods = NewDict();
  for (size_t k = 0; k < modifiers.size(); ++k) {
    ASSIGN_OR_RETURN(c10::IValue s, modifiers[k]->SaveState());
    mods.insert(StateKey(k, *modifiers[k]), s);
  }
  state.insert("modifiers", mods);
  c10::impl::GenericList values_per_batch(c10::AnyType::get());
  for (int64_t b = 0; b < ctx.num_batches(); ++b) {
    c10::impl::GenericDict values = NewDict();
    for (const std::string& name : cache.Names(b)) {
      ASSIGN_OR_RETURN(c10::IValue v, cache.Get(b, name));
      values.insert(name, v);
    }
    values_per_batch.push_back(values);
  }
  state.insert("cache", values_per_batch);
  ASSIGN_OR_RETURN(std::vector<char> bytes,
                   runtime::PickleSave(state, "checkpoint state"));
  RETURN_IF_ERROR(WritePickle(StatePath(next), bytes));
  if (keep_previous_) {
    // The new one is safely on disk: all but it and the one before go.
    for (int kept : Kept()) {
      if (kept < next - 1) std::remove(StatePath(kept).c_str());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int>> RunCheckpoint::Restore(
    RunContext& ctx, absl::Span<Modifier* const> modifiers, int num_subgraphs,
    const PutFn& put, std::optional<int> at) {
  if (keep_previous_ && !at.has_value()) {
    return absl::InternalError("RunCheckpoint: which kept state to restore?");
  }
  const std::string path = StatePath(at.value_or(0));
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  auto damaged = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("checkpoint '", path, "' ", why,
                                            "; delete ", dir_,
                                            " to start afresh"));
  };
  auto load = [&](const std::string& file) -> absl::StatusOr<c10::IValue> {
    std::vector<char> bytes;
    {
      // pickle_load wants a vector; the text goes before unpickling, so the
      // peak stays at two copies of the file, as it was.
      ASSIGN_OR_RETURN(std::string text, util::ReadFile(file));
      bytes.assign(text.begin(), text.end());
    }
    absl::StatusOr<c10::IValue> v =
        runtime::TorchCall("", [&] { return torch::jit::pickle_load(bytes); });
    if (!v.ok()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", file, "' is damaged: ", v.status().message()));
    }
    return v;
  };
  ASSIGN_OR_RETURN(c10::IValue root, load(path));
  if (!root.isGenericDict()) return damaged("is not a dict");
  c10::impl::GenericDict state = root.toGenericDict();
  auto field = [&](const char* key) -> absl::StatusOr<c10::IValue> {
    auto it = state.find(std::string(key));
    if (it == state.end()) return damaged(absl::StrCat("lacks '", key, "'"));
    return it->value();
  };
  ASSIGN_OR_RETURN(c10::IValue format, field("format"));
  ASSIGN_OR_RETURN(c10::IValue version, field("version"));
  if (!format.isString() || format.toStringRef() != kCheckpointFormat) {
    return damaged("is not a tracecut calibration checkpoint");
  }
  if (!version.isInt() || version.toInt() != kCheckpointVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", path, "' has version ",
                     version.isInt() ? absl::StrCat(version.toInt()) : "?",
                     "; this tracecut reads version ", kCheckpointVersion));
  }
  ASSIGN_OR_RETURN(c10::IValue identity, field("identity"));
  if (!identity.isString()) return damaged("has no run identity");
  if (identity.toStringRef() != identity_) {
    std::vector<std::string> old_lines =
        absl::StrSplit(identity.toStringRef(), '\n');
    std::vector<std::string> new_lines = absl::StrSplit(identity_, '\n');
    std::string diff;
    for (size_t k = 0; k < std::max(old_lines.size(), new_lines.size()); ++k) {
      std::string o = k < old_lines.size() ? old_lines[k] : "";
      std::string m = k < new_lines.size() ? new_lines[k] : "";
      if (o != m) {
        diff = absl::StrCat("it has '", o, "', this run '", m, "'");
        break;
      }
    }
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint in ", dir_, " was made by a different run (",
                     diff, "); delete the directory or run without --resume"));
  }
  ASSIGN_OR_RETURN(c10::IValue next_v, field("next_subgraph"));
  if (!next_v.isInt() || next_v.toInt() < 0 || next_v.toInt() > num_subgraphs) {
    return damaged("has a bad next_subgraph");
  }
  const int next = static_cast<int>(next_v.toInt());
  if (at.has_value() && next != *at) return damaged("has a bad next_subgraph");

  ASSIGN_OR_RETURN(c10::IValue files, field("weight_files"));
  if (!files.isList()) return damaged("has a bad weight_files list");
  weight_files_.clear();
  for (const c10::IValue& f : files.toListRef()) {
    if (!f.isString()) return damaged("has a bad weight_files list");
    const std::string file = absl::StrCat(dir_, "/", f.toStringRef());
    ASSIGN_OR_RETURN(c10::IValue weights, load(file));
    if (!weights.isGenericDict()) return damaged("has a bad weight file");
    for (const auto& e : weights.toGenericDict()) {
      if (!e.key().isString() || !e.value().isTensor()) {
        return damaged(absl::StrCat("has a bad entry in ", f.toStringRef()));
      }
      RETURN_IF_ERROR(
          ctx.UpdateTensor(e.key().toStringRef(), e.value().toTensor()));
    }
    weight_files_.push_back(f.toStringRef());
  }
  ctx.TakeUpdatedTensors();

  ASSIGN_OR_RETURN(c10::IValue results, field("results"));
  ASSIGN_OR_RETURN(ctx.results(), CalibrationResults::FromIValue(results));

  ASSIGN_OR_RETURN(c10::IValue mods, field("modifiers"));
  if (!mods.isGenericDict()) return damaged("has no modifier states");
  for (size_t k = 0; k < modifiers.size(); ++k) {
    const std::string key = StateKey(k, *modifiers[k]);
    auto it = mods.toGenericDict().find(key);
    if (it == mods.toGenericDict().end()) {
      return damaged(absl::StrCat("has no state for modifier '", key, "'"));
    }
    RETURN_IF_ERROR(modifiers[k]->RestoreState(it->value()));
  }

  ASSIGN_OR_RETURN(c10::IValue cache, field("cache"));
  if (!cache.isList() ||
      static_cast<int64_t>(cache.toListRef().size()) != ctx.num_batches()) {
    return damaged("has a cache for a different number of batches");
  }
  int64_t b = 0;
  for (const c10::IValue& values : cache.toListRef()) {
    if (!values.isGenericDict()) return damaged("has a bad cache entry");
    for (const auto& e : values.toGenericDict()) {
      if (!e.key().isString()) return damaged("has a bad cache entry");
      RETURN_IF_ERROR(put(b, e.key().toStringRef(), e.value()));
    }
    ++b;
  }
  return next;
}

}  // namespace tracecut::pipelines
