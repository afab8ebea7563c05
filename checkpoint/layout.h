#ifndef TRACECUT_CHECKPOINT_LAYOUT_H_
#define TRACECUT_CHECKPOINT_LAYOUT_H_

// Model tensors a Hugging Face checkpoint stores under other names or in
// pieces. transformers 5 converts some checkpoints when it loads them and
// back when it saves: Mixtral's `block_sparse_moe.experts.E.w1/w3/w2` become
// the model's fused `mlp.experts.gate_up_proj` (experts stacked, gate and up
// concatenated) and `down_proj`. `tracecut export` writes that mapping, from
// transformers' own conversion table, into the program's
// tracecut_model.json ("checkpoint_layout"); tracecut reads a model tensor
// from its pieces and writes it back as them, so the output checkpoint has
// the names transformers and vLLM expect.
//
//   ASSIGN_OR_RETURN(Layout layout, Layout::FromModelJson(json, "m.pt2"));
//   if (const std::vector<Piece>* pieces = layout.Find(name)) {
//     ASSIGN_OR_RETURN(torch::Tensor t, ReadPieces(ckpt, name, *pieces));
//   }

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"

namespace tracecut::checkpoint {

// One checkpoint tensor and the box of the model tensor it fills: offsets
// and sizes per dimension of the model tensor; the checkpoint tensor is the
// box reshaped (same number of elements, row-major order).
struct Piece {
  std::string name;
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

class Layout {
 public:
  Layout() = default;
  // The "checkpoint_layout" of a tracecut_model.json (an empty layout when
  // it has none). InvalidArgument naming `source` and the tensor for a
  // malformed entry or pieces that do not tile their tensor's box.
  static absl::StatusOr<Layout> FromModelJson(absl::string_view json,
                                              absl::string_view source);
  // The layout in a model's extra files (tracecut_model.json, as `tracecut
  // export` embeds it); empty without one.
  static absl::StatusOr<Layout> FromExtraFiles(
      const std::unordered_map<std::string, std::string>& files);

  bool empty() const { return pieces_.empty(); }
  // Every model tensor stored in pieces, by name.
  const std::map<std::string, std::vector<Piece>>& tensors() const {
    return pieces_;
  }
  // The pieces of model tensor `name`; nullptr when the checkpoint holds it
  // under its own name.
  const std::vector<Piece>* Find(const std::string& name) const;
  // The model tensor a checkpoint tensor is a piece of, with the piece;
  // nullptr when none is.
  const std::pair<std::string, Piece>* Owner(
      const std::string& checkpoint_name) const;
  // The first model tensor stored in more than one piece (fused MoE
  // experts), with its pieces; nullptr when none is.
  const std::pair<const std::string, std::vector<Piece>>* FirstSplit() const;

 private:
  std::map<std::string, std::vector<Piece>> pieces_;
  std::map<std::string, std::pair<std::string, Piece>> owner_;
};

// `piece`'s sizes without their size-1 dimensions: the checkpoint tensor's
// shape when the piece is a stacked slice (an expert's [1, out, in] box is
// its Linear's [out, in] weight).
std::vector<int64_t> SqueezedSizes(const Piece& piece);

// The shape of the tensor `pieces` tile.
std::vector<int64_t> ShapeOf(const std::vector<Piece>& pieces);

// The model tensor `name` read from its pieces in `ckpt`, in their stored
// dtype. Errors name the checkpoint file and tensor: a missing piece, one
// whose shape or dtype disagrees.
absl::StatusOr<torch::Tensor> ReadPieces(const Checkpoint& ckpt,
                                         const std::string& name,
                                         const std::vector<Piece>& pieces);

// The box of `piece` in `t` (a view: writing to it writes `t`).
torch::Tensor BoxOf(const torch::Tensor& t, const Piece& piece);

// `value`'s piece as the checkpoint tensor (contiguous, shape `shape`: the
// checkpoint's; the box's sizes when empty).
absl::StatusOr<torch::Tensor> PieceOf(const torch::Tensor& value,
                                      const Piece& piece,
                                      const std::vector<int64_t>& shape = {});

}  // namespace tracecut::checkpoint

#endif  // TRACECUT_CHECKPOINT_LAYOUT_H_
