"""Merge linear layers that read the same input into one wider matmul (attention's Q, K and V projections, a
gated MLP's gate and up projections).

Small-M matmuls are latency-bound: three [512, 768] x [768, 768] products take about three times as long as one
[512, 768] x [768, 2304] on the H200 (each is a few microseconds of tail and launch), and on the CPU one call packs
the shared input once instead of three times.  The merged weight (and bias) is a new constant, so the pass runs
only where a weight may be copied (``fold_affine.copy_weights``: on the CPU, and on a GPU outside default mode);
the merged constant is laid out as the originals were (``permute`` of a ``[sum N, K]`` constant where each was
the transpose of an ``nn.Linear`` weight), so the library sees the same kind of problem, only wider.  Each old
result is a column slice of the merged one: a view, read in place by the kernels and library calls after it.

Before::

    %x = reshape(%h, shape=(512, 768))
    %q = extern(%bq, %x, permute(%Wq), target=aten.addmm.default)   : [512, 768]
    %k = extern(%bk, %x, permute(%Wk), target=aten.addmm.default)   : [512, 768]
    %v = extern(%bv, %x, permute(%Wv), target=aten.addmm.default)   : [512, 768]

After::

    %x = reshape(%h, shape=(512, 768))
    %qkv = extern(%b', %x, permute(%W'), target=aten.addmm.default) : [512, 2304]   (%W' = cat(Wq, Wk, Wv))
    %q = slice(%qkv, dim=1, start=0, step=1)                         : [512, 768]
    %k = slice(%qkv, dim=1, start=768, step=1)                       : [512, 768]
    %v = slice(%qkv, dim=1, start=1536, step=1)                      : [512, 768]

Only plain products merge: ``mm(x, W)`` and ``addmm(b, x, W)`` with the default scalars, constant ``W`` and a
bias the same for every row; mm and addmm are never mixed (a zero bias would change nothing but the work).
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.ir.extern import build_extern, extern_args
from kiln.ir.graph import ConstRef, Graph, GraphBuilder, Node
from kiln.ir.interp import constant_value
from kiln.ir.ops import Op
from kiln.passes.fold_affine import copy_weights
from kiln.passes.rewrite import RewriteLog, copy_with_inputs

aten = torch.ops.aten


def _linear(n: Node) -> tuple[Node, Node | None, Node] | None:
    """(input, bias or None, weight [K, N]) of a plain ``mm``/``addmm`` with a constant weight, else None."""
    if n.op is not Op.EXTERN or n.attr("out_index") is not None or len(n.shape) != 2:
        return None
    target = n.attr("target")
    args, kwargs = extern_args(n)
    if kwargs or not all(isinstance(a, Node) for a in args):
        return None
    if target is aten.mm.default and len(args) == 2:
        x, w, bias = args[0], args[1], None
    elif target is aten.addmm.default and len(args) == 3:
        bias, x, w = args
        if len(bias.shape) != 1 or constant_value(bias) is None:  # one bias row, a constant
            return None
    else:
        return None
    if constant_value(w) is None or len(w.shape) != 2:
        return None
    return x, bias, w


def _weight_rows(w: Node) -> torch.Tensor | None:
    """``w`` [K, N] as the [N, K] constant it is the transpose of (an ``nn.Linear`` weight), else None."""
    if w.op is Op.PERMUTE and tuple(w.attr("dims")) == (1, 0) and w.inputs[0].op is Op.CONSTANT:
        return w.inputs[0].attr("value").tensor
    return None


Parts = tuple[Node, "Node | None", Node]  # (input, bias or None, weight [K, N]) of a linear


def _groups(graph: Graph, log: RewriteLog) -> list[list[tuple[Node, Parts]]]:
    """Linears to merge, each list in program order with its parts: two or more reading one input, of one kind
    and dtype, whose weights may be copied."""
    found: dict[tuple[Any, ...], list[tuple[Node, Parts]]] = {}
    for n in graph.nodes:
        parts = _linear(n)
        if parts is not None:
            x, bias, w = parts
            found.setdefault((x, bias is None, n.dtype, _weight_rows(w) is not None), []).append((n, parts))
    return [members for members in found.values()
            if len(members) > 1 and all(copy_weights(constant_value(w), log) for _, (_, _, w) in members)]


def _merged(b: GraphBuilder, members: list[tuple[Node, Parts]], x: Node) -> Node:
    """The one wider product of ``members`` (built in ``b``, reading ``x``)."""
    width = sum(m.shape[1] for m, _ in members)
    rows = [_weight_rows(w) for _, (_, _, w) in members]
    if all(r is not None for r in rows):  # transposed nn.Linear weights: keep that form
        weight = b.add(Op.PERMUTE, (b.add(Op.CONSTANT, (), value=ConstRef(torch.cat(rows, 0))),), dims=(1, 0))
    else:
        columns = torch.cat([constant_value(w) for _, (_, _, w) in members], 1).contiguous()
        weight = b.add(Op.CONSTANT, (), value=ConstRef(columns))
    dtype = members[0][0].dtype
    if members[0][1][1] is None:
        return build_extern(b, aten.mm.default, [x, weight], {}, (x.shape[0], width), dtype)
    bias = torch.cat([constant_value(bias) for _, (_, bias, _) in members]).contiguous()
    return build_extern(b, aten.addmm.default, [b.add(Op.CONSTANT, (), value=ConstRef(bias)), x, weight], {},
                        (x.shape[0], width), dtype)


def merge_linears(graph: Graph, log: RewriteLog | None = None) -> Graph:
    log = log if log is not None else RewriteLog()
    groups = _groups(graph, log)
    if not groups:
        return graph
    place: dict[Node, tuple[int, int]] = {}  # member -> (its group, its first column in the merged product)
    for k, members in enumerate(groups):
        start = 0
        for m, _ in members:
            place[m] = (k, start)
            start += m.shape[1]
    b = GraphBuilder()
    new: dict[Node, Node] = {}
    merged: dict[int, Node] = {}  # group -> its product, built where the group's first member was
    for n in graph.nodes:
        if n not in place:
            new[n] = copy_with_inputs(n, tuple(new[i] for i in n.inputs), b)
            continue
        k, start = place[n]
        if k not in merged:
            members = groups[k]
            merged[k] = _merged(b, members, new[members[0][1][0]])
            log.hit(f"{len(members)} linears on one input merged")
        new[n] = b.add(Op.SLICE, (merged[k],), shape=n.shape, dim=1, start=start, step=1)
    return b.finish([new[o] for o in graph.outputs])
