"""Helpers shared by the ATen lowerings: scalar constants, broadcasting, type promotion, EXTERN nodes.

A lowering receives a ``Lowerer`` (which owns the graph builder), the FX node (its ``meta["val"]`` gives
the ATen result's shape and dtype, which the lowering must reproduce) and the already-lowered arguments:
graph ``Node``s for tensors, Python values otherwise.
"""
from __future__ import annotations

import contextlib
import math
import weakref
from typing import Any, Sequence

import torch
import torch.fx

from kiln.ir.extern import build_extern
from kiln.ir.graph import GraphBuilder, Node
from kiln.ir.ops import Op, broadcast_shapes, dim, numel, reduced_shape
from kiln.ir.sym import (FloatSize, Size, SizeExpr, Symbol, UnsupportedSize, floordiv, from_sympy, is_symbolic,
                         symbols_of_shape_env)

# dtypes the generated kernels load and store; anything else runs as an EXTERN ATen call.  Half precision is
# computed in fp32 by both code generators (codegen/cpp_expr.py, codegen/triton_expr.py).
KERNEL_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
                           torch.uint8, torch.bool, torch.bfloat16, torch.float16})
TRITON_KERNEL_DTYPES = KERNEL_DTYPES


class Unsupported(Exception):
    """Raised by a lowering that cannot handle these arguments: the op becomes an EXTERN node."""


def meta_val(fx_node: torch.fx.Node) -> Any:
    return fx_node.meta.get("val")


def meta_shape(val: torch.Tensor) -> tuple[Size, ...]:
    """The shape of a traced value (a fake tensor) in kiln's sizes (``sym_size``)."""
    return tuple(sym_size(s) for s in val.shape)


_SYMBOLS: "weakref.WeakKeyDictionary[Any, dict[str, Symbol]]" = weakref.WeakKeyDictionary()


def sym_size(v: Any) -> Size:
    """A size from the traced graph as kiln's: an int, or a ``torch.SymInt`` as a size expression over kiln's
    ``Symbol``s (their ranges from the SymInt's ShapeEnv) - never ``int()`` of it, which would make Dynamo guard
    on (specialize) the size."""
    if isinstance(v, (torch.SymInt, torch.SymFloat)):  # (a SymFloat: a float computed from sizes, sym.FloatSize)
        shape_env = v.node.shape_env
        symbols = _SYMBOLS.get(shape_env)
        if symbols is None or any(s.name not in symbols for s in v.node.expr.free_symbols):
            symbols = _SYMBOLS[shape_env] = symbols_of_shape_env(shape_env)
        try:
            return from_sympy(v.node.expr, symbols)
        except UnsupportedSize as exc:  # (a Min, a Max: the op that needs it stays ATen's)
            raise Unsupported(str(exc)) from exc
    if isinstance(v, SizeExpr):  # (an argument the lowering already converted: a size node's value)
        return v
    return int(v)


def norm_dim(d: int, ndim: int) -> int:
    nd = max(ndim, 1)
    if not -nd <= d < nd:
        raise Unsupported(f"dim {d} out of range for {ndim}-d tensor")
    return d % nd


