"""The fuzzer's programs through the symbolic lowering (docs/dynamic_shapes.md, layers 1-2): each program traced
with ``dynamic=True``, lowered with size expressions, optimized by the whole pass pipeline and run by the
reference interpreter, against eager on the same inputs.  What it checks: that lowering a graph with symbolic
sizes and optimizing it compute what eager computes (at the traced size - other sizes need Dynamo's guards,
which ``tests/unit/test_symbolic_lowering.py`` covers by hand).  A graph the symbolic lowering refuses
(``LoweringError``: a size kiln has no form for, a lowering that would specialize) is counted, not failed.

    python -m kiln.testing.fuzz_symbolic --seeds 0:300 [--dtype all] [--size full] [--compile [--target triton]
        [--grad]]

``--compile``: through kiln's own backend instead (``torch.compile(backend="kiln", dynamic=True)``): the symbolic
graph compiled to C++ with its sizes read at run time and a Program planned for the call's sizes (layers 3-6);
a graph kiln ran eagerly counts as ``fallback`` with the report's reason (a refusal, or a failure to look at).
``--target triton``: the GPU's code generator instead - Triton kernels with size parameters, one plan
([Note: GPU kernels with size parameters]) - run by Triton's interpreter on the CPU tensors (``TRITON_INTERPRET=1``
is set before Triton is imported) or on the GPU's where there is one (``--device cuda``).
"""
from __future__ import annotations

import argparse
import collections
import warnings
from typing import Any

import torch


def _symbolic_backend(refused: list[str]) -> Any:
    """A Dynamo backend: AOT graph -> symbolic graph IR -> passes -> the reference interpreter."""
    from torch._functorch.aot_autograd import aot_module_simplified

    from kiln.frontend.decompositions import decomposition_table
    from kiln.frontend.lower import LoweringError, lower_fx
    from kiln.ir.interp import interpret
    from kiln.passes.pipeline import run_pipeline

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        def compile_forward(g: torch.fx.GraphModule, fake_inputs: list[Any]) -> Any:
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            # (with dynamic shapes AOTAutograd calls this inside its fake mode: constants are real tensors here,
            # folded by real ops)
            with unset_fake_temporarily():
                try:
                    graph, _ = lower_fx(g, {}, symbolic=True)
                except LoweringError as exc:
                    refused.append(str(exc).split(":")[0][:80])
                    return g.forward
                graph = run_pipeline(graph)

            def run(*args: Any) -> Any:
                return tuple(interpret(graph, [a for a in args if isinstance(a, torch.Tensor)]))
            return run
        # (captured as kiln's frontend captures: its decompositions, input mutations kept in the graph)
        return aot_module_simplified(gm, example_inputs, fw_compiler=compile_forward,
                                     decompositions=decomposition_table(), keep_inference_input_mutations=True)
    return backend


def check(seed: int, dtype: str, size: str, compile: bool = False, target: str = "auto",
          device: str = "cpu", grad: bool = False) -> tuple[str, str]:
    """(status, detail) of one program: ok, mismatch, crash, refused (fallback with ``compile``), or eager_error
    (an invalid program).  ``target``: kiln's (with ``compile``); ``device``: where the inputs live; ``grad``
    (with ``compile``, CPU inputs): where the outputs match, the program compiled again with ``dynamic=True``
    for training, its inputs' gradients against eager's ([Note: fuzzing gradients]; status ``mismatch`` or
    ``crash`` with a ``gradient:`` detail)."""
    from kiln.report import mark, reports_since
    from kiln.testing.fuzz_gen import generate
    from kiln.testing.fuzz_run import compare, short_error
    program = generate(seed, dtype, size)
    ns = program.namespace()
    fn, make = ns["fn"], ns["make_inputs"]

    def make_inputs() -> list[Any]:
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in make()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ref = fn(*make_inputs())
        except Exception as exc:  # noqa: BLE001 - the program is invalid: it does not count
            return "eager_error", ": ".join(short_error(exc))
        refused: list[str] = []
        torch._dynamo.reset()
        position = mark()
        try:
            if compile:
                compiled = torch.compile(fn, backend="kiln", dynamic=True, options={"target": target})
            else:
                compiled = torch.compile(fn, backend=_symbolic_backend(refused), dynamic=True)
            out = compiled(*make_inputs())
        except Exception as exc:  # noqa: BLE001 - kiln (or Dynamo) raised
            return "crash", ": ".join(short_error(exc))
        finally:
            torch._dynamo.reset()
    diff = compare(out, ref, program.out_tol, "output")
    if diff is not None:
        return "mismatch", diff[1]
    if compile:
        fallbacks = [r.fallback for r in reports_since(position) if r.fallback]
        if fallbacks:
            return "fallback", fallbacks[0][:100]
        return _gradients(program, target) if grad else ("ok", "")
    return ("refused", refused[0]) if refused else ("ok", "")


