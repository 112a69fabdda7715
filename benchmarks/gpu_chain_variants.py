"""Variants of the elementwise chain's kernel on the H200, to find what keeps it from the copy bandwidth.

Each variant is the kernel kiln generates for the chain (one persistent row reduction per 4096-wide row),
changed in one respect.  Prints microseconds (triton.testing.do_bench, median) and the fraction of the
device copy bandwidth measured in the same process.

    python -m benchmarks.gpu_chain_variants
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from benchmarks.gpu_profile import copy_bandwidth
from kiln.runtime.triton_math import tanh as _tanh_accurate  # what kiln emits for fp32 (on a GPU)
from kiln.runtime.triton_math import tanh_half as _tanh_approx  # ... and for bf16/fp16 results


@triton.jit
def _sigmoid_fast(x):
    return tl.fdiv(1.0, 1.0 + tl.exp(-x), ieee_rounding=False)


@triton.jit
def chain_kernel(a_ptr, b_ptr, o_ptr, N: tl.constexpr, RBLOCK: tl.constexpr, FAST: tl.constexpr,
                 EVICT: tl.constexpr, TANH_EXP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, RBLOCK)
    m = r < N
    if EVICT:
        a = tl.load(a_ptr + row * N + r, mask=m, other=0, eviction_policy="evict_first").to(tl.float32)
        b = tl.load(b_ptr + row * N + r, mask=m, other=0, eviction_policy="evict_first").to(tl.float32)
    else:
        a = tl.load(a_ptr + row * N + r, mask=m, other=0).to(tl.float32)
        b = tl.load(b_ptr + row * N + r, mask=m, other=0).to(tl.float32)
    if FAST:
        sa = _sigmoid_fast(a)
        d = a - b
        sd = _sigmoid_fast(d)
    else:
        sa = tl.sigmoid(a)
        d = a - b
        sd = tl.sigmoid(d)
    if TANH_EXP == 1:
        tb = 2.0 * _sigmoid_fast(2.0 * b) - 1.0
    elif TANH_EXP == 2:
        tb = _tanh_accurate(b)
    elif TANH_EXP == 3:
        tb = _tanh_approx(b)
    else:
        tb = libdevice.tanh(b)
    x = sa * tb + d * sd
    mean = tl.sum(tl.where(m, x, 0.0), 0) * (1.0 / N)
    c = x - mean
    var = tl.sum(tl.where(m, c * c, 0.0), 0) * (1.0 / N)
    y = c * tl.rsqrt(var + 1e-6)
    tl.store(o_ptr + row * N + r, y.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _tanh_probe(x_ptr, y_ptr, MODE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i)
    if MODE == 2:
        y = _tanh_accurate(x)
    else:
        y = _tanh_approx(x)
    tl.store(y_ptr + i, y)


def main() -> None:
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(a)
    bw = copy_bandwidth()
    nbytes = 3 * a.numel() * a.element_size()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; chain moves {nbytes / 1e6:.1f} MB")
    x = torch.linspace(-12, 12, 1 << 20, device="cuda")
    ref = torch.tanh(x.double())
    for mode, fn in ((2, _tanh_accurate), (3, _tanh_approx)):
        y = torch.empty_like(x)
        _tanh_probe[(x.numel() // 1024,)](x, y, MODE=mode, BLOCK=1024)
        err = ((y.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max().item()
        print(f"tanh mode {mode}: max relative error {err:.2e}")
    for warps in (8,):
        for fast, evict, tanh_exp in ((False, False, 0), (False, True, 1), (False, True, 2), (False, True, 3)):
            fn = lambda: chain_kernel[(n,)](a, b, o, N=n, RBLOCK=n, FAST=fast, EVICT=evict,  # noqa: E731
                                            TANH_EXP=tanh_exp, num_warps=warps)
            us = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
            print(f"warps {warps:2d} fast_div {fast!s:5} evict_first {evict!s:5} tanh mode {tanh_exp}: "
                  f"{us:6.1f} us  {nbytes / (us * 1e-6) / bw:5.1%} of copy bandwidth", flush=True)


if __name__ == "__main__":
    main()
