"""``kiln bisect``: from "kiln's result differs from eager" to the guilty pass, choice or kernel, and a reproducer.

    result = kiln.bisect(model, x)            # or: kiln bisect my_models:make_model   (FACTORY() -> (model, inputs))
    print(result)                             # what differs, what fixes it, the guilty step, the reproducer file

It narrows the cause automatically, each attempt a fresh compile on fresh copies of the inputs:

1. ``KILN_CHECK``: the pass checker names a pass that changes the graph's meaning; the step checker
   (runtime/checking.py) names the first kernel, native call or extern whose result differs from the
   reference computed on that step's own inputs.
2. Passes turned off one by one (``Config.disabled_passes``): a pass whose absence makes the result right.
3. Library choices and code-generation switches turned off one by one: kiln's library selection, native calls,
   fusion, constant folding, Winograd, layout choice.
4. The culprit is the most specific finding: a step (kernel / native call / extern), else a pass, else a choice.

The reproducer is a pickle beside a short script: for a step, the step alone as a graph (its inputs the values
it read); otherwise the captured graph IR of the failing graph with random inputs and the options that fail.
``python FILE`` compiles it with kiln's runtime and compares with the reference interpreter.
"""
from __future__ import annotations

import dataclasses
import io
import pickle
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

# switches that change which code runs, each with the value that turns its choice off
CHOICES: list[tuple[str, Any]] = [("library_selection", False), ("native_calls", False), ("fusion", False),
                                  ("constant_folding", False), ("winograd_tiles", ""), ("layout_autotune", False)]


@dataclasses.dataclass
class BisectResult:
    differs: bool
    detail: str = ""                                        # which output differs, and by how much
    culprit_kind: str = ""                                  # "kernel", "native", "extern", "fused", "pass", "choice"
    culprit: str = ""
    fixes: list[str] = dataclasses.field(default_factory=list)  # passes / options that make the result right
    step: Any = None                                        # the StepInfo of the first diverging step
    reproducer: Path | None = None
    log: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        if not self.differs:
            return "kiln bisect: the compiled result matches eager; nothing to bisect"
        lines = [f"kiln bisect: {self.detail}"] + [f"  {line}" for line in self.log]
        lines.append(f"guilty {self.culprit_kind}: {self.culprit}" if self.culprit else "no single culprit found")
        if self.step is not None:
            lines.append(self.step.describe())
        if self.reproducer is not None:
            lines.append(f"reproducer: python {self.reproducer}")
        return "\n".join(lines)


def bisect(fn: Callable, *inputs: Any, rtol: float = 1e-4, atol: float = 1e-4, out_dir: str | Path = ".",
           options: dict[str, Any] | None = None, verbose: bool = True) -> BisectResult:
    """Narrow a difference between ``fn(*inputs)`` compiled by kiln and eager to a pass, choice or kernel."""
    from kiln.passes.pipeline import PIPELINE
    base = dict(options or {})
    with torch.inference_mode():
        expected = fn(*_clone(inputs))
    first = _attempt(fn, inputs, expected, base, rtol, atol)
    result = BisectResult(differs=first.problem != "", detail=first.problem)
    if not result.differs:
        return _done(result, verbose)
    checked = _attempt(fn, inputs, expected, {**base, "check": True}, rtol, atol)
    pass_error = _pass_error(checked.error)
    result.step = getattr(_cause(checked.error), "info", None)
    result.log.append(f"KILN_CHECK: {_first_line(checked.error) if checked.error else 'no step differs'}")
    for name, _ in PIPELINE:
        if not _attempt(fn, inputs, expected, {**base, "disabled_passes": name}, rtol, atol).problem:
            result.fixes.append(f"pass {name}")
    for option, value in CHOICES:
        if not _attempt(fn, inputs, expected, {**base, option: value}, rtol, atol).problem:
            result.fixes.append(f"{option}={value!r}")
    result.log.append("right with: " + (", ".join(result.fixes) or "none of the passes or choices off"))
    _blame(result, pass_error)
    result.reproducer = _write_reproducer(result, first, base, Path(out_dir))
    return _done(result, verbose)


def _blame(result: BisectResult, pass_error: str) -> None:
    if result.step is not None:
        result.culprit_kind, result.culprit = result.step.kind, result.step.name
    elif pass_error:
        result.culprit_kind, result.culprit = "pass", pass_error
    elif any(f.startswith("pass ") for f in result.fixes):
        result.culprit_kind, result.culprit = "pass", next(f[5:] for f in result.fixes if f.startswith("pass "))
    elif result.fixes:
        result.culprit_kind, result.culprit = "choice", result.fixes[0]


def _done(result: BisectResult, verbose: bool) -> BisectResult:
    if verbose:
        print(result)
    return result


@dataclasses.dataclass
class _Outcome:
    problem: str                        # '' when the result matched
    error: BaseException | None = None
    reports: list = dataclasses.field(default_factory=list)


