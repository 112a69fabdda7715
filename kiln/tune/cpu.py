"""Schedules for the C++ kernels: from the tuning database, or measured in max-autotune within a budget.

For each kernel of a plan (``apply_schedules``):
- a database record for its canonical key (``cpp_schedule.kernel_key``) -> that schedule, nothing measured
  (so a second compile of a tuned model measures nothing, and ``default`` mode profits from earlier tuning);
- else, when tuning and budget is left: each candidate of the rule-generated space
  (``cpp_schedule.candidates``) is compiled alone with the kernel's buffers and timed in its own process
  (``tune/measure.py``); the fastest is stored and used.  For pointwise loop nests, once the database holds
  enough samples, only the cost model's first few (``tune/cpu_pointwise.py``) are measured, and every
  measured candidate becomes a sample;
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
from kiln.tune import cpu_pointwise, progress
from kiln.tune.choices import Choices
from kiln.tune.db import TuningDB
from kiln.tune.measure import Candidate, measure


@dataclasses.dataclass
class TuneStats:
    """What ``apply_schedules`` did for one graph (the report's ``tuning``)."""
    measured: int = 0        # candidates measured
    from_database: int = 0   # kernels whose schedule came from the database
    skipped: list[str] = dataclasses.field(default_factory=list)  # "name: status" of failed candidates


POINTWISE, REDUCTION = "pointwise", "reduction"  # record kinds of the kernels' schedules
KINDS = (POINTWISE, REDUCTION, cpu_pointwise.SAMPLE_KIND)  # the record kinds this tuner writes and reads


def _standalone(k: Kernel, dtype_of: dict[str, torch.dtype], node_of: dict[str, Node],
                schedule: CppSchedule) -> Candidate:
    reads, writes = k.buffers()
    names = sorted(reads | writes, key=lambda b: int(b[3:]) if b[3:].isdigit() else 0)
    slot_of = {b: i for i, b in enumerate(names)}
    source = translation_unit([dataclasses.replace(k, schedule=schedule)], [[k.name]], slot_of, dtype_of, set())
    buffers = tuple(((max(node_of[b].numel, 1),), str(dtype_of[b]).replace("torch.", "")) for b in names)
    return Candidate(f"{k.name}:{schedule.trace()}", source, buffers, trace=schedule.trace())


def apply_schedules(kernels: list[Kernel], dtype_of: dict[str, torch.dtype], node_of: dict[str, Node],
                    tune: bool, budget_s: float | None = None, choices: Choices | None = None) -> TuneStats:
    """Set ``k.schedule`` on every kernel (see the module docstring); what was measured or found.  ``choices``:
    the compile's measured-choice service (its store; else one for this call)."""
    stats = TuneStats()
    own = choices is None
    choices = choices if choices is not None else Choices()
    try:
        deadline = time.monotonic() + (budget_s if budget_s is not None else config.get().tune_budget_s)
        for done, k in enumerate(kernels):
            if tune:
                progress.update(done, len(kernels), None, max(0.0, deadline - time.monotonic()))
            key = kernel_key(k, dtype_of)
            kind = REDUCTION if k.is_reduction else POINTWISE
            trace = choices.stored_schedule(kind, key, k.name)
            if trace is not None:
                k.schedule = CppSchedule.from_trace(trace)
                stats.from_database += 1
                continue
            k.schedule = default_schedule(k)
            if not tune or time.monotonic() > deadline:
                continue
            try:
                found = _tune(k, key, dtype_of, node_of, choices.db, deadline, stats)
            except Exception as e:  # noqa: BLE001 - tuning one kernel must never fail the compile
                stats.skipped.append(f"{k.name}: tuning failed ({type(e).__name__}: {e}); heuristic schedule")
                continue
            if found is not None:
                trace, median_s, spread_s = found
                k.schedule = CppSchedule.from_trace(trace)
                choices.store_schedule(kind, key, k.name, trace, median_s, spread_s, structure=f"cpp:{kind}")
                progress.update(done + 1, len(kernels), median_s, max(0.0, deadline - time.monotonic()))
    finally:
        if own:
            choices.close()
    return stats


def _tune(k: Kernel, key: str, dtype_of: dict[str, torch.dtype], node_of: dict[str, Node], db: TuningDB,
          deadline: float, stats: TuneStats) -> tuple[dict, float, float] | None:
    """Measure kernel ``k``'s candidates (each pointwise one kept in ``db`` as a cost-model sample): the
    fastest one's (trace, median s, spread s), or None when none ran."""
    space = candidates(k)
    nbytes = cpu_pointwise.kernel_bytes(k, node_of, dtype_of)
    space = _ranked(space, k, nbytes, db)
    results = measure([_standalone(k, dtype_of, node_of, s) for s in space],
                      timeout_s=max(10.0, min(60.0, deadline - time.monotonic())))
    stats.measured += len(space)
    ok = [(m.median_s, m) for m in results if m.status == "ok"]
    if space[0].loops and not k.is_reduction:  # (the cost model knows pointwise loop nests only)
        for t, m in ok:
            sample = cpu_pointwise.Sample(m.trace["loops"], tuple(k.outer), nbytes, torch.get_num_threads(), t)
            db.put(f"{key}|{sample.loops}|t{sample.threads}", cpu_pointwise.SAMPLE_KIND, sample.trace(), t,
                   m.spread_s or 0.0, structure=cpu_pointwise.SAMPLE_KIND)
    stats.skipped += [f"{m.name}: {m.status}" for m in results if m.status != "ok"]
    if not ok:
        return None
    _, best = min(ok, key=lambda t: t[0])
    return best.trace, best.median_s, best.spread_s or 0.0


def _ranked(space: list[CppSchedule], k: Kernel, nbytes: int, db: TuningDB) -> list[CppSchedule]:
    """A pointwise kernel's loop-nest candidates worth measuring: the cost model's first ``TOP`` once it has
    ``MIN_SAMPLES`` samples of this machine to learn from; all of them before that."""
    if len(space) <= cpu_pointwise.TOP or not space[0].loops or k.is_reduction:
        return space  # (a reduction's few accumulator widths are all measured)
    samples = cpu_pointwise.samples_in(db)
    if len(samples) < cpu_pointwise.MIN_SAMPLES:
        return space
    correction = cpu_pointwise.fit_correction(samples)
    order = cpu_pointwise.rank([s.loops for s in space], tuple(k.outer), nbytes, torch.get_num_threads(),
                               correction)
    by_loops = {s.loops: s for s in space}
    return [by_loops[t] for t in order[:cpu_pointwise.TOP]]
