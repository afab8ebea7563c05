"""compressed-tensors' and llm-compressor's own quantization results, for
tracecut's bit-exactness test (ct_conformance_test.cc).

  make_ct_reference.py OUT_DIR

writes OUT_DIR/ct_reference.safetensors: inputs and, per case, the results
the Python stack computes on the CPU; OUT_DIR/ct_cases.json lists the cases:

  {"name", "kind": "weight" | "dynamic_act" | "static_act",
   "args": QuantizationArgs.model_dump(mode="json"),
   "input": KEY (weight) | [KEY, ...] (activation batches),
   "scale", "zero_point", "global_scale", "fake", "codes": KEY or null,
   weights also "scheme", "format" (infer_module_format) and "compressed":
   {name: KEY} (the format's compressor's state dict);
   "kind": "gptq": "hessian", "result" (llm-compressor's GPTQ), "loss"}

Weights go through llm-compressor's QuantizationModifier path on a
torch.nn.Linear: compressed-tensors' initialize_module_for_quantization
(parameter dtypes), llm-compressor's initialize_observer / observe /
update_qparams (observer, global scale, calculate_qparams), then
compressed-tensors' fake_quantize (what the calibrated module computes) and
quantize (what the compressors store: int8 / float8 codes, fp4 values).
Dynamic activations go through compute_dynamic_scales_and_zp; static ones
through the input observer over several batches and update_qparams.

OUT_DIR/presets.json: every preset's QuantizationScheme.model_dump(mode="json")
with targets ["Linear"], and "config": a QuantizationConfig dump.

Deterministic: fixed seeds, one thread.
"""
import json
import os
import sys

import torch
from compressed_tensors.compressors import BaseCompressor
from compressed_tensors.compressors.format import infer_module_format
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    QuantizationStatus,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.lifecycle.forward import fake_quantize, quantize
from compressed_tensors.quantization.lifecycle.initialize import (
    initialize_module_for_quantization,
)
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp
from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight
from llmcompressor.observers import Observer
from llmcompressor.modifiers.quantization.calibration import (
    initialize_observer,
    observe,
    update_qparams,
)
from safetensors.torch import save_file

torch.manual_seed(0)
torch.set_num_threads(1)

# Presets whose weights differ (INT8 is W8A8; W*A8/W*A4 repeat W*A16's
# weights), each checked on every weight below.
WEIGHT_PRESETS = [
    "W2A16", "W3A16", "W4A16", "W4A16_ASYM", "W8A16", "W8A8", "FP8",
    "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "MXFP4A16", "MXFP8A16",
]
# Observer "mse" on these presets' weights.
MSE_PRESETS = ["W4A16", "W4A16_ASYM", "W8A8", "FP8_DYNAMIC", "NVFP4A16",
               "MXFP4A16"]
# Presets with activations: dynamic ones per batch, static ones calibrated.
ACT_PRESETS = ["W8A8", "W4A8", "W4AFP8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK",
               "NVFP4", "MXFP4", "MXFP8"]

tensors = {}
cases = []


def put(key, t):
    tensors[key] = t.detach().contiguous().clone()
    return key


def weights():
    """Weights [192, 256] (rows not a multiple of 128: block padding) and one
    [200, 384], with the edge cases the issue names."""
    w = {}
    base = torch.randn(192, 256) * 0.02
    w["fp32"] = base.clone()
    w["bf16"] = (torch.randn(192, 256) * 0.05).to(torch.bfloat16)
    w["fp16"] = (torch.randn(192, 256) * 0.05).to(torch.float16)
    z = (torch.randn(192, 256) * 0.02).to(torch.bfloat16)
    z[0:4, 0:128] = 0  # whole int groups, NVFP4/MX groups, one block corner
    z[7] = 0  # a whole row (channel)
    z[9, 32:64] = 0  # one MX group
    w["zero_groups_bf16"] = z
    o = base.clone()
    o[5, 17] = 1000.0  # one huge outlier
    o[100, 3] = -300.0
    w["outlier"] = o
    s = base.clone()
    s[0:2, 0:128] = torch.randn(2, 128) * 1e-39  # fp32 subnormals
    s[3, 0:16] = 1e-45  # the smallest subnormal
    w["subnormal"] = s
    sb = (torch.randn(192, 256) * 0.02).to(torch.bfloat16)
    sb[0:2, 0:64] = (torch.randn(2, 64) * 1e-39).to(torch.bfloat16)
    w["subnormal_bf16"] = sb
    w["odd_shape_bf16"] = (torch.randn(200, 384) * 0.03).to(torch.bfloat16)
    # Many exact ties of x / scale at .5 for int rounding: a grid of halves.
    t = (torch.randint(-15, 16, (192, 256)).float() / 2.0) * 0.01
    t[:, 0] = 0.075  # absmax per row/group: 0.075 / 7.5 = 0.01
    w["ties"] = t
    return w


