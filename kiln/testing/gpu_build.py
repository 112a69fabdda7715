"""Build a GPU module's Triton kernels for a real GPU target without a GPU: what CI can check of the Triton code
generator beyond Triton's interpreter.

Under ``TRITON_INTERPRET=1`` (how CI runs the GPU tests on CPU tensors) a kernel runs as Python and numpy, so a
kernel that Triton's compiler rejects - a load masked by an integer tensor, a type its MLIR verifier refuses -
still runs and passes.  On a GPU the compile fails and the graph falls back to eager (T5 on the H200 did).
``gpu_build_errors`` hands every kernel of a module to kiln's compile workers (``runtime/compile_worker``: a stub
driver names the target, no CUDA context), in a process without the interpreter, through the same front end,
MLIR passes, LLVM and ptxas a GPU machine runs::

    module = triton_graph(report.optimized, report, torch.device("cpu"))   # built under the interpreter
    assert gpu_build_errors(module) == {}                                  # {kernel: error} else
"""
from __future__ import annotations

import os
import tempfile
from typing import Any

HOPPER = ("cuda", 90, 32)  # the H200's target: (backend, compute capability, warp size)


def gpu_build_errors(module: Any, target: tuple[str, int, int] = HOPPER, workers: int = 2,
                     deadline_s: float = 600.0) -> dict[str, str]:
    """``{kernel name: error}`` for each kernel of ``module`` (a ``TritonGraph``) that fails to compile for
    ``target``; a kernel the workers left undone (a crash, the deadline) is reported as such.  Kernels with the
    same text, dtypes and launch compile once (Triton's cache, a fresh one per call)."""
    from kiln.runtime.compile_pool import CompilePool
    jobs = module.compile_jobs()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory(prefix="kiln-gpu-build-") as cache:
        env["TRITON_CACHE_DIR"] = cache
        pool = CompilePool(max(1, min(workers, len(jobs))), target, env)
        try:
            answers = pool.compile(jobs, deadline_s=deadline_s)
        finally:
            pool.close()
    errors = {}
    for job in jobs:
        answer = answers.get(job["id"])
        if answer is None:
            errors[job["kernel"]] = "not compiled (the worker crashed or the deadline passed)"
        elif not answer.get("ok"):
            errors[job["kernel"]] = answer.get("error", "?")
    return errors
