"""What ``kiln.explain`` prints (a module of its own name would replace the ``kiln.explain`` function on the
package when first imported): the graph IR after capture and after the passes, each kernel with the nodes it fuses and
why, the extern calls, the memory plan and the generated C++."""
from __future__ import annotations

import re
from typing import Any, Callable

from kiln.ir.graph import format_graph
from kiln.report import CompileReport


def format_report(r: CompileReport, *, source: bool = True) -> str:
    out = [f"=== kiln report: graph {r.name!r}, mode {r.mode}, target {r.target}, compiled in "
           f"{r.compile_seconds:.2f} s{' (module from cache)' if r.from_cache else ''}"]
    if r.phases:
        out.append("--- compile phases: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.2f} s" if isinstance(v, float) else f"{k.replace('_', ' ')} {v}"
            for k, v in r.phases.items()))
    if r.fallback:
        out.append(f"!!! fell back to eager: {r.fallback}")
    for line in r.tune_skipped:
        out.append(f"--- tuning skipped {line}")
    if r.captured is not None:
        out += ["", "--- graph IR after capture", format_graph(r.captured)]
    if r.passes:
        out += ["", "--- passes"]
        for p in r.passes:
            notes = f"  [{', '.join(p.notes)}]" if p.notes else ""
            line = f"  {p.name:<16} {p.nodes_before:>4} -> {p.nodes_after:<4} nodes {p.seconds * 1e3:7.2f} ms"
            out.append(line + notes)
    if r.optimized is not None:
        out += ["", "--- graph IR after the passes", format_graph(r.optimized)]
    if r.kernels:
        out += ["", f"--- {len(r.kernels)} generated kernels"]
        for k in r.kernels:
            out.append(k.format())
            out.append(f"  why: {k.reason}")
    if r.plan:
        out += ["", f"--- plan: {r.plan.count(chr(10)) + 1} steps in order (kernels and library calls, the buffers "
                    f"each reads and writes)", r.plan]
    out += ["", f"--- extern calls ({len(r.externs)}): " + (", ".join(r.externs) if r.externs else "none")]
    if r.native_externs:
        out.append(f"    {len(r.native_externs)} of them called from the generated C++, not through Python: "
                   + ", ".join(r.native_externs))
    m = r.matmuls
    if m is not None and m.candidates:
        out.append(f"--- matmuls: {m.candidates} candidates for the Triton template, {m.from_database} decided by "
                   f"the tuning database, {m.measured} variants measured ({m.seconds:.1f} s); "
                   f"{len(m.fused)} run as templates, {len(m.kept_extern)} stay on cuBLAS")
        out += [f"  template {line}" for line in m.fused]
    if r.memory:
        out.append(f"--- memory: {r.memory.get('summary', '')}")
        for key in ("layout", "cuda_graph"):
            if key in r.memory:
                out.append(f"--- {key.replace('_', ' ')}: {r.memory[key]}")
    if source and r.source:
        title = "generated Triton" if r.target == "triton" else "generated C++ (without the math prelude)"
        out += ["", f"--- {title}", _strip_prelude(r.source)]
    if source and r.wrapper:
        out += ["", "--- generated call (kiln.runtime.wrapper: the program as straight-line Python)", r.wrapper]
    return "\n".join(out)


_TIMED_TWIN = re.compile(r'extern "C" void kiln_segment_\d+_timed\(.*?\n\}\n*', re.DOTALL)


def _strip_prelude(src: str) -> str:
    """The generated source without the shared prelude, and without the segments' timed twins (kiln.profile's
    copies of each segment, which only note the time between the same calls)."""
    from kiln.codegen.cpp import HELPERS
    from kiln.codegen.cpp_prelude import PRELUDE
    shared = "\n\n".join([PRELUDE, HELPERS])
    if src.startswith(shared):  # (a graph with no generated kernel has only library calls after it)
        src = src[len(shared):].lstrip("\n")
    return _TIMED_TWIN.sub("", src)


def explain(model_or_fn: Callable, *example_inputs: Any, **options: Any) -> str:
    import torch

    import kiln
    from kiln.report import mark, reports_since

    torch._dynamo.reset()
    position = mark()
    compiled = kiln.compile(model_or_fn, **options)
    with torch.inference_mode():
        compiled(*example_inputs)
    text = "\n\n".join(format_report(r) for r in reports_since(position)) or "kiln: nothing was compiled"
    print(text)
    return text


def profile(model_or_fn: Callable, *example_inputs: Any, calls: int = 10, warmup: int = 2, **options: Any) -> Any:
    import torch

    import kiln
    from kiln.runtime.profiling import Profile

    if calls < 1 or warmup < 1:
        raise ValueError(f"kiln.profile: calls and warmup must be at least 1 (the first call compiles), "
                         f"got calls={calls}, warmup={warmup}")
    torch._dynamo.reset()
    compiled = kiln.compile(model_or_fn, **options)
    with torch.inference_mode():
        for _ in range(warmup):
            compiled(*example_inputs)
        with Profile() as prof:
            for _ in range(calls):
                compiled(*example_inputs)
    print(prof)
    return prof
