"""kiln: compile PyTorch models into fused C++ kernels.

    import kiln
    fast = kiln.compile(model)              # or torch.compile(model, backend="kiln")
    kiln.explain(model, example_input)      # what kiln did, and why
    kiln.profile(model, example_input)      # time per kernel, against the machine's limit
"""
from __future__ import annotations

from typing import Any, Callable

__version__ = "0.1.0"

TARGETS = ("auto", "cpu", "cuda", "triton")


def compile(model_or_fn: Callable, *, mode: str = "default", target: str = "auto", dynamic: bool = False,
            fullgraph: bool = False, **options: Any) -> Callable:
    """Compile a model or function with kiln; returns a callable with the same behaviour.

    ``mode``: "default", "reduce-overhead" or "max-autotune" (as in torch.compile).
    ``target``: "auto" (the inputs' device: C++ on CPU, Triton on CUDA), "cpu", "cuda", or "triton" (Triton code
    also for CPU tensors, run by Triton's interpreter when ``TRITON_INTERPRET=1``).
    ``options``: kiln settings (see ``kiln.config.Config``), e.g. ``check=True``.
    """
    import torch

    from kiln import config
    from kiln.frontend.dynamo import check_mode, kiln_backend

    if not callable(model_or_fn):
        raise TypeError(f"kiln.compile expects an nn.Module or a function, got {type(model_or_fn).__name__}")
    mode = check_mode(mode)
    if target not in TARGETS:
        raise ValueError(f"kiln.compile: unknown target {target!r}; accepted targets are {list(TARGETS)}")
    if target != "auto":
        options = {**options, "target": "triton" if target == "cuda" else target}
    config.get().with_options(**options)  # validate option names now, not at the first call

    def backend(gm: Any, example_inputs: Any) -> Callable:
        return kiln_backend(gm, example_inputs, mode=mode, options=options)

    if _on_gpu(model_or_fn) and target in ("auto", "cuda", "triton"):
        from kiln.runtime import compile_pool
        with config.scope(**options):
            compile_pool.warm()  # Triton compile workers start while TorchDynamo traces

    return torch.compile(model_or_fn, backend=backend, dynamic=dynamic, fullgraph=fullgraph)


def _on_gpu(model_or_fn: Callable) -> bool:
    import torch
    params = getattr(model_or_fn, "parameters", None)
    if not callable(params) or not torch.cuda.is_available():
        return False
    return any(p.is_cuda for p in params())


def explain(model_or_fn: Callable, *example_inputs: Any, **options: Any) -> str:
    """Compile ``model_or_fn`` on ``example_inputs`` and return (and print) kiln's report."""
    from kiln.explaining import explain as _explain
    return _explain(model_or_fn, *example_inputs, **options)


def profile(model_or_fn: Callable, *example_inputs: Any, calls: int = 10, warmup: int = 2, **options: Any) -> Any:
    """Compile ``model_or_fn`` with kiln (``options`` as for ``compile``, e.g. ``mode="max-autotune"``), run it
    ``warmup`` times, then ``calls`` times with each step of its compiled graphs timed; print and return the
    ``Profile``: per step its time, share, GFLOP/s, GB/s and the machine's limit for it."""
    from kiln.explaining import profile as _profile
    return _profile(model_or_fn, *example_inputs, calls=calls, warmup=warmup, **options)


def __getattr__(name: str) -> Any:
    if name == "Profile":  # ``with kiln.Profile() as p:`` around calls of kiln-compiled code (imports torch)
        from kiln.runtime.profiling import Profile
        return Profile
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
