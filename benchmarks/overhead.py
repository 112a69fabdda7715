"""Per-call overhead: a tiny graph (x * 2 + 1 on 16 floats) where the work is nothing and the time is the
runtime's own cost.  Prints median microseconds per call for eager, Inductor and kiln, measured interleaved
in one process (Dynamo's guard check is part of both compiled numbers)."""
from __future__ import annotations

import statistics
import time

import torch

import kiln


def _per_call_us(fn, x, calls: int = 2000) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    torch.set_num_threads(1)

    def f(x):
        return x * 2 + 1

    x = torch.randn(16)
    fns = {"eager": f, "inductor": torch.compile(f), "kiln": kiln.compile(f)}
    samples: dict[str, list[float]] = {k: [] for k in fns}
    with torch.inference_mode():
        for fn in fns.values():
            fn(x)
        for _ in range(7):
            for name, fn in fns.items():
                samples[name].append(_per_call_us(fn, x))
    for name, values in samples.items():
        print(f"{name:<9} {statistics.median(values):7.1f} us per call")
    mod = next(r for r in kiln.report.reports() if r.kernels)
    print(f"(kiln: {len(mod.kernels)} kernel, {len(mod.externs)} extern calls)")


if __name__ == "__main__":
    main()
