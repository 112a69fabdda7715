"""Where kiln's compile time goes on one zoo model: the first call (Dynamo, AOTAutograd, kiln, the first run)
under cProfile with an empty kiln cache, then kiln's compile phases and the functions with the most cumulative
time below kiln's backend entry point.

    python -m benchmarks.compile_profile --model opt --device cuda --dtype bf16 [--mode default] [--top 40]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="opt")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--mode", default="default")
    p.add_argument("--top", type=int, default=40, help="functions listed, by cumulative time")
    p.add_argument("--save", default=None, help="write the raw profile here (pstats format)")
    args = p.parse_args()
    os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-compile-profile-"))
    import torch
    import kiln
    from benchmarks.gpu_memory import DTYPES
    from benchmarks.zoo import builder
    from kiln.report import mark, reports_since
    dtype = getattr(torch, DTYPES[args.dtype])
    model, inputs = builder("sdpa")(args.model, device=args.device, dtype=dtype)
    model.eval()
    position = mark()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    with torch.inference_mode():
        profiler.enable()
        kiln.compile(model, mode=args.mode)(*inputs)
        profiler.disable()
    print(f"{args.model} {args.device} {args.dtype} {args.mode}: first call {time.perf_counter() - start:.2f} s "
          f"(under cProfile)")
    for report in reports_since(position):
        print("  phases:", ", ".join(f"{k} {v:.2f} s" for k, v in report.phases.items()))
    if args.save:
        profiler.dump_stats(args.save)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats(r"kiln|triton|inductor|_functorch|fx", args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
