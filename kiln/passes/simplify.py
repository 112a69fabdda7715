"""Algebraic simplification: identity ops, view chains, x*1, x+0, x-0, x/1, -(-x), cast to the same dtype, a
reduction over size-1 axes, and the round trips of boolean masks through float ones (``_mask_rule``).

Before::                                              After::

    %1 = reshape(%in0, shape=(4, 2, 4)) : f32[4, 2, 4]    %2 = reshape(%in0, shape=(8, 4)) : f32[8, 4]
    %2 = reshape(%1, shape=(8, 4)) : f32[8, 4]            %3 = permute(%in1, dims=(1, 0)) ...
    %3 = permute(%in1, dims=(1, 0)) : ...                 (x * 1 and a double transpose disappear)
    %4 = permute(%3, dims=(1, 0)) : ...
    %6 = mul(%2, %ones) : f32[8, 4]
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.ops import Op
from kiln.passes.rewrite import RewriteLog, rewrite


def scalar_value(n: Node) -> Any:
    """The value of a node that is one scalar everywhere (FULL, maybe expanded/reshaped), else None."""
    while n.op in (Op.EXPAND, Op.RESHAPE):
        n = n.inputs[0]
    if n.op is Op.FULL:
        return n.attr("value")
    return None


def is_scalar(n: Node, value: float) -> bool:
    """``n`` is the number ``value`` everywhere (not a bool)."""
    v = scalar_value(n)
    return v is not None and not isinstance(v, bool) and v == value


def _identity(n: Node, inputs: tuple[Node, ...]) -> Node | None:
    """Rules whose result is one of the node's inputs (types must match exactly)."""
    op = n.op
    x = inputs[0] if inputs else None
    if op in (Op.RESHAPE, Op.EXPAND, Op.CAST) and x.shape == n.shape and x.dtype == n.dtype:
        return x
    if op is Op.PERMUTE and n.attr("dims") == tuple(range(len(n.shape))):
        return x
    if op is Op.NEG and x.op is Op.NEG:
        return x.inputs[0]
    if op in (Op.ADD, Op.SUB) and is_scalar(inputs[1], 0) and x.shape == n.shape and n.dtype.is_floating_point:
        return x
    if op is Op.ADD and is_scalar(x, 0) and n.dtype.is_floating_point:
        return inputs[1]
    if op in (Op.MUL, Op.DIV) and is_scalar(inputs[1], 1):
        return x
    if op is Op.MUL and is_scalar(x, 1):
        return inputs[1]
    return None


_SIZE_ONE_REDUCTIONS = (Op.SUM, Op.PROD, Op.AMAX, Op.AMIN)


def _compare_scalars(op: Op, a: Any, a_dtype: torch.dtype, c: Any, c_dtype: torch.dtype) -> bool:
    """``a op c`` as the kernel computes it: each scalar in its node's dtype, compared in the promoted one."""
    common = torch.promote_types(a_dtype, c_dtype)
    x, y = torch.tensor(a, dtype=a_dtype).to(common), torch.tensor(c, dtype=c_dtype).to(common)
    return bool(torch.eq(x, y) if op is Op.EQ else torch.ne(x, y))


