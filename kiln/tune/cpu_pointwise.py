"""Cost model of a pointwise C++ kernel's loop-nest schedule: an analytic estimate times a learned correction.

A pointwise kernel streams its buffers once, so the estimate is the bytes it moves at one core's streaming
rate, divided among the threads its parallel loops can use (with the imbalance of the last round of work
items), plus what the loop structure adds: an entry into the vector loop per ``inner`` elements (a short
innermost axis makes many short SIMD loops), a division and a remainder per element for each fused axis,
and an OpenMP fork when threads are used::

    estimate = bytes / MEM_BYTES_PER_S / threads * imbalance + entries * LOOP_S
               + divmods * elements * DIVMOD_S + [threads] * FORK_S

The rates are rough on purpose: a ``Correction`` (``tune/ranking.py``) multiplies the estimate by
``exp(w . features)``, with ``w`` fitted by ridge least squares to ``log(measured / estimated)`` over every
candidate this machine measured before (kept in the tuning database as samples), centred per kernel, so the
model learns what orders one kernel's schedules here.
max-autotune then measures only the ranking's first ``TOP`` candidates once ``MIN_SAMPLES`` samples exist.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from kiln.ir.loops import LoopNest, Trace
from kiln.tune.ranking import Correction

MEM_BYTES_PER_S = 10e9   # one core streaming (read + write)
LOOP_S = 4e-9            # entering and leaving one vector loop (peel, tail, bookkeeping)
DIVMOD_S = 0.5e-9        # a division and remainder by a constant, per element, vectorized
FORK_S = 3e-6            # an OpenMP parallel region
SAMPLE_KIND = "cpp_pointwise_sample"
TOP = 2                  # candidates measured once the correction has data
MIN_SAMPLES = 12


@dataclasses.dataclass(frozen=True)
class Structure:
    """What the estimate reads off a scheduled nest."""
    elements: int
    threads: int          # threads the parallel loops can use
    imbalance: float      # >= 1: the last round of work items leaves threads idle
    entries: int          # entries into the innermost loop
    divmods: int          # divisions + remainders per element (fused axes)
    unrolled: bool


def structure(trace: Trace, extents: Sequence[int], threads: int) -> Structure:
    nest = trace.apply(LoopNest.plain(extents))
    elements = math.prod(extents)
    parallel = [lp for lp in nest.loops if lp.kind == "parallel"]
    trips = math.prod(lp.extent for lp in parallel) if parallel else 1
    used = min(threads, trips) if parallel and elements > parallel[0].min_work else 1
    imbalance = math.ceil(trips / used) / (trips / used) if used > 1 else 1.0
    inner = nest.loops[-1].extent if nest.loops else 1
    divmods = sum(expr.count("/") + expr.count("%") for _, expr in nest.defs)
    return Structure(elements, used, imbalance, max(1, elements // max(inner, 1)), divmods,
                     any(lp.unroll for lp in nest.loops))


def estimate_s(st: Structure, nbytes: int) -> float:
    return (nbytes / MEM_BYTES_PER_S / st.threads * st.imbalance + st.entries * LOOP_S
            + st.divmods * st.elements * DIVMOD_S + (FORK_S if st.threads > 1 else 0.0))


def features(st: Structure, nbytes: int) -> list[float]:
    est = estimate_s(st, nbytes)
    return [1.0, math.log2(st.threads), math.log2(st.imbalance), st.entries * LOOP_S / est,
            st.divmods * st.elements * DIVMOD_S / est, float(st.unrolled)]


@dataclasses.dataclass(frozen=True)
class Sample:
    """One measured candidate: its schedule, the kernel's extents and bytes, the threads, the time."""
    loops: str
    extents: tuple[int, ...]
    nbytes: int
    threads: int
    seconds: float

    def trace(self) -> dict:
        return {"loops": self.loops, "extents": list(self.extents), "bytes": self.nbytes, "threads": self.threads}

    @staticmethod
    def from_record(trace: dict, seconds: float) -> "Sample":
        return Sample(str(trace["loops"]), tuple(int(e) for e in trace["extents"]), int(trace["bytes"]),
                      int(trace["threads"]), seconds)


def fit_correction(samples: Sequence[Sample]) -> Correction:
    """The correction (``tune/ranking.Correction``) from measured candidates, each kernel (its extents, bytes
    and threads) centred on its own."""
    rows = []
    for s in samples:
        st = structure(Trace.parse(s.loops), s.extents, s.threads)
        rows.append(((s.extents, s.nbytes, s.threads), features(st, s.nbytes),
                     math.log(s.seconds / estimate_s(st, s.nbytes))))
    return Correction.fit(rows)


def predict_s(loops: str, extents: Sequence[int], nbytes: int, threads: int, correction: Correction) -> float:
    st = structure(Trace.parse(loops), extents, threads)
    return estimate_s(st, nbytes) * correction.factor(features(st, nbytes))


def rank(loops: Sequence[str], extents: Sequence[int], nbytes: int, threads: int,
         correction: Correction) -> list[str]:
    """The schedules, best predicted first."""
    return sorted(loops, key=lambda t: predict_s(t, extents, nbytes, threads, correction))


def kernel_bytes(kernel, node_of: dict, dtype_of: dict) -> int:
    """Bytes of the buffers a kernel reads and writes (each once: what a pointwise kernel streams)."""
    return sum(max(node_of[b].numel, 1) * dtype_of[b].itemsize for b in set().union(*kernel.buffers()))


def samples_in(db) -> list[Sample]:
    return [Sample.from_record(r.trace, r.median_s) for r in db.records() if r.kind == SAMPLE_KIND]
