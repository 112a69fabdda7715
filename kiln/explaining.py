"""``kiln.explain`` and ``kiln.profile``: compile, run once (or timed), print the report (``report.format_report``:
the graph IR after capture and after the passes, each kernel with the nodes it fuses and why, the Program's steps
and memory, the generated code) or the profile.  Not named ``explain.py``: a submodule of that name would replace
the ``kiln.explain`` function on the package when first imported."""
from __future__ import annotations

from typing import Any, Callable

from kiln.report import format_report


def explain(model_or_fn: Callable, *example_inputs: Any, **options: Any) -> str:
    import torch

    from kiln.api import compile as kiln_compile
    from kiln.report import mark, reports_since

    torch._dynamo.reset()
    position = mark()
    compiled = kiln_compile(model_or_fn, **options)
    with torch.inference_mode():
        compiled(*example_inputs)
    text = "\n\n".join(format_report(r) for r in reports_since(position)) or "kiln: nothing was compiled"
    print(text)
    return text


def profile(model_or_fn: Callable, *example_inputs: Any, calls: int = 10, warmup: int = 2, **options: Any) -> Any:
    import torch

    from kiln.api import compile as kiln_compile
    from kiln.runtime.profiling import Profile

    if calls < 1 or warmup < 1:
        raise ValueError(f"kiln.profile: calls and warmup must be at least 1 (the first call compiles), "
                         f"got calls={calls}, warmup={warmup}")
    torch._dynamo.reset()
    compiled = kiln_compile(model_or_fn, **options)
    with torch.inference_mode():
        for _ in range(warmup):
            compiled(*example_inputs)
        with Profile() as prof:
            for _ in range(calls):
                compiled(*example_inputs)
    print(prof)
    return prof
