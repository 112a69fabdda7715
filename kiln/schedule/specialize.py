"""A symbolic graph's plan made concrete for one call's sizes (docs/dynamic_shapes.md, layers 5 and 6).

[Note: a Program per size] A graph traced with dynamic shapes is lowered, optimized, partitioned and turned into
kernels once, with size expressions (``ir/sym.py``); its C++ reads the sizes from a table at run time, so one
build serves every size.  What depends on the sizes and not on the code - the arena's offsets and total, the
views' strides, the extern calls' size arguments, the output buffers - is decided per size tuple: the graph and
plan are copied with every size expression evaluated, and ``build_program`` plans them as it plans a static
graph (~1 ms for a transformer layer).  The runtime keeps one Program per size seen (``runtime/dynamic.py``,
least recently used dropped).  Reuse and in-place decisions are the static planner's on the evaluated sizes;
the kernels are shared, unchanged::

    symbolic graph + plan (kernels over s0)  --Specializer(env={s0: 37})-->  Program (arena 37-sized)
                                              --Specializer(env={s0: 90})-->  Program (arena 90-sized)

Library calls from the generated code (``runtime/native.py``) bake their sizes into the C++ source, which must
stay the same for every size: a symbolic graph's library ops are called through Python (``native_calls`` off).
"""
from __future__ import annotations

from typing import Any, Callable

from kiln.ir.graph import Graph, Node
from kiln.ir.kernel import Kernel
from kiln.ir.program import ExternStep, Plan, Program
from kiln.ir.sym import PerSize, evaluate, is_symbolic
from kiln.schedule.program import build_program


def _concrete(value: Any, env: dict[str, int], node_map: dict[Node, Node]) -> Any:
    """``value`` (a node attribute) with its size expressions evaluated, through tuples, lists and dicts."""
    if is_symbolic(value):
        return evaluate(value, env)
    if isinstance(value, PerSize):
        return value.at(env)
    if isinstance(value, Node):
        return node_map.get(value, value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_concrete(v, env, node_map) for v in value)
    if isinstance(value, list):
        return [_concrete(v, env, node_map) for v in value]
    if isinstance(value, dict):
        return {k: _concrete(v, env, node_map) for k, v in value.items()}
    return value


def holds_size(value: Any) -> bool:
    """Does an attribute hold a size expression or a value chosen per size anywhere (through tuples, lists and
    dicts)?"""
    if is_symbolic(value) or isinstance(value, PerSize):
        return True
    if isinstance(value, (tuple, list)):
        return any(holds_size(v) for v in value)
    if isinstance(value, dict):
        return any(holds_size(v) for v in value.values())
    return False


def static_nodes(graph: Graph) -> set[Node]:
    """The nodes whose value does not depend on the sizes (no size expression in their shape or attributes, nor in
    any node they are computed from): every size's graph shares them as they are (weights, their views)."""
    found: set[Node] = set()
    for n in graph.nodes:
        if all(i in found for i in n.inputs) and not any(is_symbolic(d) for d in n.shape) \
                and not holds_size(n.attrs):
            found.add(n)
    return found


def concrete_graph(graph: Graph, env: dict[str, int], static: set[Node],
                   sized_attrs: set[Node]) -> tuple[Graph, dict[Node, Node]]:
    """A copy of ``graph`` with every shape and attribute evaluated at ``env``, and the map old node -> new;
    ``static`` (``static_nodes(graph)``): nodes kept as they are; ``sized_attrs``: the nodes whose attributes
    hold a size."""
    node_map: dict[Node, Node] = {}
    nodes = []
    for n in graph.nodes:
        if n in static:
            new = n
        else:
            attrs = _concrete(n.attrs, env, node_map) if n in sized_attrs else dict(n.attrs)
            new = Node(n.op, tuple(node_map[i] for i in n.inputs), attrs,
                       tuple(evaluate(s, env) if is_symbolic(s) else s for s in n.shape), n.dtype)
        node_map[n] = new
        nodes.append(new)
    return Graph(nodes, [node_map[n] for n in graph.inputs], [node_map[n] for n in graph.outputs]), node_map


def concrete_plan(plan: Plan, node_map: dict[Node, Node], env: dict[str, int]) -> Plan:
    """``plan`` over the concrete graph's nodes: the same kernels (their code reads the sizes at run time), the
    extern steps, buffers, aliases and layouts of the mapped nodes."""
    steps: list[Any] = []
    for s in plan.steps:
        if isinstance(s, Kernel):
            steps.append(s)
        elif isinstance(s, ExternStep):
            steps.append(ExternStep(node_map[s.node]))
        else:
            raise TypeError(f"a symbolic plan has no {type(s).__name__} steps (an operator's own GPU step)")
    return Plan(steps, {node_map[n]: b for n, b in plan.buffer_of.items()}, {node_map[n] for n in plan.aliases},
                plan.kernels, {node_map[n]: _concrete(st, env, node_map) for n, st in plan.strides_of.items()},
                {node_map[n] for n in plan.cl_convs}, {node_map[n] for n in plan.bmm_relayout})


class Specializer:
    """The concrete graph and its Program for the sizes ``env`` ([Note: a Program per size]) of one symbolic graph
    and plan, with what does not depend on the sizes found once: ``specializer(env) -> (graph, Program)``."""

    def __init__(self, graph: Graph, plan: Plan, arena: bool = True,
                 kernel_at: Callable[[Kernel, dict[str, int]], Kernel] | None = None):
        """``arena``: as ``build_program``'s (False on a GPU); ``kernel_at(kernel, env)``: the kernel a size's plan
        takes (default: the shared one; a GPU's: a copy with the launch schedule of those sizes)."""
        self.graph, self.plan = graph, plan
        self.arena, self.kernel_at = arena, kernel_at
        self.static = static_nodes(graph)
        self.sized_attrs = {n for n in graph.nodes if n not in self.static and holds_size(n.attrs)}
        for k in plan.kernels:  # (planned once; every size's program asks them again)
            k.freeze_buffers()

    def __call__(self, env: dict[str, int]) -> tuple[Graph, Program]:
        graph, node_map = concrete_graph(self.graph, env, self.static, self.sized_attrs)
        plan = concrete_plan(self.plan, node_map, env)
        if self.kernel_at is not None:
            at = {id(k): self.kernel_at(k, env) for k in plan.kernels}
            plan.steps = [at.get(id(s), s) if isinstance(s, Kernel) else s for s in plan.steps]
            plan.kernels = [at[id(k)] for k in plan.kernels]
        return graph, build_program(graph, plan, arena=self.arena)
