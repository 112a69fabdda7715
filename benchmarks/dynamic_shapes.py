"""Varying sizes (issue 19): the suite's 4-layer GPT at batch 1 over 15 sequence lengths, two passes, eager /
Inductor / kiln in one process.

    python -m benchmarks.dynamic_shapes [--device cpu|cuda] [--dtype fp32|bf16] [--threads 1] [--repeats 3]
                                        [--backends eager,inductor,inductor-dyn,kiln,kiln-dyn] [--fresh-caches]
                                        [--json F]

For each backend: the first pass calls the model once per length in order (compiles included: the time from the
first call to the last result); the second pass times each length again (median of ``--repeats`` calls, the
backends interleaved per length) and sums over the lengths.  ``inductor``/``kiln``: ``torch.compile`` as users
call it (automatic dynamic: the second size recompiles with the changed dimension symbolic); ``-dyn``:
``dynamic=True``; ``-ro``: ``mode="reduce-overhead"`` (``kiln-dyn-ro``; with the flags in any order), ``-mat``:
``mode="max-autotune"``; ``-static``
(kiln): on the GPU a static module per size instead of kernels with size parameters; ``+option=value`` after a
kiln backend's name: that kiln option (an A/B in one process: ``kiln-dyn+gpu_attention_entry=composite``).  Reported
per backend: graphs compiled (Dynamo's count), graphs kiln ran eagerly (its reports),
both passes, and the largest difference from eager's outputs at any length.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import torch

from benchmarks.models import gpt

LENGTHS = [16, 23, 37, 50, 64, 77, 100, 128, 150, 200, 256, 300, 384, 400, 512]
BACKENDS = ["eager", "inductor", "inductor-dyn", "kiln", "kiln-dyn"]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _make(backend: str, model: torch.nn.Module) -> Callable[..., Any]:
    """The backend's callable.  Each compiled one calls the model from a frame of its own: Dynamo keeps what it
    learnt about a frame (automatic dynamic's "this dimension changed") per code object, so backends compiling
    the same ``forward`` would otherwise start from each other's knowledge (the second one's first graph
    already symbolic)."""
    if backend == "eager":
        return model
    backend, *extra = backend.split("+")  # kiln options after "+": "kiln-dyn+gpu_attention_entry=composite"
    name, *flags = backend.split("-")
    kwargs: dict[str, Any] = {"dynamic": True} if "dyn" in flags else {}
    if "ro" in flags:  # reduce-overhead (CUDA graphs; kiln records one per size)
        kwargs["mode"] = "reduce-overhead"
    if "mat" in flags:  # max-autotune (kiln: its GEMM's schedules tuned per size bucket as the lengths come)
        kwargs["mode"] = "max-autotune"
    if name == "kiln":
        import kiln  # noqa: F401  (registers the backend)
    namespace: dict[str, Any] = {}
    exec(compile("def call(ids):\n    return model(ids)\n", f"<dynamic_shapes {backend}>", "exec"),
         {"model": model}, namespace)
    if name == "kiln":  # (kiln's backend function itself: no need of the installed package's entry point)
        from kiln.frontend.dynamo import kiln_backend
        mode = kwargs.pop("mode", "default")
        # -static: the GPU's static module per size ([Note: a GPU module per size])
        options: dict[str, Any] = {"gpu_symbolic_kernels": False} if "static" in flags else {}
        options.update((k, _literal(v)) for k, v in (option.split("=", 1) for option in extra))

        def backend(gm: Any, example_inputs: Any) -> Any:
            return kiln_backend(gm, example_inputs, mode=mode, options=options, name="GPT")
        return torch.compile(namespace["call"], backend=backend, **kwargs)
    return torch.compile(namespace["call"], backend=name, **kwargs)


def _literal(text: str) -> Any:
    """An option's value from the command line: a Python literal (``False``, ``8``) where it is one, else text."""
    import ast
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def first_pass(name: str, make: Callable[[], Callable[..., Any]], order: list[int], inputs: dict[int, Any],
               reference: dict[int, torch.Tensor], device: str) -> dict[str, Any]:
    """Backend ``name``'s first pass: ``make()`` its callable, call it on ``inputs[k]`` for each ``k`` of ``order``
    (compiles included).  Returns the callable (``fn``), the seconds, Dynamo's graph count, kiln's graphs run
    eagerly and symbolic (its reports; kiln backends only), the largest absolute and relative differences from
    ``reference``."""
    from torch._dynamo.utils import counters
    from kiln.report import mark, reports_since
    position = mark()
    before = counters["stats"]["unique_graphs"]
    fn = make()
    err = rel = 0.0
    _sync(device)
    start = time.perf_counter()
    for k in order:
        out = fn(inputs[k])
        _sync(device)
        diff = (out.float() - reference[k]).abs().max().item()
        err, rel = max(err, diff), max(rel, diff / reference[k].abs().max().item())
    seconds = time.perf_counter() - start
    reports = reports_since(position) if name.startswith("kiln") else []
    return {"fn": fn, "reports": reports, "first_pass_s": seconds,
            "graphs": counters["stats"]["unique_graphs"] - before,
            "eager_graphs": sum(r.fallback is not None for r in reports),
            "eager_calls_first_pass": _eager_calls(reports),
            "symbolic_graphs": sum(r.dynamic is not None for r in reports),
            "ranges": [r.dynamic.get("ranges") for r in reports if r.dynamic],
            "max_abs_err": err, "max_rel_err": rel}


