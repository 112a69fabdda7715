"""Schedules for kiln's CPU GEMM (``library/gemm/source.py``): a rule-generated space, a cost model that learns from
this machine's measurements, measurement of the best few, and the tuning database.

A GEMM schedule is ``(mr, kc, mc)``: micro-tile rows (compiled in), the depth of a rank-``kc`` update and the rows
of A packed at once.  For one problem ``[m, k] @ [k, n]``:

1. **Space** (``candidates``): every micro-tile height the ISA has registers for, K split into equal blocks of at
   most 256 ... 2048, and A blocks filling 1/4 ... 1.5 of L2 (rounded to whole micro-tiles, capped at ``m``).
2. **Cost model** (``estimate_s``): FMA time with the micro-tile's edge waste and the C tile's reload per K
   block, plus the bytes moved to and from memory: A packed once, C re-read per K block, B re-read per A block
   (from the last-level cache when B fits in half of it).
   ``Correction`` multiplies it by ``exp(w . features)`` (tile height, block sizes, how far the A block and
   the B micro-panel overflow L2 and L1), ``w`` fitted by ridge least squares to log(measured / estimated) over
   the samples this machine's database holds.
3. **Measurement** (max-autotune): the ``MEASURED`` best-ranked candidates run alternately on random data, each
   call on another copy of the weight so B comes from memory as in a model (``timing.cold_copies``), their
   times corrected for the machine's drift between rounds (``timing.drift_corrected``); every timing is kept
   as a sample (what the next fit learns from), the fastest as the problem's record, so a second compile
   measures nothing and default mode uses it too.  A problem whose measurement the model puts above
   ``BUDGET_SHARE`` of ``Config.tune_budget_s`` keeps the rule.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import torch

from kiln import config
from kiln.ir.sym import PerSize, bucket, evaluate
from kiln.library.gemm.source import GemmSchedule, equal_blocks, schedule_for
from kiln.tune import timing
from kiln.tune.choices import Choices
from kiln.tune.ranking import Correction

# 2: timed with cold weights; 3: the micro-kernel prefetches its C tile (K blocks' C re-reads got cheaper)
KIND, SAMPLE_KIND = "cpu_gemm4", "cpu_gemm4_sample"
KINDS = (KIND, SAMPLE_KIND)
MEASURED = 8        # candidates measured per problem
ROUNDS = 7          # alternating rounds (timing.drift_corrected)
KC_LIMITS = (256, 512, 1024, 2048)
A_BLOCK_FRACTIONS = (0.25, 0.5, 0.75, 1.5)
FEATURES = ("bias", "log_kc", "log_mc", "tall_tile", "a_over_l2", "b_over_l1")
RIDGE = 0.1
BUDGET_SHARE = 0.1  # most of ``Config.tune_budget_s`` one problem's measurement may take (estimated)


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the cost model knows of the core: caches, tile width, and rough rates (their scale does not matter
    for ranking; the learned correction absorbs the rest)."""
    l1: int = 32 * 1024
    l2: int = 1024 * 1024
    nr: int = 32
    tile_heights: tuple[int, ...] = (8, 12)
    flops_per_s: float = 117e9     # one core's FMA peak (benchmarks/fma_probe.py on the dev box)
    mem_bytes_per_s: float = 20e9
    l3: int = 32 * 1024 * 1024
    l3_bytes_per_s: float = 60e9   # one core reading from the last-level cache

    @staticmethod
    def here() -> "Machine":
        from kiln.library.gemm import op as cpu_gemm
        nr = cpu_gemm.library().kiln_gemm_nr()
        return Machine(l1=timing.cache_bytes(1, 32 * 1024), l2=timing.cache_bytes(2, 1024 * 1024),
                       l3=timing.cache_bytes(3, 32 * 1024 * 1024), nr=nr,
                       tile_heights=(8, 12) if nr == 32 else (6,))


