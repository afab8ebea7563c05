#include "checkpoint/layout.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/status_macros.h"

namespace tracecut::checkpoint {
namespace {

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

// `s` without its size-1 dimensions: a piece's box and its checkpoint
// tensor agree up to those (a stacked expert's box has a leading 1).
std::vector<int64_t> Squeezed(const std::vector<int64_t>& s) {
  std::vector<int64_t> out;
  for (int64_t d : s) {
    if (d != 1) out.push_back(d);
  }
  return out;
}

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The pieces must lie in the tensor's box and cover it once: in bounds, and
// their element counts add up to the box's (an overlap would leave a gap).
absl::Status CheckTiling(const std::string& name,
                         const std::vector<Piece>& pieces,
                         absl::string_view source) {
  if (pieces.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": checkpoint_layout of '", name, "' is empty"));
  }
  const size_t rank = pieces[0].sizes.size();
  int64_t total = 0;
  for (const Piece& p : pieces) {
    if (p.offsets.size() != rank || p.sizes.size() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": checkpoint_layout of '", name, "': piece '", p.name,
          "' has ", p.offsets.size(), " offsets and ", p.sizes.size(),
          " sizes for a ", rank, "-dimensional tensor"));
    }
    for (size_t d = 0; d < rank; ++d) {
      if (p.offsets[d] < 0 || p.sizes[d] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": checkpoint_layout of '", name, "': piece '",
                         p.name, "' has a negative extent"));
      }
    }
    total += Numel(p.sizes);
  }
  const std::vector<int64_t> shape = ShapeOf(pieces);
  if (total != Numel(shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": checkpoint_layout of '", name, "': its ", pieces.size(),
        " pieces hold ", total, " elements, its shape ", Shape(shape), " has ",
        Numel(shape)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Layout> Layout::FromModelJson(absl::string_view json,
                                             absl::string_view source) {
  Layout layout;
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    if (!j.is_object() || !j.contains("checkpoint_layout")) return layout;
    for (const auto& [name, entries] : j["checkpoint_layout"].items()) {
      std::vector<Piece> pieces;
      for (const auto& e : entries) {
        pieces.push_back({e.at("name").get<std::string>(),
                          e.at("offsets").get<std::vector<int64_t>>(),
                          e.at("sizes").get<std::vector<int64_t>>()});
      }
      RETURN_IF_ERROR(CheckTiling(name, pieces, source));
      for (const Piece& p : pieces) {
        if (!layout.owner_.emplace(p.name, std::make_pair(name, p)).second) {
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": checkpoint_layout: '", p.name,
                           "' is a piece of two tensors"));
        }
      }
      layout.pieces_.emplace(name, std::move(pieces));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": checkpoint_layout: ", e.what()));
  }
  return layout;
}

std::vector<int64_t> SqueezedSizes(const Piece& piece) {
  return Squeezed(piece.sizes);
}

absl::StatusOr<Layout> Layout::FromExtraFiles(
    const std::unordered_map<std::string, std::string>& files) {
  auto it = files.find("tracecut_model.json");
  if (it == files.end()) return Layout();
  return FromModelJson(it->second, "tracecut_model.json");
}

torch::Tensor BoxOf(const torch::Tensor& t, const Piece& piece) {
  torch::Tensor v = t;
  for (size_t d = 0; d < piece.sizes.size(); ++d) {
    v = v.narrow(static_cast<int64_t>(d), piece.offsets[d], piece.sizes[d]);
  }
  return v;
}

const std::vector<Piece>* Layout::Find(const std::string& name) const {
  auto it = pieces_.find(name);
  return it == pieces_.end() ? nullptr : &it->second;
}

const std::pair<std::string, Piece>* Layout::Owner(
    const std::string& checkpoint_name) const {
  auto it = owner_.find(checkpoint_name);
  return it == owner_.end() ? nullptr : &it->second;
}

std::vector<int64_t> ShapeOf(const std::vector<Piece>& pieces) {
  std::vector<int64_t> shape(pieces.empty() ? 0 : pieces[0].sizes.size(), 0);
  for (const Piece& p : pieces) {
    for (size_t d = 0; d < shape.size() && d < p.sizes.size(); ++d) {
      shape[d] = std::max(shape[d], p.offsets[d] + p.sizes[d]);
    }
  }
  return shape;
}

const std::pair<const std::string, std::vector<Piece>>* Layout::FirstSplit()
    const {
  for (const auto& entry : pieces_) {
    if (entry.second.size() > 1) return &entry;
  }
  return nullptr;
}

absl::StatusOr<torch::Tensor> ReadPieces(const Checkpoint& ckpt,
                                         const std::string& name,
                                         const std::vector<Piece>& pieces) {
  const std::vector<int64_t> shape = ShapeOf(pieces);
  torch::Tensor out;
  for (const Piece& p : pieces) {
    if (!ckpt.Has(p.name)) {
      return absl::NotFoundError(absl::StrCat(
          ckpt.dir(), ": no tensor '", p.name, "' (a piece of '", name, "')"));
    }
    ASSIGN_OR_RETURN(TensorInfo info, ckpt.Info(p.name));
    if (Squeezed(info.shape) != Squeezed(p.sizes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          ckpt.FileOf(p.name), ": tensor '", p.name, "' has shape ",
          Shape(info.shape), ", but as a piece of '", name, "' it fills ",
          Shape(p.sizes)));
    }
    if (!out.defined()) {
      out = torch::empty(shape, torch::dtype(info.dtype));
    } else if (info.dtype != out.scalar_type()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ckpt.FileOf(p.name), ": tensor '", p.name, "' is ",
                       c10::toString(info.dtype), ", the other pieces of '",
                       name, "' are ", c10::toString(out.scalar_type())));
    }
    ASSIGN_OR_RETURN(torch::Tensor t, ckpt.Get(p.name));
    try {
      BoxOf(out, p).copy_(t.reshape(p.sizes));
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat(ckpt.FileOf(p.name), ": '", p.name,
                       "': ", e.what_without_backtrace()));
    }
  }
  return out;
}

absl::StatusOr<torch::Tensor> PieceOf(const torch::Tensor& value,
                                      const Piece& piece,
                                      const std::vector<int64_t>& shape) {
  if (value.dim() != static_cast<int64_t>(piece.sizes.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", piece.name, "' is a piece of a ", piece.sizes.size(),
                     "-dimensional tensor, not of one of shape ",
                     Shape(value.sizes().vec())));
  }
  for (size_t d = 0; d < piece.sizes.size(); ++d) {
    if (piece.offsets[d] + piece.sizes[d] > value.size(d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", piece.name, "' lies outside a tensor of shape ",
                       Shape(value.sizes().vec())));
    }
  }
  try {
    return BoxOf(value, piece)
        .contiguous()
        .reshape(shape.empty() ? piece.sizes : shape);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", piece.name, "': ", e.what_without_backtrace()));
  }
}

}  // namespace tracecut::checkpoint
