"""Sweep the persistent-reduction schedule (rows per program, warps) on one model and print device time per
call for each: evidence for the heuristic in kiln/codegen/triton.py.

    python -m benchmarks.gpu_sched_sweep --model chain --dtype bf16
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
    args = p.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model, inputs = models.build(args.model, device="cuda", dtype=dtype)
    for xblock in (1, 2, 4):
        for warps in (4, 8, 16, 32):
            torch._dynamo.reset()
            try:
                rows = profile(kiln.compile(model, triton_persistent_schedule=f"{xblock},{warps}"), inputs)
                kern = [r for r in rows if r[0].startswith("kernel_")]
                print(f"xblock {xblock:2d} warps {warps:2d}: kernels {sum(r[2] for r in kern):8.1f} us  "
                      f"all {sum(r[2] for r in rows):8.1f} us", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"xblock {xblock} warps {warps}: {type(exc).__name__}: {str(exc)[:100]}")


if __name__ == "__main__":
    main()
