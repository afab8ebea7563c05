#!/usr/bin/env python3
"""Python reference for the partition row: llm-compressor's sequential
partitioning, timed on a real torch.fx graph of the same model.

    tools/python -P partition_ref.py GRAPH.json [--targets=LlamaDecoderLayer]
                                         [--reps=N]

GRAPH.json is `tracecut trace --format=json` output, i.e. the very graph that
tracecut's PartitionGraph partitions in the same benchmark row. It is rebuilt,
untimed, as what llm-compressor holds after tracing: a torch.fx GraphModule
(one fx Node per IR node, same names, ops, targets and operands; call_function
targets are the torch.ops overloads where they exist; meta carries the
nn_module_stack, output tensor shapes and source line) whose root module has
a submodule or buffer at every call_module and get_attr target, the modules
typed after their class names so that targets match by class name.

Timed (median of --reps), re-implemented from llm-compressor's
src/llmcompressor/pipelines/sequential/helpers.py: everything trace_subgraphs
does after tracing, in the same way (lists scanned where it scans lists, sets
where it uses sets):

* match_modules: sequential targets matched by module name or class name;
* topological_partition: graph_is_well_formed, find_target_nodes
  (get_submodule per call_module), Kahn's algorithm from the graph inputs with
  get_attr nodes held back, a new partition after each target node, then each
  get_attr placed at the front of the earliest partition holding one of its
  users (found by scanning the partition lists), and the coverage assert;
* partition_graph: per partition a new torch.fx.Graph owned by the model, a
  placeholder per value read from outside the partition, Graph.node_copy of
  every node, an output node returning the dict of values read later, lint(),
  input_names and graph_is_well_formed;
* trace_consumed_names: the last reader of each input.

Why this matches tracecut's side: PartitionGraph matches targets, places every
node, and builds per subgraph a complete executable ir::Graph (placeholders,
a copy of every node with scope and meta, get_attr reads, an output tuple) plus
the input/output/last-use names. Neither side generates code at partition
time: llm-compressor compiles a Subgraph's Python code lazily on its first
forward (Subgraph.forward), so that is not in partition_s; codegen_s reports
what Graph.python_code for every subgraph would add, for information.

Graphs traced with decoder layers as leaves (--leaf=LlamaDecoderLayer) have
the call_module target nodes llm-compressor's tracer produces (it never traces
inside sequential targets). For graphs traced through the layers, which
llm-compressor cannot partition, the target node of an instance is the last
node in graph order inside it (by nn_module_stack): Kahn's algorithm then
advances the partition exactly where the instance ends, as it does after a
leaf target. The output says which ("mode": "leaf" or "scope").

Prints JSON: load_s (json.load), build_s (fx graph, untimed), partition_s
(median wall time), partition_min_s, cpu_s (median thread CPU time),
codegen_s, partitions, targets, nodes, mode.
"""

import argparse
import collections
import json
import re
import statistics
import time

import torch
import torch.fx
from torch.fx import Graph, GraphModule


# ----- Rebuilding the traced fx graph (untimed) ------------------------------

def short_type(qualified):
    return qualified.rsplit(".", 1)[-1] if qualified else ""


_classes = {}


def module_class(type_name):
    """An nn.Module subclass named after the traced module's class."""
    name = short_type(type_name) or "Module"
    if name not in _classes:
        _classes[name] = type(name, (torch.nn.Module,), {})
    return _classes[name]()


def build_root(graph_json):
    types = {}
    for j in graph_json["nodes"]:
        for e in j.get("scope", []):
            types.setdefault(e["path"], e["type"])
    root = module_class(types.get(""))
    modules = {"": root}

    def module_at(path):
        if path in modules:
            return modules[path]
        parent, _, atom = path.rpartition(".")
        m = module_class(types.get(path))
        module_at(parent).add_module(atom, m)
        modules[path] = m
        return m

    for path in sorted((p for p in types if p), key=lambda p: p.count(".")):
        module_at(path)
    for j in graph_json["nodes"]:
        if j["op"] == "call_module":
            module_at(j["target"])
    for j in graph_json["nodes"]:
        if j["op"] == "get_attr":
            parent, _, atom = j["target"].rpartition(".")
            owner = module_at(parent)
            if not hasattr(owner, atom):
                owner.register_buffer(atom, torch.empty(0))
    return root


