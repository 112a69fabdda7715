"""``run_program(program) -> Result``: compiled vs eager on fresh copies of the inputs, classified.

Classes: ``ok``; ``mismatch`` (an output or an input changed in place differs beyond its tolerance, or its
dtype/shape differs); ``crash`` (kiln raised, or - in a worker - the process died); ``fallback`` (kiln gave up
on a graph and ran it eagerly: not a wrong result, but counted and reported, with kiln's reason); and two
classes that do not count against kiln: ``eager_error`` (eager itself rejects the program) and
``torch_error`` (the same failure with ``backend="aot_eager"``: Dynamo or AOTAutograd, not kiln).
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Callable

import torch

from kiln.testing.fuzz_pool import eager_only
from kiln.testing.fuzz_program import Program

FAILURES = ("mismatch", "crash")


@dataclasses.dataclass
class Result:
    """What one run of a program gave.  ``signature`` says how it failed, coarsely enough to survive
    shrinking (the shrinker keeps a candidate only if it fails with the same signature)."""

    seed: int
    status: str
    detail: str = ""
    signature: str = ""
    seconds: float = 0.0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    fallbacks: list[str] = dataclasses.field(default_factory=list)
    members: list[int] = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status in FAILURES

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def short_error(exc: BaseException) -> tuple[str, str]:
    """(type name, first line) of an exception, with Dynamo's wrappers peeled off."""
    inner = exc
    for _ in range(6):
        nxt = getattr(inner, "inner_exception", None) or inner.__cause__
        if nxt is None or type(inner).__name__ not in ("BackendCompilerFailed", "InternalTorchDynamoError",
                                                      "TorchRuntimeError", "Unsupported"):
            break
        inner = nxt
    lines = str(inner).strip().splitlines()
    return type(inner).__name__, (lines[0] if lines else "")[:300]


def compile_fn(fn: Callable, backend: str | Callable, options: dict[str, Any] | None) -> Callable:
    if backend == "kiln":
        import kiln
        return kiln.compile(fn, **(options or {}))
    return torch.compile(fn, backend=backend)


def compare(out: Any, ref: Any, tols: list[Any], what: str) -> tuple[str, str] | None:
    """(signature, message) of the first difference between ``out`` and ``ref``, or None."""
    if not isinstance(out, (tuple, list)) or len(out) != len(ref):
        return "mismatch:structure", f"{what}s: got {type(out).__name__} of {len(out)}, expected {len(ref)}"
    for i, (a, e, tol) in enumerate(zip(out, ref, tols)):
        if not isinstance(a, torch.Tensor):
            return "mismatch:type", f"{what} {i}: got {type(a).__name__}"
        if a.dtype != e.dtype or a.shape != e.shape:
            return "mismatch:meta", f"{what} {i}: {a.dtype}{list(a.shape)} vs eager's {e.dtype}{list(e.shape)}"
        rt, at = tol or (0.0, 0.0)
        try:
            torch.testing.assert_close(a, e, rtol=rt, atol=at, equal_nan=True, check_stride=False)
        except AssertionError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            return f"mismatch:{what}", f"{what} {i} ({e.dtype}{list(e.shape)}, rtol={rt:.3g} atol={at:.3g}): " + \
                " | ".join(lines[:4])
    return None


def run_program(program: Program, backend: str | Callable = "kiln", options: dict[str, Any] | None = None,
                control: bool = True, decoy: bool = True, grad: bool = False) -> Result:
    """Run ``program`` eagerly and compiled (``backend``: "kiln", another Dynamo backend name, or a backend
    callable) on fresh copies of its inputs and classify the outcome.  ``control``: confirm a failure
    against ``aot_eager`` before blaming kiln.  ``decoy``: call the compiled function first on other input
    values of the same layouts (not compared), so a value computed once and reused by the next call (a stale
    cache) shows as a mismatch of the compared, second call.  ``grad``: where the outputs match, compile it
    again for training and compare its inputs' gradients too ([Note: fuzzing gradients])."""
    ns = program.namespace()
    fn, make_inputs = ns["fn"], ns["make_inputs"]
    res = Result(program.seed, "ok", members=list(program.members))
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_in = make_inputs()
        try:
            with eager_only():
                ref = fn(*ref_in)
        except Exception as exc:  # noqa: BLE001 - the program is invalid: it does not count
            res.status, res.detail = "eager_error", ": ".join(short_error(exc))
            return res
        torch._dynamo.reset()
        first = _decoy_inputs(make_inputs, fn) if decoy else None
        replays = first is not None and replays_graphs(options)
        decoy_ref = fn(*make_inputs(shift=DECOY_SHIFT)) if replays else None
        out, inp, held = _compiled_run(res, fn, make_inputs, first, backend, options, REPLAY_CALLS if replays else 1)
    if res.status == "ok":
        diff = compare(out, ref, program.out_tol, "output") or \
            compare(inp, ref_in, program.input_tol, "input") or \
            (compare(held, decoy_ref, program.out_tol, "held output") if replays else None)
        if diff is not None:
            res.status, (res.signature, res.detail) = "mismatch", diff
        elif grad:
            _gradient_run(res, program, backend, options)
        if res.status == "ok" and res.fallbacks:
            res.status, res.detail = "fallback", res.fallbacks[0]
            res.signature = "fallback:" + res.fallbacks[0].split(":")[0]
    if (res.failed or res.status == "fallback") and control and backend != "aot_eager":
        again = run_program(program, "aot_eager", control=False, decoy=decoy, grad=grad)
        if again.signature == res.signature or _same_capture_failure(res, again):
            res.status, res.detail = "torch_error", f"aot_eager fails the same way: {again.detail}"
    torch._dynamo.reset()
    res.seconds = time.perf_counter() - start
    return res


