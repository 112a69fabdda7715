"""Gradients of a fuzz program: ``check_gradients(program, compile_fn) -> (status, signature, detail)``.

[Note: fuzzing gradients] ``--grad`` runs each program a second time for training: its float inputs that it does
not change in place require gradients, each float output is weighted by fixed random values (float64) and summed
outside the compiled function, and ``torch.autograd.grad`` gives every such input's gradient - so the compile
is a forward graph and a backward graph (AOTAutograd's partition, kiln's training path), as a model's step is.

Tolerance, without a false positive: a backward adds its own roundings (and sums over broadcast dimensions) to
the forward's, so no per-output tolerance of the forward analysis carries over.  Instead each gradient is also
computed exactly enough - eager in float64 on the same values upcast (the program's text with ``FT`` float64,
[Note: three executions]) - and the compiled gradient ``gc`` is wrong only if it is far from eager's ``ge``
*and* less accurate than it::

    d = max|gc - ge|   e_eager = max|ge - gx|   e_compiled = max|gc - gx|   (gx: float64)
    base = rtol * depth * max|gx| + atol * depth           (BASE_TOL per unit of depth, depth = statements)
    wrong  <=>  d > 16 * e_eager + base  and  e_compiled > 4 * e_eager + base

A gradient routed by a decision near its boundary (a ReLU of a value that rounds to either sign) may flip in a
correct compile; where eager's rounding flips it the float64 run shows it (``e_eager`` large), and where only
the compiled one does it is less accurate than eager and reported.  Non-finite gradients in eager or float64
(a square root at 0) are skipped for that input.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kiln.testing.fuzz_numerics import BASE_TOL
from kiln.testing.fuzz_pool import eager_only
from kiln.testing.fuzz_program import Program

# how far a compiled gradient may be from eager's, in units of eager's own error (see the Note)
FROM_EAGER, FROM_EXACT = 16.0, 4.0


class Skip(Exception):
    """The program has nothing to differentiate, or eager itself cannot differentiate it."""


class CompiledRaised(Exception):
    """The compiled function or its backward raised (the cause): a crash of the compiler under test."""


def _leaves(program: Program, xs: list[torch.Tensor]) -> list[int]:
    """Positions of the inputs that get gradients: float inputs the program does not change in place."""
    return [k for k, (x, tol) in enumerate(zip(xs, program.input_tol))
            if tol is None and isinstance(x, torch.Tensor) and x.is_floating_point()]


def _gradients(fn: Callable, xs: list[torch.Tensor], wrt: list[int], weights: list[torch.Tensor] | None,
               seed: int) -> tuple[list[torch.Tensor | None], list[torch.Tensor]]:
    """(gradients of the weighted output sum with respect to ``xs[k]`` for k in ``wrt``, the weights used);
    ``weights`` None: drawn here from ``seed`` for each float output."""
    for k in wrt:
        xs[k].requires_grad_(True)
    outs = fn(*xs)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    if weights is None:
        g = torch.Generator().manual_seed(seed)
        weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) if _differentiable(o) else None
                   for o in outs]
    terms = [(o.double() * w).sum() for o, w in zip(outs, weights) if w is not None and _differentiable(o)]
    if not terms:
        raise Skip("no output depends differentiably on an input")
    grads = torch.autograd.grad(sum(terms), [xs[k] for k in wrt], allow_unused=True)
    return [None if g is None else g.detach() for g in grads], weights


def _differentiable_inputs(ns: dict[str, Any], wrt: list[int], seed: int) -> list[int]:
    """``wrt``, or where eager refuses to differentiate with respect to all of them at once (a BatchNorm's
    running statistics cannot require gradients; an in-place op on a value that then needs saving), those it
    differentiates with respect to one at a time."""
    def works(ks: list[int]) -> bool:
        try:
            _gradients(ns["fn"], ns["make_inputs"](), ks, None, seed)
            return True
        except Exception:  # noqa: BLE001 - (Skip included: nothing differentiable with these alone)
            return False
    if works(wrt):
        return wrt
    return [k for k in wrt if works([k])]


def _differentiable(o: Any) -> bool:
    return isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad


def check_gradients(program: Program, compile_fn: Callable[[Callable], Callable],
                    calls: int = 1) -> tuple[str, str, str]:
    """Compile ``program.fn`` with ``compile_fn`` and compare the gradients of its inputs with eager's (see
    [Note: fuzzing gradients]).  Returns (status, signature, detail): status "ok", "skip" (nothing to check:
    the detail says why) or "mismatch"; ``CompiledRaised`` where the compiled function or its backward
    raised.  ``calls``: training steps taken with the compiled function, on fresh copies of the inputs, the last
    one compared (reduce-overhead records its graphs at the third and replays them after: [Note: fuzzing
    replays])."""
    ns, ns64 = program.namespace(), program.namespace(ft="float64")
    wrt = _leaves(program, ns["make_inputs"]())
    if not wrt:
        return "skip", "", "no input to differentiate"
    seed = program.seed
    with eager_only():
        wrt = _differentiable_inputs(ns, wrt, seed)
    if not wrt:
        return "skip", "", "eager differentiates with respect to none of the inputs"
    try:
        with eager_only():
            ge, weights = _gradients(ns["fn"], ns["make_inputs"](), wrt, None, seed)
            exact_in = [x.detach().to(torch.float64) if x.is_floating_point() else x for x in ns["make_inputs"]()]
            gx, _ = _gradients(ns64["fn"], exact_in, wrt, weights, seed)
    except Exception as exc:  # noqa: BLE001 - eager cannot differentiate it (an in-place op on a saved value)
        return "skip", "", f"eager: {type(exc).__name__}: {str(exc)[:120]}"
    try:
        compiled = compile_fn(ns["fn"])
        for _ in range(calls):
            gc, _ = _gradients(compiled, ns["make_inputs"](), wrt, weights, seed)
    except Skip as exc:
        return "skip", "", str(exc)
    except Exception as exc:  # noqa: BLE001 - the compiled forward or backward raised: the caller names it
        raise CompiledRaised() from exc
    depth = max(1, len(program.stmts))
    rtol, atol = BASE_TOL[program.ft]
    for k, c, e, x in zip(wrt, gc, ge, gx):
        shape = program.inputs[k].shape
        c, e, x = (torch.zeros(shape, dtype=torch.float64) if t is None else t.double() for t in (c, e, x))
        if not (torch.isfinite(e).all() and torch.isfinite(x).all()):
            continue  # (ill-conditioned in eager or exactly: nothing to hold the compile to)
        scale = x.abs().max().item() if x.numel() else 0.0
        base = (rtol * scale + atol) * depth
        e_eager = (e - x).abs().max().item() if x.numel() else 0.0
        d = (c - e).abs().max().item() if x.numel() else 0.0
        e_compiled = (c - x).abs().max().item() if x.numel() else 0.0
        far = d > FROM_EAGER * e_eager + base and e_compiled > FROM_EXACT * e_eager + base
        if far or not torch.isfinite(c).all():
            name = program.inputs[k].name
            return "mismatch", "mismatch:gradient", (
                f"gradient of input {k} ({name}, {program.ft}{list(shape)}): max |compiled - eager| {d:.3g}, "
                f"compiled vs float64 {e_compiled:.3g}, eager vs float64 {e_eager:.3g}, allowed {base:.3g} "
                f"+ {FROM_EAGER:g}x eager's error (largest gradient {scale:.3g})")
    return "ok", "", ""
