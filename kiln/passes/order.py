"""Memory-aware order: a library call that is the last reader of a large value runs early, so the value dies early.

ResNet's downsampling block reads its input ``x`` twice: in ``conv1`` (main branch) and in the 1x1 downsample
convolution, which capture places after the main branch's ``conv2``.  ``x`` then lives through ``conv2``,
whose call is the block's peak (on a GPU in default mode cuDNN converts a 4.5 MiB weight inside it).  Run the
downsample before ``conv2`` and ``x`` dies there; only its result, half the size, lives through ``conv2``.

The call moves up to just before the first library call that follows the value's other last reader, so no
kernel is split (a kernel never spans a library call) and a library call keeps its epilogue kernel next to
it.  It moves only when the value it frees is at least as large as its own result.

Before::                                                   After::

    %1 = extern(%x, %w1, target=convolution)                  %1 = extern(%x, %w1, target=convolution)
    %2 = relu(%1)                                             %2 = relu(%1)
    %3 = extern(%2, %w2, target=convolution)                  %5 = extern(%x, %wd, target=convolution)
    %4 = relu(%3)                                             %3 = extern(%2, %w2, target=convolution)
    %5 = extern(%x, %wd, target=convolution)                  %4 = relu(%3)
    %6 = add(%4, %5)                                          %6 = add(%4, %5)
"""
from __future__ import annotations

from kiln.ir.graph import Graph, Node, view_root
from kiln.ir.ops import VIEW, Op
from kiln.ir.sym import size_hint
from kiln.passes.cse import is_random
from kiln.ir.graph import mutates
from kiln.passes.rewrite import RewriteLog


def _nbytes(n: Node) -> int:
    """Bytes of ``n`` (at the sizes it was traced with, for symbolic sizes: this pass only orders)."""
    return size_hint(n.numel) * n.dtype.itemsize


def _readers(nodes: list[Node]) -> dict[Node, list[Node]]:
    """Value -> the non-view nodes that read it (through views), in program order."""
    readers: dict[Node, list[Node]] = {}
    for n in nodes:
        if n.op in VIEW:
            continue
        for base in dict.fromkeys(view_root(i) for i in n.inputs):
            readers.setdefault(base, []).append(n)
    return readers


def _hoist_one(nodes: list[Node], log: RewriteLog | None) -> bool:
    """Move the first call that qualifies; True if one moved."""
    position = {n: k for k, n in enumerate(nodes)}
    readers = _readers(nodes)
    for call in nodes:
        if call.op is not Op.EXTERN or mutates(call) or is_random(call):
            continue
        for value in dict.fromkeys(view_root(i) for i in call.inputs):
            if value.op in (Op.INPUT, Op.CONSTANT) or _nbytes(value) < _nbytes(call):
                continue  # the caller holds inputs anyway; constants live forever
            rs = readers[value]
            if len(rs) < 2 or rs[-1] is not call:
                continue
            # the first library call after the value's other last reader
            target = next((k for k in range(position[rs[-2]] + 1, position[call])
                           if nodes[k].op is Op.EXTERN), None)
            if target is None or any(mutates(n) or is_random(n) for n in nodes[target:position[call]]):
                continue  # (never past a write to an input, nor past a random draw: their order is observable)
            moved = _movable(call, nodes, position, target)
            if moved is None:
                continue
            rest = [n for n in nodes if n not in moved]
            at = rest.index(nodes[target])
            nodes[:] = rest[:at] + sorted(moved, key=position.__getitem__) + rest[at:]
            if log:
                log.hit(f"{call.attr('target')} moved up: its input dies earlier")
            return True
    return False


def _movable(call: Node, nodes: list[Node], position: dict[Node, int], target: int) -> set[Node] | None:
    """``call`` and the views and constants it reads that are defined after ``target``; None if an input is
    computed there (the call depends on something between, so it cannot move)."""
    moved = {call}
    stack = list(call.inputs)
    while stack:
        n = stack.pop()
        if position[n] < target or n in moved:
            continue
        if n.op not in VIEW and n.op not in (Op.FULL, Op.CONSTANT):
            return None
        moved.add(n)
        stack.extend(n.inputs)
    return moved


def hoist_last_readers(graph: Graph, log: RewriteLog | None = None) -> Graph:
    nodes = list(graph.nodes)
    for _ in range(len(nodes)):  # each move frees one value earlier; a call moves at most once per value
        if not _hoist_one(nodes, log):
            break
    return Graph(nodes, list(graph.inputs), list(graph.outputs))
