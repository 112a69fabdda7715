"""kiln_bmm (``library/gemm/source.py``) at kernel level: mha_cross's scores product, called through ctypes.

One thread.  ``a`` = Q of 8 heads ([64 queries, 8 x 64] read in place, head stride 64), ``b`` = K^T (keys
[S, 8 x 64] read in place: unit stride along the reduced dimension, so ``kiln_bmm`` packs it), optionally plus an
additive [64, S] mask broadcast over the heads; S = 64 (two full column panels), 69 (two and a 5-column
remainder), 96 (three).  Reported: median us per call over rounds of 100 calls.

    python -m benchmarks.cpu_bmm [--rounds 30]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from kiln.library.gemm import op as cpu_gemm
    lib = cpu_gemm.library()
    p, i = ctypes.c_void_p, ctypes.c_int64
    fn = lib.kiln_bmm
    fn.argtypes = [p, i, i, i, p, i, i, i, p, i, i, i, p, i, i, i, i, i, i, ctypes.c_int]
    heads, queries, dim, most = 8, 64, 64, 96
    q, k = torch.randn(queries, heads * dim), torch.randn(most, heads * dim)
    mask, out = torch.randn(queries, most), torch.empty(heads, queries, most)

    def run(keys: int, masked: bool, calls: int) -> None:
        for _ in range(calls):
            fn(q.data_ptr(), dim, heads * dim, 1, k.data_ptr(), dim, 1, heads * dim,
               mask.data_ptr() if masked else None, 0, most, 1, out.data_ptr(), queries * most, most,
               heads, queries, keys, dim, 1)

    peak_us = 2 * heads * queries * dim / 117.5e3  # per key, at the FMA probe's 117.5 GFLOP/s (Zen 4 core)
    for keys in (64, 69, 96):
        for masked in (False, True):
            run(keys, masked, 100)
            times = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                run(keys, masked, 100)
                times.append((time.perf_counter() - start) / 100)
            us = statistics.median(times) * 1e6
            print(f"{keys} keys{' + mask' if masked else ''}: {us:.1f} us ({peak_us * keys / us:.0%} of 117.5 GFLOP/s)")


if __name__ == "__main__":
    main()
