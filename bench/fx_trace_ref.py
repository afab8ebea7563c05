#!/usr/bin/env python3
"""Peer for the trace row: torch.fx.symbolic_trace of the same Python Llama.

    tools/python -P bench/fx_trace_ref.py --layers 32 --hidden 512

Prints one JSON object: build_s (constructing the Python model with the
fixture's seeds, the Python-side analogue of loading the .pt), trace_s (median
of 3 torch.fx traces) and the node count.

Plain torch.fx cannot trace the HF-style Llama (tests/fixtures/README.md):
LlamaModel._prepare_decoder_attention_mask branches on `input_shape[-1] > 1`
and LlamaRotaryEmbedding.forward on `seq_len > self.max_seq_len_cached`, both
Proxies. What this traces instead, precisely: a torch.fx.Tracer whose leaves
are torch.fx's defaults plus LlamaRotaryEmbedding, with
_prepare_decoder_attention_mask replaced for the trace by a torch.fx.wrap'd
free function (one call_function node, not traced through), torch.arange
recorded as a call_function when its bound is a Proxy. Everything else,
every decoder layer included, is traced through as HF's models are.
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
    import modeling_llama
    import torch
    import torch.fx

    lib.setup_torch()
    config = gen_llama.llama_config(args.layers, args.hidden)
    start = time.perf_counter()
    model = gen_llama.build_llama(config)
    build_s = time.perf_counter() - start

    original = modeling_llama.LlamaModel._prepare_decoder_attention_mask

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m, qualname):
            if isinstance(m, modeling_llama.LlamaRotaryEmbedding):
                return True
            return super().is_leaf_module(m, qualname)

    def patched(self, attention_mask, input_shape, inputs_embeds, past_key_values_length):
        return _wrapped_mask(attention_mask, inputs_embeds)

    modeling_llama.LlamaModel._prepare_decoder_attention_mask = patched
    real_arange = torch.arange

    def arange(*a, **kw):
        # torch.arange(0, seq_length) with a Proxy bound: record the call.
        for v in list(a) + list(kw.values()):
            if isinstance(v, torch.fx.Proxy):
                return v.tracer.create_proxy("call_function", real_arange, a, kw)
        return real_arange(*a, **kw)

    torch.arange = arange
    times = []
    for _ in range(3):
        start = time.perf_counter()
        graph = Tracer().trace(model)
        gm = torch.fx.GraphModule(model, graph)
        times.append(time.perf_counter() - start)
    nodes = len(list(gm.graph.nodes))
    # The fx graph must compute what the model does.
    modeling_llama.LlamaModel._prepare_decoder_attention_mask = original
    torch.arange = real_arange
    inputs = lib.make_inputs(gen_llama.llama_inputs(config))
    with torch.no_grad():
        ref = model(*inputs)[0]
        got = gm(*inputs)[0]
    err = float((ref - got).abs().max())
    print(json.dumps({"layers": args.layers, "hidden": args.hidden, "build_s": build_s,
                      "trace_s": statistics.median(times), "nodes": nodes, "max_err": err}))


import torch.fx  # noqa: E402


@torch.fx.wrap
def _wrapped_mask(attention_mask, inputs_embeds):
    import modeling_llama

    bsz, seq = attention_mask.shape
    return modeling_llama.LlamaModel._prepare_decoder_attention_mask(
        None, attention_mask, (bsz, seq), inputs_embeds, 0)


if __name__ == "__main__":
    main()
