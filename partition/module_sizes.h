#ifndef TRACECUT_PARTITION_MODULE_SIZES_H_
#define TRACECUT_PARTITION_MODULE_SIZES_H_

// Parameter sizes for PartitionOptions::param_bytes from the TorchScript
// module that owns a graph's tensors (LibTorch; the partitioner itself only
// sees the callback).
//
//   PartitionOptions options;
//   options.param_bytes = ModuleParamBytes(gm.module());
//   options.max_param_bytes = int64_t{4} << 30;

#include <torch/csrc/jit/api/module.h>

#include "partition/partitioner.h"

namespace tracecut::partition {

// A path naming a tensor attribute ("model.layers.0.self_attn.q_proj.weight")
// gives its bytes; a path naming a submodule ("model.layers.0.mlp", a leaf
// module of call_module) gives the bytes of all its parameters and buffers,
// recursively, each tensor counted once. Anything else is unknown. Never
// throws.
ParamBytesFn ModuleParamBytes(const torch::jit::Module& root);

}  // namespace tracecut::partition

#endif  // TRACECUT_PARTITION_MODULE_SIZES_H_