def linear_for(weight, scheme):
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False,
                          dtype=weight.dtype)
    lin.weight.data = weight.clone()
    lin.quantization_scheme = scheme
    initialize_module_for_quantization(lin, scheme, force_zero_point=True)
    lin.quantization_status = QuantizationStatus.CALIBRATION
    return lin


def args_json(args):
    return json.loads(args.model_dump_json())


def weight_case(name, wkey, weight, scheme):
    args = scheme.weights
    lin = linear_for(weight, scheme)
    initialize_observer(lin, "weight")
    observe(lin, "weight")
    update_qparams(lin, "weight")
    scale = lin.weight_scale.data
    zp = lin.weight_zero_point.data
    gs = getattr(lin, "weight_global_scale", None)
    gs = None if gs is None else gs.data
    fake = fake_quantize(lin.weight.data, scale, zp, args, global_scale=gs)
    dtype = None if args.num_bits == 4 and args.type == "float" else \
        args.pytorch_dtype()
    codes = quantize(lin.weight.data, scale, zp, args, dtype=dtype,
                     global_scale=gs)
    i = len(cases)
    # What the format's compressor stores for the module.
    fmt = infer_module_format(torch.nn.Linear, scheme)
    state = {"weight": lin.weight.data, "weight_scale": scale,
             "weight_zero_point": zp}
    if gs is not None:
        state["weight_global_scale"] = gs
    compressed = BaseCompressor.get_value_from_registry(fmt.value).compress(
        state, scheme)
    cases.append({
        "name": name, "kind": "weight", "args": args_json(args), "input": wkey,
        "scheme": json.loads(scheme.model_dump_json()), "format": fmt.value,
        "compressed": {k: put(f"c{i}.ct.{k}", v)
                       for k, v in compressed.items()},
        "scale": put(f"c{i}.scale", scale),
        "zero_point": put(f"c{i}.zero_point", zp),
        "global_scale": None if gs is None else put(f"c{i}.global_scale", gs),
        "fake": put(f"c{i}.fake", fake),
        "codes": put(f"c{i}.codes", codes),
    })


def activations(dtype):
    acts = [torch.randn(2, 8, 256).to(dtype) for _ in range(3)]
    acts[1][0, 3, 10] = 40.0  # an outlier token
    acts[2][1, 2, :] = 0  # an all-zero token
    return acts


def act_cases(preset, dtype):
    scheme = preset_name_to_scheme(preset, ["Linear"])
    args = scheme.input_activations
    acts = activations(dtype)
    keys = [put(f"act.{preset}.{dtype}.{j}", a) for j, a in enumerate(acts)]
    weight = torch.zeros(64, 256, dtype=dtype)
    if args.dynamic is True:
        for j, a in enumerate(acts):
            scale, zp = compute_dynamic_scales_and_zp(a, args, module=None)
            fake = fake_quantize(a, scale, zp, args)
            i = len(cases)
            cases.append({
                "name": f"{preset}/input/{dtype}/batch{j}",
                "kind": "dynamic_act", "args": args_json(args),
                "input": [keys[j]],
                "scale": put(f"c{i}.scale", scale),
                "zero_point": put(f"c{i}.zero_point", zp),
                "global_scale": None, "fake": put(f"c{i}.fake", fake),
                "codes": None,
            })
        return
    # Static (FP8) or "local" (NVFP4: the global scale is calibrated).
    lin = linear_for(weight, scheme)
    initialize_observer(lin, "input")
    for a in acts:
        lin.input_observer(a)
    update_qparams(lin, "input")
    gs = getattr(lin, "input_global_scale", None)
    gs = None if gs is None else gs.data
    if args.dynamic == "local":
        i = len(cases)
        entry = {
            "name": f"{preset}/input/{dtype}", "kind": "static_act",
            "args": args_json(args), "input": keys, "scale": None,
            "zero_point": None, "global_scale": put(f"c{i}.global_scale", gs),
            "fake": None, "codes": None,
        }
        cases.append(entry)
        # Then each batch quantized with dynamic local scales.
        for j, a in enumerate(acts):
            scale, zp = compute_dynamic_scales_and_zp(a, args, module=None,
                                                      global_scale=gs)
            fake = fake_quantize(a, scale, zp, args, global_scale=gs)
            i = len(cases)
            cases.append({
                "name": f"{preset}/input/{dtype}/batch{j}",
                "kind": "dynamic_act", "args": args_json(args),
                "input": [keys[j]], "scale": put(f"c{i}.scale", scale),
                "zero_point": put(f"c{i}.zero_point", zp),
                "global_scale": put(f"c{i}.global_scale", gs),
                "fake": put(f"c{i}.fake", fake), "codes": None,
            })
        return
    scale = lin.input_scale.data
    zp = lin.input_zero_point.data
    fake = fake_quantize(acts[0], scale, zp, args)
    i = len(cases)
    cases.append({
        "name": f"{preset}/input/{dtype}", "kind": "static_act",
        "args": args_json(args), "input": keys,
        "scale": put(f"c{i}.scale", scale),
        "zero_point": put(f"c{i}.zero_point", zp), "global_scale": None,
        "fake": put(f"c{i}.fake", fake), "codes": None,
    })


