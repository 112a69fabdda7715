"""Math for generated Triton kernels: ``km.<name>(x)`` in kernel source.

On a GPU these are CUDA's libdevice functions.  Triton's interpreter (``TRITON_INTERPRET=1``, how CI runs the
GPU code generator on CPU tensors) cannot call libdevice, so there the same names are defined from the
``tl``/``tl.math`` primitives it does support.  Those versions are for testing the generator, not for speed;
their accuracy is within the per-op tolerances of the tests (fp32: 1.3e-5 relative).
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
    def erf(x):
        return libdevice.erf(x)

    @triton.jit
    def erfc(x):
        return libdevice.erfc(x)

    @triton.jit
    def ndtr(x):
        return 0.5 * libdevice.erfc(x * -0.7071067811865476)

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
        if isinstance(y, (int, float)):  # (interpreted: a literal exponent as a block, so '&' of its tests works)
            y = tl.full(x.shape, y, tl.float32)
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
    def erf(x):
        return tl.math.erf(x)

    @triton.jit
    def erfc(x):
        return 1.0 - tl.math.erf(x)

    @triton.jit
    def ndtr(x):
        return 0.5 - 0.5 * tl.math.erf(x * -0.7071067811865476)


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