_functions = {}


def function_target(target):
    """torch.ops.aten.add.Tensor for "aten::add.Tensor", else a stand-in."""
    if target in _functions:
        return _functions[target]
    fn = None
    ns, _, rest = target.partition("::")
    name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        fn = getattr(packet, overload) if overload else packet
    except (AttributeError, RuntimeError):
        pass
    if fn is None:
        def fn(*args, **kwargs):
            raise NotImplementedError(target)
        fn.__name__ = re.sub(r"\W", "_", target)
    _functions[target] = fn
    return fn


def build_fx(graph_json):
    root = build_root(graph_json)
    graph = Graph()
    env = {}

    def arg(a):
        if isinstance(a, dict):
            if "ref" in a:
                return env[a["ref"]]
            if "tuple" in a:
                return tuple(arg(x) for x in a["tuple"])
            if "dtype" in a:
                return getattr(torch, a["dtype"])
            if "device" in a:
                return torch.device(a["device"])
            if "str" in a:
                return a["str"]
            raise ValueError(f"unknown argument {a}")
        if isinstance(a, list):
            return [arg(x) for x in a]
        return a

    for j in graph_json["nodes"]:
        op, target = j["op"], j.get("target")
        args = tuple(arg(a) for a in j.get("args", []))
        kwargs = {k: arg(v) for k, v in j.get("kwargs", {}).items()}
        if op == "call_function":
            target = function_target(target)
        if op == "output":
            node = graph.output(args[0] if args else None)
        else:
            node = graph.create_node(op, target, args, kwargs, name=j["name"])
        node.meta["nn_module_stack"] = {e["path"]: e["type"] for e in j.get("scope", [])}
        if j.get("outputs"):
            node.meta["tensor_meta"] = [
                (tuple(o.get("shape", [])), o.get("dtype"), o.get("device"))
                for o in j["outputs"]]
        if "source" in j:
            s = j["source"]
            node.stack_trace = f'File "{s.get("file")}", line {s.get("line")}'
        env[j["name"]] = node
    graph.lint()
    return root, GraphModule(root, graph)


# ----- llm-compressor's partitioning (timed) --------------------------------

def find_name_or_class_matches(name, module, targets):
    for t in targets:
        if t.startswith("re:"):
            if re.match(t[3:], name) or re.match(t[3:], module.__class__.__name__):
                return True
        elif t == name or t == module.__class__.__name__:
            return True
    return False


def match_modules(model, target_names):
    return set(m for name, m in model.named_modules()
               if find_name_or_class_matches(name, m, target_names))


def graph_is_well_formed(graph):
    for node in graph.nodes:
        for user in node.users:
            if node not in user.all_input_nodes:
                return False
        for input_node in node.all_input_nodes:
            if node not in input_node.users:
                return False
        if len(node.users) != len(set(node.users)) or len(node.all_input_nodes) != len(
                set(node.all_input_nodes)):
            return False
    return True


def find_target_nodes(gm, targets, model):
    nodes = set(n for n in gm.graph.nodes
                if n.op == "call_module" and gm.get_submodule(n.target) in targets)
    if nodes:
        return nodes, "leaf"
    # Layers traced through: each instance ends at its last node.
    paths = set(name for name, m in model.named_modules() if m in targets)
    last = {}
    for n in gm.graph.nodes:
        for path in n.meta.get("nn_module_stack", ()):
            if path in paths:
                last[path] = n
    return set(last.values()), "scope"


