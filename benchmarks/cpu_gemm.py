"""kiln's CPU GEMM against the libraries and this core's FMA peak (issue 4: 2048^3 fp32 at >= 80% of peak).

One thread.  Each round times kiln (``kiln::linear_packed``, weight packed beforehand, as in a compiled
graph), MKL (``torch.addmm``, what eager calls) and oneDNN (``mkldnn._linear_pointwise``) back to back on the
same inputs; the FMA probe runs between rounds, so a slow phase of this shared machine lowers both the peak
and the GEMMs.  Reported: median GFLOP/s per backend, and kiln's median per-round fraction of the peak.

    python -m benchmarks.cpu_gemm [--shapes 2048x2048x2048,64x1024x4096] [--rounds 7] [--gelu] [--cold 3]

``--gelu``: each library applies the exact gelu in its epilogue (kiln's ``gelu=True``, oneDNN's "gelu" post-op,
MKL's addmm followed by ATen's gelu).  ``--cold N``: each call takes the next of N copies of the weight, so it
comes from memory as in a model (N = 1: one weight, warm in the caches).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="2048x2048x2048,64x1024x4096,256x768x2304")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--gelu", action="store_true", help="with the exact gelu as each library's epilogue")
    p.add_argument("--cold", type=int, default=1, help="weight copies cycled through (1: one warm weight)")
    args = p.parse_args()
    torch.set_num_threads(1)
    from benchmarks.fma_probe import peak_gflops
    from kiln.library.gemm import op as cpu_gemm
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.split("x"))
        x, b = torch.randn(m, k), torch.randn(n)
        ws = [torch.randn(n, k) for _ in range(max(1, args.cold))]
        packs = [cpu_gemm.pack_weight(w) for w in ws]
        post = ("gelu", [], "none") if args.gelu else ("none", [], "")

        def kiln(i: int) -> torch.Tensor:
            return torch.ops.kiln.linear_packed(x, packs[i], b, n, gelu=args.gelu)

        def mkl(i: int) -> torch.Tensor:
            y = torch.addmm(b, x, ws[i].t())
            return torch.nn.functional.gelu(y) if args.gelu else y

        def onednn(i: int) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x, ws[i], b, *post)
        torch.testing.assert_close(kiln(0), mkl(0), rtol=1e-4, atol=1e-3)
        turns = itertools.cycle(range(len(ws)))  # each call the next weight copy
        calls = {name: (lambda fn=fn: fn(next(turns))) for name, fn in (("kiln", kiln), ("mkl", mkl),
                                                                          ("onednn", onednn))}
        flop = 2 * m * n * k / 1e9
        rates: dict[str, list[float]] = {name: [] for name in calls}
        fractions = []
        for _ in range(args.rounds):
            peak = peak_gflops()
            for name, fn in calls.items():
                fn()
                rates[name].append(flop / min(_seconds(fn) for _ in range(2)))
            fractions.append(rates["kiln"][-1] / peak)
        line = "  ".join(f"{name} {statistics.median(r):6.1f}" for name, r in rates.items())
        print(f"{shape}: {line} GFLOP/s; kiln at {statistics.median(fractions):.0%} of the FMA peak "
              f"(peak median {peak:.1f})")


if __name__ == "__main__":
    main()
