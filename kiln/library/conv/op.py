"""kiln's CPU convolutions at run time: the compiled libraries, the weight transforms, and the ``kiln::conv_winograd``
and ``kiln::conv_gemm`` ops (which of them, or oneDNN, runs a convolution is measured per shape: library/conv/select.py).

The weight is transformed (``U = G g G^T`` for every channel pair, in float64) and packed for the GEMM once, when
the graph is compiled; the graph calls ``torch.ops.kiln.conv_winograd(x, packed, bias, residual, ...)`` like
any extern.  The op reads its input in any layout (channels-last with vector loads, NCHW with gathers) and writes its
output channels-last (``[N, C, H, W]`` with NHWC strides) or, for a graph's output, NCHW (scatters), and
its epilogue adds the bias and an optional residual and applies an optional ReLU (``max(0, x)`` keeping NaN, as
``torch.relu``), so a ResNet block's conv-BN(-add)-ReLU is one call.
"""
from __future__ import annotations

import ctypes
import math
import functools
from typing import Any, Callable

import torch

from kiln.library.conv.source_gemm import conv_gemm_source
from kiln.library.gemm.source import schedule_for
from kiln.library.conv.source_winograd import winograd_matrices, winograd_source
from kiln.runtime import native, references
from kiln.library.gemm.op import bind_gemm

TILE_SIZES = (2, 4)  # F(2x2, 3x3) and F(4x4, 3x3)
L2_BLOCK = 768 * 1024  # bytes the transformed tiles of one block (V and M) may take


@functools.lru_cache(maxsize=None)
def library(m: int) -> ctypes.CDLL:
    from kiln.runtime.build import load_module
    # (kiln_winograd's C parameters are listed once, by the op's binder ``_native_winograd``)
    return bind_gemm(load_module(winograd_source(m), name=f"kiln_winograd{m}").lib)


def available(m: int = 2) -> bool:
    from kiln.runtime.build import builds
    return builds(lambda: library(m))


def supports(weight_shape: tuple[int, ...], stride: list[int], dilation: list[int], groups: int) -> bool:
    """3x3 filters, unit stride and dilation, no groups: the case Winograd's F(m, 3) computes."""
    return (len(weight_shape) == 4 and tuple(weight_shape[2:]) == (3, 3) and list(stride) == [1, 1]
            and list(dilation) == [1, 1] and groups == 1)


