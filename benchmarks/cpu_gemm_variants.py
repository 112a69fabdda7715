"""Variants of kiln's CPU GEMM library timed against each other (alternate rounds, one process, one thread).

Each variant is kiln's GEMM source (``library/gemm/source.py``) built with one compile-time switch changed, called
through ctypes with the rule's schedule; every call takes the next of several copies of the weight, so B comes
from memory as in a model (``tune/timing.cold_copies``).  Reported per shape: each variant's median
GFLOP/s and the median over rounds of its time relative to the first variant's.

    python -m benchmarks.cpu_gemm_variants [--shapes 64x1024x4096,256x768x2304] [--rounds 15]

Variants: ``as shipped`` (the first row tile of each column panel prefetches the next panel of B; each micro-tile
prefetches its rows of C before its k loop), ``no-B-prefetch`` (``KILN_B_PREFETCH 0``), ``no-C-prefetch``
(``KILN_C_PREFETCH 0``) and ``k-loop-not-unrolled`` (``KILN_K_UNROLL 1``; shipped: 4).  ``--kc``/``--mc``
replace the rule's K block depth and A block rows.  ``--mr 7,6`` adds the library built with micro-tiles of that
many rows (shipped: 8) as variants ``mr=7`` ...; ``--only-mr`` leaves out the compile-time switches.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

VARIANTS = {"as shipped": "", "no-B-prefetch": "#define KILN_B_PREFETCH 0\n",
            "no-C-prefetch": "#define KILN_C_PREFETCH 0\n", "k-loop-not-unrolled": "#define KILN_K_UNROLL 1\n"}
SHAPES = "64x1024x4096,64x4096x1024,256x768x2304,256x3072x768,256x768x8192,1024x1024x1024,2048x2048x2048"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--kc", type=int, default=0, help="K block depth (default: the rule's, schedule_for)")
    ap.add_argument("--mc", type=int, default=0, help="rows of A per block (default: the rule's)")
    ap.add_argument("--mr", default="", help="micro-tile row counts to add as variants, e.g. 7,6")
    ap.add_argument("--only-mr", action="store_true", help="as shipped and the --mr variants only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from kiln.library.gemm.source import GemmSchedule, equal_blocks, gemm_source, schedule_for
    from kiln.library.gemm import op as cpu_gemm
    from kiln.tune import timing
    from kiln.runtime.build import load_module
    variants = {name: (switch, 8) for name, switch in VARIANTS.items()
                if not args.only_mr or name == "as shipped"}
    variants.update({f"mr={r}": ("", int(r)) for r in args.mr.split(",") if r})
    libs = {name: cpu_gemm.bind_gemm(load_module(switch + gemm_source(GemmSchedule(mr=mr)), name="kiln_gemm_variant").lib)
            for name, (switch, mr) in variants.items()}
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.split("x"))
        x, bias = torch.randn(m, k), torch.randn(n)
        packs = [cpu_gemm.pack_weight(torch.randn(n, k)) for _ in range(timing.cold_copies(4 * n * k))]
        out = torch.empty(m, n)
        s = schedule_for(m, k)
        s = GemmSchedule(mr=s.mr, kc=args.kc or s.kc, mc=args.mc or s.mc)
        times: dict[str, list[float]] = {name: [] for name in libs}
        for _ in range(args.rounds):
            for name, lib in libs.items():
                mr = variants[name][1]
                mc = s.mc if mr == s.mr or args.mc else equal_blocks(m, s.mc + mr - 1, mr)  # whole tiles of mr
                start = time.perf_counter()
                for p in packs:
                    lib.kiln_gemm(x.data_ptr(), k, p.data_ptr(), bias.data_ptr(), out.data_ptr(), n, m, n, k, s.kc,
                                  mc, 0, 1)
                times[name].append((time.perf_counter() - start) / len(packs))
        first = next(iter(libs))
        cells = []
        for name, ts in times.items():
            rel = statistics.median(t / f for t, f in zip(ts, times[first]))
            cells.append(f"{name} {2 * m * n * k / statistics.median(ts) / 1e9:6.1f} GFLOP/s (time x{rel:.3f})")
        print(f"{shape}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
