"""The one mechanism passes use to build a new graph from an old one.

``rewrite(graph, rule)`` walks nodes in order; for each node it calls ``rule(node, inputs, b)`` with the
node's already-rewritten inputs and the builder.  The rule returns a replacement node (built with ``b``),
or ``None`` to keep the node (copied only if its inputs changed).  A ``RewriteLog`` counts what each rule did
so the pipeline can report it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.tune.choices import Choices

Rule = Callable[[Node, tuple[Node, ...], GraphBuilder], "Node | None"]


@dataclasses.dataclass
class RewriteLog:
    """What a pass did (counts of rewrites, for the report), and the compile it runs in: ``mode`` - passes
    that measure tune only in max-autotune, and GPU weight copies are held only outside default mode - and
    ``choices``, the compile's measured-choice service (``tune/choices.py``)."""
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    mode: str = "default"
    choices: Choices = dataclasses.field(default_factory=Choices)

    def hit(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def notes(self) -> list[str]:
        return [f"{k}: {v}" for k, v in sorted(self.counts.items())]


def copy_with_inputs(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
    if all(a is c for a, c in zip(inputs, node.inputs)):
        return b.add_node(node)
    attrs = {k: v for k, v in node.attrs.items() if k != "shape"}
    return b.add(node.op, inputs, shape=node.shape, dtype=node.dtype, **attrs)


def rewrite(graph: Graph, rule: Rule) -> Graph:
    b = GraphBuilder()
    mapping: dict[Node, Node] = {}
    for n in graph.nodes:
        inputs = tuple(mapping[i] for i in n.inputs)
        new = rule(n, inputs, b)
        mapping[n] = new if new is not None else copy_with_inputs(n, inputs, b)
    return b.finish([mapping[o] for o in graph.outputs])
