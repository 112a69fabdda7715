"""``kiln.compile``: the entry point that hands a model to TorchDynamo with kiln as its backend.  A module of its
own so that ``kiln.explain``, ``kiln.profile`` and ``kiln.bisect`` can call it without importing the package root
(which imports them)."""
from __future__ import annotations

from typing import Any, Callable


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
    _check_choices(options.get("choices", config.get().choices))

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


def _check_choices(text: str) -> None:
    """``choices`` names kinds and answers the choosing passes declare: checked now, not at the first call."""
    if text:
        from kiln.passes import pipeline  # noqa: F401  (its passes declare the kinds they choose)
        from kiln.schedule import choose, operand_layout  # noqa: F401  (the layout kinds)
        from kiln.tune.choices import parse_forced
        parse_forced(text)
