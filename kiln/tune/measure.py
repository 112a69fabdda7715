"""Measuring schedule candidates robustly, each in its own process.

A candidate is a generated C++ translation unit (kiln's format: ``kiln_segment_0(void** b)`` over a table
of buffer pointers) plus the buffers it reads and writes.  Each candidate is compiled and timed in a fresh
worker process (``kiln/tune/worker.py``), so one that fails to compile, crashes (a bad schedule indexing out
of bounds) or hangs is recorded and skipped while tuning carries on:

    compile error -> status "compile-error"    (the compiler's message kept in ``detail``)
    signal / exit -> status "crash"
    no answer     -> status "timeout"          (the child is killed after ``timeout_s``)

Timing: ``warmup`` untimed calls, then ``repeats`` timed calls; the buffers are rotated among several
copies whose total exceeds the last-level cache, so a candidate is not timed on warm caches it would not
have in a model; the result is the median with the interquartile spread.  ``confirm`` re-measures the best
candidate in a second child and keeps the slower of the two medians (a lucky run cannot win).

Compiling and timing are kept apart: the candidates are first built in parallel (``jobs`` compilers at once,
into the build cache), then timed one worker at a time, with the thread count the caller's kernels run with.
Timing while another candidate compiled let the compiler take a core from the kernel's OpenMP threads: on the
2-core dev box a pointwise kernel then measured up to 5x slower at random.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Sequence

ROTATE_BYTES = 64 << 20  # buffer copies rotated until their total passes this (beyond the L3 of our CPUs)
MAX_COPIES = 8


@dataclasses.dataclass(frozen=True)
class Candidate:
    name: str                                          # what schedule this is (for reports and the database)
    source: str                                        # the translation unit
    buffers: tuple[tuple[tuple[int, ...], str], ...]   # (shape, torch dtype name) per pointer slot
    trace: Any = None                                  # the schedule as data (stored with the measurement)


@dataclasses.dataclass
class Measurement:
    name: str
    status: str                  # ok | compile-error | crash | timeout
    median_s: float | None = None
    spread_s: float | None = None
    detail: str = ""
    trace: Any = None


def run_child(request: dict[str, Any]) -> tuple[str, float | None, float | None, str]:
    """In the worker process: build, allocate, time one candidate; returns (status, median, spread, detail)."""
    import ctypes

    import torch

    from kiln.runtime.build import KilnBuildError, load_module
    try:
        lib = load_module(request["source"], name="kiln_candidate").lib
    except KilnBuildError as exc:
        return "compile-error", None, None, str(exc)[-2000:]
    fn = lib.kiln_segment_0
    fn.argtypes, fn.restype = [ctypes.c_void_p], None
    if request.get("threads") and hasattr(lib, "kiln_set_threads"):
        lib.kiln_set_threads.argtypes = [ctypes.c_int]
        lib.kiln_set_threads(int(request["threads"]))
    torch.manual_seed(0)
    one_set = [_random(tuple(shape), getattr(torch, dtype)) for shape, dtype in request["buffers"]]
    per_set = sum(t.numel() * t.element_size() for t in one_set) or 1
    copies = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // per_set)))
    sets = [one_set] + [[t.clone() for t in one_set] for _ in range(copies - 1)]
    tables = [(ctypes.c_void_p * max(len(s), 1))(*[t.data_ptr() for t in s]) for s in sets]
    for i in range(request["warmup"]):
        fn(ctypes.addressof(tables[i % len(tables)]))
    times = []
    for i in range(request["repeats"]):
        table = tables[i % len(tables)]
        start = time.perf_counter()
        fn(ctypes.addressof(table))
        times.append(time.perf_counter() - start)
    q = statistics.quantiles(times, n=4) if len(times) >= 4 else [min(times), 0, max(times)]
    return "ok", statistics.median(times), q[2] - q[0], f"{copies} buffer set(s)"


def _random(shape: tuple[int, ...], dtype: Any) -> Any:
    import torch
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    return torch.randint(0, 7, shape, dtype=dtype)


def _start(c: Candidate, repeats: int, warmup: int) -> subprocess.Popen:
    """A worker process (``python -m kiln.tune.worker``): the request on stdin, the result on stdout.  Not
    multiprocessing: its spawn start would re-import the user's ``__main__`` in every worker."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # kiln's parent folder
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "kiln.tune.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    import torch
    request = {"source": c.source, "buffers": [list(b) for b in c.buffers], "repeats": repeats, "warmup": warmup,
               "threads": torch.get_num_threads()}
    proc.stdin.write(json.dumps(request))
    proc.stdin.close()
    return proc


def _finish(c: Candidate, proc: subprocess.Popen) -> Measurement:
    with proc.stdout, proc.stderr:  # closed here: the pipes are this measurement's, nobody reads them later
        out, err = proc.stdout.read(), proc.stderr.read()
    if proc.returncode != 0:
        return Measurement(c.name, "crash", detail=f"exit code {proc.returncode}: {err[-1500:]}", trace=c.trace)
    try:
        status, median, spread, detail = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Measurement(c.name, "crash", detail=f"no result: {err[-1500:]}", trace=c.trace)
    return Measurement(c.name, status, median, spread, detail, c.trace)


def prebuild(candidates: Sequence[Candidate], jobs: int) -> None:
    """Compile the candidates into the build cache, ``jobs`` at a time (the compiler runs outside the GIL), so
    the timing workers only load them.  Best effort: a candidate that fails to build fails again in its worker,
    which reports it."""
    from concurrent.futures import ThreadPoolExecutor

    from kiln.runtime.build import KilnBuildError, load_module

    def build(c: Candidate) -> None:
        try:
            load_module(c.source, name="kiln_candidate")
        except KilnBuildError:
            pass
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(build, candidates))


def measure(candidates: Sequence[Candidate], *, repeats: int = 20, warmup: int = 3, timeout_s: float = 60.0,
            jobs: int = 2, confirm: bool = True) -> list[Measurement]:
    """Measure every candidate: built ``jobs`` at a time, then timed one worker process at a time; results in
    the candidates' order."""
    if jobs > 1:
        prebuild(candidates, jobs)
    jobs = 1  # timings must not overlap with each other nor with builds
    results: dict[int, Measurement] = {}
    pending = list(enumerate(candidates))
    running: list[tuple[int, subprocess.Popen, float]] = []
    while pending or running:
        while pending and len(running) < jobs:
            i, c = pending.pop(0)
            running.append((i, _start(c, repeats, warmup), time.monotonic()))
        for entry in list(running):
            i, proc, started = entry
            c = candidates[i]
            if proc.poll() is not None:
                results[i] = _finish(c, proc)
            elif time.monotonic() - started > timeout_s:
                proc.kill()
                proc.wait(timeout=10)
                proc.stdout.close()
                proc.stderr.close()
                results[i] = Measurement(c.name, "timeout", detail=f"no result after {timeout_s:.0f} s",
                                         trace=c.trace)
            else:
                continue
            running.remove(entry)
        time.sleep(0.01)
    ordered = [results[i] for i in range(len(candidates))]
    if confirm:
        ok = [(m.median_s, i) for i, m in enumerate(ordered) if m.status == "ok"]
        if ok:
            best = min(ok)[1]
            again = measure([candidates[best]], repeats=repeats, warmup=warmup, timeout_s=timeout_s, jobs=1,
                            confirm=False)[0]
            if again.status == "ok" and again.median_s > ordered[best].median_s:
                ordered[best].median_s = again.median_s
                ordered[best].detail += "; confirmed by a second run (kept the slower median)"
    return ordered