def topological_partition(gm, target_nodes):
    assert graph_is_well_formed(gm.graph)
    partitions = [[]]
    remaining = {node: len([n for n in node.all_input_nodes if n.op != "get_attr"])
                 for node in gm.graph.nodes}
    index = 0
    queue = collections.deque(node for node in gm.graph.nodes
                              if remaining[node] == 0 and node.op != "get_attr")
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
    for node in gm.graph.find_nodes(op="get_attr") if hasattr(gm.graph, "find_nodes") else (
            n for n in gm.graph.nodes if n.op == "get_attr"):
        user_partitions = []
        for user in node.users:
            for i in range(len(partitions)):
                if user in partitions[i]:
                    user_partitions.append(i)
                    break
        partitions[min(user_partitions)].insert(0, node)
    assert set().union(*partitions) == set(gm.graph.nodes)
    return partitions


class Subgraph:
    __slots__ = ("graph", "input_names", "consumed_names")

    def __init__(self, graph, input_names, consumed_names):
        self.graph = graph
        self.input_names = input_names
        self.consumed_names = consumed_names


def partition_graph(model, partitions):
    subgraphs = []
    for partition_nodes in partitions:
        graph = Graph(model)
        node_map = {}
        new_input_nodes = {
            input_node
            for node in partition_nodes
            for input_node in node.all_input_nodes
            if input_node not in partition_nodes and input_node.op
        }
        for input_node in new_input_nodes:
            node_map[input_node] = graph.placeholder(input_node.name)
        for node in partition_nodes:
            node_map[node] = graph.node_copy(node, lambda n: node_map[n])
        if not any(n.op == "output" for n in graph.nodes):
            output_dict = {
                node.name: node_map[node]
                for node in partition_nodes
                if any(user not in partition_nodes for user in node.users.keys())
            }
            graph.output(output_dict)
        graph.lint()
        input_names = set(node.name for node in graph.nodes if node.op == "placeholder")
        subgraphs.append(Subgraph(graph, input_names, set()))
        assert graph_is_well_formed(graph)
    return subgraphs


def trace_consumed_names(subgraphs):
    all_input_names = set().union(*(s.input_names for s in subgraphs))
    for input_name in all_input_names:
        for subgraph in reversed(subgraphs):
            if input_name in subgraph.input_names:
                subgraph.consumed_names.add(input_name)
                break
        else:
            raise ValueError(f"Could not find input name {input_name} in subgraphs")


def partition(model, gm, target_names):
    targets = match_modules(model, target_names)
    target_nodes, mode = find_target_nodes(gm, targets, model)
    partitions = topological_partition(gm, target_nodes)
    subgraphs = partition_graph(model, partitions)
    trace_consumed_names(subgraphs)
    return subgraphs, len(targets), mode


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("graph")
    parser.add_argument("--targets", default="LlamaDecoderLayer",
                        help="comma-separated module class names, names or re: patterns")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    start = time.perf_counter()
    with open(args.graph) as f:
        graph_json = json.load(f)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    model, gm = build_fx(graph_json)
    build_s = time.perf_counter() - start
    target_names = args.targets.split(",")
    times, cpu = [], []
    for _ in range(max(1, args.reps)):
        start, cpu_start = time.perf_counter(), time.thread_time()
        subgraphs, num_targets, mode = partition(model, gm, target_names)
        cpu.append(time.thread_time() - cpu_start)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    for s in subgraphs:
        s.graph.python_code("self")
    codegen_s = time.perf_counter() - start
    print(json.dumps({"load_s": load_s, "build_s": build_s,
                      "partition_s": statistics.median(times), "partition_min_s": min(times),
                      "cpu_s": statistics.median(cpu),
                      "codegen_s": codegen_s,
                      "partitions": len(subgraphs), "targets": num_targets,
                      "nodes": len(gm.graph.nodes), "mode": mode}))


if __name__ == "__main__":
    main()
