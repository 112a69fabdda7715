"""This core's fp32 FMA peak: the ceiling kiln's CPU GEMM and convolution are judged against (issue 4).

A loop of independent vector FMA chains (enough chains to cover the FMA latency on every port), built with
kiln's own compiler flags (``-O3 -march=native``), run on one thread; FLOPs = 2 per lane per FMA.  The chains
and the two operands must all stay in registers: 16 chains of 256-bit vectors need 18 of AVX2's 16 ymm
registers, and the three spilled chains then ran through memory every iteration (an AVX2 core read 52.6
GFLOP/s, below what GEMMs reach on it), so the 256-bit probe runs 12 chains.

    python -m benchmarks.fma_probe            # prints GFLOP/s for 512-bit (where the core has AVX-512) and
                                              # 256-bit vectors
"""
from __future__ import annotations

import ctypes
import time

SOURCE = r"""
#include <cstdint>
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
// CHAINS independent accumulators: each FMA depends only on its own chain, so the ports stay busy.
#define PROBE(NAME, V, LANES, CHAINS)                                                        \
  extern "C" double NAME(int64_t iters) {                                                    \
    V acc[CHAINS]; V a, b;                                                                   \
    for (int l = 0; l < LANES; ++l) { a[l] = 1.0f + 1e-7f * l; b[l] = 0.999999f; }           \
    for (int c = 0; c < CHAINS; ++c) acc[c] = a * (float)(c + 1);                            \
    for (int64_t i = 0; i < iters; ++i) {                                                    \
      _Pragma("GCC unroll 16")                                                               \
      for (int c = 0; c < CHAINS; ++c) acc[c] = acc[c] * b + a;                              \
      __asm__ volatile("" : "+x"(a));                                                        \
    }                                                                                        \
    double s = 0; for (int c = 0; c < CHAINS; ++c) for (int l = 0; l < LANES; ++l) s += acc[c][l]; \
    return s;                                                                                \
  }
#ifdef __AVX512F__
PROBE(fma512, v16, 16, 16)
#endif
PROBE(fma256, v8, 8, 12)
"""


def measure(fn, lanes: int, chains: int = 16, iters: int = 20_000_000) -> float:
    """Best of 5 runs, GFLOP/s."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        fn(iters)
        best = min(best, time.perf_counter() - start)
    return 2 * lanes * chains * iters / best / 1e9


def probes() -> list[tuple[str, float]]:
    """(probe, GFLOP/s) for each vector width this core has."""
    from kiln.runtime.build import load_module
    lib = load_module(SOURCE, name="fma_probe").lib
    out = []
    for name, lanes, chains in (("fma512", 16, 16), ("fma256", 8, 12)):
        if not hasattr(lib, name):  # no AVX-512 on this core
            continue
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_double
        fn(1000)
        out.append((name, measure(fn, lanes, chains)))
    return out


def peak_gflops() -> float:
    """This core's fp32 FMA peak (the fastest probe), GFLOP/s."""
    return max(g for _, g in probes())


def main() -> None:
    for name, gflops in probes():
        print(f"{name}: {gflops:7.1f} GFLOP/s fp32 (1 thread)")


if __name__ == "__main__":
    main()
