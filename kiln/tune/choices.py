"""The one service for measured choices: which implementation runs a problem - a library or kiln's kernel for a
GEMM, a convolution algorithm, kiln's attention kernel or ATen's, a half-precision product in fp32, a graph's
layout.

A compile makes one ``Choices`` (``Choices.for_compile``); the passes get it on their ``RewriteLog``
(``log.choices``) and the layout choice from the compiler.  ``decide`` answers, in this order:

1. **forced** by ``Config.choices`` (``"gemm=kiln,conv=winograd2"``): how tests, experiments and ``kiln bisect``
   pin a path without measuring (a forced kind also applies to problems too small to measure);
2. **stored** in the tuning database (``tune/db.py``: this problem, this machine, these software versions);
3. **measured** with ``timing.fastest`` (alternating rounds, per-round ratios, a win confirmed) and stored -
   within the compile's measuring budget; past it,
4. **predicted**: the asking pass's rule (or its baseline), not stored, so a later compile with budget left
   measures it.

The tuners' schedules (the pointwise kernels' loop nests, kiln's GEMM blocking, the GPU matmul template's tiles)
go through the same service and store: ``schedule`` answers the stored one, or what the tuner measured (in
max-autotune), stored; their records and samples live in the same database.

Every answer is kept in ``made`` (the compile report's ``choices``), with how it was reached.

    GEMM = Kind("gemm", 10, ("kiln", "onednn", "aten"))     # a pass declares its kind once
    choices.decide(GEMM, (m, k, n, threads), calls, baseline="kiln", what="linear 64x768x3072")
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from kiln import config
from kiln.tune import timing
from kiln.tune.db import TuningDB

KINDS: dict[str, "Kind"] = {}  # every kind declared so far, by name (what Config.choices may force)


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of choice: its name (``Config.choices`` forces it by that name), a version (bump it when the
    candidates or their timing change, so that stored answers are measured again) and the answers it takes."""
    name: str
    version: int
    values: tuple[str, ...]

    def __post_init__(self) -> None:
        KINDS[self.name] = self

    @property
    def record_kind(self) -> str:
        """The tuning database's ``kind`` column for this kind's answers (``kiln db prune --retired`` keeps it)."""
        return f"choice:{self.name}-v{self.version}"

    def record_key(self, key: tuple[Any, ...]) -> str:
        return f"{self.record_kind}:{','.join(map(str, key))}"


@dataclasses.dataclass(frozen=True)
class Made:
    """One answer, for the report: ``how`` is forced, stored, measured, predicted or only (one candidate)."""
    kind: str
    what: str
    choice: str
    how: str
    note: str = ""

    def format(self) -> str:
        return f"{self.kind:<13} {self.what}: {self.choice} ({self.how}{'; ' + self.note if self.note else ''})"


def measuring_s(candidates: int, flops: float) -> float:
    """Rough seconds to measure ``candidates`` implementations of a ``flops`` problem: about 12 calls each (a
    warm-up, the rounds, the finalists again) at 40 GFLOP/s per thread - an AVX2 core's order of magnitude, so a
    compile with a budget does not start a measurement that would overrun it several times over."""
    import torch
    return candidates * 12 * flops / (40e9 * max(1, torch.get_num_threads()))


def parse_forced(text: str) -> dict[str, str]:
    """``Config.choices`` text -> {kind: answer}; ValueError naming an unknown kind or answer and what is known."""
    forced = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, value = (s.strip() for s in item.partition("="))
        kind = KINDS.get(name)
        if kind is None:
            raise ValueError(f"kiln: option 'choices' names an unknown kind {name!r}; the kinds are {sorted(KINDS)}")
        if value not in kind.values:
            raise ValueError(f"kiln: option 'choices' gives {name}={value!r}; {name} takes one of {list(kind.values)}")
        forced[name] = value
    return forced


