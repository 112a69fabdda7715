"""GPU matmul results in rows padded to 16 bytes, where the row length alone breaks cuBLAS's alignment.

cuBLAS chooses its kernels by the alignment of each operand's leading dimension.  A result row of 50257 bf16
values (GPT-2's tied LM head: vocabulary 50257) forces an alignment-1 kernel for the whole product: on the H200,
[512, 768] x [768, 50257] took 154 us of GPT-2's ~540 us per call, in eager, Inductor and kiln alike.  Written into
rows padded to the next multiple of 16 bytes, cuBLAS takes its aligned kernels.  ``kiln::mm_rows`` is ATen's
``mm``/``addmm`` with ``out=`` a column slice of such a padded buffer (a layout cuBLAS writes in place: leading
dimension >= the row length, unit column stride); the plan knows the result's strides (``fixed_strides``), so the
kernels after it index the padded rows, and a graph output is made contiguous for the caller, as any library
result whose layout kiln fixes.  No weight is copied - only the result's layout changes - so the rewrite holds in
every mode.

Before::

    %y = extern(%x, %wt, target=aten.mm.default) : bf16[512, 50257]

After::

    %y = extern(%x, %wt, None, target=kiln.mm_rows.default) : bf16[512, 50257]   (strides (50264, 1))
"""
from __future__ import annotations

import torch

from kiln.ir.extern import build_extern, extern_args
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.interp import constant_value
from kiln.ir.ops import Op
from kiln.ir.sym import is_symbolic
from kiln.passes.rewrite import RewriteLog, rewrite

aten = torch.ops.aten
ALIGN_BYTES = 16
MIN_ELEMENTS = 1 << 20  # smaller results: the padded buffer's extra bytes and a copy for an output cost more
DEVICES = ("cuda",)     # where weights must be for the rewrite (tests widen it to run it on CPU tensors)


def padded_row(n: int, dtype: torch.dtype) -> int:
    """Row length ``n`` rounded up to a multiple of 16 bytes of ``dtype``."""
    per = max(1, ALIGN_BYTES // dtype.itemsize)
    return -(-n // per) * per


@torch.library.custom_op("kiln::mm_rows", mutates_args=())
def mm_rows(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ w (+ bias)`` written into rows padded to 16 bytes: a ``[M, N]`` view with row stride
    ``padded_row(N)``."""
    m, n = x.shape[0], w.shape[1]
    out = torch.empty((m, padded_row(n, x.dtype)), dtype=x.dtype, device=x.device)[:, :n]
    if bias is None:
        torch.mm(x, w, out=out)
    else:
        torch.addmm(bias, x, w, out=out)
    return out


@mm_rows.register_fake
def _(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    m, n = x.shape[0], w.shape[1]
    return x.new_empty((m, padded_row(n, x.dtype)))[:, :n]


def row_strides(node: Node) -> tuple[int, ...] | None:
    """The strides ``kiln::mm_rows`` writes ``node``'s result with (None for any other node)."""
    if node.op is not Op.EXTERN or node.attr("target") is not mm_rows._opoverload:
        return None
    return (padded_row(node.shape[1], node.dtype), 1)


def _misaligned(node: Node, devices: tuple[str, ...]) -> list | None:
    """(x, w, bias) of a plain ``mm``/``addmm`` on ``devices`` whose result rows break the alignment, else None."""
    if node.op is not Op.EXTERN or node.attr("out_index") is not None or len(node.shape) != 2:
        return None
    target = node.attr("target")
    if target not in (aten.mm.default, aten.addmm.default) or node.dtype not in (torch.float16, torch.bfloat16,
                                                                                   torch.float32):
        return None
    args, kwargs = extern_args(node)
    if kwargs:
        return None
    x, w, bias = (args[0], args[1], None) if target is aten.mm.default else (args[1], args[2], args[0])
    m, n = node.shape
    if is_symbolic(m) or is_symbolic(n):
        return None  # (sizes known per call only: docs/dynamic_shapes.md)
    if n == padded_row(n, node.dtype) or m * n < MIN_ELEMENTS or (bias is not None and len(bias.shape) != 1):
        return None
    weight = constant_value(w)
    device = weight.device.type if weight is not None else None
    return [x, w, bias] if device in devices else None


def align_matmul_rows(graph: Graph, log: RewriteLog | None = None) -> Graph:
    """Misaligned GPU products (a constant weight on one of ``DEVICES``) as ``kiln::mm_rows`` calls."""
    devices = DEVICES

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        args = _misaligned(Node(node.op, inputs, node.attrs, node.shape, node.dtype), devices)
        if args is None:
            return None
        if log:
            log.hit("matmul result rows padded to 16 bytes")
        return build_extern(b, mm_rows._opoverload, args, {}, node.shape, node.dtype)

    return rewrite(graph, rule)