def transform_weight(w: torch.Tensor, m: int) -> torch.Tensor:
    """``w [K, C, 3, 3]`` -> per tile position p, ``U[p] = (G w G^T)[p]`` as a ``[C x K]`` GEMM operand packed in
    NR-wide panels; 1-D fp32, positions one after another."""
    _, g, _ = winograd_matrices(m)
    gm = torch.tensor([[float(v) for v in g.row(i)] for i in range(g.rows)], dtype=torch.float64)
    u = torch.einsum("ia,kcab,jb->ijkc", gm, w.detach().to(torch.float64).cpu(), gm)
    alpha = g.rows
    k, c = w.shape[:2]
    u = u.reshape(alpha * alpha, k, c).to(torch.float32).contiguous()
    lib = library(m)
    nr = lib.kiln_gemm_nr()
    panel = -(-k // nr) * nr * c
    out = torch.empty(alpha * alpha * panel, dtype=torch.float32)
    for p in range(alpha * alpha):  # B[c][k] = U[p][k][c]: unit stride along c, c along k
        lib.kiln_pack_b(u[p].data_ptr(), c, k, 1, c, out[p * panel:].data_ptr())
    return out


def tiles_per_block(m: int, c: int, k: int, threads: int, tiles: int) -> int:
    """Tiles per block: V and M of one block fill ``L2_BLOCK``, a multiple of the GEMM's tile rows, and at least
    one block per thread."""
    alpha2 = (m + 2) ** 2
    tb = max(8, L2_BLOCK // (4 * alpha2 * (c + k)) // 8 * 8)
    per_thread = -(-tiles // max(1, threads))
    return max(8, min(tb, -(-per_thread // 8) * 8))


def gatherable(strides: tuple[int, ...]) -> bool:
    """Channels 1 float apart (vector loads), or few enough that lane offsets fit the gathers' int32?"""
    return strides[1] == 1 or strides[1] * 16 < 2 ** 31


def _gatherable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a channels-last copy when its channels are too far apart for the gathers (``gatherable``)."""
    if gatherable(t.stride()):
        return t
    return t.contiguous(memory_format=torch.channels_last)


def _check_input(op: str, x: torch.Tensor) -> None:
    if x.dtype != torch.float32 or x.dim() != 4 or x.device.type != "cpu":
        raise ValueError(f"kiln::{op} expects a 4-D fp32 CPU input [N, C, H, W], got {x.dtype} {list(x.shape)} "
                         f"on {x.device}")


def _output(op: str, x: torch.Tensor, residual: torch.Tensor | None, k: int, ho: int, wo: int, filter_size: str,
            padding: list[int], channels_last: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The checks kiln's convolution ops share, then ``(y, residual)`` in layouts the kernels read: y
    channels-last (or NCHW for a graph output)."""
    n = x.shape[0]
    if ho <= 0 or wo <= 0:
        raise ValueError(f"kiln::{op}: input {list(x.shape)} with padding {padding} is smaller than the "
                         f"{filter_size} filter")
    if residual is not None and (tuple(residual.shape) != (n, k, ho, wo) or residual.dtype != torch.float32):
        raise ValueError(f"kiln::{op}: residual {residual.dtype} {list(residual.shape)}, expected "
                         f"float32 {[n, k, ho, wo]}")
    layout = torch.channels_last if channels_last else torch.contiguous_format
    y = _gatherable(torch.empty((n, k, ho, wo), dtype=torch.float32, memory_format=layout))
    return y, _gatherable(residual) if residual is not None else None


def conv_winograd_impl(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                       residual: torch.Tensor | None, out_channels: int, tile: int, padding: list[int],
                       relu: bool, channels_last: bool, relu_input: bool = False,
                       relu_max: float | None = None, relu_input_max: float | None = None) -> torch.Tensor:
    _check_input("conv_winograd", x)
    if tile not in TILE_SIZES:
        raise ValueError(f"kiln::conv_winograd: tile must be one of {TILE_SIZES}, got {tile}")
    h, w = x.shape[2:]
    ph, pw = padding
    ho, wo = h + 2 * ph - 2, w + 2 * pw - 2
    k = out_channels
    y, res = _output("conv_winograd", x, residual, k, ho, wo, "3x3", padding, channels_last)
    if y.numel() == 0:
        return y
    return native.call(torch.ops.kiln.conv_winograd.default,
                       dict(x=_gatherable(x), packed=packed, bias=native.contiguous(bias), residual=res, out_channels=k,
                            tile=tile, padding=padding, relu=relu, channels_last=channels_last,
                            relu_input=relu_input, relu_max=relu_max, relu_input_max=relu_input_max), y)


@torch.library.custom_op("kiln::conv_winograd", mutates_args=(), device_types="cpu")
def conv_winograd(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                  out_channels: int, tile: int, padding: list[int], relu: bool,
                  channels_last: bool = True, relu_input: bool = False,
                  relu_max: float | None = None, relu_input_max: float | None = None) -> torch.Tensor:
    """``[relu](conv2d([relu](x), W, bias, padding) [+ residual])`` for a 3x3 stride-1 ``W`` given by
    ``transform_weight(W, tile)``; the result is channels-last, or contiguous (NCHW) if not ``channels_last``.
    ``relu_max``, ``relu_input_max``: the ReLUs' upper clamps (ReLU6: 6; None: none)."""
    return conv_winograd_impl(x, packed, bias, residual, out_channels, tile, padding, relu, channels_last,
                              relu_input, relu_max, relu_input_max)


@conv_winograd.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
      out_channels: int, tile: int, padding: list[int], relu: bool, channels_last: bool = True,
      relu_input: bool = False, relu_max: float | None = None, relu_input_max: float | None = None) -> torch.Tensor:
    n, _, h, w = x.shape
    return x.new_empty((n, out_channels, h + 2 * padding[0] - 2, w + 2 * padding[1] - 2),
                       memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def native_prefix(args: dict, strides_of: Callable, out_strides: tuple[int, ...], k: int, ho: int,
                  wo: int) -> list[tuple[str, Any]] | None:
    """The parameters every kiln convolution function starts with, ``x, n, h, w, c, x strides, weight, bias,
    residual, residual strides, y, y strides``, for a native call (runtime/native.py, which the ops' Python
    implementations also call through); None where the arguments need a check, copy or refusal first."""
    x, packed, bias, res = args["x"], args["packed"], args["bias"], args["residual"]
    xs = strides_of(x) if native.fp32_tensor(x, 4) else None
    rs = strides_of(res) if native.fp32_tensor(res, 4) else None
    n = x.shape[0] if xs is not None else 0
    if xs is None or not gatherable(xs) or not native.fp32_tensor(packed, 1) or not native.dense(bias, strides_of) \
            or (res is not None and (rs is None or not gatherable(rs) or tuple(res.shape) != (n, k, ho, wo))) \
            or len(out_strides) != 4 or ho <= 0 or wo <= 0 or n * k * ho * wo == 0:
        return None
    Ref, I64 = native.Ref, native.I64
    _, c, h, w = x.shape
    return ([(native.PTR, Ref(x))] + [(I64, v) for v in (n, h, w, c, *xs)]
            + [(native.PTR, Ref(packed)), (native.PTR, Ref(bias)), (native.PTR, Ref(res))]
            + [(I64, v) for v in (rs or (0, 0, 0, 0))] + [(native.PTR, Ref(native.OUT))]
            + [(I64, v) for v in out_strides])


@native.register(torch.ops.kiln.conv_winograd.default)
def _native_winograd(args: dict, strides_of: Callable, out_strides: tuple[int, ...]) -> tuple | None:
    """``kiln_winograd`` called from the generated code, with conv_winograd_impl's checks and blocking."""
    x, k, tile, (ph, pw) = args["x"], args["out_channels"], args["tile"], args["padding"]
    if tile not in TILE_SIZES or not native.fp32_tensor(x, 4):
        return None
    n, c, h, w = x.shape
    ho, wo = h + 2 * ph - 2, w + 2 * pw - 2
    prefix = native_prefix(args, strides_of, out_strides, k, ho, wo)
    if prefix is None:
        return None
    threads = torch.get_num_threads()  # (the blocking only: any thread count computes the same result)
    tb = tiles_per_block(tile, c, k, threads, n * -(-ho // tile) * -(-wo // tile))
    kc = schedule_for(tb, c).kc if c > 0 else 1
    I64, I32 = native.I64, native.I32
    return (native.address(library(tile).kiln_winograd), f"kiln_winograd F({tile}x{tile})",
            prefix + [(I64, v) for v in (k, ph, pw, ho, wo)]
            + relu_flags(args) + [(I64, tb), (I64, kc), (I32, native.THREADS)])


# ------------------------------------------------------------------ implicit-GEMM convolution (any filter, stride)
@functools.lru_cache(maxsize=None)
def gemm_library() -> ctypes.CDLL:
    from kiln.runtime.build import load_module
    # (kiln_conv_gemm's and kiln_conv_direct's C parameters are listed once, by the binder ``_native_conv_gemm``)
    return bind_gemm(load_module(conv_gemm_source(), name="kiln_conv_gemm").lib)


def gemm_available() -> bool:
    from kiln.runtime.build import builds
    return builds(gemm_library)


def gemm_supports(stride: list[int], dilation: list[int], groups: int) -> bool:
    """Any filter size, stride and padding; no dilation, no groups."""
    return list(dilation) == [1, 1] and groups == 1 and all(s > 0 for s in stride)


def pack_conv_weight(w: torch.Tensor) -> torch.Tensor:
    """``w [K, C, kh, kw]`` as the GEMM's ``[kh*kw*C x K]`` operand, rows ordered (dy, dx, c), in NR-wide panels;
    1-D fp32."""
    lib = gemm_library()
    k = w.shape[0]
    taps = w.detach().float().cpu().permute(0, 2, 3, 1).contiguous()  # [K, kh, kw, C]: one row of B^T per k
    kg = taps[0].numel()
    nr = lib.kiln_gemm_nr()
    out = torch.empty(-(-k // nr) * nr * kg, dtype=torch.float32)
    lib.kiln_pack_b(taps.data_ptr(), kg, k, 1, kg, out.data_ptr())
    return out


def rows_per_block(kg: int, k: int, rows: int) -> int:
    """Output pixels per block: the block's packed A (one K block) and its C share ``L2_BLOCK``; a multiple of
    24 (whole micro-tiles of 6 and 8 rows), at most the whole output."""
    kc = min(kg, schedule_for(rows, kg).kc)
    mb = max(24, L2_BLOCK // (4 * (kc + k)) // 24 * 24)
    return min(mb, -(-rows // 24) * 24)


def conv_gemm_impl(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                   out_channels: int, kernel: list[int], stride: list[int], padding: list[int], relu: bool,
                   channels_last: bool, relu_input: bool = False, direct: bool = False,
                   relu_max: float | None = None, relu_input_max: float | None = None) -> torch.Tensor:
    _check_input("conv_gemm", x)
    h, w = x.shape[2:]
    kh, kw = kernel
    ho, wo = output_hw(h, w, kernel, stride, padding)
    k = out_channels
    y, res = _output("conv_gemm", x, residual, k, ho, wo, f"{kh}x{kw}", padding, channels_last)
    if y.numel() == 0:
        return y
    # direct: the same packed weight, no im2col packing (few input channels: kiln_conv_direct)
    return native.call(torch.ops.kiln.conv_gemm.default,
                       dict(x=_gatherable(x), packed=packed, bias=native.contiguous(bias), residual=res, out_channels=k,
                            kernel=kernel, stride=stride, padding=padding, relu=relu, channels_last=channels_last,
                            relu_input=relu_input, direct=direct, relu_max=relu_max,
                            relu_input_max=relu_input_max), y)


@torch.library.custom_op("kiln::conv_gemm", mutates_args=(), device_types="cpu")
def conv_gemm(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
              out_channels: int, kernel: list[int], stride: list[int], padding: list[int], relu: bool,
              channels_last: bool = True, relu_input: bool = False, direct: bool = False,
              relu_max: float | None = None, relu_input_max: float | None = None) -> torch.Tensor:
    """``[relu](conv2d([relu](x), W, bias, stride, padding) [+ residual])`` for ``W`` given by
    ``pack_conv_weight(W)``; the result is channels-last, or contiguous (NCHW) if not ``channels_last``.
    ``direct``: without packing the input (``kiln_conv_direct``, for few input channels); ``relu_max``,
    ``relu_input_max``: the ReLUs' upper clamps (ReLU6: 6; None: none)."""
    return conv_gemm_impl(x, packed, bias, residual, out_channels, kernel, stride, padding, relu, channels_last,
                          relu_input, direct, relu_max, relu_input_max)


@native.register(torch.ops.kiln.conv_gemm.default)
def _native_conv_gemm(args: dict, strides_of: Callable, out_strides: tuple[int, ...]) -> tuple | None:
    """``kiln_conv_gemm`` (or ``kiln_conv_direct``) called from the generated code, as conv_gemm_impl calls it."""
    x, k, kernel, stride, padding = (args[a] for a in ("x", "out_channels", "kernel", "stride", "padding"))
    if not native.fp32_tensor(x, 4):
        return None
    n, c, h, w = x.shape
    ho, wo = output_hw(h, w, kernel, stride, padding)
    prefix = native_prefix(args, strides_of, out_strides, k, ho, wo)
    if prefix is None:
        return None
    I64, I32 = native.I64, native.I32
    sizes = [(I64, v) for v in (k, *kernel, *stride, *four_sides(padding)[:2], ho, wo)]
    flags = relu_flags(args)
    if args["direct"]:
        return (native.address(gemm_library().kiln_conv_direct), "kiln_conv_direct",
                prefix + sizes + flags + [(I32, native.THREADS)])
    kg = kernel[0] * kernel[1] * c
    mb = rows_per_block(kg, k, n * ho * wo)
    return (native.address(gemm_library().kiln_conv_gemm), "kiln_conv_gemm",
            prefix + sizes + flags + [(I64, mb), (I64, schedule_for(mb, kg).kc), (I32, native.THREADS)])


def relu_flags(args: dict) -> list[tuple[str, Any]]:
    """The ``int relu, float relu_max, int relu_in, float relu_in_max`` parameters of every kiln convolution
    function (an absent clamp: inf)."""
    hi, hi_in = args.get("relu_max"), args.get("relu_input_max")
    return [(native.I32, int(args["relu"])), (native.F32, math.inf if hi is None else float(hi)),
            (native.I32, int(args["relu_input"])), (native.F32, math.inf if hi_in is None else float(hi_in))]


def output_hw(h: int, w: int, kernel: list[int], stride: list[int], padding: list[int]) -> tuple[int, int]:
    """A convolution's output height and width (no dilation); ``padding``: ``[ph, pw]`` on both sides, or
    ``[top, left, bottom, right]`` (TensorFlow's "same" padding of a stride-2 layer: more after than before)."""
    top, left, bottom, right = four_sides(padding)
    return ((h + top + bottom - kernel[0]) // stride[0] + 1, (w + left + right - kernel[1]) // stride[1] + 1)


def four_sides(padding: list[int]) -> list[int]:
    """``padding`` as ``[top, left, bottom, right]``.  (The C kernels take top and left; the output size says the
    rest: they skip every tap outside the input.)"""
    if len(padding) == 4:
        return list(padding)
    if len(padding) != 2:
        raise ValueError(f"kiln: a convolution's padding is [ph, pw] or [top, left, bottom, right], got {padding}")
    return [padding[0], padding[1], padding[0], padding[1]]


def reference_conv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Any, padding: list[int],
                   groups: int = 1) -> torch.Tensor:
    """ATen's conv2d with kiln's padding (four-sided: an explicit zero pad first)."""
    top, left, bottom, right = four_sides(padding)
    if top == bottom and left == right:
        return torch.nn.functional.conv2d(x, w, bias, stride, [top, left], groups=groups)
    return torch.nn.functional.conv2d(torch.nn.functional.pad(x, (left, right, top, bottom)), w, bias, stride, 0,
                                      groups=groups)


def result_like(x: torch.Tensor, out_channels: int, kernel: list[int], stride: list[int], padding: list[int],
                channels_last: bool) -> torch.Tensor:
    """An empty tensor shaped and laid out as a kiln convolution's result (the ops' fake implementations)."""
    n, _, h, w = x.shape
    ho, wo = output_hw(h, w, kernel, stride, padding)
    return x.new_empty((n, out_channels, ho, wo),
                       memory_format=torch.channels_last if channels_last else torch.contiguous_format)


@conv_gemm.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
      out_channels: int, kernel: list[int], stride: list[int], padding: list[int], relu: bool,
      channels_last: bool = True, relu_input: bool = False, direct: bool = False,
      relu_max: float | None = None, relu_input_max: float | None = None) -> torch.Tensor:
    return result_like(x, out_channels, kernel, stride, padding, channels_last)


# The step checker's references: what each op computes, in ATen, on the weight it was packed from.

def reference_epilogue(y: torch.Tensor, args: dict) -> torch.Tensor:
    if args.get("residual") is not None:
        y = y + args["residual"]
    if not args.get("relu"):
        return y
    y = torch.relu(y)
    return y.clamp(max=args["relu_max"]) if args.get("relu_max") is not None else y


def reference_input(args: dict) -> torch.Tensor:
    if not args.get("relu_input"):
        return args["x"]
    x = torch.relu(args["x"])
    return x.clamp(max=args["relu_input_max"]) if args.get("relu_input_max") is not None else x


@references.register("kiln::conv_winograd")
def _winograd_reference(args: dict) -> torch.Tensor | None:
    w = references.baked_source(args["packed"])
    if w is None:
        return None
    y = torch.nn.functional.conv2d(reference_input(args), w.float(), args["bias"], 1, args["padding"])
    return reference_epilogue(y, args)


@references.register("kiln::conv_gemm")
def _conv_gemm_reference(args: dict) -> torch.Tensor | None:
    w = references.baked_source(args["packed"])
    if w is None:
        return None
    y = reference_conv(reference_input(args), w.float(), args["bias"], args["stride"], args["padding"])
    return reference_epilogue(y, args)
