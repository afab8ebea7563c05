#ifndef TRACECUT_RUNTIME_LOWERING_INTERNAL_H_
#define TRACECUT_RUNTIME_LOWERING_INTERNAL_H_

// The lowerer behind lowering.h, shared by lowering.cc (one IR node at a
// time) and lowering_hierarchy.cc (outlining modules' forwards, Note
// [Keeping the module hierarchy]). Not part of the API.

#include <ATen/core/jit_type.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/ir/named_value.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"
#include "runtime/lowering.h"

namespace tracecut::runtime::internal {

using torch::jit::Graph;
using torch::jit::NamedValue;
using torch::jit::Value;

// A lowered IR value: one Value, or the outputs of a multi-output operator
// (read with getitem; packed into a tuple only if used whole).
struct Lowered {
  Value* value = nullptr;
  std::vector<Value*> outputs;
};

// Replaces `type`'s forward by `graph`; with `drop_helpers`, also removes
// the methods only the old forward called (they would call the children's
// new forwards the old way).
void InstallForward(const c10::ClassTypePtr& type,
                    const std::shared_ptr<Graph>& graph,
                    const c10::FunctionSchema& schema, bool drop_helpers);

// After outlining: a module that kept its old forward but whose forward (or
// a helper of it) calls an outlined forward the old way loses them, and so
// on up. The graph never calls those; the saved file must still compile.
void RemoveStaleForwards(const c10::ClassTypePtr& root,
                         const std::vector<c10::ClassTypePtr>& outlined);

class Lowerer {
 public:
  // `root`, the object of `self_type`, is needed to outline (and may then
  // change: an instance whose forward differs from its type's gets a type of
  // its own); without it the result is flat.
  Lowerer(const GraphModule& gm, c10::ClassTypePtr self_type,
          const LoweringOptions& options, torch::jit::Module* root = nullptr)
      : gm_(gm),
        self_type_(std::move(self_type)),
        options_(options),
        root_(root) {
    frame_.graph = std::make_shared<Graph>();
  }

  absl::StatusOr<std::shared_ptr<Graph>> Run();

  // The module types that got an outlined forward, in order.
  const std::vector<c10::ClassTypePtr>& outlined() const { return outlined_; }
  // The paths of the module instances whose forward runs outlined nodes.
  const std::vector<std::string>& outlined_paths() const {
    return outlined_paths_;
  }

 private:
  // Note [Keeping the module hierarchy]
  // With LoweringOptions::keep_hierarchy, the nodes of one call of a module
  // (consecutive nodes whose scope holds it) become that module's forward,
  // and its parent calls it, so that a saved model traces again to the same
  // scopes. A module's nodes stay inline in its parent (as without the
  // option) when they cannot be outlined exactly:
  //  * its type's forward must stay as it is (KeptTypes): a leaf, a module
  //    read by get_attr, one whose forward a kept method calls, one with
  //    hooks or __getstate__, or anything inside those;
  //  * its nodes are not one run (called twice, or interleaved by a pass),
  //    call_method, call a module outside it, or return nothing;
  //  * another instance of its type got a different forward (types share
  //    methods), e.g. a pass changed one layer only.
  // Tensors outside the module (tied weights, lifted constants) are read by
  // the caller and passed in.
  //
  // (lowering_hierarchy.cc)

  absl::Status LowerOne(const ir::Node& node);

  // The module, below the frame's, that `node` belongs to at scope depth
  // `depth`, or null when it is lowered in the frame itself.
  const ir::ScopeEntry* ChildOf(const ir::Node& node, size_t depth) const;

  bool keep_hierarchy() const {
    return options_.keep_hierarchy && root_ != nullptr;
  }

  // True if `path` is strictly inside module `module` ("" = the root).
  static bool IsBelow(absl::string_view path, absl::string_view module) {
    if (module.empty()) return !path.empty();
    return path.size() > module.size() && absl::StartsWith(path, module) &&
           path[module.size()] == '.';
  }

