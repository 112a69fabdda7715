"""Long reductions into few rows split in two stages, for the GPU (Triton target).

[Note: reductions split for the GPU] A Triton reduction kernel gives each program a block of rows and loops over
the reduced elements.  A BatchNorm's statistics and gradients reduce ``[N, C, H, W]`` over ``(N, H, W)``: C rows
(64) of N*H*W elements (200,704 in ResNet-18's first layer at batch 16) - 64 programs on a GPU of 132
multiprocessors, each streaming 800 KB alone: 0.62 ms for one BatchNorm-backward kernel (H100, bf16), the largest
kernel of the training step.  Reducing over ``(H, W)`` first gives N*C rows (1,024) of H*W; the second stage sums
N values per channel::

    before:                                              after:
      %5 = sum(%4, axes=(0, 2, 3)) : f32[64]               %5a = sum(%4, axes=(2, 3), keepdim) : f32[16, 64, 1, 1]
                                                           %5 = sum(%5a, axes=(0, 2, 3))     : f32[64]

The first stage takes the reduction's whole prologue (the fused elementwise work), the second is a small kernel.
Applied where the reduction leaves fewer than ``FEW_ROWS`` rows, reduces at least ``LONG`` elements, and its
leading reduced axis is at least 2 with at least ``LONG_REST`` elements behind it (static sizes only); sums,
maxima and minima (the order of a sum changes by rounding only; a half-precision sum's first stage keeps float32).
The CPU's kernels split long rows over threads themselves (codegen/cpp.py, [Note: split reduction]).
"""
from __future__ import annotations

import math

import torch

from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.ops import HALF, Op
from kiln.passes.rewrite import RewriteLog, rewrite

FEW_ROWS = 256        # rows the reduction leaves: below this the GPU is not filled by row-parallel programs
LONG = 1 << 15        # elements reduced per row: below this one program per row is quick anyway
LONG_REST = 1 << 10   # elements per row of the first stage: enough to be worth a program each

_SPLIT = (Op.SUM, Op.AMAX, Op.AMIN)


def _split_axis(n: Node) -> int | None:
    """The reduced axis the second stage sums over, or None where ``n`` is not worth splitting."""
    if n.op not in _SPLIT or len(n.inputs) != 1:
        return None
    x = n.inputs[0]
    axes = tuple(sorted(n.attr("axes") or ()))
    if len(axes) < 2 or not all(isinstance(d, int) for d in x.shape):
        return None
    reduced = math.prod(x.shape[a] for a in axes)
    rows = math.prod(x.shape) // max(reduced, 1)
    lead = axes[0]
    if rows >= FEW_ROWS or reduced < LONG or x.shape[lead] < 2 or reduced // x.shape[lead] < LONG_REST:
        return None
    return lead


def split_reductions(graph: Graph, log: RewriteLog | None = None) -> Graph:
    """``graph`` with its long reductions into few rows made two ([Note: reductions split for the GPU])."""
    if not any(_split_axis(n) is not None for n in graph.nodes):
        return graph

    def rule(n: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        lead = _split_axis(n)
        if lead is None:
            return None
        (x,) = inputs
        axes = tuple(sorted(n.attr("axes")))
        first_axes = tuple(a for a in axes if a != lead)
        partial_dtype = torch.float32 if n.op is Op.SUM and n.dtype in HALF else n.dtype
        partial_shape = tuple(1 if d in first_axes else s for d, s in enumerate(x.shape))
        partial = b.add(n.op, (x,), shape=partial_shape, dtype=partial_dtype, axes=first_axes, keepdim=True)
        if log is not None:
            log.hit(f"split {n.op.value}")
        return b.add(n.op, (partial,), shape=n.shape, dtype=n.dtype, axes=axes, keepdim=n.attr("keepdim"))
    return rewrite(graph, rule)
