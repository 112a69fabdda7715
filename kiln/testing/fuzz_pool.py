"""Worker processes for the fuzzer: a crash in generated C++ (a segfault) or a hang costs one task, not the run.

Each worker is ``python -m kiln.testing.fuzz --worker``: it reads one JSON task per line on stdin and answers
one line ``@@FUZZ {json}`` on stdout (anything else a library prints is ignored).  A worker that dies or
passes its deadline is replaced; its task is answered as a ``crash`` with the signal or ``timeout``.  Workers
are recycled every ``max_tasks`` tasks, which bounds memory (every built module stays loaded in a process).
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

PREFIX = "@@FUZZ "
# [Note: eager's own crashes] A worker writes these around what runs eager PyTorch alone (the reference, the
# gradient probes): a worker that dies in between was killed by PyTorch itself - eager's autograd segfaulted on
# gradient fuzz seed 10426 (a batch_norm whose running statistics are the weight's tensors) - and the task is
# answered ``torch_error``, not a crash of kiln's code.
EAGER_RUNNING, EAGER_DONE = "kiln-fuzz: eager PyTorch running", "kiln-fuzz: eager PyTorch done"
WORKER_ENV = "KILN_FUZZ_WORKER"  # set in a pool's workers


@contextlib.contextmanager
def eager_only() -> Any:
    """Mark (on the worker's stderr) a stretch that runs eager PyTorch alone ([Note: eager's own crashes]); outside
    a pool's worker, nothing."""
    if os.environ.get(WORKER_ENV) != "1":
        yield
        return
    sys.stderr.write(EAGER_RUNNING + "\n")
    sys.stderr.flush()
    try:
        yield
    finally:
        sys.stderr.write(EAGER_DONE + "\n")
        sys.stderr.flush()
# a worker ended by one of these was stopped from outside (a shell, a session's cleanup), not by a crash in
# kiln's code: its task runs once more
EXTERNAL = frozenset({-signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP})


class Worker:
    def __init__(self, env: dict[str, str]):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "kiln.testing.fuzz", "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, bufsize=0)
        self.buffer = b""  # stdout read with os.read: a buffered reader would hide lines from select()
        self.task: dict[str, Any] | None = None
        self.deadline = 0.0
        self.done = 0

    def send(self, task: dict[str, Any], timeout: float) -> None:
        self.task, self.deadline = task, time.monotonic() + timeout
        self.proc.stdin.write((json.dumps(task) + "\n").encode())

    def read_answer(self) -> dict[str, Any] | None:
        """Read what the worker wrote; its answer if a whole answer line arrived (raises EOFError at the end)."""
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not data:
            raise EOFError
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            text = line.decode(errors="replace")
            if text.startswith(PREFIX):
                return json.loads(text[len(PREFIX):])
        return None

    def stderr_tail(self) -> str:
        self.log.seek(0)
        lines = [ln for ln in self.log.read().splitlines() if ln.strip() and "Warning" not in ln
                 and not ln.startswith((EAGER_RUNNING, EAGER_DONE))]
        return " | ".join(lines[-3:])[-400:]

    def died_in_eager(self) -> bool:
        """Did the worker stop inside ``eager_only`` ([Note: eager's own crashes])?"""
        self.log.seek(0)
        marks = [ln for ln in self.log.read().splitlines() if ln.startswith((EAGER_RUNNING, EAGER_DONE))]
        return bool(marks) and marks[-1].startswith(EAGER_RUNNING)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child, by its handle
        self.proc.wait()
        self.log.close()


