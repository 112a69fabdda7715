"""Triton kernels compiled in worker processes, so a graph's kernels compile in parallel.

Why processes: most of a Triton compile is Python (AST to TTIR) and MLIR passes that hold the GIL, so threads
compile one kernel at a time; only ``ptxas`` ran in parallel.  Workers (``kiln.runtime.compile_worker``) are
started early - ``warm()`` runs when ``kiln.compile`` sees a model on a GPU, so their start-up overlaps
TorchDynamo's tracing - and live as long as this process.  Each compiled kernel lands in Triton's disk cache;
the parent's own warm-up of it is then a cache hit.  Anything a worker cannot do (a crash, an error, a hang
past the deadline) is left to the parent, which compiles the kernel itself as before: the pool only saves
time, it never decides a result.

Nobody waits for a worker to start (session 4 measured that wait: 8 workers made a cold process's first call
slower, MLP 6.5 -> 9.4 s on the H200): the parent's threads and the started workers take kernels from one
queue (``serve``), so a worker still importing torch simply takes none.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any, Callable

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
        # Each worker's start-up line is read by a thread of its own, so that nobody waits for a start: a
        # worker takes jobs once started (see ``serve``), until then the parent compiles them itself.
        self.started = [threading.Event() for _ in range(workers)]
        self._gone = [threading.Event() for _ in range(workers)]  # died before or while starting
        self._busy = [threading.Lock() for _ in range(workers)]   # one job at a time on a worker's pipes
        for i in range(workers):
            threading.Thread(target=self._await_start, args=(i,), daemon=True).start()
        self.cache_dir = (env or os.environ).get("TRITON_CACHE_DIR")  # where the workers put kernels
        self.compiled = 0   # kernels compiled by workers (for the report and the tests)
        self._count = threading.Lock()

    def _await_start(self, i: int) -> None:
        (self.started[i] if self._answer(i) is not None else self._gone[i]).set()

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p.poll() is None and not self._gone[i].is_set()]

    def ready(self) -> list[int]:
        """The workers started and alive now."""
        return [i for i in self.alive() if self.started[i].is_set()]

    def _answer(self, i: int) -> dict[str, Any] | None:
        line = self.procs[i].stdout.readline()
        return json.loads(line) if line else None

    def _run(self, i: int, job: dict[str, Any]) -> dict[str, Any] | None:
        try:
            self.procs[i].stdin.write(json.dumps(job) + "\n")
            self.procs[i].stdin.flush()
            return self._answer(i)
        except (OSError, ValueError):
            return None

    def serve(self, todo: queue.Queue, spec: Callable[[Any], dict[str, Any]],
              done: Callable[[Any, dict[str, Any] | None], None]) -> list[threading.Thread]:
        """Feed the items of ``todo`` to the workers, sharing the queue with whoever else takes from it (the
        parent's own compile threads): one thread per live worker, which waits for its worker's start only while
        items remain, then takes items until the queue is empty.  ``spec(item)`` is the job sent (see
        compile_worker); ``done(item, answer)`` runs in the feeding thread after each job (``answer`` None: the
        worker died on it - it takes no more).  Returns the threads (the caller joins them)."""
        def feed(i: int) -> None:
            while not self.started[i].is_set():
                if self._gone[i].is_set() or self.procs[i].poll() is not None or todo.empty():
                    return
                self.started[i].wait(0.005)
            with self._busy[i]:
                while True:
                    try:
                        item = todo.get_nowait()
                    except queue.Empty:
                        return
                    answer = self._run(i, spec(item))
                    if answer is not None and answer.get("ok"):
                        with self._count:
                            self.compiled += 1
                    done(item, answer)
                    if answer is None:
                        return

        threads = [threading.Thread(target=feed, args=(i,), daemon=True) for i in self.alive()]
        for t in threads:
            t.start()
        return threads

    def join(self, threads: list[threading.Thread], deadline_s: float) -> None:
        """Wait for ``serve``'s threads; a worker still busy at the deadline is killed (its thread then sees it
        die: a new pool starts next time)."""
        end = time.monotonic() + deadline_s
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        if any(t.is_alive() for t in threads):
            for i, p in enumerate(self.procs):
                if self._busy[i].locked():
                    p.kill()
            for t in threads:
                t.join()

    def compile(self, jobs: list[dict[str, Any]], deadline_s: float = 300.0) -> dict[int, dict[str, Any]]:
        """Run ``jobs`` (see compile_worker) on the workers alone, waiting for them to start; the answers by job
        id (missing: not done - every worker died)."""
        todo: queue.Queue = queue.Queue()
        for job in jobs:
            todo.put(job)
        answers: dict[int, dict[str, Any]] = {}

        def done(job: dict[str, Any], answer: dict[str, Any] | None) -> None:
            if answer is not None:
                answers[job["id"]] = answer
        self.join(self.serve(todo, lambda job: job, done), deadline_s)
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
