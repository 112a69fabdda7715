"""kiln: compile PyTorch models into fused C++ kernels.

    import kiln
    fast = kiln.compile(model)              # or torch.compile(model, backend="kiln")
    kiln.explain(model, example_input)      # what kiln did, and why
    kiln.profile(model, example_input)      # time per kernel, against the machine's limit
    kiln.bisect(model, example_input)       # why a compiled result differs from eager: the guilty pass/kernel
"""
from __future__ import annotations

from typing import Any, Callable

from kiln.api import compile  # noqa: F401,A004  (kiln.compile)
from kiln.config import TARGETS  # noqa: F401  (kiln.TARGETS: the accepted ``target`` values)
from kiln.version import __version__  # noqa: F401


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
