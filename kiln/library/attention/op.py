"""kiln's CPU attention at run time: the compiled library (``library/attention/source.py``), the ``kiln::attention``
op, and the per-shape measurement against ATen's CPU flash-attention kernel.

The op returns ``[B, H, T, D]`` as a view of a ``[B, T, H, D]`` buffer, the layout ATen's CPU and CUDA
attention kernels also give, so merging the heads afterwards is a view (``schedule/layout.py``)."""
from __future__ import annotations

import ctypes
import functools
from typing import Callable

import torch

from kiln.library.attention.source import attention_source
from kiln.runtime import native, references



@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    from kiln.runtime.build import load_module
    # (kiln_attention's C parameters are listed once, by the op's binder ``_native``)
    return load_module(attention_source(), name="kiln_attention").lib


def available() -> bool:
    from kiln.runtime.build import builds
    return builds(library)


def attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                   causal: bool, zero_empty: bool) -> torch.Tensor:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.float32 or t.dim() != 4 or t.device.type != "cpu":
            raise ValueError(f"kiln::attention expects 4-D fp32 CPU tensors [B, H, T, D]; {name} is {t.dtype} "
                             f"{list(t.shape)} on {t.device}")
    b, h, t, d = q.shape
    s = k.shape[2]
    if tuple(k.shape) != (b, h, s, d) or tuple(v.shape) != (b, h, s, d):
        raise ValueError(f"kiln::attention: k {list(k.shape)} and v {list(v.shape)} must be [B, H, S, D] = "
                         f"[{b}, {h}, S, {d}] for q {list(q.shape)}")
    if causal and s != t:
        raise ValueError(f"kiln::attention: a causal mask needs as many keys as queries, got {t} and {s}")
    if mask is not None:
        if mask.dtype != torch.float32 or mask.device.type != "cpu" or mask.dim() > 4:
            raise ValueError(f"kiln::attention: the mask must be an additive fp32 CPU tensor of at most 4 dims, "
                             f"got {mask.dtype} {list(mask.shape)} on {mask.device}")
        try:
            mask = mask.expand(b, h, t, s)
        except RuntimeError:
            raise ValueError(f"kiln::attention: mask {list(mask.shape)} does not broadcast to [B, H, T, S] = "
                             f"{[b, h, t, s]}") from None
    if q.stride(3) != 1:
        q = q.contiguous()
    out = torch.empty(b, t, h, d, dtype=torch.float32).permute(0, 2, 1, 3)
    if out.numel() == 0:
        return out
    if s == 0:
        return out.fill_(0.0 if zero_empty else float("nan"))  # softmax over no keys: 0/0, as torch
    return native.call(torch.ops.kiln.attention.default,
                       dict(q=q, k=k, v=v, mask=mask, scale=float(scale), causal=causal, zero_empty=zero_empty), out)


@torch.library.custom_op("kiln::attention", mutates_args=(), device_types="cpu")
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
              causal: bool, zero_empty: bool) -> torch.Tensor:
    """``softmax(q @ k^T * scale [+ mask] [-inf above the diagonal]) @ v`` for ``[B, H, T, D]`` fp32 tensors;
    ``mask`` additive, broadcast to ``[B, H, T, S]``.  A row whose scores are all -inf gives zeros with
    ``zero_empty`` (ATen's flash kernels), else NaN (softmax written out)."""
    return attention_impl(q, k, v, mask, scale, causal, zero_empty)


@attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, causal: bool,
      zero_empty: bool) -> torch.Tensor:
    b, h, t, d = q.shape
    return q.new_empty(b, t, h, d).permute(0, 2, 1, 3)


@native.register(torch.ops.kiln.attention.default)
def _native(args: dict, strides_of: Callable, out_strides: tuple[int, ...]) -> tuple | None:
    """``kiln_attention`` called from the generated code (runtime/native.py), with attention_impl's checks."""
    q, k, v, mask, causal = args["q"], args["k"], args["v"], args["mask"], args["causal"]
    strides = [strides_of(t) if native.fp32_tensor(t, 4) else None for t in (q, k, v)]
    if any(st is None for st in strides) or strides[0][3] != 1 or len(out_strides) != 4 or out_strides[3] != 1:
        return None
    b, h, t, d = q.shape
    s = k.shape[2]
    if tuple(k.shape) != (b, h, s, d) or tuple(v.shape) != (b, h, s, d) or (causal and s != t) \
            or b * h * t * d == 0 or s == 0:
        return None
    Ref, I64 = native.Ref, native.I64
    mask_strides = (0, 0, 0, 0)
    if mask is not None:
        found = native.broadcast_strides(mask, strides_of, (b, h, t, s))
        if found is None:
            return None
        mask_strides = found
    return (native.address(library().kiln_attention), "kiln_attention",
            [(native.PTR, Ref(q)), (native.PTR, Ref(k)), (native.PTR, Ref(v)),
             (native.PTR, Ref(mask)), (native.PTR, Ref(native.OUT))]
            + [(I64, x) for x in (b, h, t, s, d, *strides[0][:3], *strides[1], *strides[2], *mask_strides,
                                  *out_strides[:3])]
            + [(native.F32, args["scale"]), (native.I32, int(causal)), (native.I32, int(args["zero_empty"])),
               (native.I32, native.THREADS)])


@references.register("kiln::attention")
def _reference(args: dict) -> torch.Tensor:
    """What the op computes, in fp64 ATen (the step checker's reference)."""
    q, k, v = (args[a].double() for a in "qkv")
    scores = q @ k.transpose(-1, -2) * args["scale"]
    if args["mask"] is not None:
        scores = scores + args["mask"].double()
    if args["causal"]:
        t, s = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(1 + s - t), float("-inf"))
    probs = torch.softmax(scores, -1)
    if args["zero_empty"]:  # a row of -inf scores: zeros, as ATen's flash kernels
        probs = torch.where((scores == float("-inf")).all(-1, keepdim=True), 0.0, probs)
    return (probs @ v).to(args["q"].dtype)