def _died(worker: Worker, why: str) -> dict[str, Any]:
    code = worker.proc.poll()
    if why == "timeout":
        detail = "timeout: the worker did not answer in time (a hang in generated code?)"
    elif code is not None and code < 0:
        detail = f"the worker died from signal {signal.Signals(-code).name}"
    else:
        detail = f"the worker exited with code {code}"
    sig = "crash:timeout" if why == "timeout" else f"crash:{detail.split()[-1]}"
    if worker.died_in_eager():  # ([Note: eager's own crashes])
        return {"status": "torch_error", "signature": f"torch_error:eager-{sig}",
                "detail": f"eager PyTorch alone: {detail}; stderr: {worker.stderr_tail()}", "died": True}
    return {"status": "crash", "signature": sig, "detail": f"{detail}; stderr: {worker.stderr_tail()}",
            "died": True}


class Pool:
    """``jobs`` workers; ``run(tasks, on_result)`` answers every task, calling ``on_result(task, answer)``."""

    def __init__(self, jobs: int, timeout: float = 300.0, max_tasks: int = 60):
        self.jobs, self.timeout, self.max_tasks = max(1, jobs), timeout, max_tasks
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", WORKER_ENV: "1"}
        self.workers: list[Worker] = []
        self._cache: tempfile.TemporaryDirectory | None = None
        if "KILN_CACHE_DIR" not in os.environ:  # ~50 MB of modules per 1000 programs: not into the user's cache
            self._cache = tempfile.TemporaryDirectory(prefix="kiln-fuzz-cache-")
            self.env["KILN_CACHE_DIR"] = self._cache.name

    def run(self, tasks: collections.deque, on_result: Callable[[dict[str, Any], dict[str, Any]], None],
            timeout: Callable[[dict[str, Any]], float] | None = None) -> None:
        """Run every task of ``tasks``; ``on_result`` may append more (a failed group's members)."""
        sel = selectors.DefaultSelector()
        busy: dict[int, Worker] = {}
        while True:
            while tasks and len(busy) < self.jobs:
                task = tasks.popleft()
                w = self._idle_worker()
                w.send(task, timeout(task) if timeout else self.timeout)
                busy[w.proc.pid] = w
                sel.register(w.proc.stdout, selectors.EVENT_READ, w)
            if not busy:
                break
            self._wait(sel, busy, on_result, tasks)
        sel.close()

    def _wait(self, sel: selectors.BaseSelector, busy: dict[int, Worker],
              on_result: Callable[[dict[str, Any], dict[str, Any]], None], tasks: collections.deque) -> None:
        now = time.monotonic()
        wait = max(0.05, min(w.deadline for w in busy.values()) - now)
        for key, _ in sel.select(timeout=wait):
            w: Worker = key.data
            try:
                answer = w.read_answer()
            except EOFError:
                w.proc.wait()
                self._finish(sel, busy, w, _died(w, "died"), on_result, dead=True, retry=tasks)
                continue
            if answer is not None:
                self._finish(sel, busy, w, answer, on_result)
        for w in list(busy.values()):
            if time.monotonic() > w.deadline:
                w.proc.kill()
                w.proc.wait()
                self._finish(sel, busy, w, _died(w, "timeout"), on_result, dead=True)

    def _finish(self, sel: selectors.BaseSelector, busy: dict[int, Worker], w: Worker, answer: dict[str, Any],
                on_result: Callable[[dict[str, Any], dict[str, Any]], None], dead: bool = False,
                retry: collections.deque | None = None) -> None:
        sel.unregister(w.proc.stdout)
        del busy[w.proc.pid]
        task, w.task = w.task, None
        w.done += 1
        if dead or w.done >= self.max_tasks:
            self.workers.remove(w)
            w.stop()
        if retry is not None and w.proc.returncode in EXTERNAL and not task.get("retried"):
            retry.appendleft({**task, "retried": True})  # stopped from outside (not kiln's crash): once more
            return
        on_result(task, answer)

    def _idle_worker(self) -> Worker:
        for w in self.workers:
            if w.task is None:
                return w
        w = Worker(self.env)
        self.workers.append(w)
        return w

    def close(self) -> None:
        for w in self.workers:
            try:
                w.proc.stdin.close()
            except OSError:
                pass
            w.stop()
        self.workers = []
        if self._cache is not None:
            self._cache.cleanup()
            self._cache = None