def breakdown(calls: dict[str, Callable[..., Any]], inputs: dict[int, Any], lengths: list[int],
              results: dict[str, dict[str, Any]], kernels: int = 0) -> None:
    """Per backend and length: the host's time to issue a call while the GPU is busy, the kernels' time per call
    and their number (``benchmarks.host_time``): is the call bound by the host or the device?  ``kernels``: also
    list each backend's that many longest kernels at each length."""
    from benchmarks.host_time import device_kernels, device_us, host_us
    if kernels:
        for T in lengths:
            for b, fn in calls.items():
                rows = device_kernels(fn, (inputs[T],))
                print(f"{b} at length {T}: {sum(r[1] for r in rows):.0f} us in {sum(r[2] for r in rows)} kernels")
                for name, us, count in rows[:kernels]:
                    print(f"  {us:8.1f} us {count:3d}x  {name[:110]}")
    print("\n| length | backend | host us | kernels us | launches |\n|---|---|---|---|---|")
    for T in lengths:
        for b, fn in calls.items():
            kernels_us, launches = device_us(fn, (inputs[T],))
            host = host_us(fn, (inputs[T],), launches)
            results[b].setdefault("breakdown", {})[T] = {"host_us": host, "kernels_us": kernels_us,
                                                         "launches": launches}
            print(f"| {T} | {b} | {host:.0f} | {kernels_us:.0f} | {launches} |", flush=True)


