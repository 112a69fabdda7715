"""Skinny matmuls on the GPU: Triton tiles for few rows against cuBLAS (``torch.addmm``).

A transformer called on a short sequence (a decode step, a prompt of tens of tokens) multiplies ``M`` = a few
to a few tens of rows by its weights: the product is bound by reading the weight (``K x N``), and what decides
its time is how many programs share that read.  cuBLAS's kernels for such shapes keep wide column tiles (its
``64x8``/``64x24`` nvjet kernels on Hopper at M=37), so a ``768 x 3072`` weight is read by ~50 programs on a
132-SM chip.  This measures, per shape, the best of a set of narrow-tile configurations (one row tile of
``BLOCK_M`` >= M, columns in tiles of 16-128, K in one loop or split over ``SPLIT_K`` programs that add fp32
partial sums atomically) against ``torch.addmm`` - each timed as a CUDA graph of back-to-back calls
(``library.gpu_matmul.tune.time_on_device``), the split variants with their zeroing and cast included.

    python -m benchmarks.skinny_matmul [--rows 1,16,37,64] [--dtype bf16]

Shapes are the suite GPT's (d=768) linear layers and its 8192-word head.  The kernel takes M, N, K as run-time
arguments (one compile per configuration serves every shape): it bounds what a template with size parameters
could reach, it is not kiln's template.
"""
from __future__ import annotations

import argparse
import itertools

import torch

SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072), (8192, 768)]  # (N, K): qkv, proj, fc1, fc2, head


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def skinny_mm(a, b, bias, out, M, N, K, sam, sak, sbk, sbn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        om = tl.arange(0, BLOCK_M)
        on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        am = tl.where(om < M, om, 0)
        bn = tl.where(on < N, on, 0)
        iters = tl.cdiv(K, SPLIT_K * BLOCK_K)
        k0 = pid_k * iters * BLOCK_K
        limit = tl.minimum(K, k0 + iters * BLOCK_K)
        rk = k0 + tl.arange(0, BLOCK_K)
        a_ptr = a + am[:, None] * sam + rk[None, :] * sak
        b_ptr = b + rk[:, None] * sbk + bn[None, :] * sbn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, iters):
            kmask = rk < limit - kk * BLOCK_K
            a_t = tl.load(a_ptr, mask=kmask[None, :], other=0.0)
            b_t = tl.load(b_ptr, mask=kmask[:, None], other=0.0)
            acc = tl.dot(a_t, b_t, acc)
            a_ptr += BLOCK_K * sak
            b_ptr += BLOCK_K * sbk
        rm = om[:, None]
        rn = on[None, :]
        xmask = (rm < M) & (rn < N)
        if SPLIT_K == 1:
            acc += tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)
            tl.store(out + rm * N + rn, acc.to(out.dtype.element_ty), mask=xmask)
        else:
            if pid_k == 0:
                acc += tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)
            tl.atomic_add(out + rm * N + rn, acc, mask=xmask, sem="relaxed")
    return skinny_mm


def configs(m: int) -> list[tuple[int, int, int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) worth trying for ``m`` rows."""
    block_m = max(16, 1 << (m - 1).bit_length())
    if block_m > 64:
        return []
    out = []
    for bn, bk, split, warps, stages in itertools.product((16, 32, 64, 128), (64, 128, 256), (1, 2, 4),
                                                          (2, 4), (4,)):
        if bn * bk > 128 * 128:
            continue
        out.append((block_m, bn, bk, split, warps, stages))
    return out


def main() -> None:
    from kiln.library.gpu_matmul.tune import time_on_device
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,16,37,64")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--top", type=int, default=3, help="configurations listed per shape")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    kernel = _kernel()
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, {args.dtype}; us per call (CUDA graph of 10 calls, median of 7)")
    print("| M | N | K | cuBLAS us | best Triton us | ratio | best config (BM, BN, BK, split, warps, stages) |")
    print("|---|---|---|---|---|---|---|")
    for m in (int(v) for v in args.rows.split(",")):
        for n, k in SHAPES:
            x = torch.randn(m, k, device=dev, dtype=dtype)
            w = torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5
            bias = torch.randn(n, device=dev, dtype=dtype)
            wt = w.t()
            ref = torch.addmm(bias, x, wt)
            cublas, _ = time_on_device(lambda: torch.addmm(bias, x, wt))
            out = torch.empty(m, n, device=dev, dtype=dtype)
            acc = torch.empty(m, n, device=dev, dtype=torch.float32)
            timings = []
            for bm, bn, bk, split, warps, stages in configs(m):
                grid = (-(-n // bn), split)

                def run(bm=bm, bn=bn, bk=bk, split=split, warps=warps, stages=stages, grid=grid) -> None:
                    if split == 1:
                        kernel[grid](x, wt, bias, out, m, n, k, x.stride(0), x.stride(1), wt.stride(0),
                                     wt.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=1,
                                     num_warps=warps, num_stages=stages)
                    else:
                        acc.zero_()
                        kernel[grid](x, wt, bias, acc, m, n, k, x.stride(0), x.stride(1), wt.stride(0),
                                     wt.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                                     num_warps=warps, num_stages=stages)
                        out.copy_(acc)
                try:
                    run()
                    torch.cuda.synchronize()
                    err = (out.float() - ref.float()).abs().max().item()
                    if err > 0.05 * ref.float().abs().max().item():
                        print(f"  wrong result: M={m} N={n} K={k} config {(bm, bn, bk, split, warps, stages)}")
                        continue
                    us = time_on_device(run)[0] * 1e6
                except Exception as exc:  # noqa: BLE001 - out of resources: skipped
                    print(f"  skipped {(bm, bn, bk, split, warps, stages)}: {type(exc).__name__}")
                    continue
                timings.append((us, (bm, bn, bk, split, warps, stages)))
            timings.sort()
            if not timings:
                continue
            best, cfg = timings[0]
            print(f"| {m} | {n} | {k} | {cublas * 1e6:.2f} | {best:.2f} | {cublas * 1e6 / best:.2f} | {cfg} |",
                  flush=True)
            for us, c in timings[1:args.top]:
                print(f"|  |  |  |  | {us:.2f} |  | {c} |")


if __name__ == "__main__":
    main()
