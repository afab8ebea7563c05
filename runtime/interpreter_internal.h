#ifndef TRACECUT_RUNTIME_INTERPRETER_INTERNAL_H_
#define TRACECUT_RUNTIME_INTERPRETER_INTERNAL_H_

// The interpreter's plan, shared by interpreter.cc (planning, hooks) and
// interpreter_execute.cc (Plan::Execute). Not part of the API.

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "runtime/interpreter.h"

namespace tracecut::runtime {
namespace internal {

// Where one operand of a node comes from.
struct Operand {
  enum class Kind : uint8_t { kConstant, kValue, kList, kTuple };
  Kind kind = Kind::kConstant;
  // kValue: this is the last read of the value; move it out.
  bool move = false;
  int32_t slot = -1;              // kValue
  c10::IValue constant;           // kConstant
  c10::TypePtr element_type;      // kList; null: unified at run time
  std::vector<Operand> elements;  // kList, kTuple
};

enum class Step : uint8_t {
  kPlaceholder,
  kGetAttr,
  kOperator,
  kGetItem,
  kCallModule,
  kCallMethod,
  kOutput,
};

struct NodePlan {
  const ir::Node* node = nullptr;
  Step step = Step::kOperator;
  int32_t out = -1;  // Slot of the result; -1 for the output node.
  std::vector<Operand> operands;
  int32_t input_index = -1;  // kPlaceholder.
  // kOperator.
  torch::jit::Operation op = nullptr;
  size_t num_returns = 1;
  bool var_returns = false;
  // kGetAttr, kCallModule: attribute slots from the root object.
  std::vector<size_t> attr_slots;
  // kCallModule: the submodule's type when planned and its forward.
  const c10::ClassType* module_type = nullptr;
  torch::jit::Function* forward = nullptr;
  // Slots nobody reads after this node.
  std::vector<int32_t> release;
};

// "LlamaDecoderLayer" for a module type.
std::string ShortTypeName(const c10::ClassType& type);

}  // namespace internal

struct Interpreter::Plan {
  const ir::Graph* graph = nullptr;
  torch::jit::Module root;
  mutable std::vector<internal::NodePlan>
      nodes;  // Operations are called non-const.
  int32_t num_slots = 0;
  std::vector<const ir::Node*> placeholders;
  std::vector<std::pair<HookId, NodeHook>> node_hooks;
  std::vector<std::pair<HookId, ModuleHook>> module_hooks;
  HookId next_hook_id = 1;
  std::shared_ptr<torch::jit::Graph> scratch;

  absl::StatusOr<c10::IValue> Execute(std::vector<c10::IValue> inputs,
                                      RunStats* stats) const;
};

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_INTERPRETER_INTERNAL_H_
