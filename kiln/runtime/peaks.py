"""The machine's limits a step's time is judged against: arithmetic peak and memory bandwidth.

CPU: the fp32 FMA peak of one core from a probe (a loop of independent vector FMA chains, built with kiln's own
flags, ``-O3 -march=native``; FLOPs = 2 per lane per FMA), times the thread count; bandwidth from copying a
buffer far larger than the last-level cache.  GPU: the rate of a large cuBLAS matmul in the dtype at hand and
of a large device-to-device copy - what the hardware delivers to well-tuned code, not the datasheet.

Measured once per process (``functools.lru_cache``); ``benchmarks/fma_probe.py`` prints the probes.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import time

import torch

FMA_PROBE = r"""
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
# (probe, lanes, chains).  The chains and both operands must stay in registers: 16 chains of 256-bit vectors need
# 18 of AVX2's 16 ymm registers, and the spilled chains then ran through memory (an AVX2 core read 52.6 GFLOP/s,
# below what GEMMs reach on it), so the 256-bit probe runs 12 chains.
PROBES = (("fma512", 16, 16), ("fma256", 8, 12))


def fma_probes(iters: int = 20_000_000, repeats: int = 5) -> list[tuple[str, float]]:
    """(probe, GFLOP/s on one thread, best of ``repeats``) for each vector width this core has."""
    from kiln.runtime.build import load_module
    lib = load_module(FMA_PROBE, name="fma_probe").lib
    out = []
    for name, lanes, chains in PROBES:
        if not hasattr(lib, name):  # no AVX-512 on this core
            continue
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_double
        seconds = _best_seconds(lambda: fn(iters), torch.device("cpu"), repeats)
        out.append((name, 2 * lanes * chains * iters / seconds / 1e9))
    return out


@dataclasses.dataclass(frozen=True)
class Peaks:
    flops_per_s: float   # arithmetic peak for the graph's dtype (CPU: fp32 FMA, all threads)
    bytes_per_s: float   # memory bandwidth (bytes read + written per second)
    what: str            # how they were measured, for the report

    def limit_s(self, flops: float, nbytes: float) -> float:
        """The least time ``flops`` and ``nbytes`` can take: the roofline bound."""
        return max(flops / self.flops_per_s, nbytes / self.bytes_per_s)


@functools.lru_cache(maxsize=None)
def cpu(threads: int) -> Peaks:
    gflops = max(g for _, g in fma_probes(iters=5_000_000, repeats=3))
    bandwidth = _copy_bandwidth(torch.device("cpu"), 256 << 20)
    return Peaks(gflops * 1e9 * threads, bandwidth,
                 f"fp32 FMA probe {gflops:.1f} GFLOP/s x {threads} thread(s); copy {bandwidth / 1e9:.1f} GB/s")


@functools.lru_cache(maxsize=None)
def gpu(device: torch.device, dtype: torch.dtype) -> Peaks:
    n = 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    flops_per_s = 2 * n ** 3 / _best_seconds(lambda: torch.mm(a, a), device)
    bandwidth = _copy_bandwidth(device, 1 << 30)
    return Peaks(flops_per_s, bandwidth, f"{dtype} {n}^3 matmul {flops_per_s / 1e12:.0f} TFLOP/s; "
                                         f"copy {bandwidth / 1e9:.0f} GB/s ({torch.cuda.get_device_name(device)})")


def _copy_bandwidth(device: torch.device, nbytes: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best_seconds(lambda: dst.copy_(src), device)


def _best_seconds(fn, device: torch.device, repeats: int = 5) -> float:
    """The best of ``repeats`` timed calls of ``fn``, after one untimed call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best
