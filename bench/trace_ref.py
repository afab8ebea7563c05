#!/usr/bin/env python3
"""Peer for the trace row: PyTorch's own tracer on the same Python Llama.

    tools/python -P bench/trace_ref.py --layers 32 --hidden 512

Prints one JSON object: build_s (constructing transformers' LlamaForCausalLM
with the fixture's seeds, the Python-side analogue of loading the .pt),
trace_s (median of 3 `torch.export.export` runs, non-strict, on the fixture's
example inputs), the node count of the exported graph, and max_err (the
exported program against the eager model).

The peer used to be torch.fx.symbolic_trace of a hand-written v4.31 mirror
of the model. The fixtures are transformers' own classes now, and plain
torch.fx cannot trace transformers 5's Llama (tests/fixtures/README.md), whose
own fx tracer (HFTracer) was removed: torch.export is what replaces both.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "tests", "fixtures")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--fixtures", default=FIXTURES)
    args = parser.parse_args()

    sys.path.insert(0, args.fixtures)
    import gen_llama  # noqa: E402

    gen_llama._bootstrap()
    import fixture_lib as lib
    import torch

    lib.setup_torch()
    config = gen_llama.llama_config(args.layers, args.hidden)
    start = time.perf_counter()
    model = gen_llama.build_llama(config)
    build_s = time.perf_counter() - start

    inputs = lib.make_inputs(gen_llama.llama_inputs(config))
    kwargs = {"input_ids": inputs[0], "attention_mask": inputs[1],
              "use_cache": False}
    times = []
    for _ in range(3):
        start = time.perf_counter()
        program = torch.export.export(model, (), kwargs, strict=False)
        times.append(time.perf_counter() - start)
    nodes = len(list(program.graph.nodes))
    with torch.no_grad():
        ref = model(**kwargs).logits
        got = program.module()(**kwargs).logits
    err = float((ref - got).abs().max())
    print(json.dumps({"layers": args.layers, "hidden": args.hidden, "build_s": build_s,
                      "trace_s": statistics.median(times), "nodes": nodes, "max_err": err}))


if __name__ == "__main__":
    main()
