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

[Note: column reductions split for the GPU] A reduction over leading axes into many columns - a bias or
LayerNorm-weight gradient, ``[B*T, C]`` summed over ``B*T`` - takes ``COLUMN_XBLOCK`` columns a program at most
while keeping ``COLUMN_PROGRAMS`` programs (codegen/triton.py, [Note: column reductions on the GPU]): 4 columns
of a 768-wide gradient, 8 bytes of each 32-byte sector of a bf16 row read, each program streaming all B*T rows
(H100, GPT training step: a 3072-wide bias gradient 22 us for 12 MB).  Cut the reduced rows into chunks of about
``COLUMN_CHUNK`` and each chunk's columns become a program's: 64 whole columns (a 128-byte row segment) over
``COLUMN_CHUNK`` rows, ``C/64 x rows/chunk`` programs; the second stage sums the chunks' partial columns::

    before:                                              after:
      %5 = sum(%4, axes=(0,)) : f32[1, 3072]               %5r = reshape(%4) : f32[16, 128, 3072]
      (%4: [2048, 3072])                                   %5a = sum(%5r, axes=(1,)) : f32[16, 3072]
                                                           %5b = sum(%5a, axes=(0,)) : f32[3072]
                                                           %5 = reshape(%5b) : f32[1, 3072]

The first stage keeps the reduction's fused prologue and any elementwise work over the same rows (a LayerNorm
backward's input gradient); the second is a small kernel.  Applied to static sizes where the rows reduced are at
least ``2 * COLUMN_CHUNK`` and split evenly, and the columns fewer than ``COLUMN_WIDE`` (wider ones fill the GPU
unsplit).
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

COLUMN_CHUNK = 128    # rows a first-stage program of a split column reduction reduces (a power of two near it)
COLUMN_WIDE = 1 << 16 # columns from which a column reduction fills the GPU unsplit (1024 programs of 64)

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


def _column_chunk(n: Node) -> int | None:
    """Rows a chunk of a column reduction's first stage ([Note: column reductions split for the GPU]), or None
    where ``n`` is no column reduction worth splitting."""
    if n.op not in _SPLIT or len(n.inputs) != 1:
        return None
    x = n.inputs[0]
    axes = tuple(sorted(n.attr("axes") or ()))
    if not axes or axes != tuple(range(len(axes))) or len(axes) == len(x.shape) or \
            not all(isinstance(d, int) for d in x.shape):
        return None
    rows, columns = math.prod(x.shape[:len(axes)]), math.prod(x.shape[len(axes):])
    if rows < 2 * COLUMN_CHUNK or columns >= COLUMN_WIDE or columns < 2:
        return None
    # (the chunk a divisor of the rows: the largest not above COLUMN_CHUNK, down to half of it)
    return next((c for c in range(COLUMN_CHUNK, COLUMN_CHUNK // 2 - 1, -1) if rows % c == 0), None)


def _partial_dtype(n: Node) -> torch.dtype:
    """A first stage's type: a half-precision sum's partial sums keep float32."""
    return torch.float32 if n.op is Op.SUM and n.dtype in HALF else n.dtype


def split_reductions(graph: Graph, log: RewriteLog | None = None, columns: bool = True) -> Graph:
    """``graph`` with its long reductions into few rows ([Note: reductions split for the GPU]) and, with
    ``columns``, its reductions into many columns ([Note: column reductions split for the GPU]) made two."""
    column_chunk = _column_chunk if columns else lambda n: None
    if not any(_split_axis(n) is not None or column_chunk(n) is not None for n in graph.nodes):
        return graph

    def rule(n: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        lead = _split_axis(n)
        if lead is None:
            return _split_columns(n, inputs, b)
        (x,) = inputs
        axes = tuple(sorted(n.attr("axes")))
        first_axes = tuple(a for a in axes if a != lead)
        partial_shape = tuple(1 if d in first_axes else s for d, s in enumerate(x.shape))
        partial = b.add(n.op, (x,), shape=partial_shape, dtype=_partial_dtype(n), axes=first_axes, keepdim=True)
        if log is not None:
            log.hit(f"split {n.op.value}")
        return b.add(n.op, (partial,), shape=n.shape, dtype=n.dtype, axes=axes, keepdim=n.attr("keepdim"))

    def _split_columns(n: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        chunk = column_chunk(n)
        if chunk is None:
            return None
        (x,) = inputs
        reduced = len(n.attr("axes"))
        kept = tuple(x.shape[reduced:])
        rows = math.prod(x.shape[:reduced])
        chunks = b.add(Op.RESHAPE, (x,), shape=(rows // chunk, chunk) + kept)
        partial = b.add(n.op, (chunks,), shape=(rows // chunk,) + kept, dtype=_partial_dtype(n), axes=(1,),
                        keepdim=False)
        total = b.add(n.op, (partial,), shape=kept, dtype=n.dtype, axes=(0,), keepdim=False)
        if log is not None:
            log.hit(f"split {n.op.value} over columns")
        return total if tuple(n.shape) == kept else b.add(Op.RESHAPE, (total,), shape=n.shape)
    return rewrite(graph, rule)
