"""Peak GPU memory of one compiled call, per model and backend, each backend in a fresh process.

The figure is ``torch.cuda.max_memory_allocated()`` over one steady-state call, minus what was allocated
before the backend was created (the model's weights and the inputs, and the current stream's cuBLAS
workspace, made by one eager call).  So it counts everything the backend holds (arenas, weight copies, CUDA
graph outputs, workspaces of its own streams) plus what the call allocates.  A fresh process per backend
keeps one backend's frees (CUDA-graph trees clear cuBLAS workspaces) out of another's figure.

    python -m benchmarks.gpu_memory --models seed,gpt --backends eager,inductor,inductor-ro,kiln,kiln-ro
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def measure(model_name: str, backend: str, dtype: str) -> dict:
    """In this process: build, compile, warm up, then measure one call."""
    import torch
    from benchmarks import models
    from benchmarks.runner import make_backend
    model, inputs = models.build(model_name, device="cuda", dtype=getattr(torch, DTYPES[dtype]))
    with torch.inference_mode():
        model(*inputs)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        base_reserved = torch.cuda.memory_reserved()
        fn = make_backend(backend, model, "default", inputs)
        for _ in range(3):
            fn(*inputs)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        out = fn(*inputs)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
    return {"model": model_name, "backend": backend, "peak_mib": peak / 2**20, "held_mib": held / 2**20,
            "reserved_mib": (torch.cuda.memory_reserved() - base_reserved) / 2**20}


def _measure_in_child(model_name: str, backend: str, dtype: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_memory", "--dtype", dtype,
                           "--one", model_name, backend], capture_output=True, text=True)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"model": model_name, "backend": backend, "error": proc.stderr[-2000:]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="seed,mlp,resnet18,resnet18_b16,gpt,gpt_b8x512,chain")
    p.add_argument("--backends", default="eager,inductor,inductor-ro,kiln,kiln-ro")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--jobs", type=int, default=4, help="processes measuring at once")
    p.add_argument("--json")
    p.add_argument("--one", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.dtype)))
        return
    backends = args.backends.split(",")
    jobs = [(m, b) for m in args.models.split(",") for b in backends]
    # memory statistics are per process, so several processes can measure at once
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda job: _measure_in_child(*job, args.dtype), jobs))
    print(f"{'model':14s} " + " ".join(f"{b:>13s}" for b in backends) + "   (peak MiB per call)")
    for model_name in args.models.split(","):
        line = [f"{r['peak_mib']:13.2f}" if "peak_mib" in r else f"{'ERROR':>13s}"
                for r in rows if r["model"] == model_name]
        print(f"{model_name:14s} " + " ".join(line), flush=True)
    for row in rows:
        if "error" in row:
            print(f"{row['model']} {row['backend']}: {row['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
