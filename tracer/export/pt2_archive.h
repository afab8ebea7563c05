#ifndef TRACECUT_TRACER_EXPORT_PT2_ARCHIVE_H_
#define TRACECUT_TRACER_EXPORT_PT2_ARCHIVE_H_

// Reading a torch.export archive (.pt2, as torch.export.save writes it) with
// LibTorch's own pieces: the zip container (caffe2's PyTorchStreamReader) and
// the PT2 schema with its JSON deserializer
// (torch/csrc/utils/generated_serialization_types.h, generated from
// torch/_export/serde/schema.py). No parser of our own.
//
//   ASSIGN_OR_RETURN(Pt2Archive a, ReadPt2Archive("llama.pt2"));
//   a.program.get_graph_module().get_graph().get_nodes() ...
//   a.tensors.at("model.embed_tokens.weight")

#include <torch/csrc/utils/generated_serialization_types.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/layout.h"

namespace tracecut::tracer::exported {

// A tensor the program reads that stays in the checkpoint until needed.
struct DeferredTensor {
  std::string name;        // In the checkpoint (a tied alias's own name).
  c10::ScalarType dtype;   // What the program expects (converted on load).
  c10::ScalarType stored;  // What the checkpoint holds.
  // Non-empty: the checkpoint stores it in these pieces, not as `name`
  // (checkpoint/layout.h).
  std::vector<checkpoint::Piece> pieces;
};

struct Pt2Archive {
  std::string path;
  torch::_export::ExportedProgram program;
  // Parameters, buffers and lifted constants by fully qualified name, as the
  // archive's weights and constants configs list them. Entries that share a
  // payload file (tied weights) share one tensor.
  std::map<std::string, torch::Tensor> tensors;
  // Files passed as `extra_files` to torch.export.save, by name.
  std::map<std::string, std::string> extra_files;
  // The program's example inputs, (args, kwargs) as torch.save wrote them;
  // empty when the archive has none.
  std::string sample_inputs;
  // With Pt2ReadOptions::defer_checkpoint_tensors: the tensors left in the
  // checkpoint (`tensors` holds stand-ins for them, see there), by fully
  // qualified name, and the directory holding that checkpoint.
  std::map<std::string, DeferredTensor> deferred;
  std::string checkpoint_dir;
};

struct Pt2ReadOptions {
  // Read no tensor from the checkpoint next to the archive: each gets a
  // stand-in of its shape and the program's dtype holding one element (NaN
  // for floating dtypes, so a computation that reads a stand-in by mistake
  // shows as a non-finite activation, never as a plausible result), and an
  // entry in Pt2Archive::deferred. For calibration that streams weights
  // (pipelines/weight_stream.h).
  bool defer_checkpoint_tensors = false;
};

// The extra file in which `tracecut export --meta` embeds the buffers a
// checkpoint does not hold (non-persistent ones, such as rotary inv_freq):
// a safetensors image, base64 (torch.export.save takes text files only).
inline constexpr char kEmbeddedBuffers[] = "tracecut_buffers.safetensors.b64";

// A deferred tensor's stand-in: one element (NaN for floating dtypes, else
// 0) expanded to `shape`; and whether `t` is one (more than one element
// over a one-element storage).
torch::Tensor StandIn(c10::ScalarType dtype, const std::vector<int64_t>& shape);
bool IsStandIn(const torch::Tensor& t);

// True when `path` looks like a torch.export archive by name (".pt2").
bool IsPt2Path(const std::string& path);

// Reads the archive at `path`. Tensors the program reads but the archive
// lacks (a meta-device export) come from the embedded buffers and from the
// safetensors checkpoint in the archive's directory, by name (converted to
// the program's floating dtype). Errors name the file and what is wrong: not a
// zip, no models/*.json, JSON that does not match the schema of this
// LibTorch (with the exporting torch version), a payload file missing or of
// the wrong size, pickled payloads (which need Python to read).
absl::StatusOr<Pt2Archive> ReadPt2Archive(const std::string& path,
                                          const Pt2ReadOptions& options = {});

// c10's dtype for the schema's ScalarType; nullopt for UNKNOWN.
std::optional<c10::ScalarType> ToScalarType(torch::_export::ScalarType type);

// Fails, naming the member, when a zip archive written for LibTorch (a .pt2
// or a TorchScript .pt) has a member that inflates to more than the archive
// holds (plus 64 MiB for JSON another zip tool compressed): what a
// decompression bomb looks like. Reads the central directory only; an
// archive LibTorch cannot open passes (its loader then says why).
absl::Status CheckArchiveMemberSizes(const std::string& path);

}  // namespace tracecut::tracer::exported

#endif  // TRACECUT_TRACER_EXPORT_PT2_ARCHIVE_H_
