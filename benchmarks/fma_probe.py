"""This core's fp32 FMA peak: the ceiling kiln's CPU GEMM and convolution are judged against (issue 4).

The probe (``kiln/runtime/peaks.py``, which ``kiln.profile`` also uses): a loop of independent vector FMA chains,
built with kiln's own compiler flags (``-O3 -march=native``), run on one thread; FLOPs = 2 per lane per FMA.

    python -m benchmarks.fma_probe            # prints GFLOP/s for 512-bit (where the core has AVX-512) and
                                              # 256-bit vectors
"""
from __future__ import annotations

from kiln.runtime.peaks import fma_probes


def probes() -> list[tuple[str, float]]:
    """(probe, GFLOP/s) for each vector width this core has."""
    return fma_probes()


def peak_gflops() -> float:
    """This core's fp32 FMA peak (the fastest probe), GFLOP/s."""
    return max(g for _, g in probes())


def main() -> None:
    for name, gflops in probes():
        print(f"{name}: {gflops:7.1f} GFLOP/s fp32 (1 thread)")


if __name__ == "__main__":
    main()
