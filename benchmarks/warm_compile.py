"""Warm-cache compile time: each model compiled in a *new process* whose caches (kiln's module cache,
Inductor's FX/AOT caches) were filled by an earlier process.  Prints the first-call seconds (Dynamo tracing,
compile from cache, one run) per backend, best of ``--runs`` fresh processes after one filling run."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time, torch
torch.set_num_threads(1)
from benchmarks.models import MODELS
name, backend = sys.argv[1], sys.argv[2]
model, inputs = MODELS[name]()
with torch.inference_mode():
    start = time.perf_counter()
    if backend == "kiln":
        import kiln
        fn = kiln.compile(model)
    else:
        fn = torch.compile(model)
    fn(*inputs)
    print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def first_call_seconds(name: str, backend: str, env: dict[str, str]) -> float:
    proc = subprocess.run([sys.executable, "-c", CHILD, name, backend], env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="seed,mlp,resnet18,gpt,chain")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    caches = tempfile.mkdtemp(prefix="kiln-warm-")
    env = dict(os.environ, OMP_NUM_THREADS="1", KILN_CACHE_DIR=os.path.join(caches, "kiln"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"))
    print("| model | backend | cold s | warm s (best of %d new processes) |" % args.runs)
    print("|---|---|---|---|")
    for name in args.models.split(","):
        for backend in ("inductor", "kiln"):
            cold = first_call_seconds(name, backend, env)
            warm = min(first_call_seconds(name, backend, env) for _ in range(args.runs))
            print(f"| {name} | {backend} | {cold:.2f} | {warm:.2f} |", flush=True)


if __name__ == "__main__":
    main()
