#!/usr/bin/env python3
"""Python reference of llm-compressor's sequential-pipeline partitioning.

Re-implemented from the published description of llm-compressor's
`topological_partition` (src/llmcompressor/pipelines/sequential/helpers.py),
on a graph read from `tracecut trace --format=json`:

* in-degree of every node = its input nodes that are not get_attr;
* Kahn's algorithm from the zero-in-degree non-get_attr nodes, FIFO; a node
  goes to the current partition, and after a target node (a call_module of a
  sequential target) the partition index advances, so targets land in
  disjoint partitions and each node in the latest partition its last input
  allows;
* get_attr nodes are placed last, each at the front of the earliest
  partition holding one of its users (found by scanning partition lists, as
  the original does);
* then, as llm-compressor's partition_graph does, each partition's consumed
  values (read from earlier partitions) and produced values (read later).

    partition_ref.py GRAPH.json [--target-regex=REGEX] [--reps=N]

Prints JSON: load_s (json.load), partition_s (median of reps, partition +
consumed/produced), partitions.
"""

import argparse
import collections
import json
import re
import statistics
import time


def refs(arg, out):
    if isinstance(arg, dict):
        if "ref" in arg:
            out.append(arg["ref"])
        elif "tuple" in arg:
            for a in arg["tuple"]:
                refs(a, out)
    elif isinstance(arg, list):
        for a in arg:
            refs(a, out)
    return out


class Node:
    __slots__ = ("name", "op", "target", "inputs", "users")

    def __init__(self, name, op, target):
        self.name, self.op, self.target = name, op, target
        self.inputs = []
        self.users = {}  # insertion-ordered, as fx's Node.users


def build(graph_json):
    nodes = {}
    order = []
    for j in graph_json["nodes"]:
        n = Node(j["name"], j["op"], j.get("target"))
        seen = {}
        for r in refs(j.get("args", []), []) + refs(list(j.get("kwargs", {}).values()), []):
            seen.setdefault(r, None)
        n.inputs = [nodes[r] for r in seen]
        for i in n.inputs:
            i.users[n] = None
        nodes[n.name] = n
        order.append(n)
    return order


def topological_partition(order, target_nodes):
    partitions = [[]]
    remaining = {n: len([i for i in n.inputs if i.op != "get_attr"]) for n in order}
    index = 0
    queue = collections.deque(n for n in order if remaining[n] == 0 and n.op != "get_attr")
    while queue:
        node = queue.popleft()
        partitions[index].append(node)
        if node in target_nodes:
            index += 1
            partitions.append([])
        for user in node.users:
            remaining[user] -= 1
            if remaining[user] == 0:
                queue.append(user)
    for node in (n for n in order if n.op == "get_attr"):
        user_partitions = []
        for user in node.users:
            for i in range(len(partitions)):
                if user in partitions[i]:
                    user_partitions.append(i)
                    break
        partitions[min(user_partitions)].insert(0, node)
    assert sum(len(p) for p in partitions) == len(order)
    return partitions


def partition_io(partitions):
    where = {}
    for i, p in enumerate(partitions):
        for n in p:
            where[n] = i
    result = []
    for i, p in enumerate(partitions):
        consumed = {}
        produced = {}
        for n in p:
            for inp in n.inputs:
                if where[inp] != i and inp.op != "get_attr":
                    consumed[inp.name] = None
            for u in n.users:
                if where[u] > i:
                    produced[n.name] = None
        result.append((list(consumed), list(produced)))
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("graph")
    parser.add_argument("--target-regex", default=r"(.*\.)?layers\.[0-9]+")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    start = time.perf_counter()
    with open(args.graph) as f:
        graph_json = json.load(f)
    load_s = time.perf_counter() - start
    pattern = re.compile(args.target_regex)
    # Building the node objects stands in for the fx graph llm-compressor
    # already has: not timed, as tracecut's side times PartitionGraph alone.
    order = build(graph_json)
    targets = {n for n in order if n.op == "call_module" and pattern.fullmatch(n.target)}
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        partitions = topological_partition(order, targets)
        partition_io(partitions)
        times.append(time.perf_counter() - start)
    print(json.dumps({"load_s": load_s, "partition_s": statistics.median(times),
                      "partitions": len([p for p in partitions if p]),
                      "targets": len(targets), "nodes": len(order)}))


if __name__ == "__main__":
    main()
