"""Constant folding: evaluate nodes whose inputs are all known at compile time.

Weights are CONSTANT nodes (frozen at capture), so anything computed only from weights - BatchNorm's
scale and shift - becomes one constant.  Views of weights (a transposed linear weight) stay views: they are
free, and the GEMM library is tuned for the layout the model was written with.  Scalar arithmetic on FULL
nodes folds to a FULL.  A fold that would materialise a tensor larger than its largest constant input (an
``expand`` of a weight, say) is skipped: computing it inside a kernel is cheaper than storing it.  On a GPU
with ``Config.gpu_weight_copies`` off nothing computed from weights is folded: the compiled graph then holds
no tensor beside the model's own, and BatchNorm's per-channel arithmetic runs in the kernel that reads it.

Before::                                         After::

    %0 = constant(...) : f32[64]                     %5 = constant(...) : f32[64, 1, 1]
    %1 = add(%0, %eps) : f32[64]
    %2 = rsqrt(%1) : f32[64]
    %5 = reshape(%2, shape=(64, 1, 1)) : f32[64, 1, 1]
"""
from __future__ import annotations

import torch

from kiln.ir.graph import ConstRef, Graph, GraphBuilder, Node
from kiln.ir.interp import eval_node
from kiln.ir.ops import VIEW, Op
from kiln.ir.sym import is_symbolic
from kiln.passes.cse import is_random
from kiln.passes.fold_affine import copy_weights
from kiln.passes.rewrite import RewriteLog, rewrite

def _is_scalar_broadcast(n: Node) -> bool:
    """A constant scalar broadcast (a FULL of a number: one of a size expression - ``x.shape[-2] ** 0.5`` under
    dynamic shapes - is the call's value, not a constant)."""
    while n.op in (Op.EXPAND, Op.RESHAPE):
        n = n.inputs[0]
    return n.op is Op.FULL and not is_symbolic(n.attr("value"))


def _known(n: Node) -> bool:
    return n.op is Op.CONSTANT or _is_scalar_broadcast(n)


def _value(n: Node) -> torch.Tensor:
    if n.op is Op.CONSTANT:
        return n.attr("value").tensor
    if n.op is Op.FULL:
        return eval_node(n, [])
    return eval_node(n, [_value(n.inputs[0])])


def fold_constants(graph: Graph, log: RewriteLog | None = None, max_numel: int = 1 << 26) -> Graph:
    def rule(n: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        if n.op in (Op.INPUT, Op.CONSTANT, Op.FULL, Op.IOTA) or not inputs:
            return None
        if not all(_known(i) for i in inputs) or any(is_symbolic(d) for d in n.shape):
            return None  # (a value whose size is the call's is not a constant)
        if n.op is Op.EXTERN and (not str(n.attr("target")).startswith("aten.") or is_random(n)):
            return None
        consts = [i.numel for i in inputs if i.op is Op.CONSTANT]
        if consts and n.op in VIEW:
            return None  # a view of a weight costs nothing; materialising it would change the library's layout
        if consts and (n.numel > max(consts) or n.numel > max_numel):
            return None  # e.g. expand of a weight: cheaper to compute in the kernel than to store
        if not consts and n.shape != ():
            return None  # scalar broadcasts stay symbolic
        if not all(copy_weights(_value(i), log) for i in inputs if i.op is Op.CONSTANT):
            return None  # a GPU graph that may hold no tensors of its own: BatchNorm's scale is computed in-kernel
        value = eval_node(n, [_value(i) for i in inputs])
        if log:
            log.hit(f"folded {n.op.value}")
        if not consts:
            return b.add(Op.FULL, (), shape=(), dtype=n.dtype, value=value.item())
        return b.add(Op.CONSTANT, (), value=ConstRef(value.contiguous()))

    return rewrite(graph, rule)
