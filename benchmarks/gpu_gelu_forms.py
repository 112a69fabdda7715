"""Exact GELU on the GPU in its two forms, ``x/2 * erfc(-x/sqrt 2)`` (kiln's lowering) and ``x/2 * (1 + erf(x/sqrt
2))`` (ATen's and Inductor's), as bf16 Triton kernels over transformer FFN shapes: device time per call (CUDA
events, interleaved rounds, medians) and each form's largest error against an fp64 reference.

    python -m benchmarks.gpu_gelu_forms
"""
from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from benchmarks.transpose_tiles import device_us


@triton.jit
def _gelu_erfc(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0).to(tl.float32)
    tl.store(y_ptr + i, ((x * 0.5) * libdevice.erfc(x * -0.7071067811865476)).to(tl.bfloat16), mask=i < n)


@triton.jit
def _gelu_erf(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0).to(tl.float32)
    tl.store(y_ptr + i, ((x * 0.5) * (1.0 + libdevice.erf(x * 0.7071067811865476))).to(tl.bfloat16), mask=i < n)


def main() -> None:
    for shape in ((512, 3072), (788, 3072), (4096, 3072), (512, 11008)):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 3
        n = x.numel()
        ref = torch.nn.functional.gelu(x.double())
        times: dict[str, list[float]] = {"erfc": [], "erf": []}
        outs = {}
        for _ in range(15):
            for name, kernel in (("erfc", _gelu_erfc), ("erf", _gelu_erf)):
                y = torch.empty_like(x)
                grid = (triton.cdiv(n, 1024),)
                times[name].append(device_us(lambda: kernel[grid](x, y, n, BLOCK=1024, num_warps=4), calls=50))
                outs[name] = y
        line = " ".join(f"{k} {statistics.median(v):6.2f} us (max err {(outs[k].double() - ref).abs().max():.2e})"
                        for k, v in times.items())
        print(f"gelu bf16 {str(shape):>14}: {line}", flush=True)


if __name__ == "__main__":
    main()
