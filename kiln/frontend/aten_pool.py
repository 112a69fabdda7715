"""Pooling lowerings: windows as strided slices of a padded input, combined elementwise.

A k x k pooling window is k*k strided slices of the (padded) input, each of the output's shape; max pooling
is their elementwise maximum (NaN-propagating, like ATen), average pooling their sum over a divisor.  The
fusion pass turns this into one pointwise kernel over the output (the padding becomes a bounds check in each
load), so pooling fuses with its neighbours and needs no extern call.  ATen's NCHW max_pool2d takes 6.2 ms
for ResNet-18's 64x112x112 stem pooling on one thread here; the fused kernel is far below that.

    max_pool2d(x, k=3, s=2, p=1) on [1, 64, 112, 112]:
      %1 = pad(x, pads=((0,0),(0,0),(1,0),(1,0)), value=-inf)          [1, 64, 113, 113]
      %2 = slice(slice(%1, dim=2, start=0, step=2), dim=3, start=0, step=2)   [1, 64, 56, 56]
      ... one slice pair per window offset (kh, kw) ...
      %k = maximum(maximum(%2, %3), ...)                                  [1, 64, 56, 56]
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from kiln.frontend.aten import out_dtype, out_shape, register
from kiln.frontend.aten_movement import slice_node
from kiln.ir.extern import build_extern
from kiln.frontend.lowering_base import Lowerer, Unsupported, meta_shape, meta_val
from kiln.ir.graph import ConstRef, Node
from kiln.ir.ops import Op
from kiln.ir.sym import Size, is_symbolic

aten = torch.ops.aten
MAX_WINDOW = 64  # larger windows (rare) stay with ATen: the unrolled kernel would grow too long


def _pair(v: Any, default: Sequence[int] | None = None) -> tuple[int, int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        if default is None:
            raise Unsupported("pooling argument missing")
        return int(default[0]), int(default[1])
    if isinstance(v, int):
        return v, v
    return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))


def _windows(L: Lowerer, x: Node, out_hw: tuple[Size, Size], kernel: tuple[int, int], stride: tuple[int, int],
             padding: tuple[int, int], dilation: tuple[int, int], fill: float, ceil_mode: bool = False) -> list[Node]:
    """One node per window offset: the input values that offset contributes to each output position."""
    nd = len(x.shape)
    pads = [(0, 0)] * nd
    for j, d in enumerate((nd - 2, nd - 1)):
        reach = (out_hw[j] - 1) * stride[j] + (kernel[j] - 1) * dilation[j] + 1  # padded extent the windows touch
        after = reach - x.shape[d] - padding[j]
        if is_symbolic(after):
            # A symbolic height or width: the padding after the input depends on its remainder modulo the stride
            # (3x3 stride 2 with one pixel: 1 for odd, 0 for even sizes).  ``out`` is at most
            # (size + 2p - d(k-1) - 1) // s + 1, rounded up in ceil mode, so ``after`` is at most p (+ s - 1):
            # padding that much always covers the windows, and what they do not touch is never read.
            after = padding[j] + (stride[j] - 1 if ceil_mode else 0)
        pads[d] = (padding[j], max(after, 0))
    padded = x
    if any(p != (0, 0) for p in pads):
        shape = tuple(s + b + a for s, (b, a) in zip(x.shape, pads))
        padded = L.b.add(Op.PAD, (x,), shape=shape, pads=tuple(pads), value=fill)
    out = []
    for kh in range(kernel[0]):
        # (``traced``: each window's slice has the output's length; with symbolic sizes the symbols' ranges
        # alone cannot show that ``reach`` stays inside the padded input, the arithmetic above does)
        rows = slice_node(L, padded, nd - 2, kh * dilation[0], kh * dilation[0] + (out_hw[0] - 1) * stride[0] + 1,
                          stride[0], out_hw[0])
        for kw in range(kernel[1]):
            out.append(slice_node(L, rows, nd - 1, kw * dilation[1],
                                  kw * dilation[1] + (out_hw[1] - 1) * stride[1] + 1, stride[1], out_hw[1]))
    return out


def _tree(L: Lowerer, op: Op, parts: list[Node]) -> Node:
    """Combine pairwise (a balanced tree: shorter dependency chains than a left fold)."""
    while len(parts) > 1:
        nxt = [L.b.add(op, (parts[i], parts[i + 1])) for i in range(0, len(parts) - 1, 2)]
        parts = nxt + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def _check(x: Node, dtype: torch.dtype, kernel: tuple[int, int]) -> None:
    if len(x.shape) not in (3, 4) or not dtype.is_floating_point or x.dtype != dtype:
        raise Unsupported("pooling of this input")
    if kernel[0] * kernel[1] > MAX_WINDOW:
        raise Unsupported("pooling window too large to unroll")


@register(aten.max_pool2d_with_indices)
def _max_pool2d_with_indices(L: Lowerer, n: Any, x: Node, kernel_size: Any, stride: Any = (), padding: Any = 0,
                             dilation: Any = 1, ceil_mode: bool = False) -> tuple[Node, Node]:
    """Values from the window maximum; the indices (needed only for training: dead code elimination removes
    them otherwise) from ``_window_argmax``, in the same kernel - or, with symbolic sizes, an ATen call."""
    val = meta_val(n)
    dtype = val[0].dtype
    kernel = _pair(kernel_size)
    _check(x, dtype, kernel)
    out_hw = meta_shape(val[0])[-2:]
    stride_hw, pad_hw, dil_hw = _pair(stride, kernel), _pair(padding), _pair(dilation)
    parts = _windows(L, x, out_hw, kernel, stride_hw, pad_hw, dil_hw, float("-inf"), ceil_mode)
    values = _tree(L, Op.MAXIMUM, parts)
    if any(is_symbolic(d) for d in (*x.shape[-2:], *out_hw)):
        args = (x, kernel_size, stride, padding, dilation, ceil_mode)
        return values, build_extern(L.b, n.target, args, {}, meta_shape(val[1]), val[1].dtype, 1)
    return values, _window_argmax(L, parts, values, tuple(x.shape[-2:]), tuple(out_hw), kernel, stride_hw, pad_hw,
                                  dil_hw)


def _window_argmax(L: Lowerer, parts: list[Node], values: Node, in_hw: tuple[int, int], out_hw: tuple[int, int],
                   kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int],
                   dilation: tuple[int, int]) -> Node:
    """ATen's max-pooling indices (the flat ``h * W + w`` position in the input plane of each window's maximum)
    as elementwise work over the windows ``parts`` (in ``(kh, kw)`` order, padding read as -inf) and their
    maximum ``values``.

    [Note: max-pooling indices] ATen's loop visits a window's in-bounds positions in order from a maximum of -inf
    at the first of them and moves on ``val > max || isnan(val)``: the first position of the maximum, the last
    NaN, the first in-bounds position where every value is -inf.  Here: the first ``k`` with ``v_k == max`` (a
    scan from the last window to the first, each step ``where(v_k == max, position_k, found)``), the last ``k``
    with ``v_k != v_k`` where the maximum is NaN (a scan the other way), the first in-bounds position where the
    maximum is -inf (padding reads -inf too, so equality alone could pick it) - each scan a chain in which every
    step reads the last once, not ATen's running maximum, which both the next comparison and the next maximum
    read (a tree doubling per window to walk: 2^25 nodes for a 5 x 5 window).  Positions are a constant per
    output position (the window's corner) plus the window offset.  Before, the indices were an ATen call
    beside kiln's values: ResNet-18's training step paid 5.2 ms for ATen's NCHW kernel over 4 x 64 x 48 x 48
    (one thread)."""
    out_h, out_w = out_hw

    def first_valid(o: int, j: int) -> int:
        start = o * stride[j] - padding[j]
        while start < 0:
            start += dilation[j]
        return start
    first = torch.tensor([[first_valid(oh, 0) * in_hw[1] + first_valid(ow, 1) for ow in range(out_w)]
                          for oh in range(out_h)], dtype=torch.int64)
    base = torch.tensor([[(oh * stride[0] - padding[0]) * in_hw[1] + ow * stride[1] - padding[1]
                          for ow in range(out_w)] for oh in range(out_h)], dtype=torch.int64)
    shape = parts[0].shape
    first_node = L.expand(L.b.add(Op.CONSTANT, (), value=ConstRef(first)), shape)
    corner = L.expand(L.b.add(Op.CONSTANT, (), value=ConstRef(base)), shape)
    offsets = [kh * dilation[0] * in_hw[1] + kw * dilation[1] for kh in range(kernel[0]) for kw in range(kernel[1])]
    positions = [L.binary(Op.ADD, corner, off, torch.int64) for off in offsets]
    found = first_node
    for v, here in reversed(list(zip(parts, positions))):
        found = L.b.add(Op.WHERE, (L.b.add(Op.EQ, (v, values)), here, found))
    last_nan = first_node
    for v, here in zip(parts, positions):
        last_nan = L.b.add(Op.WHERE, (L.b.add(Op.NE, (v, v)), here, last_nan))
    all_inf = L.b.add(Op.EQ, (values, L.full(float("-inf"), shape, values.dtype)))
    found = L.b.add(Op.WHERE, (all_inf, first_node, found))
    return L.b.add(Op.WHERE, (L.b.add(Op.NE, (values, values)), last_nan, found))


@register(aten.max_pool2d)
def _max_pool2d(L: Lowerer, n: Any, x: Node, kernel_size: Any, stride: Any = (), padding: Any = 0,
                dilation: Any = 1, ceil_mode: bool = False) -> Node:
    dtype = out_dtype(n)
    kernel = _pair(kernel_size)
    _check(x, dtype, kernel)
    parts = _windows(L, x, tuple(out_shape(n)[-2:]), kernel, _pair(stride, kernel), _pair(padding), _pair(dilation),
                     float("-inf"), ceil_mode)
    return _tree(L, Op.MAXIMUM, parts)


def _avg_divisor(in_hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
                 padding: tuple[int, int], count_include_pad: bool) -> torch.Tensor:
    """ATen's divisor per output position: the window clipped to the padded input (count_include_pad) or to
    the input itself."""
    def extent(o: int, j: int) -> tuple[int, int]:
        start = o * stride[j] - padding[j]
        end = min(start + kernel[j], in_hw[j] + padding[j])
        size = end - start
        return size, min(end, in_hw[j]) - max(start, 0)

    div = torch.empty(out_hw, dtype=torch.float64)
    for oh in range(out_hw[0]):
        ph, ch = extent(oh, 0)
        for ow in range(out_hw[1]):
            pw, cw = extent(ow, 1)
            div[oh, ow] = ph * pw if count_include_pad else ch * cw
    return div


@register(aten.avg_pool2d)
def _avg_pool2d(L: Lowerer, n: Any, x: Node, kernel_size: Any, stride: Any = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> Node:
    dtype = out_dtype(n)
    kernel = _pair(kernel_size)
    _check(x, dtype, kernel)
    stride_hw, pad_hw = _pair(stride, kernel), _pair(padding)
    out_hw = tuple(out_shape(n)[-2:])
    symbolic = any(is_symbolic(d) for d in (*x.shape[-2:], *out_hw))
    # (a symbolic height or width: the divisor is one number where every window lies inside the padded input and
    # counts all of it - floor mode, the padding counted or none; else it varies per position and size)
    if symbolic and not divisor_override and (ceil_mode or not (count_include_pad or pad_hw == (0, 0))):
        raise Unsupported("average pooling of a symbolic size with windows clipped at the border")
    total = _tree(L, Op.ADD, _windows(L, x, out_hw, kernel, stride_hw, pad_hw, (1, 1), 0.0, ceil_mode))
    if divisor_override:
        return L.binary(Op.DIV, total, int(divisor_override), dtype)
    if symbolic:
        return L.binary(Op.DIV, total, kernel[0] * kernel[1], dtype)
    div = _avg_divisor(tuple(x.shape[-2:]), out_hw, kernel, stride_hw, pad_hw, count_include_pad)
    if bool((div == div.flatten()[0]).all()):
        return L.binary(Op.DIV, total, int(div.flatten()[0]), dtype)
    const = L.b.add(Op.CONSTANT, (), value=ConstRef(div.to(dtype)))
    return L.b.add(Op.DIV, (total, L.expand(const, total.shape)))
