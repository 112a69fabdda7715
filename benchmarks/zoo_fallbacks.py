"""Does every zoo model compile whole in a mode?  Each model (CI or full size) is compiled with kiln in the given
modes and called once; prints the graphs it compiled and any eager fallback with its reason (issue 18: no zoo
model falls back, in any mode).  Dynamo is reset between models (they share the zoo wrapper's ``forward``, and
its recompile limit would otherwise send the ninth model to eager).

    python -m benchmarks.zoo_fallbacks --modes reduce-overhead,max-autotune            (CPU, CI size)
    KILN_TUNE_BUDGET_S=20 python -m benchmarks.zoo_fallbacks --modes max-autotune      (shorter tuning)
    python -m benchmarks.zoo_fallbacks --device cuda --dtype bf16 --full --modes max-autotune
"""
from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    import torch

    import kiln
    from benchmarks.zoo import builder
    from kiln.report import mark, reports_since
    from kiln.testing import zoo
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=None, help="comma-separated zoo models (default: all)")
    p.add_argument("--modes", default="default,reduce-overhead,max-autotune")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--full", action="store_true", help="full-size configs (default: the CI ones)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    names = args.models.split(",") if args.models else list(zoo.specs())
    failed = 0
    for mode in args.modes.split(","):
        for name in names:
            torch._dynamo.reset()
            model, inputs = builder("sdpa")(name, small=not args.full, device=args.device, dtype=dtype)
            model.eval()
            start, position = time.perf_counter(), mark()
            try:
                with torch.inference_mode():
                    kiln.compile(model, mode=mode)(*inputs)
                reports = reports_since(position)
                fallbacks = [r.fallback for r in reports if r.fallback]
                line = f"{len(reports)} graph(s)" + (f", FELL BACK: {fallbacks}" if fallbacks else ", whole")
                failed += bool(fallbacks) or not reports
            except Exception as exc:  # noqa: BLE001 - reported, the sweep goes on
                line, failed = f"ERROR {type(exc).__name__}: {str(exc)[:200]}", failed + 1
            print(f"{mode:16s} {name:14s} {line} ({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"{failed} model/mode pair(s) not compiled whole")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
