"""The demo: compile the seed Conv-BN-ReLU model and the 4-layer GPT with kiln, print kiln's report for the
seed model and the speedups over eager (1 thread, interleaved timing, medians)."""
from __future__ import annotations

import statistics
import time

import torch

import kiln
from benchmarks.models import MODELS
from kiln.report import mark, reports_since


def _time(fn, inputs, calls: int = 3) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    torch.set_num_threads(1)
    for name in ("seed", "gpt"):
        model, inputs = MODELS[name]()
        position = mark()
        with torch.inference_mode():
            expected = model(*inputs)
            start = time.perf_counter()
            compiled = kiln.compile(model)
            got = compiled(*inputs)
            compile_s = time.perf_counter() - start
            err = (got - expected).abs().max().item()
            ratios, eager_ms, kiln_ms = [], [], []
            for _ in range(5):
                e, k = _time(model, inputs), _time(compiled, inputs)
                eager_ms.append(e)
                kiln_ms.append(k)
                ratios.append(e / k)
        report = reports_since(position)[-1]
        if name == "seed":
            print(report.format())
        print(f"\n== {name}: eager {statistics.median(eager_ms):.2f} ms, kiln {statistics.median(kiln_ms):.2f} ms, "
              f"speedup {statistics.median(ratios):.2f}x, first call (compile) {compile_s:.2f} s, "
              f"max abs error {err:.2e}; {len(report.kernels)} generated kernels (fused elementwise and reduction "
              f"work), library calls: {', '.join(sorted(set(report.externs))) or 'none'}")


if __name__ == "__main__":
    main()
