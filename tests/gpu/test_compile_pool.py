"""Triton compile workers: kernels compile for the GPU target in other processes (no GPU needed: the workers
never touch one), into Triton's disk cache; a bad job is reported, not fatal, and the others still compile."""
import json
import os

import pytest

from kiln.runtime.compile_pool import CompilePool

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def kernel_0(p0, p1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(p1 + x, tl.exp(tl.load(p0 + x, mask=x < 1000).to(tl.float32)).to(p1.dtype.element_ty), mask=x < 1000)


@triton.jit
def kernel_1(p0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    tl.store(p0 + tl.arange(0, XBLOCK), undefined_name)


kernel_2 = kernel_0
'''


def test_workers_compile_into_the_cache_and_isolate_failures(tmp_path):
    path = tmp_path / "kiln_0123456789abcdef01234567.py"
    path.write_text(SOURCE)
    cache = tmp_path / "triton-cache"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile for real, not interpret
    env["TRITON_CACHE_DIR"] = str(cache)
    pool = CompilePool(2, ("cuda", 90, 32), env=env)
    try:
        job = {"path": str(path), "grid": [4, 1, 1], "constants": {"XBLOCK": 256, "RBLOCK": 1}, "num_warps": 4}
        answers = pool.compile([{**job, "id": 0, "kernel": "kernel_0", "dtypes": ["bfloat16", "bfloat16"]},
                                {**job, "id": 1, "kernel": "kernel_1", "dtypes": ["float32"]},
                                {**job, "id": 2, "kernel": "no_such_kernel", "dtypes": ["float32"]},
                                {**job, "id": 3, "kernel": "kernel_2", "dtypes": ["float32", "float32"]}],
                               deadline_s=240)
    finally:
        pool.close()
    assert answers[0]["ok"] and answers[3]["ok"], json.dumps(answers)
    assert not answers[1]["ok"] and "undefined_name" in answers[1]["error"]
    assert not answers[2]["ok"] and "no_such_kernel" in answers[2]["error"]
    cubins = list(cache.rglob("*.cubin"))
    assert len(cubins) == 2  # kernel_0 for bf16 and (as kernel_2) for fp32
    assert pool.compiled == 2


def _jobs(path, n):
    job = {"path": str(path), "grid": [4, 1, 1], "constants": {"XBLOCK": 256, "RBLOCK": 1}, "num_warps": 4,
           "kernel": "kernel_0"}
    return [{**job, "id": k, "dtypes": [d, d]} for k, d in enumerate(["float32", "bfloat16", "float16"][:n])]


def test_a_worker_not_started_yet_is_not_waited_for_and_the_queue_is_shared(tmp_path):
    """``serve`` shares its queue with the parent's own threads: while the workers are still starting (each
    imports torch, seconds), the parent takes every job and nothing waits for them; once started, a worker takes
    jobs from the same queue and each job is done exactly once."""
    import queue
    import threading
    import time
    path = tmp_path / "kiln_0123456789abcdef01234568.py"
    path.write_text(SOURCE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    pool = CompilePool(1, ("cuda", 90, 32), env=env)
    try:
        todo = queue.Queue()
        for job in _jobs(path, 3):
            todo.put(job)
        by_worker = []
        start = time.monotonic()
        feeders = pool.serve(todo, lambda job: job, lambda job, answer: by_worker.append(job["id"]))
        by_parent = []
        while not todo.empty():
            by_parent.append(todo.get_nowait()["id"])
        pool.join(feeders, deadline_s=60)
        assert time.monotonic() - start < 1.0  # (a worker's start takes seconds)
        assert sorted(by_parent) == [0, 1, 2] and by_worker == [] and pool.compiled == 0

        assert pool.started[0].wait(120)
        for job in _jobs(path, 3):
            todo.put(job)
        done = []
        lock = threading.Lock()

        def record(job, answer):
            with lock:
                done.append((job["id"], answer["ok"]))
        pool.join(pool.serve(todo, lambda job: job, record), deadline_s=240)
        assert sorted(done) == [(0, True), (1, True), (2, True)] and pool.compiled == 3
    finally:
        pool.close()


def test_graph_compile_shares_kernels_between_its_threads_and_the_workers(tmp_path, monkeypatch):
    """``TritonGraph._compile_shared``: every unique kernel is compiled (or, when a worker built it, loaded) by
    the parent exactly once; a kernel whose compile fails raises in the caller after all threads stopped."""
    import threading
    from kiln.runtime import compile_pool
    from kiln.runtime.triton_module import TritonGraph
    path = tmp_path / "kiln_0123456789abcdef01234569.py"
    path.write_text(SOURCE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    pool = CompilePool(2, ("cuda", 90, 32), env=env)
    assert all(e.wait(120) for e in pool.started)
    monkeypatch.setattr(compile_pool, "get", lambda start=True: pool)
    graph = TritonGraph.__new__(TritonGraph)
    jobs = _jobs(path, 3)
    graph.compile_jobs = lambda launches: [{**jobs[i], "id": k} for k, (i, _) in enumerate(launches)]
    unique = {("k", i): (i, 0) for i in range(3)}
    loaded, lock = [], threading.Lock()

    def compile_one(launch):
        import time
        time.sleep(0.3)  # (a parent compile: the workers, started first, take jobs meanwhile)
        with lock:
            loaded.append(launch)
        return f"compiled {launch}"
    try:
        phases = {}
        got = graph._compile_shared(unique, compile_one, phases)
        assert got == {key: f"compiled {launch}" for key, launch in unique.items()}
        assert sorted(loaded) == [(0, 0), (1, 0), (2, 0)]
        assert 1 <= phases["kernels_by_workers"] <= 3 and phases["compile_workers"] > 0

        def broken(launch):
            if launch == (1, 0):
                raise RuntimeError("kiln-test: kernel 1 does not compile")
            return "ok"
        with pytest.raises(RuntimeError, match="kernel 1 does not compile"):
            graph._compile_shared(unique, broken, {})
    finally:
        pool.close()
