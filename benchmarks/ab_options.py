"""A/B of kiln compile options on zoo models: the same model compiled twice (``--a`` and ``--b`` option sets, each
``key=value;key=value``), called in interleaved rounds on the same inputs; medians per round and their ratio.

    python -m benchmarks.ab_options --models bert,llama --b "disabled_passes=merge_linears" --threads 1
    python -m benchmarks.ab_options --device cuda --dtype bf16 --models bert --mode reduce-overhead \\
        --b "disabled_passes=merge_linears"

For deciding a pass or a rule on measured evidence; figures that go into RESULTS.md come from benchmarks/zoo.py.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch


def parse_options(text: str) -> dict[str, Any]:
    """kiln options from ``"a=1;b=x;c=true"`` (true/false as bools, integers as ints - ``gpu_recompute_limit=8`` -,
    the rest as text; kiln's config checks them)."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, value = part.split("=", 1)
        value = value.strip()
        number = value.lstrip("-")
        out[key.strip()] = {"true": True, "false": False}.get(value.lower(),
                                                              int(value) if number.isdigit() else value)
    return out


def _time(fn: Any, inputs: tuple, calls: int, device: str) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn(*inputs)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls
    t = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    return (time.perf_counter() - t) * 1e3 / calls


def main() -> None:
    import kiln
    from benchmarks.zoo import builder
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="bert")
    p.add_argument("--a", default="", help="options of A (default: none)")
    p.add_argument("--b", default="", help="options of B")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--mode", default="default")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    for name in args.models.split(","):
        model, inputs = builder("sdpa")(name, device=args.device, dtype=dtype)
        model.eval()
        with torch.inference_mode():
            fns = []
            for opts in (args.a, args.b):
                torch._dynamo.reset()
                fn = kiln.compile(model, mode=args.mode, **parse_options(opts))
                for _ in range(3):
                    fn(*inputs)
                fns.append(fn)
            times: list[list[float]] = [[], []]
            for _ in range(args.rounds):
                for k, fn in enumerate(fns):
                    times[k].append(_time(fn, inputs, args.calls, args.device))
        a, b = (statistics.median(t) for t in times)
        print(f"{name}: A {a:.3f} ms  B {b:.3f} ms  B/A {b / a:.3f}   (A: {args.a or '-'}; B: {args.b or '-'})",
              flush=True)


if __name__ == "__main__":
    main()
