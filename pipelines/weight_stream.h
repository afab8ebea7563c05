#ifndef TRACECUT_PIPELINES_WEIGHT_STREAM_H_
#define TRACECUT_PIPELINES_WEIGHT_STREAM_H_

// Weights read from a Hugging Face checkpoint when a subgraph needs them and
// released once its compressed result is written: what keeps a calibration
// run's memory at one subgraph's weights, whatever the model's size.
//
//   LoadOptions defer{.defer_checkpoint_tensors = true};  // tracer/load.h
//   ... trace; the model holds stand-ins for the deferred tensors ...
//   ASSIGN_OR_RETURN(auto writer, CompressedTensorsWriter::Create(...));
//   ASSIGN_OR_RETURN(auto stream, WeightStream::Create(gm, loaded.deferred,
//                                                      dir, writer.get()));
//   pipeline_options.weights = stream.get();
//   RunPipeline(gm, data, modifiers, results, pipeline_options);
//   RETURN_IF_ERROR(stream->WriteRest(results));
//   RETURN_IF_ERROR(writer->Finish(results));
//
// Note [Streaming weights]
// Every deferred tensor has a first and a last subgraph that reads it (a
// get_attr of it, or a call of a leaf module holding it). Before subgraph i
// runs, the tensors it reads first are copied out of the checkpoint (checked
// finite, converted to the program's dtype) into the model. After subgraph i
// is compressed and propagated, the tensors it reads last are final: they go
// to the writer as shard i and are replaced by their stand-ins again (one
// element, NaN for floating dtypes: a computation that reads a released
// tensor by mistake fails the run's finite check, it never gives a plausible
// result). A tensor several subgraphs read (a tied embedding) stays loaded
// from its first to its last; the other attributes holding it (a module
// reading another's tensor through one of its own) are set with it, so
// the model stays tied. So the model holds the weights of the running
// subgraph and of the tensors spanning it, the checkpoint's pages are dropped
// after each copy (checkpoint/safetensors.h), and the activations are the
// cache's budget. Tensors no subgraph reads are loaded before the modifiers'
// OnRunEnd (which may quantize a module no data reached) and written last.
//
// Resume: pipeline checkpoints save the weights modifiers changed; a
// released one is saved as its stand-in (one element), so a checkpoint costs
// what spans the next subgraph. On resume, the spanning tensors that no
// checkpoint restored are read again from the checkpoint; the shards of the
// finished subgraphs are already written.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"
#include "output/compressed_output.h"
#include "pipelines/pipeline.h"
#include "runtime/graph_module.h"
#include "tracer/export/pt2_archive.h"

namespace tracecut::pipelines {

class WeightStream : public SubgraphWeights {
 public:
  // `deferred`: model path -> where it is in the checkpoint in
  // `checkpoint_dir` (tracer::LoadedModel::deferred). `writer` (not owned)
  // receives each subgraph's final tensors; nullptr: they are released
  // unwritten (a data-parallel rank other than the one that writes).
  static absl::StatusOr<std::unique_ptr<WeightStream>> Create(
      runtime::GraphModule& model,
      std::map<std::string, tracer::exported::DeferredTensor> deferred,
      const std::string& checkpoint_dir,
      output::CompressedTensorsWriter* writer);

  absl::Status Plan(
      const std::vector<const partition::Subgraph*>& subgraphs) override;
  absl::Status Resume(int start) override;
  absl::Status Load(int i) override;
  absl::Status Done(int i,
                    const modifiers::CalibrationResults& results) override;
  absl::Status LoadRest() override;

  // After the run: the tensors no subgraph read, as the last shard.
  absl::Status WriteRest(const modifiers::CalibrationResults& results);

  // The model's other paths holding a deferred tensor (tied weights: the
  // importer gives a module that reads another's tensor an attribute of its
  // own), each with the deferred path.
  static absl::StatusOr<std::map<std::string, std::string>> TiedAliases(
      const runtime::GraphModule& model,
      const std::map<std::string, tracer::exported::DeferredTensor>& deferred);

  // Most bytes of deferred tensors loaded at once (for the report).
  int64_t peak_loaded_bytes() const { return peak_bytes_; }

 private:
  WeightStream(runtime::GraphModule& model, checkpoint::Checkpoint source,
               output::CompressedTensorsWriter* writer)
      : model_(model), source_(std::move(source)), writer_(writer) {}
  absl::Status LoadTensor(const std::string& path);
  absl::Status Release(const std::string& path);
  // Sets `path` and its aliases to `t`.
  absl::Status SetTied(const std::string& path, const at::Tensor& t);
  absl::Status WriteAndRelease(int index, const std::vector<std::string>& paths,
                               const modifiers::CalibrationResults& results);
  bool IsLoaded(const std::string& path) const {
    return loaded_.contains(path);
  }

  runtime::GraphModule& model_;
  checkpoint::Checkpoint source_;
  output::CompressedTensorsWriter* writer_;
  std::map<std::string, tracer::exported::DeferredTensor> deferred_;
  std::set<std::string> buffers_;  // Deferred paths that are buffers.
  // Other model paths holding a deferred path's tensor (tied weights: the
  // importer gives a module reading another's tensor an attribute of its
  // own), loaded and released with it; and each such path's deferred path.
  std::map<std::string, std::vector<std::string>> aliases_;
  std::map<std::string, std::string> canonical_;
  // Per subgraph, the deferred paths it reads first and last.
  std::vector<std::vector<std::string>> first_, last_;
  std::map<std::string, std::pair<int, int>> span_;  // path -> [first, last].
  std::set<std::string> loaded_;
  int64_t bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_WEIGHT_STREAM_H_
