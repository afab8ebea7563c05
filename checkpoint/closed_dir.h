#ifndef TRACECUT_CHECKPOINT_CLOSED_DIR_H_
#define TRACECUT_CHECKPOINT_CLOSED_DIR_H_

// A checkpoint directory as a closed world: the file names its own files
// give (an index's weight_map) resolve only to regular files inside it.
// Checkpoints are downloaded, so they are untrusted input; a weight_map
// naming "/etc/passwd", "../../x.safetensors" or a FIFO must not make
// tracecut read (or hang on) anything outside the directory.
//
//   ASSIGN_OR_RETURN(ClosedDir dir, ClosedDir::Open("llama"));
//   ASSIGN_OR_RETURN(std::string path,
//                    dir.Resolve("model-00001-of-00002.safetensors",
//                                "llama/model.safetensors.index.json: ..."));
//
// Symbolic links are followed and their target checked: the Hugging Face
// cache keeps a snapshot's files as links into the repository's blobs/
// ("models--org--name/snapshots/REV/x -> ../../blobs/SHA"), so when the
// directory is such a snapshot, that repository's blobs/ is inside too.
// Nothing else outside is.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::checkpoint {

class ClosedDir {
 public:
  // `dir` must exist and be a directory.
  static absl::StatusOr<ClosedDir> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // The directories (resolved) whose regular files entries may name.
  const std::vector<std::string>& roots() const { return roots_; }

  // The resolved path of `entry`, a relative name from one of the
  // checkpoint's files; `where` says where the name came from (the index
  // and its entry) and starts the error, which says why: an empty,
  // absolute or ".." name, a missing file, a link leading outside, or not a
  // regular file (a directory, FIFO, device, socket).
  absl::StatusOr<std::string> Resolve(absl::string_view entry,
                                      absl::string_view where) const;

 private:
  std::string dir_;
  std::vector<std::string> roots_;
};

}  // namespace tracecut::checkpoint

#endif  // TRACECUT_CHECKPOINT_CLOSED_DIR_H_
