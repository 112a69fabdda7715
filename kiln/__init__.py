"""kiln: compile PyTorch models into fused C++ kernels.

    import kiln
    fast = kiln.compile(model)              # or torch.compile(model, backend="kiln")
    kiln.explain(model, example_input)      # what kiln did, and why
    kiln.profile(model, example_input)      # time per kernel, against the machine's limit
    kiln.bisect(model, example_input)       # why a compiled result differs from eager: the guilty pass/kernel
"""
from __future__ import annotations

from typing import Any, Callable

from kiln.config import TARGETS  # noqa: F401  (kiln.TARGETS: the accepted ``target`` values)

__version__ = "0.1.0"


def compile(model_or_fn: Callable, *, mode: str = "default", target: str = "auto", dynamic: bool = False,
            fullgraph: bool = False, **options: Any) -> Callable:
    """Compile a model or function with kiln; returns a callable with the same behaviour.

    ``mode``: "default", "reduce-overhead" or "max-autotune" (as in torch.compile).
    ``target``: "auto" (the inputs' device: C++ on CPU, Triton on CUDA), "cpu", "cuda" (needs a GPU), or
    "triton" (Triton code also for CPU tensors, run by Triton's interpreter when ``TRITON_INTERPRET=1``).
    ``options``: kiln settings (see ``kiln.config.Config``), e.g. ``check=True``; names, types and values are
    checked here, before the first call.
    A call that the model cannot take (a shape or dtype its ops reject) raises the model's own error, as eager
    does, not TorchDynamo's tracing report (see frontend/user_errors.py).
    """
    import torch

    from kiln import config
    from kiln.compiler import check_target
    from kiln.frontend.dynamo import check_mode, kiln_backend
    from kiln.frontend.user_errors import guard

    if not callable(model_or_fn):
        raise TypeError(f"kiln.compile expects an nn.Module or a function, got {type(model_or_fn).__name__}")
    mode = check_mode(mode)
    check_target(target)  # an unknown target, or "cuda" without a GPU: said now, not at the first call
    if target != "auto":
        options = {**options, "target": target}
    config.get().with_options(**options)  # validate option names and values now, not at the first call

    owner = type(model_or_fn).__name__ if isinstance(model_or_fn, torch.nn.Module) else \
        getattr(model_or_fn, "__qualname__", None) or getattr(model_or_fn, "__name__", None)

    def backend(gm: Any, example_inputs: Any) -> Callable:
        return kiln_backend(gm, example_inputs, mode=mode, options=options, name=owner)

    if _on_gpu(model_or_fn) and target in ("auto", "cuda", "triton"):
        from kiln.runtime import compile_pool
        with config.scope(**options):
            compile_pool.warm()  # Triton compile workers start while TorchDynamo traces

    compiled = torch.compile(model_or_fn, backend=backend, dynamic=dynamic, fullgraph=fullgraph)
    if isinstance(compiled, torch.nn.Module):  # (an OptimizedModule: its ``forward`` is the compiled call)
        compiled.forward = guard(compiled.forward, model_or_fn)
        return compiled
    return guard(compiled, model_or_fn)


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


def bisect(model_or_fn: Callable, *example_inputs: Any, rtol: float = 1e-4, atol: float = 1e-4,
           out_dir: str = ".", **options: Any) -> Any:
    """Why does kiln's result differ from eager?  Compiles ``model_or_fn`` on ``example_inputs`` again and again
    (KILN_CHECK's step checker, each pass off, each library choice off) and returns (and prints) a
    ``BisectResult``: the guilty kernel, native call, pass or choice, and a reproducer written to ``out_dir``."""
    from kiln.testing.bisect import bisect as _bisect
    return _bisect(model_or_fn, *example_inputs, rtol=rtol, atol=atol, out_dir=out_dir, options=options)


def __getattr__(name: str) -> Any:
    if name == "Profile":  # ``with kiln.Profile() as p:`` around calls of kiln-compiled code (imports torch)
        from kiln.runtime.profiling import Profile
        return Profile
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
