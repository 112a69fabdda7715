"""kiln's CPU GEMM at run time: the compiled library, weight packing, and the ``kiln::linear_packed`` op.

The weight of a linear layer is packed once, when the graph is compiled (``pack_weight``: NR-wide panels, see
``library/gemm/source.py``), and the graph calls ``torch.ops.kiln.linear_packed(x, packed, bias, n)`` like any
ATen extern, so the GEMM library choice (``library/gemm/select.py``) can measure it against MKL and oneDNN.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Callable

import torch

from kiln.library.gemm.source import GemmSchedule, gemm_source, schedule_for
from kiln.runtime import native, references

_I = ctypes.c_int64
_P = ctypes.c_void_p


def bind_gemm(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the signatures of the GEMM entry points every library built on ``cpp_gemm.SOURCE`` exports."""
    lib.kiln_pack_b.argtypes = [_P, _I, _I, _I, _I, _P]
    lib.kiln_pack_b.restype = None
    lib.kiln_gemm.argtypes = [_P, _I, _P, _P, _P, _I, _I, _I, _I, _I, _I, ctypes.c_int, ctypes.c_int]
    lib.kiln_gemm.restype = None
    return lib


@functools.lru_cache(maxsize=None)
def library(schedule: GemmSchedule = GemmSchedule()) -> ctypes.CDLL:
    from kiln.runtime.build import load_module
    return bind_gemm(load_module(gemm_source(schedule), name="kiln_gemm").lib)


def available() -> bool:
    """Does this machine build the GEMM (AVX2+FMA or AVX-512, a working compiler)?"""
    from kiln.runtime.build import builds
    return builds(library)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """``W[N, K]`` (a linear layer's weight; the product uses ``W^T``) as packed panels, 1-D fp32."""
    lib = library()
    n, k = w.shape
    nr = lib.kiln_gemm_nr()
    w = w.contiguous()
    out = torch.empty(-(-n // nr) * nr * k, dtype=torch.float32)
    lib.kiln_pack_b(w.data_ptr(), k, n, 1, k, out.data_ptr())
    return out


def linear_packed_impl(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int,
                       schedule: GemmSchedule | None = None, gelu: bool = False,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """``schedule``: a tuned one (``library/gemm/tune.py``), or None for the rule ``schedule_for``; ``gelu``: apply
    the exact (erf) gelu to the result in the GEMM's epilogue; ``out``: an ``[m, n]`` fp32 buffer with unit
    column stride to write (a compiled graph's arena), else a new tensor."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.device.type != "cpu":
        raise ValueError(f"kiln::linear_packed expects a 2-D fp32 CPU input, got {x.dtype} {list(x.shape)} "
                         f"on {x.device}")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32)
    elif tuple(out.shape) != (m, n) or out.dtype != torch.float32 or (n > 1 and out.stride(1) != 1):
        raise ValueError(f"kiln::linear_packed.out: out must be float32 [{m}, {n}] with unit column stride, got "
                         f"{out.dtype} {list(out.shape)} strides {list(out.stride())}")
    if m == 0 or n == 0:
        return out
    if k == 0:
        out = out.copy_(bias.expand(m, n)) if bias is not None else out.zero_()
        return out.copy_(torch.nn.functional.gelu(out)) if gelu else out
    s = schedule or schedule_for(m, k, n)
    return native.call(torch.ops.kiln.linear_packed.default,
                       dict(x=x, packed=packed, bias=native.contiguous(bias), n=n, mr=s.mr, kc=s.kc, mc=s.mc,
                            gelu=gelu), out)


@torch.library.custom_op("kiln::linear_packed", mutates_args=(), device_types="cpu")
def linear_packed(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int, mr: int = 0, kc: int = 0,
                  mc: int = 0, gelu: bool = False) -> torch.Tensor:
    """``[gelu](x @ W^T + bias)`` with ``W`` given packed by ``pack_weight``; ``mr, kc, mc`` a tuned schedule (0:
    the rule's)."""
    return linear_packed_impl(x, packed, bias, n, GemmSchedule(mr=mr, kc=kc, mc=mc) if mr else None, gelu)


# The ``.out`` overload, so a compiled graph's planner puts the result in its arena like ``aten.mm``'s
# (runtime/module.py, _OUT_VARIANTS) instead of a fresh tensor per call.
_LIB = torch.library.Library("kiln", "FRAGMENT")
_LIB.define("linear_packed.out(Tensor x, Tensor packed, Tensor? bias, SymInt n, SymInt mr=0, SymInt kc=0, "
            "SymInt mc=0, bool gelu=False, *, Tensor(a!) out) -> Tensor(a!)")


def _linear_packed_out(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int, mr: int = 0,
                       kc: int = 0, mc: int = 0, gelu: bool = False, *, out: torch.Tensor) -> torch.Tensor:
    return linear_packed_impl(x, packed, bias, n, GemmSchedule(mr=mr, kc=kc, mc=mc) if mr else None, gelu, out)


_LIB.impl("linear_packed.out", _linear_packed_out, "CPU")


@native.register(torch.ops.kiln.linear_packed.default)
def _native(args: dict, strides_of: Callable, out_strides: tuple[int, ...]) -> tuple | None:
    """``kiln_gemm`` called from the generated code (runtime/native.py), with the checks of linear_packed_impl."""
    x, packed, bias, n = args["x"], args["packed"], args["bias"], args["n"]
    xs = strides_of(x) if native.fp32_tensor(x, 2) else None
    if xs is None or (xs[1] != 1 and x.shape[1] > 1) or not native.fp32_tensor(packed, 1) \
            or not native.dense(bias, strides_of) or len(out_strides) != 2 or (out_strides[1] != 1 and n > 1):
        return None
    m, k = x.shape
    if m == 0 or n == 0 or k == 0:
        return None
    s = GemmSchedule(mr=args["mr"], kc=args["kc"], mc=args["mc"]) if args["mr"] else schedule_for(m, k, n)
    Ref = native.Ref
    return (native.address(library(GemmSchedule(mr=s.mr)).kiln_gemm), f"kiln_gemm mr={s.mr}",
            [(native.PTR, Ref(x)), (native.I64, xs[0]), (native.PTR, Ref(packed)), (native.PTR, Ref(bias)),
             (native.PTR, Ref(native.OUT)), (native.I64, out_strides[0]), (native.I64, m), (native.I64, n),
             (native.I64, k), (native.I64, s.kc), (native.I64, s.mc), (native.I32, int(args["gelu"])),
             (native.I32, native.THREADS)])


@linear_packed.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int, mr: int = 0, kc: int = 0,
      mc: int = 0, gelu: bool = False) -> torch.Tensor:
    return x.new_empty(x.shape[0], n)


@references.register("kiln::linear_packed")
def _reference(args: dict) -> torch.Tensor | None:
    """What the op computes, in ATen, on the weight it was packed from (the step checker's reference)."""
    w = references.baked_source(args["packed"])
    if w is None:
        return None
    y = torch.nn.functional.linear(args["x"], w.float(), args["bias"])
    return torch.nn.functional.gelu(y) if args.get("gelu") else y