def _eager_calls(reports: list[Any]) -> int:
    """Calls kiln's symbolic GPU graphs ran eagerly so far, while a size's module was not built yet
    (``gpu_dynamic_build_after``; [Note: a GPU module per size])."""
    return sum((r.dynamic or {}).get("eager_calls", 0) for r in reports)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--json", default=None)
    ap.add_argument("--breakdown", default="",
                    help="GPU: lengths at which to split each backend's call into host time (the GPU kept busy), "
                         "kernel time and launches (benchmarks.host_time)")
    ap.add_argument("--kernels", type=int, default=0,
                    help="with --breakdown: list each backend's N longest kernels at those lengths")
    ap.add_argument("--cprofile", action="store_true",
                    help="with --breakdown: where each kiln backend's host time goes at the first of those lengths")
    ap.add_argument("--dump", default="", help="a folder: each kiln backend's generated call (its first size's)")
    ap.add_argument("--fresh-caches", action="store_true",
                    help="empty Inductor and kiln caches (new temporary directories): first passes compile cold")
    args = ap.parse_args()
    if args.fresh_caches:  # (before the first compile: both read their cache directory from the environment)
        import os
        import tempfile
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
        os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-")
    torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = 64  # (the backends share GPT.forward's frame: one entry per graph)
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 64
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    lengths = [int(v) for v in args.lengths.split(",")]
    backends = args.backends.split(",")
    split_at = [int(v) for v in args.breakdown.split(",")] if args.breakdown else []
    if set(split_at) - set(lengths):
        ap.error(f"--breakdown lengths must be among --lengths ({lengths})")
    model, _ = gpt(seq=lengths[0], device=args.device, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    inputs = {T: torch.randint(0, 8192, (1, T), generator=gen).to(args.device) for T in lengths}
    results: dict[str, dict[str, Any]] = {}
    calls: dict[str, Callable[..., Any]] = {}
    reports: dict[str, list[Any]] = {}
    with torch.inference_mode():
        reference = {T: model(x).float() for T, x in inputs.items()}
        for b in backends:
            results[b] = first_pass(b, lambda b=b: _make(b, model), lengths, inputs, reference, args.device)
            calls[b] = results[b].pop("fn")
            reports[b] = results[b].pop("reports")
            results[b]["per_length_ms"] = {}
            first, err = results[b]["first_pass_s"], results[b]["max_abs_err"]
            print(f"{b}: first pass {first:.2f} s, {results[b]['graphs']} graph(s)"
                  + (f", {results[b]['eager_graphs']} run eagerly by kiln, "
                     f"{results[b]['eager_calls_first_pass']} call(s) eager until built" if b.startswith("kiln")
                     else "")
                  + f", max |diff| from eager {err:.2e}", flush=True)
        for T in lengths:  # second pass, backends interleaved per length
            times: dict[str, list[float]] = {b: [] for b in backends}
            for r in range(args.repeats):
                # the order rotates every round: a backend timed right after another pays for what that one left
                # (session 35, H100, fixed order: kiln-dyn-ro timed right after eager 7.2 ms, kiln-dyn-static-ro -
                # the same kernels, host time within 5% - timed after it 6.5 ms)
                for b in backends[r % len(backends):] + backends[:r % len(backends)]:
                    _sync(args.device)
                    t0 = time.perf_counter()
                    calls[b](inputs[T])
                    _sync(args.device)
                    times[b].append(time.perf_counter() - t0)
            for b in backends:
                results[b]["per_length_ms"][T] = statistics.median(times[b]) * 1e3
        if args.breakdown and args.device == "cuda":
            breakdown(calls, inputs, split_at, results, args.kernels)
            if args.cprofile:
                from benchmarks.host_time import host_profile
                for b in backends:
                    if b.startswith("kiln"):
                        print(f"{b} at length {split_at[0]}:")
                        host_profile(calls[b], (inputs[split_at[0]],), top=30)
        if args.dump:
            for b in backends:
                wrappers = [r.wrapper for r in reports.get(b, []) if getattr(r, "wrapper", "")]
                if wrappers:
                    with open(f"{args.dump}/{b}_wrapper.py", "w") as f:
                        f.write(wrappers[0])
    print("\n| backend | graphs | run eagerly (kiln: graphs; calls in pass 1 / pass 2) | first pass s "
          "| second pass ms | vs eager | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    eager = sum(results["eager"]["per_length_ms"].values()) if "eager" in results else None
    for b in backends:
        r = results[b]
        r["second_pass_ms"] = sum(r["per_length_ms"].values())
        ratio = f"{r['second_pass_ms'] / eager:.3f}" if eager else "-"
        if b.startswith("kiln"):
            r["eager_calls_second_pass"] = _eager_calls(reports[b]) - r["eager_calls_first_pass"]
            eagerly = f"{r['eager_graphs']}; {r['eager_calls_first_pass']} / {r['eager_calls_second_pass']}"
        else:
            eagerly = "-"
        print(f"| {b} | {r['graphs']} | {eagerly} | {r['first_pass_s']:.2f} "
              f"| {r['second_pass_ms']:.1f} | {ratio} | {r['max_abs_err']:.2e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "dtype": args.dtype, "threads": args.threads, "lengths": lengths,
                       "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