class Lowerer:
    """Builds graph IR nodes for the lowerings; one per captured graph."""

    def __init__(self, builder: GraphBuilder):
        self.b = builder
        self.externs: list[str] = []
        self.kernel_dtypes: frozenset[torch.dtype] = KERNEL_DTYPES  # the code generator's (lower_fx sets it)
        self.triton = False  # lowering for the Triton target (lower_fx sets it)
        self.symbolic = False  # lowering a graph traced with dynamic shapes (lower_fx sets it)

    # ---------------------------------------------------------------- leaves
    def scalar(self, value: Any, dtype: torch.dtype) -> Node:
        if is_symbolic(value):  # a size as a value (``x * x.shape[1]``, an index wrapped by a symbolic size)
            if dtype == torch.bool:
                raise Unsupported(f"size {value} as a bool")
            return self.b.add(Op.FULL, (), shape=(), dtype=dtype, value=value)
        if dtype == torch.bool:
            value = bool(value)
        elif dtype.is_floating_point:
            value = float(value)
        else:
            # like ATen's (and C's) conversion of a scalar to the operand type: integers wrap around
            try:
                value = int(value)
            except (OverflowError, ValueError) as exc:
                raise Unsupported(f"{value} as {dtype}") from exc
            info = torch.iinfo(dtype)
            value = (value - info.min) % (info.max - info.min + 1) + info.min
        return self.b.add(Op.FULL, (), shape=(), dtype=dtype, value=value)

    def full(self, value: Any, shape: Sequence[int], dtype: torch.dtype) -> Node:
        return self.expand(self.scalar(value, dtype), tuple(shape))

    # ---------------------------------------------------------------- shape/dtype plumbing
    def cast(self, n: Node, dtype: torch.dtype) -> Node:
        if n.dtype == dtype:
            return n
        if n.op is Op.FULL and not n.shape:
            return self.scalar(n.attr("value"), dtype)
        return self.b.add(Op.CAST, (n,), dtype=dtype)

    def reshape(self, n: Node, shape: Sequence[Size]) -> Node:
        shape = tuple(dim(s) for s in shape)
        if -1 in shape:
            known = numel(tuple(s for s in shape if s != -1))
            rest = floordiv(n.numel, known) if is_symbolic(known) or is_symbolic(n.numel) else n.numel // max(known, 1)
            shape = tuple(rest if s == -1 else s for s in shape)
        if shape == n.shape:
            return n
        return self.b.add(Op.RESHAPE, (n,), shape=shape)

    def expand(self, n: Node, shape: Sequence[Size]) -> Node:
        shape = tuple(dim(s) for s in shape)
        if n.shape == shape:
            return n
        return self.b.add(Op.EXPAND, (n,), shape=shape)

    def permute(self, n: Node, dims: Sequence[int]) -> Node:
        dims = tuple(norm_dim(d, len(n.shape)) for d in dims)
        if dims == tuple(range(len(dims))):
            return n
        return self.b.add(Op.PERMUTE, (n,), dims=dims)

    def operand(self, x: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> Node:
        """Turn an argument (Node or Python scalar) into a node of ``dtype`` broadcast to ``shape``."""
        if not isinstance(x, Node):
            return self.expand(self.scalar(x, dtype), shape)
        return self.expand(self.cast(x, dtype), shape)

    def elementwise(self, op: Op, args: Sequence[Any], compute_dtype: torch.dtype,
                    out_dtype: torch.dtype | None = None) -> Node:
        shapes = [a.shape for a in args if isinstance(a, Node)]
        shape = broadcast_shapes(*shapes) if shapes else ()
        nodes = [self.operand(a, compute_dtype, shape) for a in args]
        out = self.b.add(op, nodes)
        return self.cast(out, out_dtype) if out_dtype is not None else out

    def binary(self, op: Op, a: Any, b: Any, dtype: torch.dtype) -> Node:
        return self.elementwise(op, (a, b), dtype)

    def reduce(self, op: Op, x: Node, axes: Sequence[int], keepdim: bool, dtype: torch.dtype | None = None) -> Node:
        axes = tuple(sorted({norm_dim(a, len(x.shape)) for a in axes})) if x.shape else ()
        if x.numel == 0:
            # Nothing to reduce: the result is the reduction's identity (no kernel loops over zero elements).
            shape = reduced_shape(x.shape, axes, keepdim)
            out_dtype = dtype or (torch.int64 if op in (Op.ARGMAX, Op.ARGMIN) else x.dtype)
            if numel(shape) == 0:
                return self.full(0, shape, out_dtype)
            if op is Op.SUM:
                return self.full(0, shape, out_dtype)
            if op is Op.PROD:
                return self.full(1, shape, out_dtype)
            raise Unsupported(f"{op.value} over zero elements")
        return self.b.add(op, (x,), axes=axes, keepdim=keepdim, dtype=dtype)

    def wrap_index(self, index: Node, size: int) -> Node:
        """An int64 index tensor with negative entries wrapped (``i < 0 ? i + size : i``), as ATen indexing does.

        Out-of-range entries are not checked here: eager raises for them, so no valid program has them."""
        index = self.cast(index, torch.int64)
        neg = self.binary(Op.LT, index, 0, torch.int64)
        return self.b.add(Op.WHERE, (neg, self.binary(Op.ADD, index, size, torch.int64), index))

    # ---------------------------------------------------------------- externs
    def extern(self, fx_node: torch.fx.Node, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Keep the ATen call as it is: one EXTERN node per tensor output."""
        val = meta_val(fx_node)
        target = owning_variant(fx_node.target)
        self.externs.append(str(target))
        dense = _dense_operands(fx_node)
        if isinstance(val, torch.Tensor):
            return _with_dense(build_extern(self.b, target, args, kwargs, meta_shape(val), val.dtype), dense)
        if isinstance(val, (list, tuple)):
            outs = []
            for k, v in enumerate(val):
                if isinstance(v, torch.Tensor):
                    outs.append(_with_dense(build_extern(self.b, target, args, kwargs, meta_shape(v), v.dtype, k),
                                            dense))
                else:
                    outs.append(v)
            return tuple(outs)
        raise Unsupported(f"{fx_node.target} returns {type(val).__name__}, not tensors")


# ATen ops that take operands in any layout and choose their own (cuDNN's and oneDNN's convolutions run
# channels-last where an operand is): kiln's layout pass lays their operands out on purpose (schedule/layout.py)
_ANY_LAYOUT = frozenset({torch.ops.aten.convolution, torch.ops.aten.convolution_backward})


def _dense_operands(fx_node: torch.fx.Node) -> tuple[bool, ...] | None:
    """Per tensor operand of an ATen call (in the order ``build_extern`` collects them): was it contiguous in the
    captured graph?

    [Note: externs get the layouts they were traced with] kiln's graph IR has no layout: a ``clone`` (or a
    ``contiguous``) is the value itself, so an extern may be handed a permuted or expanded view where the
    captured graph gave it a fresh contiguous tensor.  Most ATen ops take any strides; some do not (the CPU
    ``native_group_norm`` checks ``X.is_contiguous()``).  The runtime makes these operands contiguous again
    (a copy only when the view is not).  Asked without adding a guard (``is_contiguous_or_false``: a symbolic
    layout that is not provably contiguous counts as not), and not for an op that writes an operand."""
    from torch._prims_common import is_contiguous_or_false
    if getattr(fx_node.target, "overloadpacket", None) in _ANY_LAYOUT:
        return None
    schema = getattr(fx_node.target, "_schema", None)
    if schema is None or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return None
    flags: list[bool] = []

    def walk(v: Any) -> None:
        if isinstance(v, torch.fx.Node):
            val = v.meta.get("val")
            if isinstance(val, torch.Tensor):
                flags.append(bool(is_contiguous_or_false(val)))
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
    # (with symbolic sizes even ``is_contiguous_or_false`` can add guards - Swin's padded windows: asked at the
    # traced sizes without guarding, where a wrong "contiguous" only costs a copy that was not needed)
    shape_env = _shape_env_of(fx_node)
    with shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext():
        walk(list(fx_node.args))
        walk(dict(fx_node.kwargs))
    return tuple(flags) if any(flags) else None


def _shape_env_of(fx_node: torch.fx.Node) -> Any:
    """The ShapeEnv of the graph's symbolic sizes, where ``fx_node``'s value has one."""
    val = fx_node.meta.get("val")
    val = val[0] if isinstance(val, (list, tuple)) and val else val
    mode = getattr(val, "fake_mode", None)
    return getattr(mode, "shape_env", None)


def _with_dense(node: Node, dense: tuple[bool, ...] | None) -> Node:
    """Record ``dense`` on the extern (``dense_inputs``) where it lines up with the node's inputs."""
    if dense is not None and len(dense) == len(node.inputs):
        node.attrs["dense_inputs"] = dense
    return node


def owning_variant(target: Any) -> Any:
    """The op an extern calls for ``target``: a view op's ``*_copy`` twin (``aten.view.dtype`` ->
    ``aten.view_copy.dtype``), any other op itself.

    [Note: externs own their results] A view op's result aliases its input, and the input may live in kiln's
    arena or be an output buffer that is recycled or overwritten by the next call: returned to the caller, or
    read after the arena reused that memory, the view shows another value (a bit-cast ``y.view(torch.int32)``
    of a computed ``y`` returned stale data).  In a functional graph the copy has the same value, and its memory
    belongs to the extern's result like any library call's."""
    schema = getattr(target, "_schema", None)
    if schema is None or not any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return target
    packet = getattr(getattr(torch.ops, target.namespace), target.overloadpacket.__name__ + "_copy", None)
    return getattr(packet, target._overloadname, target) if packet is not None else target


def result_dtype(*args: Any) -> torch.dtype:
    """torch's type promotion over Nodes (by dtype and rank category) and Python scalars."""
    probes = []
    for a in args:
        if isinstance(a, Node):
            probes.append(torch.empty((1,) if a.shape else (), dtype=a.dtype))
        elif isinstance(a, (bool, int, float)):
            probes.append(a)
        elif is_symbolic(a):  # a size as a value: an int, or a float computed from sizes
            probes.append(1.0 if isinstance(a, FloatSize) else 1)
    out = probes[0]
    if len(probes) == 1:
        return out.dtype if isinstance(out, torch.Tensor) else torch.tensor(out).dtype
    dtype = torch.result_type(probes[0], probes[1])
    for p in probes[2:]:
        dtype = torch.result_type(torch.empty((1,), dtype=dtype), p)
    return dtype


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
