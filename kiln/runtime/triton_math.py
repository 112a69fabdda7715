"""Math for generated Triton kernels: ``km.<name>(x)`` in kernel source.

erf, erfc, ndtr (and on a GPU rsqrt, tanh) are kiln's own, from tl primitives (see [Note: no libdevice]); the
rarer functions are CUDA's libdevice.  Triton's interpreter (``TRITON_INTERPRET=1``, how CI runs the GPU code
generator on CPU tensors) cannot call libdevice, so there those names are defined from the ``tl``/``tl.math``
primitives it does support.  Those versions are for testing the generator, not for speed; their accuracy is
within the per-op tolerances of the tests (fp32: 1.3e-5 relative).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

if not INTERPRET:
    from triton.language.extra import libdevice

    @triton.jit
    def tanh(x):
        # libdevice's tanh costs the chain kernel 51 us where this takes 41 us (H200, benchmarks/
        # gpu_chain_variants.py); max relative error 3.8e-7 on [-12, 12].  Odd Taylor polynomial to x^13 below
        # |x| = 0.55 (where 1 - e would cancel), (1 - e) / (1 + e) with e = exp(-2|x|) above.
        ax = tl.abs(x)
        x2 = x * x
        p = 21844.0 / 6081075.0
        p = p * x2 - 1382.0 / 155925.0
        p = p * x2 + 62.0 / 2835.0
        p = p * x2 - 17.0 / 315.0
        p = p * x2 + 2.0 / 15.0
        p = p * x2 - 1.0 / 3.0
        small = x + x * x2 * p
        e = tl.exp(-2.0 * ax)
        big = (1.0 - e) / (1.0 + e)
        return tl.where(ax < 0.55, small, tl.where(x < 0, -big, big))

    @triton.jit
    def tanh_half(x):
        # for bf16/fp16 results: the hardware approximation (max relative error 1.05e-5, far below half
        # precision's rounding); the chain kernel 51 -> 32.6 us, 77% of the copy bandwidth
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)

    @triton.jit
    def expm1(x):
        return libdevice.expm1(x)

    @triton.jit
    def log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def pow(x, y):
        return libdevice.pow(x, y)

    @triton.jit
    def trunc(x):
        return libdevice.trunc(x)

    @triton.jit
    def nearbyint(x):
        return libdevice.nearbyint(x)

    @triton.jit
    def fmod(x, y):
        return libdevice.fmod(x, y)

    @triton.jit
    def rsqrt(x):
        # the instruction libdevice's rsqrtf is, without linking libdevice (see [Note: no libdevice]); no flush of
        # subnormal inputs (libdevice's under Triton's default reflect setting flushes them)
        return tl.inline_asm_elementwise("rsqrt.approx.f32 $0, $1;", "=f,f", [x.to(tl.float32)], dtype=tl.float32,
                                         is_pure=True, pack=1)

else:
    @triton.jit
    def expm1(x):
        # Taylor series near 0 (where exp(x) - 1 cancels), exp(x) - 1 elsewhere
        small = tl.abs(x) < 0.25
        p = x * (1.0 + x * (0.5 + x * (1.0 / 6 + x * (1.0 / 24 + x * (1.0 / 120 + x * (1.0 / 720 + x / 5040))))))
        return tl.where(small, p, tl.exp(x) - 1.0)

    @triton.jit
    def tanh(x):
        e = expm1(-2.0 * tl.abs(x))
        t = -e / (2.0 + e)
        return tl.where(x < 0, -t, t)

    @triton.jit
    def tanh_half(x):
        return tanh(x)

    @triton.jit
    def log1p(x):
        # log(u) * x / (u - 1) with u = 1 + x rounded: exact to rounding for small x
        u = 1.0 + x
        d = u - 1.0
        return tl.where(d == 0, x, tl.log(u) * (x / tl.where(d == 0, 1.0, d)))

    @triton.jit
    def pow(x, y):
        # (interpreted: a literal or one-element base or exponent made a block of the other's shape, so '&' of
        # its tests works; fuzz_symbolic --target triton, seeds 319 and 535)
        if isinstance(y, (int, float)):
            y = tl.full(x.shape, y, tl.float32)
        elif isinstance(x, (int, float)):
            x = tl.full(y.shape, x, tl.float32)
        else:
            x, y = tl.broadcast(x, y)
        r = tl.exp(y * tl.log(tl.abs(x)))
        odd = (tl.floor(y) == y) & (tl.floor(y * 0.5) * 2.0 != y)
        r = tl.where((x < 0) & odd, -r, r)
        r = tl.where((x < 0) & (tl.floor(y) != y), float("nan"), r)
        return tl.where(y == 0, 1.0, tl.where(x == 0, tl.where(y > 0, 0.0, float("inf")), r))

    @triton.jit
    def trunc(x):
        return tl.where(x < 0, tl.ceil(x), tl.floor(x))

    @triton.jit
    def nearbyint(x):
        f = tl.floor(x)
        d = x - f
        even = tl.floor(f * 0.5) * 2.0 == f
        return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(even, f, f + 1.0)))

    @triton.jit
    def fmod(x, y):
        return x - y * trunc(x / y)

    @triton.jit
    def rsqrt(x):
        return 1.0 / tl.sqrt(x)


# [Note: no libdevice]
# Triton links CUDA's libdevice into a kernel that calls any of its functions, and the link (and LLVM's O3 over
# the linked module) costs each such kernel ~50 ms of compile time (H100, torch 2.11 / Triton 3.6: 3 of
# encoder_fast's 7 kernels, LayerNorm's rsqrt and GELU's erf; the kernels compile in threads that share the
# GIL).  The functions every transformer needs are therefore written here with tl primitives - the same code on a
# GPU and in the interpreter, so CI tests what the GPU runs.
#
# erf and erfc: fitted by kiln (least squares in relative error, reweighted towards minimax, float64; coefficients
# rounded to fp32), not taken from a library:
#   |x| < 1:  erf(x) = x * P(x^2), P of degree 6 (fit error 1.2e-9);
#   t >= 1:   erfc(t) = exp(-t^2) / t * Q(1/t - 0.55), Q of degree 12 on 1/t in [1/10.1, 1] (fit error 1.6e-9;
#             centred so that fp32's Horner steps do not cancel: sum |q_i| is 3x the value); erf's own tail
#             (1 <= t < 4) a degree-7 Q(1/t - 0.6) on [1/4, 1] (fit error 3.5e-7, see _erfc_near).
# exp(-t^2) as exp(-h^2) * exp(-(t - h)(t + h)) with h = t to 8 fractional bits (h^2 exact in fp32 below 16), so
# the square's rounding does not grow with t.  Measured in fp32 against float64 over [-12, 12] (2M points): erf
# 1.8e-7 relative (torch's 6.5e-8), erfc 8.8e-7 (where erfc(x) < 1 takes 1 - erf(x) near x = 1; torch 8.9e-8).
@triton.jit
def _erf_small(x):
    s = x * x
    p = 7.854026625864208e-05
    p = p * s - 0.0008010247838683426
    p = p * s + 0.005188334733247757
    p = p * s - 0.026853816583752632
    p = p * s + 0.1128358542919159
    p = p * s - 0.3761262595653534
    p = p * s + 1.1283791065216064
    return x * p


@triton.jit
def _erfc_tail(t):
    """erfc(t) for t >= 1 (any t is clamped to [1, 10]: callers select this branch only there; erfc(10) is
    below fp32's smallest normal)."""
    t = tl.minimum(tl.maximum(t, 1.0), 10.0)
    u = 1.0 / t
    v = u - 0.55
    q = -0.1447855830192566
    q = q * v + 0.1196078211069107
    q = q * v + 0.03955711051821709
    q = q * v - 0.09624317288398743
    q = q * v + 0.08578860014677048
    q = q * v - 0.06034562364220619
    q = q * v + 0.011730583384633064
    q = q * v + 0.0498410202562809
    q = q * v - 0.09701266139745712
    q = q * v + 0.09835845977067947
    q = q * v - 0.020363925024867058
    q = q * v - 0.17003512382507324
    q = q * v + 0.5023534297943115
    h = tl.floor(t * 256.0) * 0.00390625
    return tl.exp(-h * h) * tl.exp(-((t - h) * (t + h))) * (q * u)


@triton.jit
def _erfc_near(t):
    """erfc(t) for 1 <= t <= 4 (clamped there) to 3.5e-7 relative: erf's tail, where erf(t) = 1 - erfc(t) needs
    erfc only to erfc(1) * 3.5e-7 = 5.5e-8, half an fp32 ulp of 1 (a shorter polynomial and exp(-t^2) as it
    rounds: compiled in every exact GELU)."""
    t = tl.minimum(tl.maximum(t, 1.0), 4.0)
    u = 1.0 / t
    v = u - 0.6
    q = -0.040107715874910355
    q = q * v + 0.011243474669754505
    q = q * v + 0.0501399040222168
    q = q * v - 0.08569424599409103
    q = q * v + 0.0802861750125885
    q = q * v - 0.00696518225595355
    q = q * v - 0.1713819056749344
    q = q * v + 0.49381229281425476
    return tl.exp(-t * t) * (q * u)


@triton.jit
def erf(x):
    x = x.to(tl.float32)
    a = tl.abs(x)
    big = tl.where(a < 4.0, 1.0 - _erfc_near(a), 1.0)
    r = tl.where(a < 1.0, _erf_small(x), tl.where(x < 0, -big, big))
    return tl.where(x != x, x, r)  # NaN stays NaN


@triton.jit
def erfc(x):
    x = x.to(tl.float32)
    a = tl.abs(x)
    tail = tl.where(a < 10.0, _erfc_tail(a), 0.0)
    r = tl.where(a < 1.0, 1.0 - _erf_small(x), tl.where(x < 0, 2.0 - tail, tail))
    return tl.where(x != x, x, r)


@triton.jit
def ndtr(x):
    """The standard normal CDF, 0.5 * erfc(-x / sqrt(2)) (exact GELU's x * ndtr(x))."""
    return 0.5 * erfc(x * -0.7071067811865476)


# combine functions of tl.reduce (plain tl: the same on GPU and in the interpreter)
@triton.jit
def max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def mul_combine(a, b):
    return a * b
