"""Small measured decisions kept as JSON beside the module cache (GEMM library per shape, layout per graph).

Writes are atomic (temporary file + rename), so concurrent processes never read half a file; a missing or
damaged file reads as empty (the decision is measured again), and a read-only cache only costs that.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kiln import config


def store_path(name: str) -> Path:
    return Path(config.get().cache_dir) / name


def load(name: str) -> dict[str, Any]:
    try:
        data = json.loads(store_path(name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(name: str, data: dict[str, Any]) -> None:
    path = store_path(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass


def machine_key() -> str:
    """Measured choices hold for one machine (``tune.db.hardware_fingerprint``: the one fingerprint the tuning
    database keys its records by too) and torch build."""
    import hashlib

    import torch

    from kiln.tune.db import hardware_fingerprint
    return hashlib.sha256(f"{hardware_fingerprint()}|{torch.__version__}".encode()).hexdigest()[:16]


class ShapeChoices:
    """Choices keyed by tuples of ints (a problem's shape and thread count), read from and written through to
    the decisions file ``<prefix>-<machine key>.json`` (the prefix carries a version: bump it when the
    candidates change, so old choices are measured again)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._choices: dict[tuple[int, ...], Any] = {}
        self._loaded = False

    def _name(self) -> str:
        return f"{self.prefix}-{machine_key()}.json"

    def get(self, key: tuple[int, ...]) -> Any:
        if not self._loaded:
            self._loaded = True
            for text, value in load(self._name()).items():
                try:
                    self._choices.setdefault(tuple(int(v) for v in text.split(",")), value)
                except ValueError:
                    pass  # a damaged entry: measured again
        return self._choices.get(key)

    def put(self, key: tuple[int, ...], value: Any) -> None:
        self._choices[key] = value
        save(self._name(), {",".join(map(str, k)): v for k, v in self._choices.items()})

    def decide(self, key: tuple[int, ...], calls: Any, baseline: str, what: str) -> Any:
        """The stored choice for ``key``; else the ``fastest`` of ``calls()`` (a function building the
        candidates: only called when there is something to measure), stored."""
        if self.get(key) is None:
            import torch
            with torch.inference_mode():
                self.put(key, fastest(calls(), baseline, what=what))
        return self.get(key)

    def clear(self) -> None:
        self._choices.clear()
        self._loaded = True


_measured: list[str] = []  # what fastest() measured since the last take_measured(), for the compile report


def note_measured(line: str) -> None:
    """Report a measurement made elsewhere (a tuner) with the pass that made it."""
    _measured.append(line)


def take_measured() -> list[str]:
    """The measurements made since the last call, one line each (the pass pipeline puts them in its report)."""
    lines = list(_measured)
    _measured.clear()
    return lines


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


def cycling(calls: list[Any]) -> Any:
    """One zero-argument function that runs ``calls`` in turn, one per call (see ``cold_copies``)."""
    position = [0]

    def call() -> Any:
        fn = calls[position[0] % len(calls)]
        position[0] += 1
        return fn()
    return call


def round_times(calls: list[Any], rounds: int) -> list[list[float]]:
    """Seconds of each zero-argument function per round, after a warm-up; in each round every function runs
    once, in turn."""
    import time
    for fn in calls:
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


def fastest(calls: dict[str, Any], baseline: str, rounds: int = 9, margin: float = 0.97, what: str = "") -> str:
    """The name of the fastest of ``calls`` (zero-argument functions); ``baseline`` unless another is clearly
    (``margin``) faster.  Compared by the median over alternating rounds of each one's time relative to the
    baseline's in the same round: on a machine whose speed drifts over seconds (a shared VM), a best-of-N time
    picks whichever candidate met the one fast moment, while a per-round ratio compares them under the same
    conditions.  The median times and ratios are noted for the report, under ``what``.

    A candidate that beats the baseline must do so again in a second measurement of the finalists (it, the
    runner-up and the baseline), which then decides: on the Zen 3 box one measurement had picked Winograd for
    ResNet's 512-channel 3x3 + ReLU, which measured 1.11x oneDNN's time (and 1.27x the implicit GEMM's) when
    timed again, alone and in the model."""
    names = list(calls)
    landslide = _landslide(calls)
    if landslide is not None:
        note_measured(f"measured {what or 'candidates'}: {landslide[1]} -> {landslide[0]}")
        return landslide[0]
    ratio, median = _ratios(calls, baseline, rounds)
    ranked = sorted(names, key=ratio.get)
    chosen = ranked[0] if ratio[ranked[0]] < margin else baseline
    lines = [f"measured {what or 'candidates'}: " + _cells(names, ratio, median)]
    if chosen != baseline:
        finalists = list(dict.fromkeys([ranked[0], ranked[1], baseline]))
        ratio, median = _ratios({name: calls[name] for name in finalists}, baseline, rounds)
        winner = min(finalists, key=ratio.get)
        chosen = winner if ratio[winner] < margin else baseline
        lines.append("again: " + _cells(finalists, ratio, median))
    note_measured("; ".join(lines) + f" -> {chosen}")
    return chosen


LANDSLIDE = 0.5  # a candidate this fraction of every other one's time, in each of two rounds, needs no more rounds
LANDSLIDE_ROUNDS = 2


def _landslide(calls: dict[str, Any]) -> tuple[str, str] | None:
    """(the winner, a note) when two rounds already settle it: one candidate under ``LANDSLIDE`` times every
    other's in both.  A slow candidate (ATen's half-precision convolution: 3.7 s a call where the fp32 one takes
    tens of ms) then costs three calls instead of twenty; no drift of a shared machine makes a 2x gap."""
    if len(calls) < 2:
        return None
    names = list(calls)
    per_round = round_times(list(calls.values()), LANDSLIDE_ROUNDS)
    for i, name in enumerate(names):
        if all(row[i] < LANDSLIDE * min(t for j, t in enumerate(row) if j != i) for row in per_round):
            best = {n: min(row[j] for row in per_round) for j, n in enumerate(names)}
            return name, ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in best.items()) + " (two rounds: a landslide)"
    return None


def _cells(names: list[str], ratio: dict[str, float], median: dict[str, float]) -> str:
    return ", ".join(f"{name} {median[name] * 1e3:.3f} ms (x{ratio[name]:.2f})" for name in names)


def _ratios(calls: dict[str, Any], baseline: str, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Per candidate: the median over rounds of its time over the baseline's, and its median time."""
    import statistics
    names = list(calls)
    per_round = round_times(list(calls.values()), rounds)
    b = names.index(baseline)
    ratio = {name: statistics.median(row[i] / row[b] for row in per_round) for i, name in enumerate(names)}
    median = {name: statistics.median(row[i] for row in per_round) for i, name in enumerate(names)}
    return ratio, median
