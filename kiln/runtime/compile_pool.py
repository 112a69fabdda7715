"""Triton kernels compiled in worker processes, so a graph's kernels compile in parallel.

Why processes: most of a Triton compile is Python (AST to TTIR) and MLIR passes that hold the GIL, so threads
compile one kernel at a time; only ``ptxas`` ran in parallel.  Workers (``kiln.runtime.compile_worker``) are
started early - ``warm()`` runs when ``kiln.compile`` sees a model on a GPU, so their start-up overlaps
TorchDynamo's tracing - and live as long as this process.  Each compiled kernel lands in Triton's disk cache;
the parent's own warm-up of it is then a cache hit.  Anything a worker cannot do (a crash, an error, a hang
past the deadline) is left to the parent, which compiles the kernel itself as before: the pool only saves
time, it never decides a result.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

from kiln import config

_pool: "CompilePool | None" = None
_lock = threading.Lock()


class CompilePool:
    def __init__(self, workers: int, target: tuple[str, int, int], env: dict[str, str] | None = None):
        self.target = target
        self.procs = [subprocess.Popen([sys.executable, "-m", "kiln.runtime.compile_worker", json.dumps(target)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True, bufsize=1, env=env)
                      for _ in range(workers)]
        self.ready = [False] * workers
        self.cache_dir = (env or os.environ).get("TRITON_CACHE_DIR")  # where the workers put kernels
        self.compiled = 0   # kernels compiled by workers (for the report and the tests)

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p.poll() is None]

    def _answer(self, i: int) -> dict[str, Any] | None:
        line = self.procs[i].stdout.readline()
        return json.loads(line) if line else None

    def compile(self, jobs: list[dict[str, Any]], deadline_s: float = 300.0) -> dict[int, dict[str, Any]]:
        """Run ``jobs`` (see compile_worker) on the workers; the answers by job id (missing: not done)."""
        todo: queue.Queue = queue.Queue()
        for job in jobs:
            todo.put(job)
        answers: dict[int, dict[str, Any]] = {}

        def feed(i: int) -> None:
            proc = self.procs[i]
            if not self.ready[i]:
                if self._answer(i) is None:
                    return  # the worker died starting up
                self.ready[i] = True
            while True:
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    proc.stdin.write(json.dumps(job) + "\n")
                    proc.stdin.flush()
                    answer = self._answer(i)
                except (OSError, ValueError):
                    answer = None
                if answer is None:
                    return  # died on this job: the parent compiles it
                answers[job["id"]] = answer

        live = self.alive()
        threads = [threading.Thread(target=feed, args=(i,), daemon=True) for i in live]
        for t in threads:
            t.start()
        end = time.monotonic() + deadline_s
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        for t, i in zip(threads, live):
            if t.is_alive():  # hung past the deadline: kill it (a new pool starts next time)
                self.procs[i].kill()
        self.compiled += sum(1 for a in answers.values() if a.get("ok"))
        return answers

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()


def _target() -> tuple[str, int, int] | None:
    import torch
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return None
    major, minor = torch.cuda.get_device_capability()
    return ("cuda", major * 10 + minor, 32)


def get(start: bool = True) -> CompilePool | None:
    """The process's pool (started now if ``start``), or None when disabled or there is no GPU."""
    global _pool
    with _lock:
        if _pool is not None and (not _pool.alive() or _pool.cache_dir != os.environ.get("TRITON_CACHE_DIR")):
            _pool.close()  # dead, or filling a cache this process no longer reads
            _pool = None
        if _pool is None and start:
            workers = config.get().compile_workers
            target = _target() if workers > 0 else None
            if target is not None:
                _pool = CompilePool(workers, target)
        return _pool


def warm() -> None:
    """Start the workers now (non-blocking), so they are ready when the first kernels are."""
    try:
        get()
    except Exception:  # noqa: BLE001 - only an optimisation
        pass