def _attempt(fn: Callable, inputs: tuple, expected: Any, options: dict[str, Any], rtol: float,
             atol: float) -> _Outcome:
    from kiln.api import compile as kiln_compile
    from kiln.report import mark, reports_since
    torch._dynamo.reset()
    position = mark()
    try:
        with torch.inference_mode():
            got = kiln_compile(fn, fallback=False, **options)(*_clone(inputs))
    except Exception as e:  # noqa: BLE001 - a crash is an outcome like a wrong value
        return _Outcome(f"{type(e).__name__}: {_first_line(e)}", e, reports_since(position))
    return _Outcome(compare(got, expected, rtol, atol), None, reports_since(position))


def compare(got: Any, expected: Any, rtol: float, atol: float) -> str:
    """'' when every output of ``got`` is close to ``expected``'s, else which one differs and how."""
    gs, _ = tree_flatten(got)
    es, _ = tree_flatten(expected)
    if len(gs) != len(es):
        return f"{len(gs)} outputs, expected {len(es)}"
    for k, (g, e) in enumerate(zip(gs, es)):
        if not isinstance(e, torch.Tensor):
            if g != e:
                return f"output {k}: {g!r}, expected {e!r}"
            continue
        try:
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
        except AssertionError as err:
            return f"output {k} differs: " + " ".join(str(err).split())
    return ""


def _clone(inputs: Any) -> Any:
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)


def _first_line(e: BaseException | None) -> str:
    return str(e).strip().splitlines()[0] if e is not None and str(e).strip() else type(e).__name__


def _cause(e: BaseException | None) -> BaseException | None:
    """The error kiln raised, out of Dynamo's wrapping (BackendCompilerFailed)."""
    seen = 0
    while e is not None and seen < 8 and type(e).__module__.startswith("torch"):
        e = getattr(e, "inner_exception", None) or e.__cause__
        seen += 1
    return e


def _pass_error(e: BaseException | None) -> str:
    from kiln.passes.check import PassCheckError
    e = _cause(e)
    if isinstance(e, PassCheckError):
        text = str(e)
        return text.split("pass ", 1)[1].split(" ", 1)[0].strip("'") if "pass " in text else text
    return ""


# ------------------------------------------------------------------ reproducers
class _Pickler(pickle.Pickler):
    """Pickles graphs: ATen and kiln ops by name (their objects are not picklable)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            return _op, (obj._schema.name, obj._overloadname)
        return NotImplemented


def _op(qualified: str, overload: str) -> Any:
    import kiln.library  # noqa: F401  (defines kiln's own ops: a saved graph may name them)
    namespace, name = qualified.split("::")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def save(path: Path, payload: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    _Pickler(buffer).dump(payload)
    path.write_bytes(buffer.getvalue())


def load(path: str | Path) -> dict[str, Any]:
    return pickle.loads(Path(path).read_bytes())


_SCRIPT = '''"""kiln bisect reproducer: {what}
run: python {name}.py      (compiles the graph in {name}.pkl with kiln's runtime, compares with the interpreter)"""
import sys

from kiln.testing.bisect import check_saved

if __name__ == "__main__":
    sys.exit(0 if check_saved(__file__.rsplit(".", 1)[0] + ".pkl") else 1)
'''


def _write_reproducer(result: BisectResult, first: _Outcome, options: dict[str, Any], out_dir: Path) -> Path | None:
    from kiln.passes.check import random_inputs
    if result.step is not None and result.step.subgraph is not None:
        payload = {"graph": result.step.subgraph, "inputs": result.step.subgraph_inputs, "options": options,
                   "passes": False, "what": f"{result.step.kind} {result.step.name} differs from the reference"}
    else:
        graphs = [r.captured for r in first.reports if getattr(r, "captured", None) is not None]
        if not graphs:
            return None
        graph = graphs[-1]
        payload = {"graph": graph, "inputs": random_inputs(graph), "options": options, "passes": True,
                   "what": f"{result.culprit_kind} {result.culprit}: {result.detail}"[:300]}
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"kiln_bisect_{result.culprit_kind or 'unknown'}_{abs(hash(result.culprit)) % 10**6}"
    try:
        save(out_dir / f"{name}.pkl", payload)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        result.log.append(f"no reproducer: the graph does not pickle ({e})")
        return None
    script = out_dir / f"{name}.py"
    script.write_text(_SCRIPT.format(what=payload["what"].replace('"""', "'''"), name=name))
    return script


def check_saved(path: str | Path) -> bool:
    """Run a saved reproducer: True when kiln's runtime now matches the interpreter on it."""
    from kiln import config
    from kiln.ir.interp import interpret
    from kiln.passes.pipeline import run_pipeline
    from kiln.report import CompileReport
    from kiln.schedule.plan import build_cpu
    payload = load(path)
    graph, inputs = payload["graph"], payload["inputs"]
    expected = interpret(graph, [t.clone() for t in inputs])
    options = {k: v for k, v in payload["options"].items() if k in config.Config.option_names()}
    with config.scope(**options), torch.inference_mode():
        report = CompileReport(name="reproducer", mode="default")
        compiled = run_pipeline(graph, report) if payload["passes"] else graph
        got = build_cpu(compiled, report)([t.clone() for t in inputs])
    problem = compare(got, expected, 1e-4, 1e-4)
    print(f"{payload['what']}\n" + (f"STILL WRONG: {problem}" if problem else "OK: matches the reference"))
    return not problem