def candidates(m: int, k: int, n: int, machine: Machine) -> list[GemmSchedule]:
    """The rule-generated space for one problem (no duplicates)."""
    out: dict[tuple[int, int, int], GemmSchedule] = {}
    for mr in machine.tile_heights:
        for limit in KC_LIMITS:
            kc = -(-k // -(-k // limit))
            for fraction in A_BLOCK_FRACTIONS:
                mc = equal_blocks(m, max(mr, int(machine.l2 * fraction) // (4 * kc) // mr * mr), mr)
                out.setdefault((mr, kc, mc), GemmSchedule(mr=mr, kc=kc, mc=mc))
    return list(out.values())


def estimate_s(s: GemmSchedule, m: int, k: int, n: int, machine: Machine) -> float:
    """Analytic time of one ``[m, k] @ [k, n]`` product under schedule ``s`` (see the module docstring)."""
    rows = -(-m // s.mr) * s.mr                         # edge tiles are computed whole
    k_blocks, a_blocks = -(-k // s.kc), -(-m // s.mc)
    panels = -(-n // machine.nr)
    # per K block each micro-tile loads, adds and stores its C tile and restarts its loop: ~12 k-steps' worth
    compute = 2.0 * rows * k * panels * machine.nr / machine.flops_per_s * (1.0 + 12.0 / s.kc)
    b_bytes = 4.0 * k * n
    # B comes from memory once; each further A block re-reads it, from the last-level cache while B fits in
    # half of it (the weights stream through the rest), else from memory again.  (On the AVX2 box a 1024^3
    # product ran fastest with 30-row A blocks - 35 passes over its 4 MiB B, all from L3 - while 16 MiB
    # weights re-read by a second A block cost 10-17%.)
    rereads = b_bytes * (a_blocks - 1)
    moved_mem = 8.0 * m * k + 8.0 * m * n * k_blocks + b_bytes + (rereads if 2 * b_bytes > machine.l3 else 0.0)
    moved_l3 = rereads if 2 * b_bytes <= machine.l3 else 0.0
    # An A block past L2 (re-read per column panel) and B micro-panels past L1 (re-read per micro-tile) cost
    # almost nothing measured here - the prefetchers hide those streams - so they are left to the correction's
    # features (a_over_l2, b_over_l1), which learn what they cost on the machine at hand.
    return compute + moved_mem / machine.mem_bytes_per_s + moved_l3 / machine.l3_bytes_per_s


def features(s: GemmSchedule, machine: Machine) -> list[float]:
    return [1.0, math.log2(s.kc), math.log2(s.mc), float(s.mr > 8), s.mc * s.kc * 4 / machine.l2,
            s.kc * machine.nr * 4 / machine.l1]


def fit_correction(samples: list[tuple[GemmSchedule, int, int, int, float]], machine: Machine) -> Correction:
    """The correction (``tune/ranking.Correction``) from ``(schedule, m, k, n, seconds)`` samples, each problem
    ``(m, k, n)`` centred on its own."""
    return Correction.fit([((m, k, n), features(s, machine), math.log(t / estimate_s(s, m, k, n, machine)))
                           for s, m, k, n, t in samples], RIDGE)


def rank(m: int, k: int, n: int, machine: Machine, correction: Correction) -> list[GemmSchedule]:
    """The space, best predicted first."""
    return sorted(candidates(m, k, n, machine),
                  key=lambda s: estimate_s(s, m, k, n, machine) * correction.factor(features(s, machine)))


def problem_key(m: int, k: int, n: int) -> str:
    return f"{KIND}:f32:{m}x{k}x{n}:t{torch.get_num_threads()}"


def _samples(db) -> list[tuple[GemmSchedule, int, int, int, float]]:
    out = []
    for r in db.records():
        if r.kind == SAMPLE_KIND:
            m, k, n = (int(v) for v in r.key.split(":")[2].split("x"))
            out.append((GemmSchedule(**{f: r.trace[f] for f in ("mr", "kc", "mc")}), m, k, n, r.median_s))
    return out


def _time_all(schedules: list[GemmSchedule], m: int, k: int, n: int, rounds: int = ROUNDS) -> list[float]:
    """Seconds per schedule on random data over ``rounds`` alternating rounds, corrected for the machine's drift
    between rounds (``timing.drift_corrected``), each call on another copy of the weight so that B comes from
    memory, as in a model (``timing.cold_copies``)."""
    from kiln.library.gemm import op as cpu_gemm
    gen = torch.Generator().manual_seed(0)
    x, bias = torch.randn(m, k, generator=gen), torch.randn(n, generator=gen)
    packs = timing.copies(cpu_gemm.pack_weight(torch.randn(n, k, generator=gen)), timing.cold_copies(4 * n * k))
    calls = [timing.cycling([lambda s=s, p=p: cpu_gemm.linear_packed_impl(x, p, bias, n, s) for p in packs])
             for s in schedules]
    return timing.drift_corrected(timing.round_times(calls, rounds))


def schedule(m: int, k: int, n: int, tune: bool, choices: Choices,
             measure: Callable[..., list[float]] = _time_all, what: str | None = None) -> GemmSchedule | None:
    """This problem's schedule through the compile's measured-choice service (``choices``): the stored one;
    else, when ``tune``, the fastest of the ``MEASURED`` best-ranked candidates (stored, with every timing as a
    sample for the cost model; a line for the report); else None (the rule, ``schedule_for``).  ``what``: the
    report's name of the problem (default ``GEMM MxKxN``)."""

    def measured(db: Any) -> tuple[dict, float, float] | None:
        machine = Machine.here()
        ranked = rank(m, k, n, machine, fit_correction(_samples(db), machine))
        chosen = ranked[:MEASURED]
        rule = schedule_for(m, k, n)
        if rule not in chosen and rule.mr in machine.tile_heights:
            chosen.append(rule)  # the rule is always in the running: tuning never makes a problem slower
        cost_s = sum(estimate_s(s, m, k, n, machine) for s in chosen) * (ROUNDS + 1) / max(1, torch.get_num_threads())
        if cost_s > BUDGET_SHARE * config.get().tune_budget_s:
            return None  # a product too big to time within its share of the budget keeps the rule
        times = measure(chosen, m, k, n)
        for s, t in zip(chosen, times):
            db.put(f"{key}:{s.mr}/{s.kc}/{s.mc}", SAMPLE_KIND, s.trace(), t, 0.0, structure=SAMPLE_KIND)
        best = min(range(len(chosen)), key=lambda i: times[i])
        won = chosen[best]
        line = f"tuned GEMM {m}x{k}x{n}: {len(chosen)} schedules, best (mr, kc, mc) = ({won.mr}, {won.kc}, {won.mc})" \
            f" {times[best] * 1e3:.3f} ms"
        if rule in chosen:
            line += f", the rule's {times[chosen.index(rule)] * 1e3:.3f} ms"
        choices.note(line)
        return won.trace(), times[best], max(times) - min(times)

    key = problem_key(m, k, n)
    trace = choices.schedule(KIND, key, what or f"GEMM {m}x{k}x{n}", measured if tune else None)
    return GemmSchedule(**{f: trace[f] for f in ("mr", "kc", "mc")}) if trace is not None else None


# ---------------------------------------------------------------------------------------------- size buckets
class BucketSchedules:
    """kiln GEMM's schedule for a product whose row count is known per call only (dynamic shapes), one per size
    bucket of the rows ([Note: schedules per size bucket]).

    [Note: schedules per size bucket] A symbolic graph's ``kiln::linear_packed`` takes ``BucketArg`` values for
    its ``mr, kc, mc`` arguments; each size's Program asks them at its row count (``PerSize.at``, when the size is
    first planned).  The bucket's schedule is the one stored for the problem at the bucket's top row count (the
    record a static compile of that size would make, so both share it); without one, the call takes the rule
    (``schedule_for``, at the call's own rows).  Under max-autotune (``tune``) a bucket without a record is
    measured when a call first brings a size of it - the buckets the program actually sees - at the bucket's top
    size, stored, and reused by every size of the bucket and by later processes; measuring stops once the
    compile's ``Config.tune_budget_s`` is spent (each product within its ``BUDGET_SHARE``, as for static ones).
    The bucket's A-block height is re-balanced for the call's rows (``equal_blocks``), the micro-tile and K
    blocking kept.  Each bucket's answer shows in the compile report's tuned schedules (rows ``lo-hi``)::

        linear_packed(x[s0, 768], W, b, 3072, mr=<bucket>, kc=<bucket>, mc=<bucket>)
          s0=37 -> bucket 64: (mr, kc, mc) = (12, 768, 48) measured at 64x768x3072 -> (12, 768, 48) at 37 rows
          s0=50 -> bucket 64: the same record, nothing measured"""

    def __init__(self, rows: Any, k: int, n: int, tune: bool, choices: Choices,
                 measure: Callable[..., list[float]] | None = None):
        self.rows, self.k, self.n = rows, k, n
        self.tune = tune
        self.choices = choices
        self.measure = measure or _time_all
        self.found: dict[int, GemmSchedule | None] = {}   # bucket -> its schedule (None: the rule)
        self.spent_s = 0.0                                  # wall seconds measuring buckets

    def args(self) -> list["BucketArg"]:
        """The three extern arguments ``mr, kc, mc``."""
        return [BucketArg(self, f) for f in ("mr", "kc", "mc")]

    def at_rows(self, m: int) -> GemmSchedule | None:
        """The schedule for ``m`` rows (None: the rule's, which the op computes itself)."""
        b = bucket(m)
        if b not in self.found:
            self.found[b] = self._bucket_schedule(b)
        s = self.found[b]
        if s is None or m <= 0:
            return None
        return GemmSchedule(mr=s.mr, kc=s.kc, mc=equal_blocks(m, s.mc, s.mr))

    def _bucket_schedule(self, b: int) -> GemmSchedule | None:
        tune = self.tune and self.spent_s < config.get().tune_budget_s
        what = f"GEMM {b}x{self.k}x{self.n} (rows {b // 2 + 1}-{b})"
        start = time.perf_counter()
        try:
            found = schedule(b, self.k, self.n, tune, self.choices, self.measure, what=what)
            lines = self.choices.take_lines()  # (at run time no pass files them: the tuner's line goes on the record)
            made = self.choices.schedules
            if lines and made and made[-1].what == what:
                made[-1] = dataclasses.replace(made[-1], note=lines[-1])
            return found
        finally:
            self.spent_s += time.perf_counter() - start
            self.choices.close()  # (run time: the compile's store is not kept open between sizes)

    def __getstate__(self) -> dict:
        # (a pickled graph - ``kiln bisect``'s reproducers - keeps the buckets found; unpickled, it looks up the
        # tuning database of wherever it runs and measures nothing)
        return {**self.__dict__, "choices": None, "tune": False, "measure": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.choices, self.measure = Choices(), _time_all

    def __repr__(self) -> str:
        return f"per-bucket({self.rows})"


class BucketArg(PerSize):
    """One of ``mr, kc, mc`` of a ``BucketSchedules`` (0: the rule's), as a ``PerSize`` extern argument."""

    def __init__(self, schedules: BucketSchedules, field: str):
        self.schedules, self.field = schedules, field

    def at(self, env: dict[str, int]) -> int:
        s = self.schedules.at_rows(evaluate(self.schedules.rows, env))
        return 0 if s is None else getattr(s, self.field)

    def __repr__(self) -> str:
        return f"{self.field}={self.schedules!r}"
