"""Common subexpression elimination: nodes with equal structural keys (op, inputs, attrs, type) are merged.

Before::                                  After::

    %0 = exp(%in0) : f32[4]                   %0 = exp(%in0) : f32[4]
    %1 = exp(%in0) : f32[4]                   %2 = add(%0, %0) : f32[4]
    %2 = add(%0, %1) : f32[4]
"""
from __future__ import annotations

import torch

from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.ops import Op
from kiln.passes.rewrite import RewriteLog, copy_with_inputs


def is_random(n: Node) -> bool:
    """An EXTERN whose every call gives new values (rand_like, dropout, ...): never merged or folded."""
    return n.op is Op.EXTERN and torch.Tag.nondeterministic_seeded in getattr(n.attr("target"), "tags", ())


def cse(graph: Graph, log: RewriteLog | None = None) -> Graph:
    b = GraphBuilder()
    mapping: dict[Node, Node] = {}
    seen: dict[tuple, Node] = {}
    for n in graph.nodes:
        new = copy_with_inputs(n, tuple(mapping[i] for i in n.inputs), b)
        if n.op is Op.INPUT or is_random(n):
            mapping[n] = new
            continue
        key = new.key()
        if key in seen:
            b.nodes.pop()
            mapping[n] = seen[key]
            if log:
                log.hit(f"merged {n.op.value}")
        else:
            seen[key] = new
            mapping[n] = new
    return b.finish([mapping[o] for o in graph.outputs])