def _mask_rule(n: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
    """A boolean mask that went through a float one and back (a padding mask made additive by the model, then
    compared with 0 by a decomposition that wants booleans again) is the boolean mask::

        %f = where(%m, -inf, 0.0) : f32           %f = where(%m, -inf, 0.0) : f32   (dead unless read elsewhere)
        %k = ne(%f, 0.0) : b8            ->       %n = logical_not(%m)
        %n = logical_not(%k) : b8                 %g = where(%m, -inf, 0.0)         (CSE merges it with %f)
        %g = where(%n, 0.0, -inf) : f32

    ``eq``/``ne`` of ``where(p, a, c)`` and a scalar, all three scalars, is ``p``, ``not p`` or a constant;
    ``not not p`` is ``p``; ``where(not p, x, y)`` is ``where(p, y, x)``."""
    if n.op is Op.LOGICAL_NOT and inputs[0].op is Op.LOGICAL_NOT and inputs[0].inputs[0].shape == n.shape:
        return inputs[0].inputs[0]
    if n.op is Op.WHERE and inputs[0].op is Op.LOGICAL_NOT:
        return b.add(Op.WHERE, (inputs[0].inputs[0], inputs[2], inputs[1]), dtype=n.dtype)
    if n.op not in (Op.EQ, Op.NE):
        return None
    w, other = inputs
    if w.op is not Op.WHERE:
        w, other = other, w
    c = scalar_value(other)
    if w.op is not Op.WHERE or c is None:
        return None
    p, a, z = w.inputs
    a, z = scalar_value(a), scalar_value(z)
    if a is None or z is None or p.dtype is not torch.bool:
        return None
    if_true = _compare_scalars(n.op, a, w.dtype, c, other.dtype)
    if_false = _compare_scalars(n.op, z, w.dtype, c, other.dtype)
    if if_true == if_false:
        return b.add(Op.EXPAND, (b.add(Op.FULL, (), shape=(), dtype=torch.bool, value=if_true),), shape=n.shape)
    out = p if if_true else b.add(Op.LOGICAL_NOT, (p,), dtype=torch.bool)
    return out if out.shape == n.shape else b.add(Op.EXPAND, (out,), shape=n.shape)


def simplify(graph: Graph, log: RewriteLog | None = None) -> Graph:
    def rule(n: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        same = _identity(n, inputs)
        if same is not None and same.shape == n.shape and same.dtype == n.dtype:
            if log:
                log.hit(f"identity {n.op.value}")
            return same
        x = inputs[0] if inputs else None
        if n.op in (Op.EQ, Op.NE, Op.LOGICAL_NOT, Op.WHERE) and (mask := _mask_rule(n, inputs, b)) is not None:
            if log:
                log.hit(f"boolean mask {n.op.value}")
            return mask
        if n.op is Op.RESHAPE and x.op is Op.RESHAPE:
            if log:
                log.hit("reshape chain")
            src = x.inputs[0]
            return src if src.shape == n.shape else b.add(Op.RESHAPE, (src,), shape=n.shape)
        if n.op is Op.PERMUTE and x.op is Op.PERMUTE:
            inner, outer = x.attr("dims"), n.attr("dims")
            dims = tuple(inner[d] for d in outer)
            if log:
                log.hit("permute chain")
            if dims == tuple(range(len(dims))):
                return x.inputs[0]
            return b.add(Op.PERMUTE, (x.inputs[0],), dims=dims)
        if n.op is Op.EXPAND and x.op is Op.EXPAND:
            if log:
                log.hit("expand chain")
            return b.add(Op.EXPAND, (x.inputs[0],), shape=n.shape)
        if n.op in _SIZE_ONE_REDUCTIONS and x is not None and all(x.shape[a] == 1 for a in n.attr("axes")):
            # a reduction over size-1 axes is its input (a feature map of 1x1 pooled): no kernel of rows of one
            if log:
                log.hit("reduction over size-1 axes")
            value = x if x.shape == n.shape else b.add(Op.RESHAPE, (x,), shape=n.shape)
            return value if value.dtype == n.dtype else b.add(Op.CAST, (value,), dtype=n.dtype)
        canonical = n.op is Op.EXPAND and x.op is Op.FULL and x.shape == ()
        if n.op in (Op.RESHAPE, Op.EXPAND) and scalar_value(x) is not None and not canonical:
            if log:
                log.hit("scalar broadcast")
            base = x if x.op is Op.FULL else x.inputs[0]
            while base.op is not Op.FULL:
                base = base.inputs[0]
            scalar = base if base.shape == () else b.add(Op.FULL, (), shape=(), dtype=base.dtype,
                                                          value=base.attr("value"))
            return b.add(Op.EXPAND, (scalar,), shape=n.shape) if n.shape else scalar
        return None

    return rewrite(graph, rule)
