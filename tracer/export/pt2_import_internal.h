#ifndef TRACECUT_TRACER_EXPORT_PT2_IMPORT_INTERNAL_H_
#define TRACECUT_TRACER_EXPORT_PT2_IMPORT_INTERNAL_H_

// The importer behind pt2_import.h (Note [Importing torch.export programs]
// in pt2_import.cc), in phases: reading the program and building its tree of
// module calls (pt2_import.cc), laying out and defining one TorchScript
// method per call (pt2_emit.cc), and rendering nodes as TorchScript
// (pt2_render.cc). Not part of the API.

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/script.h>

#include <array>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tracer/export/pt2_archive.h"
#include "tracer/export/pt2_import.h"
#include "util/status_macros.h"

namespace tracecut::tracer::exported::internal {

namespace schema = torch::_export;
using ArgTag = schema::Argument::Tag;

enum class ValueKind { kTensor, kInt, kBool, kFloat };

struct ValueInfo {
  ValueKind kind = ValueKind::kTensor;
  int producer = -1;          // Node index; -1 for graph inputs.
  std::string fqn;            // Parameters, buffers, constants.
  bool is_parameter = false;  // With fqn: parameter (else buffer).
  std::vector<int> users;     // Node indices, ascending.
  bool graph_output = false;
};

struct Call {
  std::string key, path, type;
  Call* parent = nullptr;
  std::vector<Call*> children;  // In order of first appearance.
  std::vector<int> own;         // Node indices, ascending.
  std::vector<int> region;      // Subtree's node indices, ascending.
  absl::flat_hash_set<int> in_region;
  int first = std::numeric_limits<int>::max();
};

// A frame of a Python stack trace: where a node's code came from.
struct Frame {
  std::string file;
  int64_t line = 0;
  std::string code;
};

// The frames of a torch.export `stack_trace`, outermost first, without
// generated code ("<eval_with_key>.3") and torch.export's own passes.
std::vector<Frame> ParseFrames(absl::string_view trace);

// A method body in canonical names, with the program values it reads and
// defines at its boundary.
struct FunctionCode {
  std::vector<std::string> inputs;   // Value names, in parameter order.
  std::vector<std::string> outputs;  // Value names, in return order.
  std::string text;                  // "def forward(self, ...):\n ...".
  // Per line of `text`: the model source it comes from, when known.
  std::vector<std::optional<Frame>> origins;
};

struct ModuleInfo {
  torch::jit::Module module;
  std::string type;
  std::optional<std::string> forward;  // Canonical text once defined.
  std::set<std::string> attributes;    // Names taken (for aliases).
};

// A Python identifier that is not a keyword.
bool IsIdentifier(absl::string_view s);

// The root forward's parameter name for a program input.
std::string LocalName(const std::string& value);

// A TorchScript string literal.
std::string Quote(absl::string_view s);

class Importer {
 public:
  explicit Importer(const Pt2Archive& archive)
      : archive_(archive),
        graph_(archive.program.get_graph_module().get_graph()),
        cu_(std::make_shared<torch::jit::CompilationUnit>()) {}

  absl::StatusOr<ImportedProgram> Run() {
    RETURN_IF_ERROR(ReadSignature());
    RETURN_IF_ERROR(ReadNodes());
    RETURN_IF_ERROR(BuildCalls());
    RETURN_IF_ERROR(BuildModules());
    ASSIGN_OR_RETURN(FunctionCode root, EmitFunction(*root_));
    // The root's method takes the program's user inputs by name and
    // returns its user outputs.
    RETURN_IF_ERROR(Define(*root_, root, /*is_root=*/true));
    ImportedProgram out;
    out.module = modules_.at("").module;
    out.leaf_paths.assign(leaf_paths_.begin(), leaf_paths_.end());
    return out;
  }

 private:
  // ----------------------------------------------------------- reading
  absl::Status ReadSignature();

  absl::Status AddTensorInput(const std::string& name, const std::string& fqn,
                              bool is_parameter);

  absl::Status ReadNodes();

  absl::Status DefineOutputs(int node, const schema::Argument& out);

  absl::Status CollectUses(int node, const schema::Argument& a,
                           std::vector<std::string>& used);

  // nn_module_stack: "key,path,type;key,path,type;..." (outermost first).
  static std::vector<std::array<std::string, 3>> ParseStack(
      absl::string_view s);

  absl::Status BuildCalls();

  void FillRegions(Call& c);