GPTQ_PRESETS = ["W4A16", "W4A16_ASYM", "W8A8", "FP8_DYNAMIC", "FP8_BLOCK",
                "NVFP4A16", "MXFP4A16"]


def gptq_case(preset, wname, wkey, weight, actorder=None):
    """llm-compressor's GPTQ (quantize_weight, eager) on one weight, with the
    parameters its observer gives (GPTQModifier.compress_module_list)."""
    scheme = preset_name_to_scheme(preset, ["Linear"])
    args = scheme.weights
    if actorder is not None:
        args.actorder = actorder
    g = torch.Generator().manual_seed(7)
    cols = weight.shape[1]
    mix = torch.randn(cols, cols, generator=g) * 0.1 + torch.eye(cols)
    x = torch.randn(256, cols, generator=g) @ mix
    x[:, 5] = 0  # a dead input feature
    hessian = 2 / x.shape[0] * x.t() @ x
    obs = Observer.load_from_registry("memoryless_minmax", base_name="weight",
                                      args=args)
    obs(weight)
    qp = obs.get_qparams()
    gs = qp["global_scale"]
    quantized, losses, fallback = quantize_weight(
        weights=weight.to(torch.float32)[None].clone(),
        hessians=hessian[None].clone(),
        scale=qp["scale"][None], zero_point=qp["zero_point"][None],
        global_scale=None if gs is None else gs.reshape(-1)[0][None],
        quant_args=args, blocksize=128, percdamp=0.01)
    i = len(cases)
    cases.append({
        "name": f"{preset}{'+actorder' if actorder else ''}/gptq/{wname}",
        "kind": "gptq", "args": args_json(args), "input": wkey,
        "hessian": put(f"c{i}.hessian", hessian),
        "result": put(f"c{i}.result", quantized[0].to(weight.dtype)),
        "loss": float(losses[0]), "fallback": bool(fallback[0]),
    })


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for wname, weight in weights().items():
        wkey = put(f"weight.{wname}", weight)
        for preset in WEIGHT_PRESETS:
            scheme = preset_name_to_scheme(preset, ["Linear"])
            if weight.shape[1] % 128 and scheme.weights.group_size == 128:
                continue
            weight_case(f"{preset}/{wname}", wkey, weight, scheme)
        if wname in ("fp32", "bf16", "zero_groups_bf16", "outlier"):
            for preset in MSE_PRESETS:
                scheme = preset_name_to_scheme(preset, ["Linear"])
                scheme.weights.observer = "mse"
                weight_case(f"{preset}+mse/{wname}", wkey, weight, scheme)
    gptq_weights = {"fp32": (torch.randn(192, 256) * 0.02),
                    "bf16": (torch.randn(192, 256) * 0.02).to(torch.bfloat16)}
    for wname, weight in gptq_weights.items():
        wkey = put(f"gptq_weight.{wname}", weight)
        for preset in GPTQ_PRESETS:
            gptq_case(preset, wname, wkey, weight)
        gptq_case("W4A16", wname, wkey, weight, actorder="static")
    for preset in ACT_PRESETS:
        for dtype in (torch.float32, torch.bfloat16):
            act_cases(preset, dtype)
    save_file(tensors, os.path.join(out, "ct_reference.safetensors"))
    with open(os.path.join(out, "ct_cases.json"), "w") as f:
        json.dump(cases, f, indent=1)

    presets = {name: json.loads(
        preset_name_to_scheme(name, ["Linear"]).model_dump_json())
        for name in PRESET_SCHEMES}
    config = QuantizationConfig(
        config_groups={
            "group_0": preset_name_to_scheme("NVFP4", ["re:.*mlp.*"]),
            "group_1": QuantizationScheme(
                targets=["Linear"],
                weights=QuantizationArgs(num_bits=4, group_size=64,
                                         symmetric=False, actorder="static",
                                         observer="mse",
                                         observer_kwargs={"grid": 50})),
        },
        kv_cache_scheme=QuantizationArgs(num_bits=8, type="float",
                                         strategy="attn_head"),
        ignore=["lm_head", "re:.*router"],
        format="mixed-precision",
        quantization_status=QuantizationStatus.COMPRESSED,
    )
    with open(os.path.join(out, "presets.json"), "w") as f:
        json.dump({"presets": presets,
                   "order": list(PRESET_SCHEMES),
                   "config": json.loads(config.model_dump_json())}, f,
                  indent=1)


if __name__ == "__main__":
    main()
