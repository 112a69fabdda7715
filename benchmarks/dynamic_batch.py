"""Varying batch sizes (issue 19): one dynamic compile against kiln's static compile of each size, eager and
Inductor in one process.

    python -m benchmarks.dynamic_batch --model resnet18|mlp [--sizes 1,3,8,16,32] [--device cpu|cuda]
                                       [--dtype fp32|bf16] [--threads 1] [--repeats 5] [--calls 3]
                                       [--backends eager,kiln-static,kiln,kiln-dyn,inductor] [--json F]

Backends:
- ``kiln-static``: a ``dynamic=False`` compile per size (each from a frame of its own), the bar a dynamic graph
  is held to (issue 19: within 10% of it at every size);
- ``kiln``: ``torch.compile(backend="kiln")`` as users call it - automatic dynamic: the first size compiles
  static, the second recompiles with the batch dimension symbolic;
- ``kiln-mark``: ``torch._dynamo.mark_dynamic(x, 0)`` on every input, the batch symbolic from the first call;
- ``kiln-dyn``: ``dynamic=True`` (every input dimension symbolic, the image's height and width too);
- ``inductor``, ``inductor-dyn``: Inductor, automatic dynamic and ``dynamic=True``.

Compiled callables are made from frames of their own: Dynamo keeps what it learnt about a frame (automatic
dynamic's "this dimension changed") per code object.  The first pass calls each backend once per size in order
(compiles included); then per size ``--repeats`` rounds, the backends interleaved, each the median of
``--calls`` calls; the table gives the median over rounds.  Reported per backend: graphs compiled (Dynamo's
count), graphs kiln ran eagerly and graphs with symbolic sizes (its reports), and the largest difference from
eager's outputs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import torch

from benchmarks.dynamic_shapes import _sync, first_pass
from benchmarks.models import mlp, resnet18

MODELS = {"resnet18": (resnet18, [1, 3, 8, 16, 32]), "mlp": (mlp, [1, 2, 5, 16, 33, 64, 100, 128, 200, 256])}
BACKENDS = ["eager", "kiln-static", "kiln", "kiln-mark", "kiln-dyn", "inductor"]


def _frame(model: torch.nn.Module, label: str) -> Callable[..., Any]:
    """A function calling ``model`` from a code object of its own."""
    namespace: dict[str, Any] = {}
    exec(compile("def call(x):\n    return model(x)\n", f"<dynamic_batch {label}>", "exec"), {"model": model},
         namespace)
    return namespace["call"]


class Backend:
    """One backend's callable per size (the static one compiles a graph per size)."""

    def __init__(self, name: str, model: torch.nn.Module):
        self.name = name
        compiler = name.split("-")[0]
        if compiler == "kiln":
            import kiln  # noqa: F401  (registers the backend)
        if name == "eager":
            self.fn: Callable[..., Any] | None = model
        elif name.endswith("-static"):
            self.fn = None
            self.per_size: dict[int, Callable[..., Any]] = {}
            self.model = model
        elif name.endswith("-mark"):
            # (marked before the compiled frame: Dynamo reads the mark on the argument it receives)
            inner = torch.compile(_frame(model, name), backend=compiler)

            def marked(x: torch.Tensor, inner: Callable[..., Any] = inner) -> Any:
                torch._dynamo.mark_dynamic(x, 0)
                return inner(x)
            self.fn = marked
        else:
            kwargs = {"dynamic": True} if name.endswith("-dyn") else {}
            self.fn = torch.compile(_frame(model, name), backend=compiler, **kwargs)

    def __call__(self, x: torch.Tensor) -> Any:
        if self.fn is not None:
            return self.fn(x)
        b = x.shape[0]
        if b not in self.per_size:
            compiler = self.name.split("-")[0]
            self.per_size[b] = torch.compile(_frame(self.model, f"{self.name} {b}"), backend=compiler,
                                             dynamic=False)
        return self.per_size[b](x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18", choices=sorted(MODELS))
    ap.add_argument("--sizes", default=None, help="batch sizes, in the order of the first pass")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = 64
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 64
    factory, default_sizes = MODELS[args.model]
    sizes = [int(v) for v in args.sizes.split(",")] if args.sizes else default_sizes
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model, (example,) = factory(batch=sizes[0], device=args.device, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    inputs = {b: torch.randn((b, *example.shape[1:]), generator=gen).to(args.device, dtype) for b in sizes}
    names = args.backends.split(",")
    results: dict[str, dict[str, Any]] = {}
    backends: dict[str, Backend] = {}
    with torch.inference_mode():
        reference = {b: model(x).float() for b, x in inputs.items()}
        for name in names:
            results[name] = first_pass(name, lambda name=name: Backend(name, model), sizes, inputs, reference,
                                       args.device)
            backends[name] = results[name].pop("fn")
            results[name].pop("reports")  # (kiln's CompileReports: not for the JSON)
            results[name]["ms"] = {}
            first, err = results[name]["first_pass_s"], results[name]["max_rel_err"]
            print(f"{name}: first pass {first:.2f} s, {results[name]['graphs']} graph(s)"
                  + (f" ({results[name]['symbolic_graphs']} symbolic {results[name]['ranges']}, "
                     f"{results[name]['eager_graphs']} run eagerly)" if name.startswith("kiln") else "")
                  + f", max rel diff from eager {err:.2e}", flush=True)
        for b in sizes:
            rounds: dict[str, list[float]] = {n: [] for n in names}
            for r in range(args.repeats):
                order = names[r % len(names):] + names[:r % len(names)]  # (the order rotates every round)
                for name in order:
                    times = []
                    for _ in range(args.calls):
                        _sync(args.device)
                        t0 = time.perf_counter()
                        backends[name](inputs[b])
                        _sync(args.device)
                        times.append(time.perf_counter() - t0)
                    rounds[name].append(statistics.median(times))
            for name in names:
                results[name]["ms"][b] = statistics.median(rounds[name]) * 1e3
            print(f"batch {b}: " + ", ".join(f"{n} {results[n]['ms'][b]:.3f}" for n in names), flush=True)
    head = [n for n in names if n != "eager"]
    print("\nms per call (median); in brackets: time / kiln-static's" if "kiln-static" in names else "")
    print("| batch | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for b in sizes:
        cells = []
        for n in names:
            ms = results[n]["ms"][b]
            ratio = (f" ({ms / results['kiln-static']['ms'][b]:.2f})"
                     if "kiln-static" in names and n in head and n != "kiln-static" else "")
            cells.append(f"{ms:.3f}{ratio}")
        print(f"| {b} | " + " | ".join(cells) + " |")
    print("| graphs | " + " | ".join(str(results[n]["graphs"]) for n in names) + " |")
    print("| first pass s | " + " | ".join(f"{results[n]['first_pass_s']:.2f}" for n in names) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "device": args.device, "dtype": args.dtype, "threads": args.threads,
                       "sizes": sizes, "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