  // ----------------------------------------------------------- modules
  absl::StatusOr<ModuleInfo*> GetModule(const std::string& path,
                                        const std::string& type);

  std::string TypeOf(const std::string& path) const {
    auto it = types_.find(path);
    return it == types_.end() ? "" : it->second;
  }

  absl::Status BuildModules();

  absl::Status AddTensor(ModuleInfo& m, const std::string& name,
                         const torch::Tensor& t, bool is_parameter);

  // ----------------------------------------------------------- emitting
  // Values the region of `c` reads from outside it (parameters excluded:
  // methods reach those through self), and those it defines that are read
  // outside it, both in first-use / definition order.
  FunctionCode Boundary(const Call& c) const;

  std::vector<std::string> Defined(int node) const;

  // One schedulable piece of a method: a node, or a child call.
  struct Item {
    int node = -1;
    Call* call = nullptr;
    int first = 0;
  };

  // State of one method being written.
  struct Method {
    std::string owner;  // Module path of `self`.
    absl::flat_hash_map<std::string, std::string> env;  // value -> local.
    std::vector<std::string> lines;
    // The model source each line comes from (torch.export's stack traces).
    std::vector<std::optional<Frame>> origins;
    std::optional<Frame> origin;  // Of the lines being added.
    int temps = 0;
    void Add(std::string line) {
      lines.push_back(std::move(line));
      origins.push_back(origin);
    }
    bool grouped_mm = false;  // Calls self._grouped_mm_fallback.
    std::string NewLocal(char prefix) {
      return absl::StrCat(std::string(1, prefix), temps++);
    }
  };

  absl::StatusOr<FunctionCode> EmitFunction(Call& c);

  // Schedules and writes `items`: nodes in program order where possible,
  // child calls once their inputs are ready; a child that cannot be a call
  // is replaced by its own items.
  absl::Status EmitItems(std::vector<Item> items, Method& m);

  // Writes a call of `c`'s module; false when `c` must be inlined instead.
  absl::StatusOr<bool> EmitCall(Call& c, Method& m);

  absl::Status Define(const Call& c, const FunctionCode& f, bool is_root);

  // The expression for `value` inside method `m`.
  absl::StatusOr<std::string> Lookup(Method& m, const std::string& value);

  absl::StatusOr<std::string> Render(const schema::Argument& a, Method& m,
                                     int node);

  absl::Status EmitNode(int i, Method& m);
  // Assigns node `i`'s call `expr` to locals for the names it outputs.
  absl::Status BindOutputs(int i, const std::string& expr, Method& m);

  std::vector<Frame> FramesOf(int node) const {
    const auto& meta = graph_.get_nodes()[node].get_metadata();
    auto it = meta.find("stack_trace");
    return it == meta.end() ? std::vector<Frame>() : ParseFrames(it->second);
  }

  // Where the parent calls `c`: the innermost frame of its first node whose
  // code names the module's attribute ("self.q_proj(x)"); for modules
  // reached by iteration (ModuleList), none.
  std::optional<Frame> CallSite(const Call& c) const;

  // ----------------------------------------------------------- errors
  absl::Status Unsupported(absl::string_view what) const {
    return absl::UnimplementedError(
        absl::StrCat(archive_.path, ": tracecut cannot import ", what));
  }

  // "<file>: node 'linear_3' (torch.ops.aten.linear.default) at
  // modeling_llama.py:123 `code`: <what>".
  absl::Status NodeError(int i, absl::string_view what) const;

  const Pt2Archive& archive_;
  const schema::Graph& graph_;
  std::shared_ptr<torch::jit::CompilationUnit> cu_;
  std::map<std::string, ValueInfo> values_;
  std::vector<std::vector<std::string>> uses_;  // Per node.
  mutable std::map<int, std::vector<std::string>> defined_cache_;
  std::vector<std::string> user_inputs_, user_outputs_;
  std::vector<std::unique_ptr<Call>> calls_;
  std::vector<Call*> node_call_;  // Innermost call of each node.
  Call* root_ = nullptr;
  std::set<std::string> leaf_paths_;
  std::map<std::string, std::string> types_;  // Module path -> type.
  std::map<std::string, ModuleInfo> modules_;
  std::map<std::pair<std::string, std::string>, std::string> aliases_;
  int class_counter_ = 0;
};

}  // namespace tracecut::tracer::exported::internal

#endif  // TRACECUT_TRACER_EXPORT_PT2_IMPORT_INTERNAL_H_
