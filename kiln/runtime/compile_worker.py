"""A Triton compile worker: ``python -m kiln.runtime.compile_worker '["cuda", 90, 32]'``.

Reads one JSON job per line on stdin, compiles that kernel of a generated module for the given target, and
answers one JSON line on stdout.  The compiled kernel lands in Triton's on-disk cache, where the parent's own
``warmup`` of the same kernel then finds it (the cache key is the same: same source, signature, options and
target).  The worker never touches the GPU: a stub driver names the target, so no CUDA context is created.

Job: ``{"id", "path", "kernel", "dtypes": ["bfloat16", ...], "grid": [x, y, z], "constants": {...},
"num_warps", "launcher"}`` (``launcher``: build Triton's C launcher too, default true); answer: ``{"id", "ok",
"seconds"}`` or ``{"id", "ok": false, "error"}``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

_modules: dict[str, Any] = {}


def _install_stub_driver(target: list) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime import driver
    stub = CudaDriver.__new__(CudaDriver)  # only what a warm-up compile asks of the driver
    stub.get_current_device = lambda: 0
    stub.get_current_stream = lambda device=None: 0
    stub.get_current_target = lambda: GPUTarget(target[0], target[1], target[2])
    driver.set_active(stub)


def _module(path: str) -> Any:
    if path not in _modules:
        from kiln.runtime.triton_module import import_file
        _modules[path] = import_file(path)
    return _modules[path]


def compile_job(job: dict) -> None:
    import torch
    fn = getattr(_module(job["path"]), job["kernel"])
    dtypes = [getattr(torch, d) for d in job["dtypes"]]
    compiled = fn.warmup(*dtypes, grid=tuple(job["grid"]), num_warps=job["num_warps"], **job["constants"])
    from kiln.runtime import gpu_launch
    from kiln.runtime.triton_module import build_launcher
    if job.get("launcher", True) or not gpu_launch.describable(compiled):  # (see [Note: no Triton launcher])
        build_launcher(compiled)


def _warm_up() -> None:
    """Compile one tiny kernel before answering ready, into a scratch cache (so every worker pays it).  A worker's
    first compile otherwise pays Triton's one-time set-up - its backend, the MLIR dialects, LLVM's target,
    ``kiln.runtime``'s imports - on the first kernel a graph hands it, and a cold worker took longer over one
    kernel than the parent's threads over all of a small graph's (session 35: workers took none of
    encoder_fast's kernels).  Done while the parent is still tracing, as the rest of the start."""
    import torch
    import triton
    import triton.language as tl
    from kiln.runtime import triton_module  # noqa: F401  (what the jobs import)

    @triton.jit
    def _warm(p0, p1, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(p1 + i, tl.load(p0 + i) * 2.0 + 1.0)
    import tempfile
    saved = triton.knobs.cache.dir
    with tempfile.TemporaryDirectory(prefix="kiln-worker-warm-up-") as scratch:
        triton.knobs.cache.dir = scratch  # (nothing of it in the caller's cache)
        try:
            _warm.warmup(torch.float32, torch.float32, grid=(1,), BLOCK=16)
        finally:
            triton.knobs.cache.dir = saved


def main() -> None:
    # The answers go to the parent through the original stdout; file descriptor 1 then points at stderr, because
    # a failing compile prints its MLIR diagnostics (the module's IR) to fd 1 from C++, which would break the
    # protocol and read as a crashed worker instead of the error.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _install_stub_driver(json.loads(sys.argv[1]))
    import torch  # noqa: F401  (imported before the first job, while the parent is still tracing)
    try:
        _warm_up()
    except Exception:  # noqa: BLE001 - only an optimisation; a real job reports its own error
        pass
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        start = time.perf_counter()
        try:
            compile_job(job)
            answer = {"id": job["id"], "ok": True, "seconds": time.perf_counter() - start}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which compiles it itself
            answer = {"id": job["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), file=answers, flush=True)


if __name__ == "__main__":
    main()
