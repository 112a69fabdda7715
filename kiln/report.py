"""What kiln did to a graph: captured and optimized IR, per-pass changes, kernels, externs, generated code.

``kiln.explain`` prints it; ``KILN_VERBOSE=1`` prints it after every compile.
"""
from __future__ import annotations

import dataclasses
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
    wrapper: str = ""             # GPU: the generated straight-line call (kiln.runtime.wrapper)
    fallback: str | None = None
    from_cache: bool = False
    compile_seconds: float = 0.0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per compile phase
    check_failures: list[str] = dataclasses.field(default_factory=list)
    tune_skipped: list[str] = dataclasses.field(default_factory=list)  # max-autotune: candidates/kernels skipped
    matmuls: Any = None           # GPU: matmul template choices (kiln.schedule.matmul_fusion.Stats)

    def format(self, *, source: bool = True) -> str:
        from kiln.explaining import format_report
        return format_report(self, source=source)


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