def _gradients(program: Any, target: str) -> tuple[str, str]:
    """The program's gradients through kiln's backend with ``dynamic=True`` against eager's; a failure that
    ``aot_eager`` with ``dynamic=True`` - the same capture with no kiln behind it - repeats is torch's
    (``torch_error``), not kiln's."""
    status, detail = _dynamic_gradients(
        program, lambda f: torch.compile(f, backend="kiln", dynamic=True, options={"target": target}))
    if status in ("mismatch", "crash"):
        again, why = _dynamic_gradients(program, lambda f: torch.compile(f, backend="aot_eager", dynamic=True))
        if again == status:
            return "torch_error", f"aot_eager fails the same way: {why}"
    return status, detail


def _dynamic_gradients(program: Any, compile_fn: Any) -> tuple[str, str]:
    """(ok | mismatch | crash, detail) of ``program``'s gradients compiled by ``compile_fn``."""
    from kiln.testing.fuzz_grad import CompiledRaised, check_gradients
    from kiln.testing.fuzz_run import short_error
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            status, _, detail = check_gradients(program, compile_fn)
    except CompiledRaised as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        return "crash", "gradient: " + ": ".join(short_error(cause))
    finally:
        torch._dynamo.reset()
    return ("mismatch", f"gradient: {detail}") if status == "mismatch" else ("ok", "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0:100", help="A:B")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "half", "all"])
    ap.add_argument("--size", default="full", choices=["ci", "full"])
    ap.add_argument("--compile", action="store_true", help="through kiln's backend (C++), not the interpreter")
    ap.add_argument("--target", default="auto", choices=["auto", "cpu", "triton"],
                    help="kiln's target with --compile (triton: the GPU's code generator)")
    ap.add_argument("--device", default="cpu", help="where the programs' inputs live (cuda: the GPU)")
    ap.add_argument("--grad", action="store_true",
                    help="with --compile (CPU inputs): also the inputs' gradients of a training compile")
    args = ap.parse_args()
    if args.target == "triton" and args.device == "cpu":
        import os
        os.environ.setdefault("TRITON_INTERPRET", "1")  # (before Triton is imported: its interpreter on CPU tensors)
        from kiln.testing import triton_interpreter  # ([Note: the interpreter's bf16 rounding] and its scalars)
        triton_interpreter.patch()
    torch.set_num_threads(1)
    lo, hi = (int(v) for v in args.seeds.split(":"))
    counts: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    for seed in range(lo, hi):
        status, detail = check(seed, args.dtype, args.size, args.compile, args.target, args.device,
                               args.grad and args.device == "cpu")
        counts[status] += 1
        if status in ("mismatch", "crash"):
            print(f"seed {seed}: {status}: {detail[:300]}", flush=True)
        elif status == "torch_error":
            print(f"seed {seed}: torch_error: {detail[:200]}", flush=True)
        elif status in ("refused", "fallback"):
            reasons[detail] += 1
    print(f"{hi - lo} programs: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for why, k in reasons.most_common(6):
        print(f"  refused x{k}: {why}")


if __name__ == "__main__":
    main()