def _gradient_run(res: Result, program: Program, backend: str | Callable, options: dict[str, Any] | None) -> None:
    """The training compile of ``program`` ([Note: fuzzing gradients]): a gradient that differs, or a raise, is
    recorded in ``res``; so are kiln's fallbacks; nothing to differentiate leaves it as it was."""
    import kiln.report
    from kiln.testing.fuzz_grad import CompiledRaised, check_gradients
    torch._dynamo.reset()
    mark = kiln.report.mark()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            status, signature, detail = check_gradients(program, lambda f: compile_fn(f, backend, options),
                                                        calls=REPLAY_CALLS + 1 if replays_graphs(options) else 1)
        except CompiledRaised as raised:
            name, msg = short_error(raised.__cause__)
            status, signature, detail = "crash", f"crash:gradient:{name}", \
                f"{name} in the compiled training call: {msg}"
    _record_reports(res, kiln.report.reports_since(mark))
    res.phases["grad"] = 1.0 if status != "skip" else 0.0
    if status in ("mismatch", "crash"):
        res.status, res.signature, res.detail = status, signature, detail


CAPTURE_FAILED = "capture to ATen (AOTAutograd) failed: "


def _same_capture_failure(res: Result, again: Result) -> bool:
    """kiln fell back because AOTAutograd could not trace the graph, and aot_eager - the same capture with no
    kiln behind it - raises that very error: torch's failure, not kiln's (kiln's fallback kept the model
    running; the report says why)."""
    if res.status != "fallback" or not res.detail.startswith(CAPTURE_FAILED) or again.status != "crash":
        return False
    name, _, msg = res.detail[len(CAPTURE_FAILED):].partition(": ")
    return again.signature == f"crash:{name}" and msg[:60] in again.detail


DECOY_SHIFT = 100_003  # make_inputs(shift=...): the decoy call's values
# [Note: fuzzing replays] In reduce-overhead a graph is replayed only from its third call on (a warm-up call, a
# plain call at new addresses, then the recording): with ``mode`` reduce-overhead (CUDA graphs emulated on the CPU,
# [Note: CUDA graphs emulated on the CPU]) the compiled function is called on fresh decoy inputs this many times
# before the compared call, which replays; the first decoy call's outputs, held all along, must still hold eager's
# values afterwards (each replay writes the same buffers: a held output is moved before it).
REPLAY_CALLS = 3


def replays_graphs(options: dict[str, Any] | None) -> bool:
    """Do these compile options replay CUDA graphs (or their emulation)?"""
    return bool(options) and options.get("mode") in ("reduce-overhead", "max-autotune")


def _decoy_inputs(make_inputs: Callable, fn: Callable) -> list[torch.Tensor] | None:
    """Inputs of the same shapes, layouts and kinds but other values, if eager accepts them (an index
    computed from floats may fall out of range on other values: then there is no decoy call)."""
    try:
        fn(*make_inputs(shift=DECOY_SHIFT))
    except Exception:  # noqa: BLE001 - not valid on these values: skip the decoy call
        return None
    return make_inputs(shift=DECOY_SHIFT)


def _compiled_run(res: Result, fn: Callable, make_inputs: Callable, first: list[torch.Tensor] | None,
                  backend: str | Callable, options: dict[str, Any] | None, decoy_calls: int = 1
                  ) -> tuple[Any, list[torch.Tensor], Any]:
    """Compile ``fn``, call it ``decoy_calls`` times on decoy inputs (if any; fresh copies after the first),
    then on fresh inputs: (outputs, those inputs, the first decoy call's outputs).  A raise is recorded in ``res``
    as a crash; kiln's reports (fallbacks, time per phase) too."""
    import kiln.report
    from kiln.runtime.build import build_stats
    mark, gxx = kiln.report.mark(), (build_stats.compile_seconds, build_stats.compiles)
    inp, out, when = make_inputs(), None, "the first call, on other input values" if first else "the call"
    held = None
    try:
        t0 = time.perf_counter()
        compiled = compile_fn(fn, backend, options)
        if first is not None:
            for k in range(decoy_calls):
                when = "the first call, on other input values" if k == 0 else f"call {k + 1}, on other input values"
                got = compiled(*(first if k == 0 else make_inputs(shift=DECOY_SHIFT)))
                held = got if k == 0 else held
                if k == 0:
                    res.phases["first_call"] = time.perf_counter() - t0
            when = f"call {decoy_calls + 1}"
        else:
            res.phases["first_call"] = time.perf_counter() - t0
        out = compiled(*inp)
    except Exception as exc:  # noqa: BLE001 - kiln raised: a crash
        name, msg = short_error(exc)
        res.status, res.signature, res.detail = "crash", f"crash:{name}", f"{name} in {when}: {msg}"
    _record_reports(res, kiln.report.reports_since(mark))
    res.phases["gxx"] = build_stats.compile_seconds - gxx[0]
    res.phases["gxx_builds"] = float(build_stats.compiles - gxx[1])
    return out, inp, held


def _record_reports(res: Result, reports: list[Any]) -> None:
    """kiln's compile reports of this run: fallbacks (with kiln's reason) and where the time went."""
    for r in reports:
        if r.fallback:
            res.fallbacks.append(r.fallback[:300])
        res.phases["kiln_compile"] = res.phases.get("kiln_compile", 0.0) + r.compile_seconds
        for k, v in r.phases.items():
            if isinstance(v, float):
                res.phases[k] = res.phases.get(k, 0.0) + v
    res.phases["graphs"] = float(len(reports))
