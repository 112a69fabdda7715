"""Lowerings of views, data movement, indexing and tensor creation (registered into ``aten.LOWERINGS``)."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from kiln.frontend.aten import out_dtype, out_shape, register
from kiln.frontend.lowering_base import Lowerer, Unsupported, meta_shape, meta_val, norm_dim, sym_size
from kiln.ir.graph import Node
from kiln.ir.ops import Op, broadcast_shapes, contiguous_strides, numel
from kiln.ir.sym import Size, SizeExpr, floordiv, is_symbolic, provably_le

aten = torch.ops.aten


@register(aten.view, aten._unsafe_view, aten.reshape, aten.squeeze, aten.unsqueeze, aten.flatten,
          aten.view_copy, aten.unflatten)
def _reshape(L: Lowerer, n: Any, x: Node, *args: Any, **kwargs: Any) -> Node:
    if isinstance(meta_val(n), torch.Tensor) and meta_val(n).dtype != x.dtype:
        raise Unsupported("view as another dtype")
    return L.reshape(x, out_shape(n))


@register(aten.permute, aten.permute_copy)
def _permute(L: Lowerer, n: Any, x: Node, dims: Sequence[int]) -> Node:
    return L.permute(x, dims)


@register(aten.t, aten.transpose, aten.numpy_T)
def _transpose(L: Lowerer, n: Any, x: Node, d0: int = 0, d1: int = 1) -> Node:
    nd = len(x.shape)
    if nd < 2:
        return x
    dims = list(range(nd))
    a, b = norm_dim(d0, nd), norm_dim(d1, nd)
    dims[a], dims[b] = dims[b], dims[a]
    return L.permute(x, dims)


@register(aten.expand, aten.expand_copy)
def _expand(L: Lowerer, n: Any, x: Node, size: Sequence[int], *, implicit: bool = False) -> Node:
    return L.expand(x, out_shape(n))


def _symbolic_slice(L: Lowerer, x: Node, d: int, size: Size, start: Size, end: Size, step: int,
                    traced: Size | None) -> Node:
    """``slice_node`` where a size or a bound is a size expression.  Python clamps the bounds to the dimension;
    the slice is taken as written where the symbols' ranges show no clamping happens (``x[: T]`` of a ``2 * T``
    dimension), or where the length Dynamo traced (``traced``, under the guards it installed) is the unclamped
    one; else the op stays ATen's."""
    if isinstance(end, int) and end >= 2**62:  # (the "to the end" of an open slice)
        end = size
    start = size + start if isinstance(start, int) and start < 0 else start
    end = size + end if isinstance(end, int) and end < 0 else end
    length = floordiv(SizeExpr.of(end) - start + (step - 1), step)
    in_range = provably_le(0, start) and provably_le(start, end) and provably_le(end, size)
    if not in_range and not (traced is not None and traced == length and provably_le(0, start)):
        raise Unsupported(f"slice [{start}:{end}] of a dimension of {size}: bounds not decided by the ranges")
    if start == 0 and step == 1 and length == size:
        return x
    shape = tuple(length if k == d else s for k, s in enumerate(x.shape))
    return L.b.add(Op.SLICE, (x,), shape=shape, dim=d, start=start, step=step)


