"""What kiln did to a graph: captured and optimized IR, per-pass changes, kernels, externs, generated code.

``kiln.explain`` prints it; ``KILN_VERBOSE=1`` prints it after every compile.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any


@dataclasses.dataclass
class PassRecord:
    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CompileReport:
    name: str
    mode: str = "default"
    target: str = "cpu"             # code generator used: "cpu" (C++) or "triton"
    captured: Any = None          # Graph after lowering
    optimized: Any = None         # Graph after the passes
    passes: list[PassRecord] = dataclasses.field(default_factory=list)
    kernels: list[Any] = dataclasses.field(default_factory=list)     # kernel IR objects
    plan: str = ""                # the Plan's steps in order, one line each (ir/program.Plan.format)
    externs: list[str] = dataclasses.field(default_factory=list)     # extern calls left in the plan
    native_externs: list[str] = dataclasses.field(default_factory=list)  # ... of them called from C++ (native.py)
    memory: dict[str, Any] = dataclasses.field(default_factory=dict)  # arena size, buffers, reuse
    source: str = ""
    wrapper: str = ""             # GPU: the generated straight-line call (kiln.codegen.gpu_call)
    fallback: str | None = None
    from_cache: bool = False
    compile_seconds: float = 0.0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per compile phase
    check_failures: list[str] = dataclasses.field(default_factory=list)
    tune_skipped: list[str] = dataclasses.field(default_factory=list)  # max-autotune: candidates/kernels skipped
    matmuls: Any = None           # GPU: matmul template choices (kiln.library.gpu_matmul.fusion.Stats)
    choices: list[Any] = dataclasses.field(default_factory=list)  # implementation choices (tune/choices.Made)
    schedules: list[Any] = dataclasses.field(default_factory=list)  # tuners' schedules stored or measured (Made)
    tuning: Any = None            # CPU: kernel schedules measured or found (kiln.tune.cpu.TuneStats)
    dynamic: dict[str, Any] | None = None  # a symbolic graph: its size symbols and the sizes planned so far
    eager_nodes: list[str] = dataclasses.field(default_factory=list)  # nodes run eagerly in a compiled graph, why
    host_inputs: str = ""         # GPU graph: 0-d CPU inputs copied to the device at each call (compiler.py)
    weights_changed: int = 0      # recompiles after frozen weights changed in place ([Note: frozen weights ...])
    training: str = ""            # "forward" / "backward" of a training step, then "; " and what the partition did

    def format(self, *, source: bool = True) -> str:
        return format_report(self, source=source)


def _builds(n: int) -> str:
    """How many builds a symbolic graph's sizes took ([Note: native calls at any size]: more than one where a
    library call's arguments took another form at some size)."""
    return "one build" if n <= 1 else f"{n} builds (library calls bound differently at some sizes)"


def format_report(r: CompileReport, *, source: bool = True) -> str:
    """The report as ``kiln.explain`` prints it."""
    from kiln.ir.graph import format_graph
    out = [f"=== kiln report: graph {r.name!r}, mode {r.mode}, target {r.target}, compiled in "
           f"{r.compile_seconds:.2f} s{' (module from cache)' if r.from_cache else ''}"]
    if r.phases:
        out.append("--- compile phases: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.2f} s" if isinstance(v, float) else f"{k.replace('_', ' ')} {v}"
            for k, v in r.phases.items()))
    if r.fallback:
        out.append(f"!!! fell back to eager: {r.fallback}")
    if r.training:
        part, _, rest = r.training.partition("; ")
        out.append(f"--- training step: the {part} graph of AOTAutograd's partition, parameters as inputs"
                   + (f"; {rest}" if rest else ""))
    for line in r.eager_nodes:
        out.append(f"--- ran eagerly: {line}")
    if r.host_inputs:
        out.append(f"--- host inputs: {r.host_inputs}")
    if r.weights_changed:
        out.append(f"--- frozen weights changed in place after the compile: compiled again {r.weights_changed} "
                   f"time(s) from their new values")
    if r.dynamic:
        sizes = "; ".join(", ".join(f"{k}={v}" for k, v in env.items()) for env in r.dynamic["sizes"][-8:])
        head = f"--- dynamic shapes: symbols {', '.join(r.dynamic['symbols'])} ({r.dynamic.get('ranges', '')}); "
        if "kernel_sources" in r.dynamic:  # the GPU: kernels with size parameters (schedule/gpu_symbolic.py)
            out.append(head + f"one plan, Triton kernels with size parameters: {r.dynamic['builds']} size(s) "
                       f"planned, {r.dynamic['kernel_sources']} kernel module(s) (one per kind of schedule), "
                       + (f"{r.dynamic['recordings']} CUDA graph recording(s), " if "recordings" in r.dynamic
                          else "")
                       + f"{r.dynamic['eager_calls']} call(s) run eagerly" + (f": {sizes}" if sizes else ""))
        elif "eager_calls" in r.dynamic:  # the GPU: a module per size ([Note: a GPU module per size])
            out.append(head + f"a GPU module per size: {r.dynamic['builds']} built, {r.dynamic['eager_calls']} call(s) "
                       f"run eagerly before their size's build was due" + (f": {sizes}" if sizes else ""))
        else:
            out.append(head + f"{_builds(r.dynamic.get('builds', 1))}, a memory plan per size: "
                       f"{r.dynamic.get('planned', len(r.dynamic['sizes']))} planned" + (f": {sizes}" if sizes else ""))
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
        out += ["", f"--- program: {r.plan.count(chr(10)) + 1} steps in order (kernels and library calls, the buffers "
                    f"each reads and writes, where each buffer it writes lives)", r.plan]
    out += ["", f"--- extern calls ({len(r.externs)}): " + (", ".join(r.externs) if r.externs else "none")]
    if r.native_externs:
        out.append(f"    {len(r.native_externs)} of them called from the generated C++, not through Python: "
                   + ", ".join(r.native_externs))
    if r.choices:
        out += ["", f"--- implementation choices ({len(r.choices)}; forced, stored in the tuning database, measured "
                    f"now or predicted by rule)"]
        counts: dict[str, int] = {}
        for made in r.choices:  # (the same problem in every layer: one line with its count)
            line = made.format()
            counts[line] = counts.get(line, 0) + 1
        out += [f"  {line}" + (f"  [x{n}]" if n > 1 else "") for line, n in counts.items()]
    if r.schedules:
        hows: dict[str, int] = {}
        for made in r.schedules:
            hows[made.how] = hows.get(made.how, 0) + 1
        out += ["", f"--- tuned schedules ({', '.join(f'{n} {how}' for how, n in hows.items())}; the other kernels "
                    f"use their rule's)"]
        out += [f"  {made.format()}" for made in r.schedules[:12]]
        if len(r.schedules) > 12:
            out.append(f"  ... and {len(r.schedules) - 12} more")
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
        out += ["", "--- generated call (kiln.codegen.gpu_call: the program as straight-line Python)", r.wrapper]
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


_reports: list[tuple[int, CompileReport]] = []
_count = 0


def record(report: CompileReport) -> None:
    global _count
    _reports.append((_count, report))
    _count += 1
    del _reports[:-64]


def reports() -> list[CompileReport]:
    return [r for _, r in _reports]


def mark() -> int:
    """A position in the stream of reports; ``reports_since(mark())`` gives the ones recorded after it."""
    return _count


def reports_since(position: int) -> list[CompileReport]:
    return [r for i, r in _reports if i >= position]
