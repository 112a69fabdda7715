"""``kiln::bmm``: batched products of two run-time operands on the CPU, ``a @ b (+ d)`` through any strides, by
``kiln_bmm`` of kiln's GEMM library (``library/gemm/source.py``); the torch op, its native-call binder and its
checking reference.  ``select.py`` says where and why it replaces ATen's."""
from __future__ import annotations

from typing import Callable

import torch

from kiln.library.gemm import op as cpu_gemm
from kiln.runtime import native, references


def interleaved_strides(batch: int, m: int, n: int) -> tuple[int, int, int]:
    """Strides of a ``[B, M, N]`` result laid out as ``[M, B, N]`` in memory (``interleave``)."""
    return (n, batch * n, 1)


def result_strides(batch: int, m: int, n: int, interleave: bool) -> tuple[int, int, int]:
    """The strides ``kiln::bmm`` gives its result: interleaved, or contiguous."""
    return interleaved_strides(batch, m, n) if interleave else (m * n, n, 1)


def bmm_impl(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor | None, interleave: bool = False,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b (+ d)`` for ``a [B, M, K]``, ``b [B, K, N]`` fp32 CPU tensors of any strides, ``d`` broadcast to
    ``[B, M, N]``; ``out``: a ``[B, M, N]`` buffer with unit column stride to write (the arena), else a new one,
    laid out ``[M, B, N]`` with ``interleave`` (heads merged: ``select.py``)."""
    for name, t in (("a", a), ("b", b)):
        if t.dtype != torch.float32 or t.dim() != 3 or t.device.type != "cpu":
            raise ValueError(f"kiln::bmm expects 3-D fp32 CPU tensors; {name} is {t.dtype} {list(t.shape)} on "
                             f"{t.device}")
    batch, m, k = a.shape
    if b.shape[0] != batch or b.shape[1] != k:
        raise ValueError(f"kiln::bmm: b {list(b.shape)} must be [B, K, N] = [{batch}, {k}, N] for a {list(a.shape)}")
    n = b.shape[2]
    if d is not None:
        if d.dtype != torch.float32 or d.device.type != "cpu" or d.dim() > 3:
            raise ValueError(f"kiln::bmm: d must be an fp32 CPU tensor of at most 3 dims, got {d.dtype} "
                             f"{list(d.shape)} on {d.device}")
        try:
            d = d.expand(batch, m, n)
        except RuntimeError:
            raise ValueError(f"kiln::bmm: d {list(d.shape)} does not broadcast to {[batch, m, n]}") from None
    if out is None:
        out = torch.empty_strided((batch, m, n), result_strides(batch, m, n, interleave), dtype=torch.float32)
    elif tuple(out.shape) != (batch, m, n) or out.dtype != torch.float32 or (n > 1 and out.stride(2) != 1):
        raise ValueError(f"kiln::bmm.out: out must be float32 {[batch, m, n]} with unit column stride, got "
                         f"{out.dtype} {list(out.shape)} strides {list(out.stride())}")
    if out.numel() == 0 or k == 0:  # nothing to multiply: the library's loops would leave ``out`` unwritten
        return out.copy_(d) if d is not None else out.zero_()
    return native.call(torch.ops.kiln.bmm.default, dict(a=a, b=b, d=d), out)


@torch.library.custom_op("kiln::bmm", mutates_args=(), device_types="cpu")
def bmm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor | None, interleave: bool = False) -> torch.Tensor:
    """``a @ b (+ d)`` per batch: ``torch.bmm``, or ``torch.baddbmm(d, a, b)``; ``interleave``: the ``[B, M, N]``
    result is a view of an ``[M, B, N]`` buffer."""
    return bmm_impl(a, b, d, interleave)


@bmm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor | None, interleave: bool = False) -> torch.Tensor:
    batch, m, n = a.shape[0], a.shape[1], b.shape[2]
    return a.new_empty_strided((batch, m, n), result_strides(batch, m, n, interleave))


# ``.out``: the compiled graph's planner puts the result in its arena (runtime/module.py, _OUT_VARIANTS)
_LIB = torch.library.Library("kiln", "FRAGMENT")
_LIB.define("bmm.out(Tensor a, Tensor b, Tensor? d, bool interleave=False, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.impl("bmm.out", lambda a, b, d, interleave=False, *, out: bmm_impl(a, b, d, interleave, out), "CPU")


@native.register(torch.ops.kiln.bmm.default)
def _native(args: dict, strides_of: Callable, out_strides: tuple[int, ...]) -> tuple | None:
    """``kiln_bmm`` called from the generated code, with bmm_impl's checks."""
    a, b, d = args["a"], args["b"], args["d"]
    if not (native.fp32_tensor(a, 3) and native.fp32_tensor(b, 3)) or len(out_strides) != 3:
        return None
    sa, sb = strides_of(a), strides_of(b)
    batch, m, k = a.shape
    n = b.shape[2]
    if sa is None or sb is None or tuple(b.shape[:2]) != (batch, k) or batch * m * n * k == 0 \
            or (n > 1 and out_strides[2] != 1):
        return None
    sd = (0, 0, 0)
    if d is not None:
        sd = native.broadcast_strides(d, strides_of, (batch, m, n))
        if sd is None:
            return None
    Ref, I64 = native.Ref, native.I64
    return (native.address(cpu_gemm.library().kiln_bmm), "kiln_bmm",
            [(native.PTR, Ref(a)), *((I64, s) for s in sa), (native.PTR, Ref(b)), *((I64, s) for s in sb),
             (native.PTR, Ref(d)), *((I64, s) for s in sd), (native.PTR, Ref(native.OUT)),
             (I64, out_strides[0]), (I64, out_strides[1]), (I64, batch), (I64, m), (I64, n), (I64, k),
             (native.I32, native.THREADS)])


@references.register("kiln::bmm")
def _reference(args: dict) -> torch.Tensor:
    """What the op computes, in fp64 ATen (the step checker's reference)."""
    out = torch.bmm(args["a"].double(), args["b"].double())
    if args["d"] is not None:
        out = out + args["d"].double()
    return out.float()
