"""A compiled optimizer step (issue 20 point 3): ``torch.compile(opt.step)`` with Inductor and kiln against eager's
``opt.step()``, in one process, on the same parameters and gradients.

    python -m benchmarks.optimizer_step [--optimizers sgd,adam,adamw] [--foreach both|on|off] [--layers 8]
                                        [--dim 512] [--steps 20] [--device cpu|cuda] [--threads 1] [--json F]

Each backend steps its own copy of ``--layers`` Linear(dim, dim) layers (weights and biases) whose gradients are
fixed random tensors; the steps are interleaved across backends, and the median step is reported with the first
step (compile) and how far each backend's parameters are from eager's after the steps (largest relative
difference of a parameter, 2-norm).  SGD: momentum 0.9, weight decay 0.01; Adam: amsgrad; AdamW: weight decay
0.01.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import torch

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda p, fe: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=0.01, foreach=fe),
    "adam": lambda p, fe: torch.optim.Adam(p, lr=1e-3, amsgrad=True, foreach=fe),
    "adamw": lambda p, fe: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, foreach=fe),
}


def _params(layers: int, dim: int, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    params = []
    for _ in range(layers):
        for shape in ((dim, dim), (dim,)):
            p = torch.randn(*shape, generator=g).to(device).requires_grad_()
            p.grad = torch.randn(*shape, generator=g).to(device)
            params.append(p)
    return params


def bench(name: str, foreach: bool, args: argparse.Namespace) -> dict[str, Any]:
    base = _params(args.layers, args.dim, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    runs = {}
    for backend in args.backends.split(","):
        params = [p.detach().clone().requires_grad_() for p in base]
        for p, q in zip(params, base):
            p.grad = q.grad.clone()
        opt = OPTIMIZERS[name](params, foreach)
        if backend != "eager":
            if backend == "kiln":
                import kiln  # noqa: F401  (registers the backend)
            torch._dynamo.reset()
            step = torch.compile(opt.step, backend=backend)
        else:
            step = opt.step
        runs[backend] = {"params": params, "step": step, "times": []}
    for backend, run in runs.items():  # the first step: compile included
        sync()
        start = time.perf_counter()
        run["step"]()
        sync()
        run["compile_s"] = time.perf_counter() - start
    for k in range(args.steps):
        order = list(runs.items())
        order = order[k % len(order):] + order[:k % len(order)]
        for backend, run in order:
            sync()
            start = time.perf_counter()
            run["step"]()
            sync()
            run["times"].append(time.perf_counter() - start)
    eager = runs.get("eager")
    out = {}
    for backend, run in runs.items():
        drift = 0.0
        if eager is not None:
            for p, q in zip(run["params"], eager["params"]):
                drift = max(drift, ((p - q).double().norm() / q.double().norm()).item())
        out[backend] = {"step_ms": statistics.median(run["times"]) * 1e3, "compile_s": run["compile_s"],
                        "drift": drift}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--optimizers", default="sgd,adam,adamw")
    ap.add_argument("--foreach", default="both", choices=("both", "on", "off"))
    ap.add_argument("--backends", default="eager,inductor,kiln")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.foreach]
    results = []
    print("| optimizer | foreach | backend | step ms | vs eager | first step s | drift from eager |")
    print("|---|---|---|---|---|---|---|")
    for name in args.optimizers.split(","):
        for foreach in modes:
            rows = bench(name, foreach, args)
            results.append({"optimizer": name, "foreach": foreach, "rows": rows})
            eager_ms = rows.get("eager", {}).get("step_ms", float("nan"))
            for backend, r in rows.items():
                print(f"| {name} | {foreach} | {backend} | {r['step_ms']:.3f} | {eager_ms / r['step_ms']:.2f} | "
                      f"{r['compile_s']:.2f} | {r['drift']:.1e} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
