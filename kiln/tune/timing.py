"""How kiln times candidates: alternating rounds, compared per round (``fastest`` for a choice between
implementations, ``drift_corrected`` for a tuner's schedules), each call on a cold copy of its weight.

``tune/choices.py`` asks ``fastest`` and keeps its verdicts in the tuning database.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


def cache_bytes(level: int, default: int) -> int:
    """Data cache size of cpu0 at ``level`` (Linux sysfs), or ``default``."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in base.glob("index*"):
            if int((index / "level").read_text()) == level and (index / "type").read_text().strip() != "Instruction":
                text = (index / "size").read_text().strip().upper()
                return int(text[:-1]) * 1024 if text.endswith("K") else int(text)
    except (OSError, ValueError):
        pass
    return default


def cold_copies(nbytes: int) -> int:
    """How many copies of an operand (a layer's weight) a measurement cycles through, so that each call finds its
    copy out of the last-level cache, as in a model: every layer's weight is read once per call, after the other
    layers' weights went through the cache.  Enough to fill twice the LLC; at most 16, and at most 512 MiB.

    [Note: cold weights] Timed with one hot weight, a schedule's extra passes over B look almost free (B stays in
    L3), and libraries are compared on data the model never has in cache.  With one hot weight kiln's GEMM tuner
    had stored 60-row A blocks for the MLP's 64-row product (a second block of 4 rows re-reads all of B); on this
    Zen 3 box that schedule measured 4-9% slower than one 66-row block."""
    llc = cache_bytes(3, 32 << 20)
    return max(1, min(16, 2 * llc // max(1, nbytes) + 1, (512 << 20) // max(1, nbytes)))


def copies(t: Any, n: int) -> list[Any]:
    """``n`` tensors with ``t``'s values in separate memory (``t`` first, then clones): the operand copies a
    measurement cycles through (``cold_copies``).  Their values need not differ, only their memory: drawing each
    copy at random and packing each again (kiln's GEMM panels, oneDNN's blocked weights) had taken 60% of a GEMM
    choice's time (encoder_fast's three new linear shapes: 0.41 of 0.69 s), where a clone is one memcpy."""
    return [t] + [t.clone() for _ in range(n - 1)]


def cycling(calls: list[Any]) -> Any:
    """One zero-argument function that runs ``calls`` in turn, one per call (see ``cold_copies``)."""
    position = [0]

    def call() -> Any:
        fn = calls[position[0] % len(calls)]
        position[0] += 1
        return fn()
    return call


def round_times(calls: list[Any], rounds: int, warm_up: bool = True) -> list[list[float]]:
    """Seconds of each zero-argument function per round, after a warm-up (unless the calls are warm already); in
    each round every function runs once, in turn."""
    import time
    for fn in calls if warm_up else ():
        fn()
    out = []
    for _ in range(rounds):
        row = []
        for fn in calls:
            start = time.perf_counter()
            fn()
            row.append(time.perf_counter() - start)
        out.append(row)
    return out


def drift_corrected(per_round: list[list[float]]) -> list[float]:
    """One time per function from ``round_times``: each time divided by its round's geometric mean (the machine's
    speed in that round), the median of those over rounds, times the median round mean.  Rankings then follow
    what holds round after round rather than which function met the machine's one fast moment."""
    import math
    import statistics
    means = [math.exp(sum(math.log(t) for t in row) / len(row)) for row in per_round]
    level = statistics.median(means)
    return [statistics.median(row[i] / g for row, g in zip(per_round, means)) * level
            for i in range(len(per_round[0]))]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What ``fastest`` found: the chosen name, its median seconds per call, and a line for the report."""
    choice: str
    seconds: float
    line: str


def fastest(calls: dict[str, Any], baseline: str, rounds: int = 9, margin: float = 0.97, what: str = "") -> Verdict:
    """The fastest of ``calls`` (zero-argument functions); ``baseline`` unless another is clearly (``margin``)
    faster.  Compared by the median over alternating rounds of each one's time relative to the baseline's in the
    same round: on a machine whose speed drifts over seconds (a shared VM), a best-of-N time picks whichever
    candidate met the one fast moment, while a per-round ratio compares them under the same conditions.

    The first ``LANDSLIDE_ROUNDS`` rounds may settle it alone (``_landslide``); else they count as the first of the
    ``rounds``.  A candidate that beats the baseline must do so again in a second measurement of the finalists
    (it, the runner-up and the baseline), which then decides: on the Zen 3 box one measurement had picked Winograd
    for ResNet's 512-channel 3x3 + ReLU, which measured 1.11x oneDNN's time (and 1.27x the implicit GEMM's) when
    timed again, alone and in the model."""
    names = list(calls)
    label = f"measured {what or 'candidates'}: "
    first = round_times(list(calls.values()), LANDSLIDE_ROUNDS)
    slide = _landslide(names, first)
    if slide is not None:
        return Verdict(slide[0], slide[1], label + slide[2] + f" -> {slide[0]}")
    per_round = first + round_times(list(calls.values()), max(0, rounds - LANDSLIDE_ROUNDS), warm_up=False)
    ratio, median = _ratios(names, per_round, baseline)
    ranked = sorted(names, key=ratio.get)
    chosen = ranked[0] if ratio[ranked[0]] < margin else baseline
    lines = [label + _cells(names, ratio, median)]
    if chosen != baseline:
        finalists = list(dict.fromkeys([ranked[0], ranked[1], baseline]))
        ratio, median = _ratios(finalists, round_times([calls[name] for name in finalists], rounds), baseline)
        winner = min(finalists, key=ratio.get)
        chosen = winner if ratio[winner] < margin else baseline
        lines.append("again: " + _cells(finalists, ratio, median))
    return Verdict(chosen, median[chosen], "; ".join(lines) + f" -> {chosen}")


LANDSLIDE = 0.5  # a candidate this fraction of every other one's time, in each of two rounds, needs no more rounds
LANDSLIDE_ROUNDS = 2


def _landslide(names: list[str], per_round: list[list[float]]) -> tuple[str, float, str] | None:
    """(the winner, its best time, a note) when the first rounds already settle it: one candidate under
    ``LANDSLIDE`` times every other's in each.  A slow candidate (ATen's half-precision convolution: 3.7 s a call
    where the fp32 one takes tens of ms) then costs three calls instead of twenty; no drift of a shared machine
    makes a 2x gap."""
    if len(names) < 2:
        return None
    for i, name in enumerate(names):
        if all(row[i] < LANDSLIDE * min(t for j, t in enumerate(row) if j != i) for row in per_round):
            best = {n: min(row[j] for row in per_round) for j, n in enumerate(names)}
            note = ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in best.items()) + " (two rounds: a landslide)"
            return name, best[name], note
    return None


def _cells(names: list[str], ratio: dict[str, float], median: dict[str, float]) -> str:
    return ", ".join(f"{name} {median[name] * 1e3:.3f} ms (x{ratio[name]:.2f})" for name in names)


def _ratios(names: list[str], per_round: list[list[float]], baseline: str) -> tuple[dict[str, float], dict[str, float]]:
    """Per candidate (``per_round`` columns in ``names`` order): the median over rounds of its time over the
    baseline's, and its median time."""
    import statistics
    b = names.index(baseline)
    ratio = {name: statistics.median(row[i] / row[b] for row in per_round) for i, name in enumerate(names)}
    median = {name: statistics.median(row[i] for row in per_round) for i, name in enumerate(names)}
    return ratio, median