  absl::Status LowerNodes(absl::Span<const ir::Node* const> nodes,
                          size_t depth);

  // The type of the module at `path` from the root, or null.
  c10::ClassTypePtr ModuleTypeAt(absl::string_view path) const;

  // Types whose forward stays: see Note [Keeping the module hierarchy].
  absl::Status KeptTypes();

  // Gives the instance at `path` a fresh copy of its type (attributes and
  // constants; its methods are its type's old forward, now replaced, and
  // helpers, now removed), so that it can get a forward of its own. Null
  // when that would change other instances: its parent's type is shared, or
  // its type has other methods.
  c10::ClassTypePtr OwnType(const std::string& path);

  // Outlines `run` (the nodes of the module at `path`) into that module's
  // forward and calls it; false if it cannot be (Note [Keeping the module
  // hierarchy]), with nothing but dead values added to the frame.
  absl::StatusOr<bool> Outline(absl::Span<const ir::Node* const> run,
                               const std::string& path, size_t depth);

  // Lowering one node (lowering.cc).
  absl::Status AddInputs();

  // The module's current forward schema when its arguments match the
  // placeholders by name.
  const c10::FunctionSchema* OriginalSchemaIfMatching() const;

  static void SetName(Value* v, const std::string& name);

  absl::Status Lower(const ir::Node& node);

  // The value at a dotted path from self; GetAttr nodes are shared per
  // prefix.
  absl::StatusOr<Value*> Attr(const ir::Node& node, const std::string& path,
                              bool want_module);

  // A single Value for a lowered node (tuple of outputs if multi-output).
  Value* WholeValue(Lowered& l);

  // A Value for an Argument where the consumer expects `type` (may be null
  // or generic).
  absl::StatusOr<Value*> ValueFor(const ir::Node& node, const ir::Argument& arg,
                                  const c10::TypePtr& type);

  // Named values for `schema`'s arguments from `first` on.
  absl::StatusOr<std::vector<NamedValue>> SchemaInputs(
      const ir::Node& node, const c10::FunctionSchema& schema, size_t first);

  absl::Status LowerOperator(const ir::Node& node);

  absl::Status LowerGetItem(const ir::Node& node);

  absl::Status LowerCallModule(const ir::Node& node);

  absl::Status LowerCallMethod(const ir::Node& node);

  // `args_skip_self`: the node's args exclude self (call_module) or start
  // with it (call_method).
  absl::Status CallMethod(const ir::Node& node, Value* self,
                          const std::string& name,
                          const c10::FunctionSchema& schema,
                          bool args_skip_self);

  // What is being lowered into: the root's forward, or an outlined module's.
  struct Frame {
    std::shared_ptr<Graph> graph;
    Value* self = nullptr;
    std::string path;  // The module's path in the root; "" for the root.
    absl::flat_hash_map<const ir::Node*, Lowered> values;
    absl::flat_hash_map<std::string, Value*> attrs;  // By relative path.
  };

  const GraphModule& gm_;
  c10::ClassTypePtr self_type_;
  const LoweringOptions& options_;
  Frame frame_;
  // keep_hierarchy: types whose forward must stay (KeptTypes), the forward
  // installed per outlined type (canonical text, to share it between
  // instances), and those types in order.
  absl::flat_hash_set<const c10::ClassType*> kept_types_;
  torch::jit::Module* root_;
  absl::flat_hash_map<const c10::ClassType*, std::string> installed_;
  absl::flat_hash_map<const c10::ClassType*, int> instances_;
  std::vector<c10::ClassTypePtr> outlined_;
  std::vector<std::string> outlined_paths_;
  absl::flat_hash_map<const ir::Node*, size_t> position_;
};

}  // namespace tracecut::runtime::internal

#endif  // TRACECUT_RUNTIME_LOWERING_INTERNAL_H_