def slice_node(L: Lowerer, x: Node, dim: int, start: int, end: int, step: int, traced: Any = None) -> Node:
    """``x[start:end:step]`` along ``dim`` (``traced``: the result's length as traced, where known)."""
    d = norm_dim(dim, len(x.shape))
    size = x.shape[d]
    start = 0 if start is None else start
    end = size if end is None else end
    if is_symbolic(size) or is_symbolic(start) or is_symbolic(end):
        return _symbolic_slice(L, x, d, size, start, end, step, traced)
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(start, min(size, end + size if end < 0 else end))
    length = max(0, (end - start + step - 1) // step)
    if start == 0 and step == 1 and length == size:
        return x
    shape = tuple(length if k == d else s for k, s in enumerate(x.shape))
    return L.b.add(Op.SLICE, (x,), shape=shape, dim=d, start=start, step=step)


@register(aten.slice, aten.slice_copy)
def _slice(L: Lowerer, n: Any, x: Node, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Node:
    return slice_node(L, x, dim, start, end, step, out_shape(n)[norm_dim(dim, len(x.shape))])


@register(aten.select, aten.select_copy)
def _select(L: Lowerer, n: Any, x: Node, dim: int, index: int) -> Node:
    d = norm_dim(dim, len(x.shape))
    index = index + x.shape[d] if index < 0 else index
    return L.reshape(slice_node(L, x, d, index, index + 1, 1), out_shape(n))


@register(aten.narrow)
def _narrow(L: Lowerer, n: Any, x: Node, dim: int, start: Any, length: int) -> Node:
    if isinstance(start, Node):
        raise Unsupported("narrow with a tensor start")
    d = norm_dim(dim, len(x.shape))
    start = start + x.shape[d] if start < 0 else start  # narrow's start wraps once; then [start, start + length)
    return slice_node(L, x, d, start, start + length, 1)


@register(aten.split, aten.split_with_sizes)
def _split(L: Lowerer, n: Any, x: Node, sizes: Any, dim: int = 0) -> tuple[Node, ...]:
    d = norm_dim(dim, len(x.shape))
    if is_symbolic(sizes) or is_symbolic(x.shape[d]) or isinstance(sizes, (list, tuple)) \
            and any(is_symbolic(s) for s in sizes):
        sizes = [meta_shape(v)[d] for v in meta_val(n)]  # (the parts as traced: how many, and each one's length)
    elif isinstance(sizes, int):
        sizes = [min(sizes, x.shape[d] - s) for s in range(0, x.shape[d], sizes)] or [0]
    outs, start = [], 0
    for s in sizes:
        outs.append(slice_node(L, x, d, start, start + s, 1, s))
        start += s
    return tuple(outs)


@register(aten.unbind)
def _unbind(L: Lowerer, n: Any, x: Node, dim: int = 0) -> tuple[Node, ...]:
    d = norm_dim(dim, len(x.shape))
    shape = x.shape[:d] + x.shape[d + 1:]
    return tuple(L.reshape(slice_node(L, x, d, i, i + 1, 1), shape) for i in range(x.shape[d]))


@register(aten.cat)
def _cat(L: Lowerer, n: Any, tensors: Sequence[Node], dim: int = 0) -> Node:
    dtype = out_dtype(n)
    parts = [L.cast(t, dtype) for t in tensors if t.shape != (0,) or len(out_shape(n)) == 1]
    parts = [p for p in parts if p.numel != 0] or parts[:1]  # (a symbolic size is never 0)
    if len(parts) == 1:
        return L.reshape(parts[0], out_shape(n))
    return L.b.add(Op.CAT, parts, dim=norm_dim(dim, len(out_shape(n))))


@register(aten.constant_pad_nd)
def _pad(L: Lowerer, n: Any, x: Node, pad: Sequence[int], value: float = 0.0) -> Node:
    nd = len(x.shape)
    pads = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        # (a width computed from sizes - Swin pads to a multiple of its window - is a size expression: never
        # ``int()``, which would specialize it; it must be provably non-negative, else ATen crops or pads)
        pads[nd - 1 - i] = (sym_size(pad[2 * i]), sym_size(pad[2 * i + 1]))
    if any(is_symbolic(p) and not provably_le(0, p) for side in pads for p in side):
        raise Unsupported("padding by a size expression of unknown sign")
    for d, (before, after) in enumerate(pads):  # negative padding crops
        if is_symbolic(before) or is_symbolic(after):
            continue
        if before < 0 or after < 0:
            size = x.shape[d]
            x = slice_node(L, x, d, max(-before, 0), size - max(-after, 0), 1)
    pads = [(b if is_symbolic(b) else max(b, 0), a if is_symbolic(a) else max(a, 0)) for b, a in pads]
    if tuple(x.shape) == out_shape(n):
        return x
    value = value if out_dtype(n).is_floating_point else int(value)
    return L.b.add(Op.PAD, (x,), shape=out_shape(n), pads=tuple(pads), value=value)


def _iota(L: Lowerer, size: int, start: int = 0, step: int = 1) -> Node:
    return L.b.add(Op.IOTA, (), shape=(size,), dtype=torch.int64, start=start, step=step)


@register(aten.flip)
def _flip(L: Lowerer, n: Any, x: Node, dims: Sequence[int]) -> Node:
    for d in sorted({norm_dim(d, len(x.shape)) for d in dims}) if x.shape else ():
        size = x.shape[d]
        if size > 1:
            x = L.b.add(Op.TAKE, (x, _iota(L, size, size - 1, -1)), dim=d)
    return x


@register(aten.repeat)
def _repeat(L: Lowerer, n: Any, x: Node, repeats: Sequence[int]) -> Node:
    """Tile: [s0, s1] -> reshape [1, s0, 1, s1] -> expand [r0, s0, r1, s1] -> reshape [r0 s0, r1 s1]."""
    repeats = [int(r) for r in repeats]
    if len(repeats) < len(x.shape) or any(r < 0 for r in repeats):
        raise Unsupported("repeat with fewer repeats than dims")
    shape = (1,) * (len(repeats) - len(x.shape)) + tuple(x.shape)
    inter = tuple(v for s in shape for v in (1, s))
    wide = tuple(v for r, s in zip(repeats, shape) for v in (r, s))
    return L.reshape(L.expand(L.reshape(x, inter), wide), out_shape(n))


@register(aten.diagonal, aten.diagonal_copy)
def _diagonal(L: Lowerer, n: Any, x: Node, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Node:
    """Move dim1, dim2 last, flatten them, and slice with step (cols + 1) from the first diagonal element."""
    nd = len(x.shape)
    if nd < 2:
        raise Unsupported("diagonal of a < 2-d tensor")
    d1, d2 = norm_dim(dim1, nd), norm_dim(dim2, nd)
    if d1 == d2:
        raise Unsupported("diagonal with dim1 == dim2")
    rest = [d for d in range(nd) if d not in (d1, d2)]
    rows, cols = x.shape[d1], x.shape[d2]
    start = offset if offset >= 0 else -offset * cols
    if isinstance(rows, int) and isinstance(cols, int):
        length = max(0, min(rows, cols - offset)) if offset >= 0 else max(0, min(rows + offset, cols))
    else:  # (symbolic: Dynamo's own length - one symbol for a square matrix; a min() of two has no form here)
        length = out_shape(n)[-1]
    y = L.reshape(L.permute(x, rest + [d1, d2]), tuple(x.shape[d] for d in rest) + (rows * cols,))
    shape = tuple(x.shape[d] for d in rest) + (length,)
    if shape != out_shape(n) or (isinstance(length, int) and length == 0):
        raise Unsupported("diagonal shape")
    return L.b.add(Op.SLICE, (y,), shape=shape, dim=len(rest), start=start, step=cols + 1)


@register(aten.unfold)
def _unfold(L: Lowerer, n: Any, x: Node, dim: int, size: int, step: int) -> Node:
    """Windows as a TAKE of an [windows, size] index (w * step + k), the size axis moved last."""
    nd = len(x.shape)
    if nd == 0:
        raise Unsupported("unfold of a 0-d tensor")
    d = norm_dim(dim, nd)
    windows = (x.shape[d] - size) // step + 1
    if windows <= 0 or size <= 0:
        raise Unsupported("unfold with no windows")
    starts = L.expand(L.reshape(_iota(L, windows, 0, step), (windows, 1)), (windows, size))
    offs = L.expand(L.reshape(_iota(L, size), (1, size)), (windows, size))
    taken = L.b.add(Op.TAKE, (x, L.b.add(Op.ADD, (starts, offs))), dim=d)
    dims = list(range(d + 1)) + list(range(d + 2, nd + 1)) + [d + 1]
    out = L.permute(taken, dims)
    if out.shape != out_shape(n):
        raise Unsupported("unfold shape")
    return out


@register(aten.slice_scatter)
def _slice_scatter(L: Lowerer, n: Any, x: Node, src: Node, dim: int = 0, start: Any = None, end: Any = None,
                   step: int = 1) -> Node:
    """x with x[start:end:step] (along dim) replaced by src: a WHERE over a positional mask."""
    dtype = out_dtype(n)
    d = norm_dim(dim, len(x.shape))
    size = x.shape[d]
    start = 0 if start is None else start
    start = max(0, min(size, start + size if start < 0 else start))
    length = src.shape[d] if len(src.shape) == len(x.shape) else -1
    if length < 0 or step < 1:
        raise Unsupported("slice_scatter shapes")
    if length == 0:
        return L.cast(x, dtype)
    src = L.cast(src, dtype)
    pos = _iota(L, size)
    rel = L.binary(Op.SUB, pos, start, torch.int64)
    inside = L.b.add(Op.LOGICAL_AND, (L.binary(Op.GE, rel, 0, torch.int64),
                                      L.binary(Op.LT, rel, length * step, torch.int64)))
    if step == 1:
        value = L.b.add(Op.PAD, (src,), shape=x.shape,
                        pads=tuple((start, size - start - length) if k == d else (0, 0) for k in range(len(x.shape))),
                        value=0.0 if dtype.is_floating_point else 0)
    else:
        inside = L.b.add(Op.LOGICAL_AND, (inside, L.binary(Op.EQ, L.binary(Op.REM, rel, step, torch.int64), 0,
                                                           torch.int64)))
        k = L.binary(Op.MINIMUM, L.binary(Op.MAXIMUM, L.binary(Op.FLOORDIV, rel, step, torch.int64), 0, torch.int64),
                     length - 1, torch.int64)
        value = L.b.add(Op.TAKE, (src, k), dim=d)
    mask = L.expand(L.reshape(inside, tuple(size if k == d else 1 for k in range(len(x.shape)))), x.shape)
    return L.b.add(Op.WHERE, (mask, value, L.cast(x, dtype)))


@register(aten.diagonal_scatter)
def _diagonal_scatter(L: Lowerer, n: Any, x: Node, src: Node, offset: int = 0, dim1: int = 0,
                      dim2: int = 1) -> Node:
    """x with its (offset) diagonal over (dim1, dim2) replaced by src: dims moved last, a WHERE over the
    diagonal mask of src gathered at each row (or column) position, dims moved back."""
    dtype = out_dtype(n)
    nd = len(x.shape)
    if nd < 2:
        raise Unsupported("diagonal_scatter of a < 2-d tensor")
    d1, d2 = norm_dim(dim1, nd), norm_dim(dim2, nd)
    rest = [d for d in range(nd) if d not in (d1, d2)]
    rows, cols = x.shape[d1], x.shape[d2]
    length = src.shape[-1] if src.shape else 0
    if d1 == d2 or length == 0:
        raise Unsupported("diagonal_scatter shapes")
    order = rest + [d1, d2]
    xp = L.cast(L.permute(x, order), dtype)
    i = L.expand(L.reshape(_iota(L, rows), (rows, 1)), (rows, cols))
    j = L.expand(L.reshape(_iota(L, cols), (1, cols)), (rows, cols))
    on_diag = L.binary(Op.EQ, L.b.add(Op.SUB, (j, i)), offset, torch.int64)
    k = L.binary(Op.MINIMUM, i if offset >= 0 else j, length - 1, torch.int64)
    value = L.b.add(Op.TAKE, (L.cast(src, dtype), k), dim=len(rest))
    out = L.b.add(Op.WHERE, (L.expand(on_diag, xp.shape), value, xp))
    inverse = [order.index(d) for d in range(nd)]
    return L.permute(out, inverse)


@register(aten.as_strided, aten.as_strided_copy)
def _as_strided(L: Lowerer, n: Any, x: Node, size: Sequence[int], stride: Sequence[int],
                storage_offset: int | None = None) -> Node:
    """``as_strided`` of a contiguous value (decompositions emit it to restride a result: adaptive pooling's
    mean): element ``i`` is ``flat(x)[offset + sum_k i_k * stride_k]``.  A layout that is a permutation of a
    contiguous one is a reshape and a permute (a view); any other is a TAKE at the computed flat index.  A value
    laid out otherwise in eager (its storage is not its logical order) stays with ATen.

        as_strided(%x: [2, 32, 1, 1], size=[2, 32, 1, 1], stride=[32, 1, 32, 32])  ->  %x
        as_strided(%x: [6], size=[2, 3], stride=[1, 2])  ->  permute(reshape(%x, [3, 2]), [1, 0])"""
    xv = meta_val(n.args[0])
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    offset = int(storage_offset or 0)
    if (not isinstance(xv, torch.Tensor) or not xv.is_contiguous() or xv.storage_offset() != 0
            or numel(size) == 0 or min(stride, default=0) < 0
            or offset + sum((s - 1) * st for s, st in zip(size, stride)) >= max(x.numel, 1)):
        raise Unsupported("as_strided of a non-contiguous value, or reaching past it")
    dims = sorted((k for k in range(len(size)) if size[k] != 1), key=lambda k: -stride[k])
    inner = tuple(size[k] for k in dims)
    if offset == 0 and numel(size) == x.numel and tuple(stride[k] for k in dims) == contiguous_strides(inner):
        y = L.reshape(x, inner)  # the dims in memory order, then back in the requested order
        y = L.permute(y, [dims.index(k) for k in sorted(dims)])
        return L.reshape(y, tuple(size))
    index: Node | None = None
    for k in dims:
        axis = tuple(size[k] if j == k else 1 for j in range(len(size)))
        term = L.expand(L.reshape(_iota(L, size[k], 0, stride[k]), axis), tuple(size))
        index = term if index is None else L.b.add(Op.ADD, (index, term))
    if index is None:
        index = L.full(offset, tuple(size), torch.int64)
    elif offset:
        index = L.b.add(Op.ADD, (index, L.full(offset, tuple(size), torch.int64)))
    return L.b.add(Op.TAKE, (L.reshape(x, (x.numel,)), index), dim=0)


# ------------------------------------------------------------------------------------------- indexing

def _int_index(L: Lowerer, index: Node, op: str) -> Node:
    """``index`` as int64.  Eager takes int32 and int64 indices only; any other (float indices where a model wants
    token ids, which TorchDynamo's fake tensors let through on some torch versions) stays with ATen, an extern
    that raises eager's own error, instead of being cast and read."""
    if index.dtype not in (torch.int32, torch.int64):
        raise Unsupported(f"{op} with {index.dtype} indices")
    return L.cast(index, torch.int64)


@register(aten.embedding)
def _embedding(L: Lowerer, n: Any, weight: Node, indices: Node, *args: Any) -> Node:
    return L.b.add(Op.TAKE, (weight, _int_index(L, indices, "embedding")), dim=0)


@register(aten.index_select)
def _index_select(L: Lowerer, n: Any, x: Node, dim: int, index: Node) -> Node:
    d = norm_dim(dim, len(x.shape))
    if not x.shape:
        x = L.reshape(x, (1,))
    idx = L.reshape(_int_index(L, index, "index_select"), (index.numel,))
    return L.reshape(L.b.add(Op.TAKE, (x, idx), dim=d), out_shape(n))


@register(aten.gather)
def _gather(L: Lowerer, n: Any, x: Node, dim: int, index: Node, sparse_grad: bool = False) -> Node:
    if len(x.shape) != len(index.shape) or not x.shape:
        raise Unsupported("gather of 0-d tensors")
    return L.b.add(Op.GATHER, (x, _int_index(L, index, "gather")), dim=norm_dim(dim, len(x.shape)))


@register(aten.index)
def _index(L: Lowerer, n: Any, x: Node, indices: Sequence[Any]) -> Node:
    """Advanced indexing with integer index tensors: the indexed dims are flattened into one and indexed
    with the linearized (broadcast, negative-wrapped) indices.  As in numpy, the result dims go where the
    indexed dims were when those are adjacent, else first."""
    used = [(d, i) for d, i in enumerate(indices) if i is not None]
    if not used or not x.shape or any(not isinstance(i, Node) or i.dtype in (torch.bool, torch.uint8)
                                      or i.dtype.is_floating_point for _, i in used):
        raise Unsupported("boolean (data-dependent) or empty advanced indexing")
    dims = [d for d, _ in used]
    bshape = broadcast_shapes(*(i.shape for _, i in used))
    if dims != list(range(dims[0], dims[0] + len(dims))):  # not adjacent: indexed dims go first
        x = L.permute(x, dims + [d for d in range(len(x.shape)) if d not in dims])
        dims = list(range(len(dims)))
    first, last = dims[0], dims[-1]
    sizes = x.shape[first:last + 1]
    linear: Node | None = None
    for (_, i), size in zip(used, sizes):
        term = L.expand(L.wrap_index(i, size), bshape)
        linear = term if linear is None else L.b.add(Op.ADD, (L.binary(Op.MUL, linear, size, torch.int64), term))
    flat = L.reshape(x, x.shape[:first] + (numel(sizes),) + x.shape[last + 1:])
    out = L.b.add(Op.TAKE, (flat, linear), dim=first)
    if out.shape != out_shape(n):
        raise Unsupported("advanced indexing result shape")
    return out


# ------------------------------------------------------------------------------------------- creation

@register(aten.arange)
def _arange(L: Lowerer, n: Any, *args: Any, **kwargs: Any) -> Node:
    """``arange(end)``, ``arange(start, end)``, ``arange(start, end, step)`` by the overload's positions (a
    symbolic ``end`` is a size expression, not a number: picking the numbers out of the arguments took ``1`` of
    ``arange(1, n + 1)`` for the end and dropped the start).  A symbolic start is added to an iota from 0."""
    overload = getattr(n.target, "_overloadname", "default")
    start = args[0] if overload != "default" else 0
    step = (args[2] if len(args) > 2 else kwargs.get("step", 1)) if overload.startswith("start_step") else 1
    if isinstance(step, Node) or is_symbolic(step) or isinstance(start, Node):
        raise Unsupported("arange with a tensor start, or a tensor or symbolic step")
    dtype = out_dtype(n)
    if not is_symbolic(start):
        return L.b.add(Op.IOTA, (), shape=out_shape(n), dtype=dtype, start=start, step=step)
    iota = L.b.add(Op.IOTA, (), shape=out_shape(n), dtype=dtype, start=0, step=step)
    return L.b.add(Op.ADD, (iota, L.full(start, out_shape(n), dtype)))


@register(aten.full, aten.scalar_tensor, aten.zeros, aten.ones, aten.empty, aten.new_full, aten.new_zeros,
          aten.new_ones, aten.new_empty, aten.full_like, aten.zeros_like, aten.ones_like, aten.empty_like,
          aten.empty_strided, aten.empty_permuted)
def _full(L: Lowerer, n: Any, *args: Any, **kwargs: Any) -> Node:
    name = n.target.overloadpacket.__name__
    if "zeros" in name or "empty" in name:
        value: Any = 0
    elif "ones" in name:
        value = 1
    elif name == "scalar_tensor":
        value = args[0]
    elif name in ("full", "new_full"):
        value = args[-1] if name == "full" else args[2]
    else:  # full_like
        value = args[1]
    if isinstance(value, Node):
        raise Unsupported("fill value is a tensor")
    return L.full(value, out_shape(n), out_dtype(n))


def _tri(L: Lowerer, n: Any, x: Node, diagonal: int, lower: bool) -> Node:
    if len(x.shape) < 2:
        raise Unsupported("tril/triu of < 2-d tensor")
    rows, cols = x.shape[-2], x.shape[-1]
    i = L.expand(L.reshape(L.b.add(Op.IOTA, (), shape=(rows,), dtype=torch.int64, start=0, step=1), (rows, 1)),
                 (rows, cols))
    j = L.expand(L.reshape(L.b.add(Op.IOTA, (), shape=(cols,), dtype=torch.int64, start=0, step=1), (1, cols)),
                 (rows, cols))
    diff = L.b.add(Op.SUB, (j, i))
    keep = L.binary(Op.LE if lower else Op.GE, diff, diagonal, torch.int64)
    keep = L.expand(keep, x.shape)
    zero = L.full(0, x.shape, x.dtype)
    return L.b.add(Op.WHERE, (keep, x, zero))


@register(aten.tril)
def _tril(L: Lowerer, n: Any, x: Node, diagonal: int = 0) -> Node:
    return _tri(L, n, x, diagonal, True)


@register(aten.triu)
def _triu(L: Lowerer, n: Any, x: Node, diagonal: int = 0) -> Node:
    return _tri(L, n, x, diagonal, False)


@register(aten._adaptive_avg_pool2d, aten.adaptive_avg_pool2d)
def _adaptive_avg_pool2d(L: Lowerer, n: Any, x: Node, output_size: Sequence[int]) -> Node:
    """Output sizes that divide the input (global pooling included) are equal windows: a mean over the
    window axes of [..., oh, H / oh, ow, W / ow].  Other sizes (overlapping windows) stay with ATen."""
    dtype = out_dtype(n)
    oh, ow = (int(s) for s in output_size)
    nd = len(x.shape)
    if nd not in (3, 4) or not dtype.is_floating_point or x.dtype != dtype:
        raise Unsupported("adaptive_avg_pool2d of this input")
    h, w = x.shape[-2], x.shape[-1]
    if oh <= 0 or ow <= 0 or h % oh or w % ow:
        raise Unsupported("adaptive_avg_pool2d with unequal windows")
    kh, kw = h // oh, w // ow
    if (oh, ow) == (1, 1):
        total = L.reduce(Op.SUM, x, (nd - 2, nd - 1), True)
    else:
        y = L.reshape(x, tuple(x.shape[:-2]) + (oh, kh, ow, kw))
        total = L.reduce(Op.SUM, y, (nd - 1, nd + 1), False)
    return L.reshape(L.binary(Op.DIV, total, kh * kw, dtype), out_shape(n))
