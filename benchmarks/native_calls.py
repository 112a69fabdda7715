"""What calling kiln's library ops from the generated C++ saves (``kiln/runtime/native.py``), one process, one thread.

1. The cold call: one ``kiln::linear_packed`` call on a tiny product, timed warm (right after the same call) and
   right after a 64x1024x4096 GEMM whose weight came from memory, as in a model.  The difference is what Python
   and the dispatcher cost once the GEMM has evicted them.
2. Per model: the same model compiled with native calls (the default) and without (``native_calls=False``: every
   kiln op through Python), called alternately; the median per-round time ratio.

    python -m benchmarks.native_calls [--models mlp,resnet18,gpt] [--rounds 15] [--mode max-autotune]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def cold_call(rounds: int) -> None:
    from kiln.library.gemm.source import schedule_for
    from kiln.library.gemm import op as cpu_gemm
    from kiln.tune import timing
    lib = cpu_gemm.library()
    m, k, n = 64, 1024, 4096
    s = schedule_for(m, k)
    x, bias, out = torch.randn(m, k), torch.randn(n), torch.empty(m, n)
    packs = [cpu_gemm.pack_weight(torch.randn(n, k)) for _ in range(timing.cold_copies(4 * n * k))]
    xs, bs, outs = torch.randn(4, 16), torch.randn(16), torch.empty(4, 16)
    ps = cpu_gemm.pack_weight(torch.randn(16, 16))

    def tiny() -> None:
        torch.ops.kiln.linear_packed.out(xs, ps, bs, 16, out=outs)

    warm, cold = [], []
    for r in range(rounds):
        for p in packs:
            tiny()
            start = time.perf_counter()
            tiny()
            warm.append(time.perf_counter() - start)
            lib.kiln_gemm(x.data_ptr(), k, p.data_ptr(), bias.data_ptr(), out.data_ptr(), n, m, n, k, s.kc, s.mc, 0, 1)
            start = time.perf_counter()
            tiny()
            cold.append(time.perf_counter() - start)
    print(f"one kiln::linear_packed call through Python: warm {statistics.median(warm) * 1e6:.0f} us, right after a "
          f"{m}x{k}x{n} GEMM on a cold weight {statistics.median(cold) * 1e6:.0f} us")


def models_ab(names: list[str], rounds: int, mode: str) -> None:
    import kiln
    from benchmarks import models
    for name in names:
        model, inputs = models.build(name)
        model.eval()
        with torch.inference_mode():
            compiled = {"native": kiln.compile(model, mode=mode),
                        "python": kiln.compile(model, mode=mode, native_calls=False)}
            for fn in compiled.values():
                for _ in range(3):
                    fn(*inputs)
            times: dict[str, list[float]] = {key: [] for key in compiled}
            for _ in range(rounds):
                for key, fn in compiled.items():
                    start = time.perf_counter()
                    fn(*inputs)
                    times[key].append(time.perf_counter() - start)
        ratio = statistics.median(p / q for p, q in zip(times["python"], times["native"]))
        print(f"{name}: native calls {statistics.median(times['native']) * 1e3:.2f} ms, through Python "
              f"{statistics.median(times['python']) * 1e3:.2f} ms; per round python/native {ratio:.3f}", flush=True)
        torch._dynamo.reset()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,resnet18,gpt")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--mode", default="max-autotune")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cold_call(args.rounds)
    models_ab([m for m in args.models.split(",") if m], args.rounds, args.mode)


if __name__ == "__main__":
    main()
