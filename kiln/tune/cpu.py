"""Schedules for the C++ kernels: from the tuning database, or measured in max-autotune within a budget.

For each kernel of a plan (``apply_schedules``):
- a database record for its canonical key (``cpp_schedule.kernel_key``) -> that schedule, nothing measured
  (so a second compile of a tuned model measures nothing, and ``default`` mode profits from earlier tuning);
- else, when tuning and budget is left: each candidate of the rule-generated space
  (``cpp_schedule.candidates``) is compiled alone with the kernel's buffers and timed in its own process
  (``tune/measure.py``); the fastest is stored and used;
- else the heuristic schedule.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from kiln import config
from kiln.codegen.cpp import translation_unit
from kiln.codegen.cpp_schedule import CppSchedule, candidates, default_schedule, kernel_key
from kiln.ir.graph import Node
from kiln.ir.kernel import Kernel
from kiln.tune.db import TuningDB
from kiln.tune.measure import Candidate, measure


@dataclasses.dataclass
class TuneStats:
    measured: int = 0        # candidates measured (in this process)
    from_database: int = 0   # kernels whose schedule came from the database
    skipped: list[str] = dataclasses.field(default_factory=list)  # "name: status" of failed candidates


stats = TuneStats()
# ``kiln tune`` installs a callback here: progress(kernels_done, kernels_total, best_s, seconds_left)
progress = None


def _standalone(k: Kernel, dtype_of: dict[str, torch.dtype], node_of: dict[str, Node],
                schedule: CppSchedule) -> Candidate:
    reads, writes = k.buffers()
    names = sorted(reads | writes, key=lambda b: int(b[3:]) if b[3:].isdigit() else 0)
    slot_of = {b: i for i, b in enumerate(names)}
    source = translation_unit([dataclasses.replace(k, schedule=schedule)], [[k.name]], slot_of, dtype_of, set())
    buffers = tuple(((max(node_of[b].numel, 1),), str(dtype_of[b]).replace("torch.", "")) for b in names)
    return Candidate(f"{k.name}:{schedule.trace()}", source, buffers, trace=schedule.trace())


def apply_schedules(kernels: list[Kernel], dtype_of: dict[str, torch.dtype], node_of: dict[str, Node],
                    tune: bool, budget_s: float | None = None) -> None:
    """Set ``k.schedule`` on every kernel (see the module docstring)."""
    db = TuningDB.open()
    try:
        deadline = time.monotonic() + (budget_s if budget_s is not None else config.get().tune_budget_s)
        for done, k in enumerate(kernels):
            if progress is not None:
                progress(done, len(kernels), None, max(0.0, deadline - time.monotonic()))
            key = kernel_key(k, dtype_of)
            record = db.get(key)
            if record is not None:
                k.schedule = CppSchedule.from_trace(record.trace)
                stats.from_database += 1
                continue
            k.schedule = default_schedule(k)
            if not tune or time.monotonic() > deadline:
                continue
            space = candidates(k)
            results = measure([_standalone(k, dtype_of, node_of, s) for s in space],
                              timeout_s=max(10.0, min(60.0, deadline - time.monotonic())))
            stats.measured += len(space)
            ok = [(m.median_s, m) for m in results if m.status == "ok"]
            stats.skipped += [f"{m.name}: {m.status}" for m in results if m.status != "ok"]
            if ok:
                _, best = min(ok, key=lambda t: t[0])
                k.schedule = CppSchedule.from_trace(best.trace)
                db.put(key, "reduction" if k.is_reduction else "pointwise", best.trace, best.median_s,
                       best.spread_s or 0.0, structure=f"cpp:{'reduction' if k.is_reduction else 'pointwise'}")
                if progress is not None:
                    progress(done + 1, len(kernels), best.median_s, max(0.0, deadline - time.monotonic()))
    finally:
        db.close()
