"""Dead code elimination: drop nodes no output depends on.  INPUT nodes always stay (they fix the calling
convention).

Before::                                After::

    %0 = exp(%in0) : f32[4]                 %1 = neg(%in0) : f32[4]
    %1 = neg(%in0) : f32[4]                 return (%1)
    return (%1)
"""
from __future__ import annotations

from kiln.ir.graph import Graph, Node, mutates
from kiln.ir.ops import Op


def dce(graph: Graph) -> Graph:
    live: set[Node] = set(graph.outputs) | {n for n in graph.nodes if mutates(n)}
    for n in reversed(graph.nodes):
        if n in live:
            live.update(n.inputs)
    nodes = [n for n in graph.nodes if n in live or n.op is Op.INPUT]
    return Graph(nodes, list(graph.inputs), list(graph.outputs))
