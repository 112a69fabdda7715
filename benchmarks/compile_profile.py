"""Where kiln's compile time goes on one zoo model.

Default: the first call (Dynamo, AOTAutograd, kiln, the first run) under cProfile with an empty kiln cache, then
kiln's compile phases and the functions with the most cumulative time below kiln's backend entry point.

``--breakdown``: no profiler.  With empty kiln, Inductor and Triton caches, first compile ``--warm`` (another
model, so imports and Triton's first-use costs are paid as in a zoo run), then time the first call of
``--model`` with Inductor and with kiln, kiln's phases, and the time Triton spent in its stages (ASTs to cubins
through ``JITFunction.warmup``; the C launchers it builds with the host compiler; binaries loaded)::

    python -m benchmarks.compile_profile --model opt --device cuda --dtype bf16 [--mode default] [--top 40]
    python -m benchmarks.compile_profile --model encoder_fast --device cuda --dtype bf16 --breakdown --warm mha_self
    python -m benchmarks.compile_profile --model encoder_fast --device cuda --dtype bf16 --breakdown --timeline
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import contextlib
import functools
import io
import os
import pstats
import tempfile
import time
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="opt")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--mode", default="default")
    p.add_argument("--top", type=int, default=40, help="functions listed, by cumulative time")
    p.add_argument("--save", default=None, help="write the raw profile here (pstats format)")
    p.add_argument("--breakdown", action="store_true", help="no profiler: first-call times and Triton's stages")
    p.add_argument("--warm", default=None, help="with --breakdown: compile this zoo model first")
    p.add_argument("--order", default="inductor,kiln",
                   help="with --breakdown: which backend's first call is timed first (each starts from a collected "
                        "heap; see benchmarks/runner.first_call)")
    p.add_argument("--timeline", action="store_true",
                   help="with --breakdown: when each Triton kernel's stages ran (front end, MLIR, LLVM, ptxas), by "
                        "thread, relative to the first call's start, and when kiln's backend began and ended")
    p.add_argument("--cprofile", action="store_true",
                   help="with --breakdown: each measured first call under cProfile too (its top functions printed)")
    args = p.parse_args()
    for env in ("KILN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        if args.breakdown or env == "KILN_CACHE_DIR":
            os.environ.setdefault(env, tempfile.mkdtemp(prefix="kiln-compile-profile-"))
    if args.breakdown:
        breakdown(args)
    else:
        profile(args)


def _build(args: argparse.Namespace, name: str) -> tuple[Any, tuple]:
    import torch
    from benchmarks.gpu_memory import DTYPES
    from benchmarks.zoo import builder
    model, inputs = builder("sdpa")(name, device=args.device, dtype=getattr(torch, DTYPES[args.dtype]))
    return model.eval(), inputs


def profile(args: argparse.Namespace) -> None:
    import torch
    import kiln
    from kiln.report import mark, reports_since
    model, inputs = _build(args, args.model)
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


def _timed(owner: Any, name: str, totals: dict[str, list[float]], label: str) -> None:
    """Wrap ``owner.name`` so each call's wall time adds to ``totals[label]`` (calls from several threads
    overlap: the sum is CPU-side work, not wall time)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            totals[label].append(time.perf_counter() - start)
    setattr(owner, name, wrapper)


def _instrument_triton(totals: dict[str, list[float]]) -> None:
    try:
        import triton.runtime.jit as jit
        from triton.backends.nvidia import driver as nvidia
    except ImportError:
        return
    _timed(jit.JITFunction, "warmup", totals, "triton warmup (compile)")
    _timed(nvidia.CudaLauncher, "__init__", totals, "triton C launcher build")
    _timed(nvidia, "compile_module_from_src", totals, "host compiler (launchers, utils)")


def _instrument_stages(events: list[tuple[str, str, int, float, float]]) -> None:
    """Record ``(kernel, stage, thread, start, end)`` for Triton's front end (``ASTSource.make_ir``: the Python
    AST walk to TTIR) and each backend stage (ttir, ttgir, llir, ptx, cubin: MLIR passes, LLVM, ptxas)."""
    try:
        import triton.compiler.compiler as tc
        from triton.backends.nvidia.compiler import CUDABackend
    except ImportError:
        return
    import threading
    current: dict[int, str] = {}
    make_ir = tc.ASTSource.make_ir

    def timed_make_ir(self: Any, *a: Any, **k: Any) -> Any:
        current[threading.get_ident()] = self.name
        start = time.perf_counter()
        try:
            return make_ir(self, *a, **k)
        finally:
            events.append((self.name, "frontend", threading.get_ident(), start, time.perf_counter()))
    tc.ASTSource.make_ir = timed_make_ir
    add_stages = CUDABackend.add_stages

    def timed_add_stages(self: Any, stages: dict, *a: Any, **k: Any) -> Any:
        add_stages(self, stages, *a, **k)
        for name, fn in list(stages.items()):
            def wrapped(src: Any, metadata: Any, fn: Any = fn, name: str = name) -> Any:
                start = time.perf_counter()
                try:
                    return fn(src, metadata)
                finally:
                    thread = threading.get_ident()
                    events.append((current.get(thread, "?"), name, thread, start, time.perf_counter()))
            stages[name] = wrapped
    CUDABackend.add_stages = timed_add_stages


