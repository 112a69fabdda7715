"""The C++ writer's schedule as data: what the autotuner varies per kernel.

    lanes              independent accumulators of a reduction (0: one vector register's worth; 32, 64: unrolled)
    chunk              iterations per thread work item of a flat pointwise loop
    parallel_min_work  elements below which a loop runs on one thread (OpenMP fork/join costs more)

``default_schedule`` is the heuristic; a tuned schedule comes from the tuning database (``kiln/tune``), keyed
by the kernel's canonical text (``kernel_key``), and is stored with its measurement as a JSON trace.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

import torch

from kiln.ir.kernel import Kernel


@dataclasses.dataclass(frozen=True)
class CppSchedule:
    lanes: int = 0
    chunk: int = 4096
    parallel_min_work: int = 1 << 15

    def trace(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_trace(trace: dict[str, Any]) -> "CppSchedule":
        return CppSchedule(**{k: int(v) for k, v in trace.items() if k in CppSchedule.__dataclass_fields__})


def vector_lanes(dtype: torch.dtype) -> int:
    """Lanes of one 512-bit register for ``dtype``."""
    return max(1, 64 // max(torch.empty((), dtype=dtype).element_size(), 1))


def default_schedule(kernel: Kernel) -> CppSchedule:
    return CppSchedule()


def kernel_key(kernel: Kernel, dtype_of: dict[str, torch.dtype]) -> str:
    """A canonical description of what the kernel computes (structure, shapes, dtypes), independent of the
    buffer numbering and kernel name of the graph it came from."""
    reads, writes = kernel.buffers()
    names = sorted(reads | writes, key=lambda b: int(b[3:]) if b[3:].isdigit() else 0)
    text = kernel.format().split("\n", 1)[-1]
    text = f"outer={list(kernel.outer)} rsize={kernel.rsize}\n" + text
    for i, b in enumerate(names):
        text = re.sub(rf"\b{b}\b", f"p{i}:{dtype_of[b]}", text)
    return "cpp:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def candidates(kernel: Kernel) -> list[CppSchedule]:
    """The search space (rule-generated: what each knob can change for this kernel kind)."""
    if kernel.is_reduction:
        return [CppSchedule(lanes=v) for v in (0, 8, 32, 64)]
    return [CppSchedule(chunk=c) for c in (1024, 4096, 16384, 65536)]
