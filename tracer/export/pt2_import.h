#ifndef TRACECUT_TRACER_EXPORT_PT2_IMPORT_H_
#define TRACECUT_TRACER_EXPORT_PT2_IMPORT_H_

// A torch.export program as a TorchScript module, so that the TorchScript
// front end (tracer/tracer.h) takes it from there: leaves, scopes, example
// inputs, partition, calibration and saving then see the same module tree
// whichever format the model came in.
//
// The module tree is the program's: every module path in a node's
// `nn_module_stack` or in a parameter's name becomes a submodule whose class
// is named after the original type ("torch.nn.modules.linear.Linear",
// "transformers...LlamaDecoderLayer"), parameters, buffers and constants sit
// at their fully qualified names, and each module call's region of nodes
// (the nodes whose module stack holds that call) becomes that submodule's
// `forward`, called from its parent's. A region that cannot be a call (the
// same module called twice with different code, a call whose inputs depend
// on its own outputs through the parent, a module calling one that is not
// its descendant) stays inline in the caller; its nodes keep their scope
// through the source ranges. See Note [Importing torch.export programs].
//
//   ASSIGN_OR_RETURN(Pt2Archive archive, ReadPt2Archive(path));
//   ASSIGN_OR_RETURN(ImportedProgram p, ProgramToModule(archive));

#include <torch/script.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tracer/export/pt2_archive.h"

namespace tracecut::tracer::exported {

struct ImportedProgram {
  torch::jit::Module module;
  // Modules whose code depends on tensor values (transformers' MoE experts,
  // whose loop follows the routing): the tracer must keep them as leaves.
  std::vector<std::string> leaf_paths;
};

// Errors name the archive and the node (with the model source line from its
// stack trace) that tracecut cannot import: control-flow and other
// higher-order operators, custom objects, buffer or input mutation, an
// operator TorchScript does not know.
absl::StatusOr<ImportedProgram> ProgramToModule(const Pt2Archive& archive);

// The archive's example inputs by the name of the module's forward argument
// they feed; empty when the archive has none or they do not line up with
// the program's inputs.
absl::StatusOr<std::map<std::string, c10::IValue>> SampleInputs(
    const Pt2Archive& archive);

}  // namespace tracecut::tracer::exported

#endif  // TRACECUT_TRACER_EXPORT_PT2_IMPORT_H_
