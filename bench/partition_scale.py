#!/usr/bin/env python3
"""Partition at scale (issue 17): PartitionGraph's growth curve.

    bench/partition_scale.sh [--runs=N] [--cold] [--ref] [--before=BIN]
                             [--quick]

(the .sh builds partition_bench with -c opt and calls this with its path).
Times //partition:partition_bench, one process per graph and run, on

* a Llama traced through its layers (tests/fixtures/gen_llama.py, hidden
  64, `tracecut trace` to the IR text form) at 8, 16, 32, 64, 128 layers;
* the synthetic Mixtral-shaped MoE graph of partition/test_graphs.h
  (`partition_bench --moe=LxE`, 15 nodes per expert) from 11.6k to 1.0M
  nodes: 256 experts per layer and 3, 26, 64, 258 layers, and 64 layers of
  1040 experts (1.0M nodes with 16k-node layers);

and prints a Markdown table: per graph the median over runs of each run's
median partition time (partition_bench --reps), the fastest run's min, time
per node, and the same on one thread (--threads=1; a graph of 4096 nodes or
more is otherwise partitioned on two); then the growth rows (time ratio /
node ratio, target <= 1.1) and the 1M-node rows (target < 1 s), each with
its verdict.

--cold flushes the caches before each timed partition (partition_bench
--cold), as a single partition right after loading a graph runs, instead of
a loop re-partitioning a small graph that stays in the core's L2.
--ref also times llm-compressor's partitioning on torch.fx
(bench/reference/partition_ref.py) on the same traced Llama graphs.
--before=BIN times another partition_bench build (e.g. main's) on the same
graphs; the synthetic ones are written to text for it (--write_graph).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_LAYERS = [8, 16, 32, 64, 128]
MOE = [(3, 256), (26, 256), (64, 256), (258, 256), (64, 1040)]


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


COLD = []  # ["--cold"] with --cold.


def time_graph(bench, args, runs, reps, one_thread=True):
    """Median over `runs` processes; with one_thread, the same graph is also
    timed with --threads=1 (the process-to-process alternation keeps the
    two comparable on a machine whose speed drifts), under "one"."""
    rows, ones = [], []
    for _ in range(runs):
        rows.append(run_json([bench] + args + [f"--reps={reps}"] + COLD))
        if one_thread:
            ones.append(run_json([bench] + args + [f"--reps={reps}",
                                                   "--threads=1"] + COLD))
    out = summarize(rows)
    if ones:
        out["one"] = summarize(ones)
    return out


def summarize(rows):
    return {
        "nodes": rows[0]["nodes"],
        "subgraphs": rows[0]["subgraphs"],
        "median_s": statistics.median(r["partition_s"] for r in rows),
        "min_s": min(r["min_s"] for r in rows),
        "cpu_s": statistics.median(r["cpu_s"] for r in rows),
        "destroy_s": statistics.median(r.get("destroy_s", 0) for r in rows),
        "runs": [r["partition_s"] for r in rows],
    }


def fmt_ms(s):
    return f"{1e3 * s:.3f} ms" if s < 0.1 else f"{1e3 * s:.1f} ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("--tracecut", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ref", action="store_true")
    ap.add_argument("--before", default="")
    ap.add_argument("--quick", action="store_true",
                    help="8/16 layers and the smallest MoE, 2 runs")
    ap.add_argument("--work", default="")
    ap.add_argument("--cold", action="store_true",
                    help="partition_bench --cold: caches flushed before "
                    "each timed partition")
    a = ap.parse_args()
    if a.cold:
        COLD.append("--cold")
    layers = LLAMA_LAYERS[:2] if a.quick else LLAMA_LAYERS
    moe = MOE[:1] if a.quick else MOE
    runs = 2 if a.quick else a.runs
    work = a.work or tempfile.mkdtemp(prefix="partition_scale.")
    os.makedirs(work, exist_ok=True)
    py = os.path.join(ROOT, "tools", "python")
    results = []  # (name, kind, size, ours, before, ref)
    for n in layers:
        pt = os.path.join(work, f"llama_{n}.pt")
        ir = os.path.join(work, f"llama_{n}.ir")
        if not os.path.exists(ir):
            subprocess.run([py, "-P", "tests/fixtures/gen_llama.py", "--layers",
                            str(n), "--hidden", "64", "--out", pt], check=True,
                           cwd=ROOT, capture_output=True)
            subprocess.run([a.tracecut, "trace", pt, "-o", ir], check=True,
                           capture_output=True)
        reps = 20 if n <= 32 else 10
        ours = time_graph(a.bench, [ir], runs, reps)
        before = (time_graph(a.before, [ir], runs, reps, one_thread=False)
                  if a.before else None)
        ref = None
        if a.ref:
            js = os.path.join(work, f"llama_{n}.json")
            if not os.path.exists(js):
                subprocess.run([a.tracecut, "trace", pt, "--format=json", "-o",
                                js], check=True, capture_output=True)
            ref = run_json([py, "-P", os.path.join(
                ROOT, "bench", "reference", "partition_ref.py"), js, "--reps=3"])
        results.append((f"Llama {n}L traced through", "llama", n, ours,
                        before, ref))
        print(f"llama {n}: {ours}", file=sys.stderr)
    for layers_, experts in moe:
        spec = f"{layers_}x{experts}"
        reps = 5 if layers_ * experts < 20000 else 3
        ours = time_graph(a.bench, [f"--moe={spec}"], runs, reps)
        before = None
        # The text form of a million nodes is ~0.4 GB, and the builds before
        # the parser shared scopes hold it in several GB: up to 300k nodes.
        if a.before and layers_ * experts * 15 <= 300_000:
            txt = os.path.join(work, f"moe_{spec}.ir")
            if not os.path.exists(txt):
                subprocess.run([a.bench, f"--moe={spec}", "--reps=1",
                                f"--write_graph={txt}"], check=True,
                               capture_output=True)
            before = time_graph(a.before, [txt, "--targets=MixtralDecoderLayer"],
                                max(1, runs // 2), reps, one_thread=False)
        results.append((f"MoE {layers_} layers x {experts} experts", "moe",
                        (layers_, experts), ours, before, None))
        print(f"moe {spec}: {ours}", file=sys.stderr)

    print("| graph | nodes | subgraphs | ours: median | ours: fastest | "
          "ours: CPU (median) | µs/node (median) | one thread: median | "
          "one thread: µs/node | "
          + ("before: median | before: CPU | speed-up (median) | "
             if a.before else "")
          + ("llm-compressor (partition_ref.py) | ours / ref |" if a.ref
             else ""))
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|"
          + ("---:|---:|---:|" if a.before else "")
          + ("---:|---:|" if a.ref else ""))
    for name, _, _, ours, before, ref in results:
        row = (f"| {name} | {ours['nodes']} | {ours['subgraphs']} | "
               f"{fmt_ms(ours['median_s'])} | {fmt_ms(ours['min_s'])} | "
               f"{fmt_ms(ours['cpu_s'])} | "
               f"{1e6 * ours['median_s'] / ours['nodes']:.3f} | "
               f"{fmt_ms(ours['one']['median_s'])} | "
               f"{1e6 * ours['one']['median_s'] / ours['nodes']:.3f} |")
        if a.before:
            row += (f" {fmt_ms(before['median_s'])} | "
                    f"{fmt_ms(before['cpu_s'])} | "
                    f"{before['median_s'] / ours['median_s']:.2f}× |"
                    if before else " — | — | — |")
        if a.ref:
            row += (f" {fmt_ms(ref['partition_s'])} | "
                    f"{ours['median_s'] / ref['partition_s']:.4f} |"
                    if ref else " — | — |")
        print(row)

    print()
    print("| growth / size | node ratio | time ratio | time ratio / node ratio "
          "| target | met? |")
    print("|---|---:|---:|---:|---|---|")

    def growth(label, first, last, key):
        # Wall time (median), process CPU time (steadier on a busy machine:
        # no waiting for a core in it), and both on one thread.
        for what, get in (
                ("wall", lambda r: r["median_s"]),
                ("CPU", lambda r: r["cpu_s"]),
                ("one thread, wall", lambda r: r["one"]["median_s"]),
                ("one thread, CPU", lambda r: r["one"]["cpu_s"])):
            if "one" in what and "one" not in first[key]:
                continue
            nr = last[key]["nodes"] / first[key]["nodes"]
            tr = get(last[key]) / get(first[key])
            g = tr / nr
            print(f"| {label}, {what} | {nr:.1f} | {tr:.1f} | {g:.2f} | ≤ 1.1 "
                  f"| {'yes' if g <= 1.1 else '**no**'} |")

    llama = [r for r in results if r[1] == "llama"]
    if len(llama) > 1:
        growth(f"Llama {llama[0][2]}L → {llama[-1][2]}L (ours)",
               {"o": llama[0][3]}, {"o": llama[-1][3]}, "o")
        if a.before:
            growth(f"Llama {llama[0][2]}L → {llama[-1][2]}L (before)",
                   {"o": llama[0][4]}, {"o": llama[-1][4]}, "o")
    moes = [r for r in results if r[1] == "moe" and r[2][1] == 256]
    if len(moes) > 1:
        growth(f"MoE {moes[0][3]['nodes']} → {moes[-1][3]['nodes']} nodes "
               "(256 experts per layer; ours)", {"o": moes[0][3]},
               {"o": moes[-1][3]}, "o")
        timed = [r for r in moes if r[4] is not None]
        if len(timed) > 1:
            growth(f"MoE {timed[0][4]['nodes']} → {timed[-1][4]['nodes']} "
                   "nodes (before)", {"o": timed[0][4]}, {"o": timed[-1][4]},
                   "o")
    for name, kind, _, ours, before, _ in results:
        if kind == "moe" and ours["nodes"] >= 1_000_000:
            for what, s in (("wall, median", ours["median_s"]),
                            ("wall, fastest", ours["min_s"]),
                            ("CPU, median", ours["cpu_s"]),
                            ("one thread, wall, median",
                             ours["one"]["median_s"])):
                print(f"| {name}: {ours['nodes']} nodes, {what} | — | — | "
                      f"{s:.3f} s | < 1 s | {'yes' if s < 1 else '**no**'} |")
    print()
    print("raw: " + json.dumps([{"graph": r[0], "ours": r[3], "before": r[4],
                                 "ref": r[5]} for r in results]))


if __name__ == "__main__":
    main()
