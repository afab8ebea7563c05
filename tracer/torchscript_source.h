#ifndef TRACECUT_TRACER_TORCHSCRIPT_SOURCE_H_
#define TRACECUT_TRACER_TORCHSCRIPT_SOURCE_H_

// Writing and compiling generated TorchScript: what the torch.export importer
// (tracer/export) and the models built from config.json (native_model.h)
// both do.
//
//   DefineMethods(*cu, module.type(), std::make_shared<torch::jit::Source>(
//       "def forward(self, x: Tensor) -> Tensor:\n    return x * " +
//       FloatLiteral(0.5) + "\n", "<generated>", 1));

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/frontend/source_range.h>

#include <memory>
#include <string>

namespace tracecut::tracer {

// A float as a TorchScript literal: never an int ("1" -> "1.0"), all 17
// significant digits, nan and inf as float("...").
std::string FloatLiteral(double v);

// A dtype as TorchScript code spells it: its c10 enum value (as a saved
// .pt's code does; `torch.bfloat16` does not resolve in generated code).
std::string DTypeLiteral(c10::ScalarType t);

// Compiles every `def` in `source` as a method of module class `type` in
// `cu` (torch::jit::Module::define, but with the caller's Source, so that
// node locations name where the code came from). Throws as LibTorch's
// compiler does; callers wrap it in runtime::TorchCall.
void DefineMethods(torch::jit::CompilationUnit& cu,
                   const c10::ClassTypePtr& type,
                   std::shared_ptr<torch::jit::Source> source);

}  // namespace tracecut::tracer

#endif  // TRACECUT_TRACER_TORCHSCRIPT_SOURCE_H_
