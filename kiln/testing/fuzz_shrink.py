"""Shrink a failing program and write it out as a reproducer file (``python FILE kiln``).

``shrink(program, test, signature)`` greedily applies edits while the program still fails the same way
(same ``Result.signature``): keep only the failing output, drop outputs, drop a statement with everything
computed from it, bypass a statement (its result replaced by an operand of the same dtype and shape), make an
input contiguous or plain-valued, halve an input's dim.  Each candidate is first replayed by the numerical
analysis (it must stay valid and well-conditioned; its tolerances are recomputed), and only then compiled.
"""
from __future__ import annotations

import dataclasses
import re
import textwrap
from typing import Callable, Iterator

from kiln.testing.fuzz_numerics import Analysis
from kiln.testing.fuzz_program import InputSpec, Program, Stmt, live_stmts
from kiln.testing.fuzz_run import Result


def revalidate(p: Program) -> Program | None:
    """``p`` with dead statements and unused inputs dropped and tolerances recomputed; None if it is no longer
    valid in eager or well-conditioned."""
    if not p.outputs:
        return None
    stmts = live_stmts(p.stmts, p.outputs, {i.name for i in p.inputs})
    live = {u for s in stmts for u in s.uses} | set(p.outputs)
    inputs = [i for i in p.inputs if i.name in live]
    try:
        a = Analysis.of(dataclasses.replace(p, inputs=inputs, stmts=stmts))
    except Exception:  # noqa: BLE001 - invalid or ill-conditioned candidate
        return None
    if any(o not in a.envs["ft"] for o in p.outputs):
        return None
    var_info = {i.name: (i.dtype, tuple(a.value(i.name).shape)) for i in inputs}
    for s in stmts:
        for d in s.defs:
            t = a.value(d)
            var_info[d] = ("float" if t.is_floating_point() else str(t.dtype).replace("torch.", ""), tuple(t.shape))
    return dataclasses.replace(
        p, inputs=[dataclasses.replace(i, shape=var_info[i.name][1]) for i in inputs], stmts=stmts,
        out_tol=[a.tol(o) for o in p.outputs], input_tol=[a.tol(i.name) if i.name in a.mutated else None
                                                          for i in inputs], vars=var_info)


def _failing_output(result: Result) -> int | None:
    m = re.match(r"output (\d+)", result.detail)
    return int(m.group(1)) if m else None


def _without(p: Program, drop: set[str]) -> Program:
    """``p`` without the statements defining ``drop`` and everything computed from them."""
    dead, stmts = set(drop), []
    for s in p.stmts:
        if dead.intersection(s.defs) or dead.intersection(s.uses):
            dead.update(s.defs)
            continue
        stmts.append(s)
    return dataclasses.replace(p, stmts=stmts, outputs=[o for o in p.outputs if o not in dead])


