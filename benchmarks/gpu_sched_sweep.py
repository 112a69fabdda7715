"""Sweep the persistent-reduction schedule (rows per program, warps) on one model and print device time per
call for each: evidence for the heuristic in kiln/codegen/triton.py.

    python -m benchmarks.gpu_sched_sweep --model chain --dtype bf16
    python -m benchmarks.gpu_sched_sweep --model seed_b16 --dtype bf16 --tiles    (2-D tiled pointwise kernels)
    python -m benchmarks.gpu_sched_sweep --zoo --model bert --dtype bf16         (a zoo model at full size)
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.gpu_profile import profile


def main() -> None:
    import kiln
    from benchmarks import models
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="chain")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--tiles", action="store_true", help="sweep the 2-D tiles of transposing pointwise kernels")
    p.add_argument("--zoo", action="store_true", help="--model names a zoo model (kiln/testing/zoo.py), full size")
    args = p.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if args.zoo:
        from benchmarks.zoo import builder
        model, inputs = builder("sdpa")(args.model, device="cuda", dtype=dtype)
        model.eval()
    else:
        model, inputs = models.build(args.model, device="cuda", dtype=dtype)
    if args.tiles:
        for tiles in ("64,32,4", "64,64,4", "64,64,8", "128,32,4", "128,32,8", "128,64,8", "32,64,4", "32,32,4",
                      "256,16,8", "128,128,8"):
            torch._dynamo.reset()
            rows = profile(kiln.compile(model, triton_tile_schedule=tiles), inputs)
            kern = [r for r in rows if r[0].startswith("kernel_")]
            print(f"tiles {tiles:>10}: kernels {sum(r[2] for r in kern):8.1f} us  all {sum(r[2] for r in rows):8.1f}"
                  f" us  " + " ".join(f"{r[0]} {r[2]:.1f}" for r in kern), flush=True)
        return
    for xblock in (1, 2, 4, 8):
        for warps in (2, 4, 8, 16):
            torch._dynamo.reset()
            try:
                rows = profile(kiln.compile(model, triton_persistent_schedule=f"{xblock},{warps}"), inputs)
                kern = [r for r in rows if r[0].startswith("kernel_")]
                print(f"xblock {xblock:2d} warps {warps:2d}: kernels {sum(r[2] for r in kern):8.1f} us  "
                      f"all {sum(r[2] for r in rows):8.1f} us  " + " ".join(f"{r[0]} {r[2]:.1f}" for r in kern[:4]),
                      flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"xblock {xblock} warps {warps}: {type(exc).__name__}: {str(exc)[:100]}")


if __name__ == "__main__":
    main()