def _print_timeline(events: list[tuple[str, str, int, float, float]], origin: float,
                    marks: dict[str, float]) -> None:
    threads = {t: k for k, t in enumerate(dict.fromkeys(e[2] for e in sorted(events, key=lambda e: e[3])))}
    for label, at in sorted(marks.items(), key=lambda m: m[1]):
        print(f"  {1e3 * (at - origin):8.1f} ms  {label}")
    for kernel, stage, thread, start, end in sorted(events, key=lambda e: e[3]):
        print(f"  {1e3 * (start - origin):8.1f} - {1e3 * (end - origin):7.1f} ms  thread {threads[thread]}  "
              f"{stage:8s} {1e3 * (end - start):6.1f} ms  {kernel}")
    by_stage: dict[str, float] = collections.defaultdict(float)
    for _, stage, _, start, end in events:
        by_stage[stage] += end - start
    print("  summed by stage: " + ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in by_stage.items()))


def _instrument_gc(totals: dict[str, list[float]], where: list[str]) -> None:
    """Each garbage collection's pause adds to ``totals`` (its generation in the label); for each full
    (generation-2) collection ``where`` gets the innermost torch/kiln/Triton frames it interrupted and whether
    kiln's frozen heap was in place (``gc.get_freeze_count()``), to tell a compile's own collection from one
    the code before it ran up."""
    import gc
    import traceback
    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
            if info["generation"] == 2:
                frames = [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno} {f.name}"
                          for f in traceback.extract_stack()[:-1]
                          if any(k in f.filename for k in ("torch/", "kiln/", "triton/", "transformers/"))]
                where.append(f"frozen {gc.get_freeze_count()}; " + " <- ".join(reversed(frames[-4:])))
        elif started:
            took = time.perf_counter() - started[0]
            totals[f"gc pauses (generation {info['generation']})"].append(took)
            if info["generation"] == 2 and where:
                where[-1] = f"{took:.3f} s, {where[-1]}"
    gc.callbacks.append(callback)


def breakdown(args: argparse.Namespace) -> None:
    import gc

    import torch
    import kiln
    from kiln.report import mark, reports_since
    totals: dict[str, list[float]] = collections.defaultdict(list)
    gc_where: list[str] = []
    _instrument_triton(totals)
    _instrument_gc(totals, gc_where)
    events: list[tuple[str, str, int, float, float]] = []
    marks: dict[str, float] = {}
    if args.timeline:
        _instrument_stages(events)
        import kiln.compiler
        import kiln.frontend.dynamo

        def mark_calls(owner: Any, name: str, label: str, result: str | None = None) -> None:
            """Mark when ``owner.name`` is called and returns; ``result``: also when the callable it returns is
            first called and first returns (the compiled graph's first run)."""
            original = getattr(owner, name)

            def timed(*a: Any, **k: Any) -> Any:
                marks[f"{label} called"] = time.perf_counter()
                try:
                    out = original(*a, **k)
                finally:
                    marks[f"{label} returned"] = time.perf_counter()
                if result is None or not callable(out):
                    return out

                def first_run(*a: Any, **k: Any) -> Any:
                    marks.setdefault(f"{result} called", time.perf_counter())
                    try:
                        return out(*a, **k)
                    finally:
                        marks.setdefault(f"{result} returned", time.perf_counter())
                first_run._boxed_call = getattr(out, "_boxed_call", False)  # (AOTAutograd's calling convention)
                return first_run
            setattr(owner, name, timed)
        mark_calls(kiln.frontend.dynamo, "kiln_backend", "kiln's Dynamo backend")  # (AOTAutograd's trace inside)
        mark_calls(kiln.compiler, "compile_aten_graph", "kiln's compiler", "kiln's compiled graph (first run)")
        try:
            import torch._inductor.compile_fx as inductor_fx
            mark_calls(inductor_fx, "compile_fx", "Inductor's backend")
            mark_calls(inductor_fx, "compile_fx_inner", "Inductor's compiler")
        except ImportError:
            pass

    def first_call(backend: str, name: str, profiled: bool = False) -> float:
        model, inputs = _build(args, name)
        torch._dynamo.reset()
        gc.collect()  # (as benchmarks/runner.first_call: no backend pays for the garbage of the one before it)
        totals.clear()  # (what building the model cost is not the first call's)
        gc_where.clear()
        events.clear()
        marks.clear()
        profiler = cProfile.Profile() if profiled else None
        start = time.perf_counter()
        with torch.inference_mode(), (profiler or contextlib.nullcontext()):
            if backend == "kiln":
                kiln.compile(model, mode=args.mode)(*inputs)
            else:
                torch.compile(model, mode=None if args.mode == "default" else args.mode)(*inputs)
            if args.device == "cuda":
                torch.cuda.synchronize()
        took = time.perf_counter() - start
        if events or marks:
            marks["first call returned"] = start + took
            print(f"--- {name} {backend}: timeline of the first call ---")
            _print_timeline(events, start, marks)
        if profiler is not None:
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("cumulative").print_stats(r"kiln/|_functorch|output_graph|symbolic_convert|triton|"
                                                       r"_inductor/(compile_fx|graph|codecache|async)", args.top)
            stats.sort_stats("tottime").print_stats(25)
            print(f"--- {name} {backend} under cProfile ({took:.2f} s) ---\n{out.getvalue()}")
        return took

    if args.warm:
        for backend in ("inductor", "kiln"):
            print(f"warm-up {args.warm} {backend}: first call {first_call(backend, args.warm):.2f} s")
    for backend in args.order.split(","):
        position = mark()
        print(f"{args.model} {backend}: first call {first_call(backend, args.model, args.cprofile):.2f} s")
        if backend == "kiln":
            for report in reports_since(position):
                print("  phases:", ", ".join(f"{k} {v:.3f}" for k, v in report.phases.items()),
                      f"(kiln's backend {report.compile_seconds:.3f} s of the first call)")
        for label, times in sorted(totals.items()):
            print(f"  {label}: {len(times)} calls, {sum(times):.2f} s summed, longest {max(times):.2f} s")
        for line in gc_where:
            print(f"  full collection: {line}")


if __name__ == "__main__":
    main()
