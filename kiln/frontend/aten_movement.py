"""Lowerings of views, data movement, indexing and tensor creation (registered into ``aten.LOWERINGS``)."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from kiln.frontend.aten import out_dtype, out_shape, register
from kiln.frontend.lowering_base import Lowerer, Unsupported, meta_val, norm_dim
from kiln.ir.graph import Node
from kiln.ir.ops import Op

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


def slice_node(L: Lowerer, x: Node, dim: int, start: int, end: int, step: int) -> Node:
    d = norm_dim(dim, len(x.shape))
    size = x.shape[d]
    start = 0 if start is None else start
    end = size if end is None else end
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(start, min(size, end + size if end < 0 else end))
    length = max(0, (end - start + step - 1) // step)
    if start == 0 and step == 1 and length == size:
        return x
    shape = tuple(length if k == d else s for k, s in enumerate(x.shape))
    return L.b.add(Op.SLICE, (x,), shape=shape, dim=d, start=start, step=step)


@register(aten.slice, aten.slice_copy)
def _slice(L: Lowerer, n: Any, x: Node, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Node:
    return slice_node(L, x, dim, start, end, step)


@register(aten.select, aten.select_copy)
def _select(L: Lowerer, n: Any, x: Node, dim: int, index: int) -> Node:
    d = norm_dim(dim, len(x.shape))
    index = index + x.shape[d] if index < 0 else index
    return L.reshape(slice_node(L, x, d, index, index + 1, 1), out_shape(n))


@register(aten.narrow)
def _narrow(L: Lowerer, n: Any, x: Node, dim: int, start: int, length: int) -> Node:
    return slice_node(L, x, dim, start, start + length, 1)


@register(aten.split, aten.split_with_sizes)
def _split(L: Lowerer, n: Any, x: Node, sizes: Any, dim: int = 0) -> tuple[Node, ...]:
    d = norm_dim(dim, len(x.shape))
    if isinstance(sizes, int):
        sizes = [min(sizes, x.shape[d] - s) for s in range(0, x.shape[d], sizes)] or [0]
    outs, start = [], 0
    for s in sizes:
        outs.append(slice_node(L, x, d, start, start + s, 1))
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
    parts = [p for p in parts if p.numel > 0] or parts[:1]
    if len(parts) == 1:
        return L.reshape(parts[0], out_shape(n))
    return L.b.add(Op.CAT, parts, dim=norm_dim(dim, len(out_shape(n))))


@register(aten.constant_pad_nd)
def _pad(L: Lowerer, n: Any, x: Node, pad: Sequence[int], value: float = 0.0) -> Node:
    nd = len(x.shape)
    pads = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        pads[nd - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if any(b < 0 or a < 0 for b, a in pads):
        raise Unsupported("negative padding")
    if all(b == 0 and a == 0 for b, a in pads):
        return x
    return L.b.add(Op.PAD, (x,), shape=out_shape(n), pads=tuple(pads), value=value)


# ------------------------------------------------------------------------------------------- indexing

@register(aten.embedding)
def _embedding(L: Lowerer, n: Any, weight: Node, indices: Node, *args: Any) -> Node:
    return L.b.add(Op.TAKE, (weight, L.cast(indices, torch.int64)), dim=0)


@register(aten.index_select)
def _index_select(L: Lowerer, n: Any, x: Node, dim: int, index: Node) -> Node:
    d = norm_dim(dim, len(x.shape))
    idx = L.reshape(L.cast(index, torch.int64), (index.numel,)) if index.shape != (index.numel,) else index
    return L.reshape(L.b.add(Op.TAKE, (x, L.cast(idx, torch.int64)), dim=d), out_shape(n))


@register(aten.gather)
def _gather(L: Lowerer, n: Any, x: Node, dim: int, index: Node, sparse_grad: bool = False) -> Node:
    if len(x.shape) != len(index.shape) or not x.shape:
        raise Unsupported("gather of 0-d tensors")
    return L.b.add(Op.GATHER, (x, L.cast(index, torch.int64)), dim=norm_dim(dim, len(x.shape)))


@register(aten.index)
def _index(L: Lowerer, n: Any, x: Node, indices: Sequence[Any]) -> Node:
    used = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(used) != 1 or used[0][1].dtype == torch.bool or used[0][1].dtype == torch.uint8:
        raise Unsupported("advanced indexing with several or boolean index tensors")
    d, idx = used[0]
    return L.b.add(Op.TAKE, (x, L.cast(idx, torch.int64)), dim=d)


# ------------------------------------------------------------------------------------------- creation

@register(aten.arange)
def _arange(L: Lowerer, n: Any, *args: Any, **kwargs: Any) -> Node:
    nums = [a for a in args if isinstance(a, (int, float))]
    start, step = (0, 1)
    if len(nums) >= 2:
        start = nums[0]
    if len(nums) >= 3:
        step = nums[2]
    dtype = out_dtype(n)
    return L.b.add(Op.IOTA, (), shape=out_shape(n), dtype=dtype, start=start, step=step)


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
    """Global average pooling (output 1x1) is a mean over H, W; other sizes stay with ATen."""
    if tuple(output_size) != (1, 1) or not out_dtype(n).is_floating_point:
        raise Unsupported("adaptive_avg_pool2d to a size other than 1x1")
    h, w = x.shape[-2], x.shape[-1]
    total = L.reduce(Op.SUM, x, (len(x.shape) - 2, len(x.shape) - 1), True)
    return L.binary(Op.DIV, total, h * w, out_dtype(n))
