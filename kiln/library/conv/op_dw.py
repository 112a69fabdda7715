"""kiln's depthwise convolution at run time (``library/conv/source_dw.py``): the compiled library, the weight
packing, and the ``kiln::conv_dw`` op.

Depthwise means one filter per channel: ``groups == in_channels == out_channels`` and a ``[C, 1, kh, kw]``
weight (MobileNet's and EfficientNet's 3x3 and 5x5 layers).  Like kiln's other convolutions (``library/conv/op.py``) it
reads its input in any layout, writes channels-last (or NCHW for a graph output), and takes the bias, a residual
and a ReLU as its epilogue; ``library/conv/select.py`` measures it against oneDNN per shape.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Callable

import torch

from kiln.library.conv.source_dw import conv_dw_source
from kiln.ir.extern import Baked
from kiln.runtime import native, references
from kiln.library.conv.op import (_check_input, _gatherable, _output, four_sides, native_prefix, output_hw,
                                  reference_conv, reference_epilogue, reference_input, relu_flags, result_like)



@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    from kiln.runtime.build import load_module
    # (kiln_conv_dw's C parameters are listed once, by the op's binder ``_native``)
    return load_module(conv_dw_source(), name="kiln_conv_dw").lib


def available() -> bool:
    from kiln.runtime.build import builds
    return builds(library)


def supports(in_channels: int, weight_shape: tuple[int, ...], stride: list[int], dilation: list[int],
             groups: int) -> bool:
    """A depthwise convolution with one filter per channel (channel multiplier 1), no dilation."""
    return groups > 1 and groups == in_channels == weight_shape[0] and weight_shape[1] == 1 \
        and list(dilation) == [1, 1] and all(s > 0 for s in stride)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """``w [C, 1, kh, kw]`` as ``[kh][kw][C]`` (a tap's channels contiguous); 1-D fp32."""
    return w.detach().float().cpu()[:, 0].permute(1, 2, 0).contiguous().reshape(-1)


def conv_dw_impl(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                 out_channels: int, kernel: list[int], stride: list[int], padding: list[int], relu: bool,
                 channels_last: bool, relu_input: bool = False,
                 relu_max: float | None = None, relu_input_max: float | None = None) -> torch.Tensor:
    _check_input("conv_dw", x)
    _, c, h, w = x.shape
    kh, kw = kernel
    if c != out_channels or packed.numel() != kh * kw * c:
        raise ValueError(f"kiln::conv_dw: a depthwise convolution of {out_channels} channels with a {kh}x{kw} "
                         f"filter takes {out_channels} input channels and {kh * kw * out_channels} packed weights, "
                         f"got {c} and {packed.numel()}")
    ho, wo = output_hw(h, w, kernel, stride, padding)
    y, res = _output("conv_dw", x, residual, c, ho, wo, f"{kh}x{kw}", padding, channels_last)
    if y.numel() == 0:
        return y
    return native.call(torch.ops.kiln.conv_dw.default,
                       dict(x=_gatherable(x), packed=packed, bias=native.contiguous(bias), residual=res, out_channels=c,
                            kernel=kernel, stride=stride, padding=padding, relu=relu, channels_last=channels_last,
                            relu_input=relu_input, relu_max=relu_max, relu_input_max=relu_input_max), y)


@torch.library.custom_op("kiln::conv_dw", mutates_args=(), device_types="cpu")
def conv_dw(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
            out_channels: int, kernel: list[int], stride: list[int], padding: list[int], relu: bool,
            channels_last: bool = True, relu_input: bool = False,
            relu_max: float | None = None, relu_input_max: float | None = None) -> torch.Tensor:
    """``[relu](conv2d([relu](x), W, bias, stride, padding, groups=C) [+ residual])`` for a depthwise ``W`` given
    by ``pack_weight(W)``; the result is channels-last, or contiguous (NCHW) if not ``channels_last``;
    ``relu_max``, ``relu_input_max``: the ReLUs' upper clamps (ReLU6: 6; None: none)."""
    return conv_dw_impl(x, packed, bias, residual, out_channels, kernel, stride, padding, relu, channels_last,
                        relu_input, relu_max, relu_input_max)


@conv_dw.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
      out_channels: int, kernel: list[int], stride: list[int], padding: list[int], relu: bool,
      channels_last: bool = True, relu_input: bool = False,
      relu_max: float | None = None, relu_input_max: float | None = None) -> torch.Tensor:
    return result_like(x, out_channels, kernel, stride, padding, channels_last)


@native.register(torch.ops.kiln.conv_dw.default)
def _native(args: dict, strides_of: Callable, out_strides: tuple[int, ...]) -> tuple | None:
    """``kiln_conv_dw`` called from the generated code (runtime/native.py), with conv_dw_impl's checks."""
    x, packed, kernel, stride, padding = (args[a] for a in ("x", "packed", "kernel", "stride", "padding"))
    if not native.fp32_tensor(x, 4) or not native.fp32_tensor(packed, 1):
        return None
    n, c, h, w = x.shape
    ho, wo = output_hw(h, w, kernel, stride, padding)
    weights = (packed.value if isinstance(packed, Baked) else packed).numel()
    if c != args["out_channels"] or weights != kernel[0] * kernel[1] * c:
        return None
    prefix = native_prefix(args, strides_of, out_strides, c, ho, wo)
    if prefix is None:
        return None
    return (native.address(library().kiln_conv_dw), "kiln_conv_dw",
            prefix + [(native.I64, v) for v in (*kernel, *stride, *four_sides(padding)[:2], ho, wo)]
            + relu_flags(args) + [(native.I32, native.THREADS)])


@references.register("kiln::conv_dw")
def _reference(args: dict) -> torch.Tensor | None:
    """What the op computes, in ATen, on the weight it was packed from (the step checker's reference)."""
    w = references.baked_source(args["packed"])
    if w is None:
        return None
    x = reference_input(args)
    y = reference_conv(x, w.float(), args["bias"], args["stride"], args["padding"], groups=x.shape[1])
    return reference_epilogue(y, args)