def _sub(text: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", new, text)


def _bypass(p: Program, k: int, operand: str) -> Program:
    """Statement ``k`` removed, its (single) result replaced by ``operand`` everywhere after it."""
    (d,) = p.stmts[k].defs
    later = [Stmt(_sub(s.text, d, operand), s.defs, tuple(operand if u == d else u for u in s.uses), s.op,
                  None if s.mutates is None else _sub(s.mutates, d, operand), _sub(s.noise, d, operand), s.weight,
                  tuple(tuple(_sub(c, d, operand) for c in chk) for chk in s.checks),
                  tuple(_sub(a, d, operand) for a in s.aliases)) for s in p.stmts[k + 1:]]
    outputs = list(dict.fromkeys(operand if o == d else o for o in p.outputs))
    return dataclasses.replace(p, stmts=p.stmts[:k] + later, outputs=outputs)


def candidates(p: Program, failing: int | None) -> Iterator[Program]:
    """Edits of ``p``, the ones that remove most first."""
    if failing is not None and len(p.outputs) > 1 and failing < len(p.outputs):
        yield dataclasses.replace(p, outputs=[p.outputs[failing]])
    for i in range(len(p.outputs)):
        if len(p.outputs) > 1:
            yield dataclasses.replace(p, outputs=p.outputs[:i] + p.outputs[i + 1:])
    for k in reversed(range(len(p.stmts))):
        s = p.stmts[k]
        if s.defs:
            yield _without(p, set(s.defs))
        else:
            yield dataclasses.replace(p, stmts=p.stmts[:k] + p.stmts[k + 1:])
    for k, s in enumerate(p.stmts):
        if len(s.defs) == 1 and s.mutates is None:
            for u in dict.fromkeys(s.uses):
                if p.vars.get(u) == p.vars.get(s.defs[0]):
                    yield _bypass(p, k, u)
    yield from _input_edits(p)


def _input_edits(p: Program) -> Iterator[Program]:
    for j, spec in enumerate(p.inputs):
        simpler = []
        if spec.layout != "contiguous":
            simpler.append(dataclasses.replace(spec, layout="contiguous"))
        if spec.dtype == "float" and spec.kind != "uniform":
            simpler.append(dataclasses.replace(spec, kind="uniform"))
        for d, n in enumerate(spec.shape):
            if n > 1:
                simpler.append(_resized(spec, d, max(1, n // 2)))
        for new in simpler:
            yield dataclasses.replace(p, inputs=p.inputs[:j] + [new] + p.inputs[j + 1:])


def _resized(spec: InputSpec, d: int, n: int) -> InputSpec:
    shape = list(spec.shape)
    shape[d] = n  # an index input keeps its range: the analysis rejects it if the indexed tensor shrank
    return dataclasses.replace(spec, shape=tuple(shape))


def shrink(program: Program, test: Callable[[Program], Result], signature: str, max_tests: int = 150,
           log: Callable[[str], None] | None = None) -> tuple[Program, Result | None]:
    """The smallest program found that still fails with ``signature``, and its result (None if no edit
    kept the failure: the program itself is returned)."""
    if not signature:
        raise ValueError("shrink: the signature of a failure is needed (an ok result has none)")
    best, best_result, tests = program, None, 0
    failing: int | None = None
    progress = True
    while progress and tests < max_tests:
        progress = False
        for cand in candidates(best, failing):
            cand = revalidate(cand)
            if cand is None or _size(cand) >= _size(best):
                continue
            tests += 1
            r = test(cand)
            if r.signature == signature:
                best, best_result, failing, progress = cand, r, _failing_output(r), True
                if log:
                    log(f"  shrunk to {len(best.stmts)} statements, {len(best.inputs)} inputs, "
                        f"{len(best.outputs)} outputs")
                break
            if tests >= max_tests:
                break
    return best, best_result


def _size(p: Program) -> tuple[int, ...]:
    """Order of candidates: fewer statements, outputs, inputs, elements, non-contiguous inputs."""
    numel = sum(_prod(i.shape) for i in p.inputs)
    odd = sum(i.layout != "contiguous" or i.kind != "uniform" for i in p.inputs)
    return (len(p.stmts) + len(p.outputs) + len(p.inputs), numel, odd)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


CHECK_SOURCE = '''

def check(backend="kiln"):
    """Run fn eagerly and compiled on fresh copies of the inputs; compare outputs and inputs."""
    if ":" in backend:  # 'module:attr' backend callable
        import importlib
        mod, attr = backend.split(":", 1)
        backend = importlib.import_module(mod)
        for part in attr.split("."):
            backend = getattr(backend, part)
    ref_in = make_inputs()
    ref = fn(*ref_in)
    compiled = torch.compile(fn, backend=backend)
    try:  # a first call on other values (if eager takes them): what a stale cache keeps shows in the second
        fn(*make_inputs(shift=100003))
    except Exception:
        pass
    else:
        compiled(*make_inputs(shift=100003))
    inp = make_inputs()
    out = compiled(*inp)
    assert len(out) == len(ref), (len(out), len(ref))
    for i, (a, e, (rt, at)) in enumerate(zip(out, ref, OUT_TOL)):
        meta = f"{a.dtype}{list(a.shape)} vs {e.dtype}{list(e.shape)}"
        assert a.dtype == e.dtype and a.shape == e.shape, f"output {i}: {meta}"
        torch.testing.assert_close(a, e, rtol=rt, atol=at, equal_nan=True, check_stride=False,
                                   msg=lambda m, i=i: f"output {i}: {m}")
    for i, (a, e, tol) in enumerate(zip(inp, ref_in, INPUT_TOL)):
        rt, at = tol or (0.0, 0.0)
        torch.testing.assert_close(a, e, rtol=rt, atol=at, equal_nan=True, check_stride=False,
                                   msg=lambda m, i=i: f"input {i} after the call: {m}")
    print("OK: compiled matches eager")


if __name__ == "__main__":
    import sys
    torch.set_num_threads(1)
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    check(args[0] if args else "kiln")
'''


GRADIENT_CHECK_SOURCE = '''

def check_gradients(backend="kiln"):
    """The failure is in the gradients ([Note: fuzzing gradients], kiln/testing/fuzz_grad.py): the inputs'
    gradients of the compiled training call against eager's, judged by a float64 run."""
    from kiln.testing.fuzz_grad import check_gradients as run
    from kiln.testing.fuzz_program import Program
    torch._dynamo.reset()
    status, _, detail = run(Program.from_json(PROGRAM), lambda f: torch.compile(f, backend=backend))
    assert status in ("ok", "skip"), detail
    print("OK: compiled gradients match eager's")


if __name__ == "__main__":
    check_gradients(args[0] if args else "kiln")
'''


def reproducer_source(program: Program, result: Result, name: str = "repro.py") -> str:
    """A self-contained file: the program's source (what the fuzzer ran), a ``check()`` and a main (and for a
    failure of the gradients, the program as data and a ``check_gradients()``)."""
    members = f" (group of seeds {program.members})" if len(program.members) > 1 else ""
    error = textwrap.wrap(result.detail[:600], 110) or [""]
    head = [f"# REPRODUCER  backend=kiln  class={result.status}  signature={result.signature}",
            f"# error: {error[0]}", *(f"#        {line}" for line in error[1:]),
            f"# run:   {'KILN_FALLBACK=0 ' if result.status == 'fallback' else ''}python {name} kiln",
            f"# a random program (seed {program.seed}{members}, {program.ft}), found by kiln's differential fuzzer",
            "# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py"]
    text = "\n".join(head) + "\n" + program.source() + CHECK_SOURCE
    if ":gradient" in result.signature:
        text += f"\n\nPROGRAM = {program.to_json()!r}  # noqa: E501\n" + GRADIENT_CHECK_SOURCE
    return text


def write_reproducer(program: Program, result: Result, path: str) -> str:
    import os
    with open(path, "w") as f:
        f.write(reproducer_source(program, result, os.path.basename(path)))
    return path
