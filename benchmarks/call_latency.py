"""Latency of one call on the GPU, eager against kiln's default mode: each call synchronized before and after
(launch and host overhead count), median of 30 calls, in rounds that alternate them.  kiln runs its generated
wrapper (``kiln.codegen.gpu_call``); "interpreted" is the same compiled graph run by the interpreting call.

    python -m benchmarks.call_latency --models mlp,seed,gpt,resnet18 [--rounds 3]
"""
from __future__ import annotations

import argparse
import time

import torch


def median_call_us(fn, inputs, calls: int = 30) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn(*inputs)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="mlp,seed,gpt,resnet18")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import kiln
    from benchmarks import models
    for name in args.models.split(","):
        model, inputs = models.build(name, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            compiled = kiln.compile(model)
            interpreted = kiln.compile(model, gpu_call_wrapper=False)  # the plan interpreted step by step
            for _ in range(20):
                compiled(*inputs)
                interpreted(*inputs)
                model(*inputs)
            for r in range(args.rounds):
                eager, ours = median_call_us(model, inputs), median_call_us(compiled, inputs)
                slow = median_call_us(interpreted, inputs)
                print(f"{name:8s} round {r}: eager {eager:8.1f} us   kiln default {ours:8.1f} us   "
                      f"(interpreted {slow:8.1f} us)", flush=True)


if __name__ == "__main__":
    main()
