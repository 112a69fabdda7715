"""Cold compile time on the GPU or the CPU, each (model, backend) in a fresh process with empty caches (kiln's
module cache and tuning database, Inductor's and Triton's caches), and where kiln's time goes (its compile
phases).

The figure is the first call's wall time (TorchDynamo, AOTAutograd, the backend's compile, the first run),
as in the runner's compile column, but with nothing warm in the process: no worker pool, no imported Triton
module, no cache.

    python -m benchmarks.cold_compile --models mlp,gpt --backends kiln,inductor [--kiln-workers 0,8]
    python -m benchmarks.cold_compile --device cpu --threads 1 --dtype fp32 --models seed,mlp,resnet18,gpt,chain
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def one(model_name: str, backend: str, mode: str, dtype: str, device: str = "cuda", threads: int = 0) -> dict:
    import torch
    from benchmarks import models
    from benchmarks.gpu_memory import DTYPES
    from benchmarks.runner import make_backend
    from kiln.report import mark, reports_since
    if threads:
        torch.set_num_threads(threads)
    model, inputs = models.build(model_name, device=device, dtype=getattr(torch, DTYPES[dtype]))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.inference_mode():
        sync()
        position = mark()
        start = time.perf_counter()
        fn = make_backend(backend, model, mode, inputs)
        fn(*inputs)
        sync()
        seconds = time.perf_counter() - start
    phases: dict = {}
    for r in reports_since(position):
        for k, v in r.phases.items():
            phases[k] = phases.get(k, 0) + v
        phases["kiln_total"] = phases.get("kiln_total", 0) + r.compile_seconds
    return {"model": model_name, "backend": backend, "first_call_s": seconds, "phases": phases}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="seed,mlp,resnet18,resnet18_b16,gpt,gpt_b8x512,chain")
    p.add_argument("--backends", default="kiln,inductor")
    p.add_argument("--kiln-workers", default="", help="comma list of KILN_COMPILE_WORKERS values to compare")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--threads", type=int, default=0, help="torch threads (CPU; 0: torch's default)")
    p.add_argument("--json")
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(*args.one, "default", args.dtype, args.device, args.threads)))
        return
    variants = []
    for backend in args.backends.split(","):
        if backend.startswith("kiln") and args.kiln_workers:
            variants += [(backend, w) for w in args.kiln_workers.split(",")]
        else:
            variants.append((backend, None))
    rows = []
    for model_name in args.models.split(","):
        for backend, workers in variants:
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(os.environ, KILN_CACHE_DIR=f"{tmp}/kiln", TRITON_CACHE_DIR=f"{tmp}/triton",
                           TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor")
                if workers is not None:
                    env["KILN_COMPILE_WORKERS"] = workers
                proc = subprocess.run([sys.executable, "-m", "benchmarks.cold_compile", "--dtype", args.dtype,
                                       "--device", args.device, "--threads", str(args.threads),
                                       "--one", model_name, backend], capture_output=True, text=True, env=env)
            try:
                row = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                row = {"model": model_name, "backend": backend, "error": proc.stderr[-1500:]}
            row["workers"] = workers
            rows.append(row)
            label = backend + (f"(workers={workers})" if workers is not None else "")
            if "error" in row:
                print(f"{model_name:14s} {label:22s} ERROR {row['error']}", flush=True)
                continue
            phases = ", ".join(f"{k} {v:.2f}" for k, v in row["phases"].items())
            print(f"{model_name:14s} {label:22s} {row['first_call_s']:6.2f} s  {phases}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