class Choices:
    """A compile's choices: forced ones from ``Config.choices``, the tuning database (opened at the first
    look-up), a measuring budget in estimated seconds (None: no limit) and what was decided (``made``)."""

    def __init__(self, forced: str = "", budget_s: float | None = None, db_path: str | None = None) -> None:
        self.forced = parse_forced(forced)
        self.budget_s = budget_s
        self.spent_s = 0.0  # estimated seconds of the measurements made or found stored (see ``decide``)
        self.made: list[Made] = []
        self.schedules: list[Made] = []  # the tuners' schedules found stored or measured (the report's schedules)
        self._db_path = db_path
        self._db: TuningDB | None = None
        self._lines: list[str] = []

    @classmethod
    def for_compile(cls, mode: str = "default") -> "Choices":
        """The service for one compile under the current config: max-autotune measures without a budget; the
        other modes within ``Config.choice_budget_s``."""
        cfg = config.get()
        return cls(cfg.choices, None if mode == "max-autotune" else cfg.choice_budget_s)

    # ------------------------------------------------------------------ answers
    def forced_value(self, kind: Kind) -> str | None:
        """The answer ``Config.choices`` fixes for ``kind`` (for problems below a pass's measuring threshold too)."""
        return self.forced.get(kind.name)

    def known(self, kind: Kind, key: tuple[Any, ...], what: str, use_forced: bool = True) -> str | None:
        """The forced (unless not ``use_forced``: the problem cannot take it) or stored answer, recorded in
        ``made``; None when it would have to be measured."""
        if use_forced and kind.name in self.forced:
            return self._record(kind, what, self.forced[kind.name], "forced")
        record = self.db.get(kind.record_key(key))
        if record is not None and record.trace.get("choice") in kind.values:
            return self._record(kind, what, record.trace["choice"], "stored", record.trace.get("note", ""))
        return None

    def decide(self, kind: Kind, key: tuple[Any, ...], calls: Callable[[], dict[str, Callable[[], Any]]],
               baseline: str, what: str, predict: Callable[[], str] | None = None,
               estimate_s: float = 0.0, use_forced: bool = True) -> str:
        """The answer for problem ``key`` (ints and strs that identify it, thread count included): forced, stored,
        else the fastest of ``calls()`` (a function building the candidates, called only to measure), stored;
        ``predict()`` (default: ``baseline``) where measuring would overrun the budget.

        [Note: a deterministic budget] The budget is spent in *estimated* seconds (``estimate_s``, e.g.
        ``measuring_s``), and a stored answer is charged its estimate as if measured again.  So every compile of a
        graph measures the same problems - those that fit, in graph order - and predicts the same others: the
        second process finds the first one's answers, predicts the rest as before, and loads the same module
        from the cache instead of measuring more and building another."""
        found = self.known(kind, key, what, use_forced)
        if found is not None:
            if self.made[-1].how == "stored":
                self.spent_s += estimate_s
            return found
        if not self.can_measure(estimate_s):
            guess = predict() if predict is not None else baseline
            return self._record(kind, what, guess, "predicted", f"measuring budget of {self.budget_s:g} s spent")
        import torch
        self.spent_s += estimate_s
        with torch.inference_mode():
            candidates = calls()
            if len(candidates) < 2:
                only = next(iter(candidates), baseline)
                return self._record(kind, what, only, "only candidate")
            verdict = timing.fastest(candidates, baseline, what=what)
        self.db.put(kind.record_key(key), kind.record_kind, {"choice": verdict.choice, "note": verdict.line},
                    verdict.seconds, 0.0, structure=kind.record_kind)
        return self._record(kind, what, verdict.choice, "measured", verdict.line)

    # ------------------------------------------------------------------ tuners' schedules
    def stored_schedule(self, kind: str, key: str, what: str) -> dict | None:
        """A tuner's stored schedule for one problem (``key``: its tuning-database key, ``kind`` its record kind):
        the record's trace, recorded in ``made`` as ``schedule:<kind>``; None when there is none."""
        record = self.db.get(key)
        if record is None:
            return None
        self._record_schedule(kind, what, record.trace, "stored")
        return record.trace

    def store_schedule(self, kind: str, key: str, what: str, trace: dict, median_s: float, spread_s: float,
                       structure: str | None = None) -> None:
        """Keep a schedule a tuner measured (the next compile finds it), recorded in ``made``."""
        self.db.put(key, kind, trace, median_s, spread_s, structure=structure or kind)
        self._record_schedule(kind, what, trace, "measured", f"{median_s * 1e3:.3f} ms")

    def schedule(self, kind: str, key: str, what: str,
                 measure: Callable[[TuningDB], tuple[dict, float, float] | None] | None) -> dict | None:
        """A tuner's schedule for one problem: stored (any mode); else, when ``measure`` is given (the compile
        tunes), what ``measure(db)`` found - ``(trace, median s, spread s)``, stored here; the tuner may keep its
        own samples in ``db`` on the way - ; else None: the tuner's rule (not recorded: one per kernel)."""
        trace = self.stored_schedule(kind, key, what)
        if trace is not None or measure is None:
            return trace
        found = measure(self.db)
        if found is None:
            return None
        trace, median_s, spread_s = found
        self.store_schedule(kind, key, what, trace, median_s, spread_s)
        return trace

    def _record_schedule(self, kind: str, what: str, trace: dict, how: str, note: str = "") -> None:
        shown = ", ".join(f"{k}={v}" for k, v in trace.items() if k != "note")
        self.schedules.append(Made(f"schedule:{kind}", what, shown, how, note))

    def can_measure(self, estimate_s: float = 0.0) -> bool:
        """Is there budget left for a measurement estimated at ``estimate_s``?"""
        return self.budget_s is None or 0 < self.budget_s and self.spent_s + estimate_s <= self.budget_s

    def predicted(self, kind: Kind, what: str, answer: str, why: str) -> str:
        """Record ``answer`` as predicted (not measured, not stored) for a choice its asker settled itself."""
        return self._record(kind, what, answer, "predicted", why)

    def note(self, line: str) -> None:
        """A measurement made by a tuner on the way (``library/gemm/tune.py``), for the report of the pass that asked."""
        self._lines.append(line)

    def take_lines(self) -> list[str]:
        """The measurement lines since the last call (the pipeline files them under the pass that made them)."""
        lines, self._lines = self._lines, []
        return lines

    def _record(self, kind: Kind, what: str, choice: str, how: str, note: str = "") -> str:
        self.made.append(Made(kind.name, what, choice, how, note))
        return choice

    # ------------------------------------------------------------------ the store
    @property
    def db(self) -> TuningDB:
        if self._db is None:
            self._db = TuningDB.open(self._db_path)
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
