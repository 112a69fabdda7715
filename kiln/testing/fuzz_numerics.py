"""Numerical analysis of a fuzz program: is every statement well-conditioned, and what tolerance does each
output need?  A differential fuzzer is only useful if it reports no false positives.

[Note: three executions]
Each statement runs, eagerly, in three environments on the same input values:

- ``ft``: the program's own dtype (what eager computes and the compiled program is compared with);
- ``exact``: float64 (float inputs upcast exactly): a close stand-in for exact arithmetic;
- ``noisy``: float64 with every rounded op's result perturbed by a few units in the last place of the
  program's dtype, and reductions by ``sqrt(n)`` times that of their terms: the error a *correct* compiler may
  make (other vector math functions, other summation orders, decompositions rounding intermediates).

From them:

- a statement is rejected (the generator picks another; the shrinker drops the candidate) if it produces NaN,
  infinities that differ between environments, values beyond ``CAP`` (so nothing overflows), or any int/bool
  value that differs between the environments;
- a decision (a comparison, an argmax, a float->int cast, floor/round/sign) on rounded values must have every
  element farther from its boundary than twice the operand's tolerance: a comparison right at a tie after float
  ops can legitimately go either way.  Values from exact ops only (views, max, clamp, where, int casts of
  ints, ...) are bit-identical in any correct implementation: ties on them are kept, since they test
  tie-breaking (argmax's first index, ``>`` vs ``>=``), which must match eager exactly;
- each output's tolerance: ``(0, 0)`` for exact values and every int/bool output; otherwise
  ``rtol = R * depth`` and ``atol = max(A * depth, 4 * |noisy - exact|, 16 * |ft - exact|)``, where ``depth``
  counts the rounded ops on the output's longest path (the regression files' depth scaling, ``R``, ``A`` =
  1.3e-5, 1.5e-5 in float32).  The measured terms carry what a formula would have to guess: a sum of ``n``
  terms of size ``m`` may err by about ``sqrt(n) * m * eps`` (a random walk of roundings; kiln sums in 16
  vector lanes, ATen pairwise, so the orders differ), far above ``rtol * |sum|`` when the terms cancel; exp
  and division amplify an operand's error; the noisy run propagates all of it through the program as it is.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F

from kiln.testing.fuzz_program import InputSpec, Program, Stmt

# unit roundoff of each float dtype
EPS = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# per unit of depth: (rtol, atol).  float32: the project's usual 1.3e-5/1.5e-5 (opinfo_sweep).  Half: eager and
# kiln both call ATen's half kernels, but kiln's decompositions (softmax -> amax, sub, exp, sum, div; layer_norm)
# round every intermediate to the half dtype where ATen keeps fp32 inside the op: a few roundings of 2^-11
# (float16) or 2^-8 (bfloat16) per op, so 8 units of roundoff per level of depth.
BASE_TOL = {"float32": (1.3e-5, 1.5e-5), "float16": (8 * 2.0 ** -11, 8 * 2.0 ** -11),
            "bfloat16": (8 * 2.0 ** -8, 8 * 2.0 ** -8)}
NOISE_ULPS = 4          # the noisy run's perturbation per rounded op, in units of roundoff
CAP = {"float32": 1e4, "float16": 1e3, "bfloat16": 1e3}
INT_CAP = 1 << 20


class Rejected(Exception):
    """The statement (or program) is invalid in eager or ill-conditioned; the message says why."""


def mx(t: torch.Tensor) -> float:
    """Largest magnitude of a tensor (0 for an empty one); noise expressions use it."""
    t = t.detach()
    if t.numel() == 0:
        return 0.0
    t = t.double() if t.is_floating_point() else t.double()
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def mn(t: torch.Tensor) -> float:
    """Smallest magnitude of a tensor's finite values (1 for an empty one); noise expressions use it."""
    t = t.detach().double()
    finite = t[torch.isfinite(t)]
    return float(finite.abs().min()) if finite.numel() else 1.0


def sq(n: float) -> float:
    return math.sqrt(max(n, 1.0))


def inv_std(t: torch.Tensor, k: int) -> float:
    """1 / the smallest standard deviation of ``t`` over its last ``k`` dims (layer_norm's amplification)."""
    rows = t.detach().double().flatten(-k) if k else t.detach().double()[..., None]
    if rows.numel() == 0:
        return 1.0
    return 1.0 / float(rows.var(-1, unbiased=False).min().add(1e-5).sqrt())


class Analysis:
    """Runs a program statement by statement in the three environments (see the module note).

    ``try_stmt`` adds a statement if it passes (the generator's loop); ``Analysis.of(program)`` replays a
    whole program and raises ``Rejected`` if any statement fails (the shrinker's validity test)."""

    def __init__(self, seed: int, ft: str, inputs: list[InputSpec]):
        self.seed, self.ft, self.inputs = seed, ft, list(inputs)
        self.stmts: list[Stmt] = []
        self.max_numel = 1 << 22
        self._reset()

    @classmethod
    def of(cls, program: Program) -> "Analysis":
        a = cls(program.seed, program.ft, program.inputs)
        for s in program.stmts:
            a._run(s, len(a.stmts))
            a.stmts.append(s)
        return a

    # ---------------------------------------------------------------------------------------- environments

    def _reset(self) -> None:
        ft = getattr(torch, self.ft)
        self.envs: dict[str, dict[str, Any]] = {
            k: {"torch": torch, "F": F, "FT": ft if k == "ft" else torch.float64} for k in ("ft", "exact", "noisy")}
        self.depth: dict[str, float] = {}
        self.exact: dict[str, bool] = {}
        self.dev: dict[str, tuple[float, float]] = {}   # name -> (|noisy - exact|, |ft - exact|)
        self.mutated: set[str] = set()                  # names an in-place op has changed (aliases included)
        for spec in self.inputs:
            self._add_input_tensor(spec)

    def _add_input_tensor(self, spec: InputSpec) -> None:
        t = make_input(spec, self.seed, self.ft)
        self.envs["ft"][spec.name] = t
        for k in ("exact", "noisy"):
            self.envs[k][spec.name] = t.double() if t.is_floating_point() else t.clone()
        self.depth[spec.name], self.exact[spec.name] = 0.0, True
        self.dev[spec.name] = (0.0, 0.0)

    def add_input(self, spec: InputSpec) -> None:
        self.inputs.append(spec)
        self._add_input_tensor(spec)

    def remove_input(self, name: str) -> None:
        """Undo ``add_input`` (the generator drops an op it had made an input for)."""
        self.inputs = [i for i in self.inputs if i.name != name]
        for env in self.envs.values():
            env.pop(name, None)

    def value(self, name: str) -> torch.Tensor:
        """The eager (program dtype) value of a name."""
        return self.envs["ft"][name]

    # ---------------------------------------------------------------------------------------- statements

    def try_stmt(self, stmt: Stmt) -> str | None:
        """Run ``stmt`` after the committed ones; keep it and return None if it passes, else return why not
        (and leave the state as it was).  An in-place statement is kept with ``aliases`` filled in: the names
        it changes (the liveness rule of the generator and the shrinker)."""
        try:
            if stmt.mutates is not None:
                stmt = dataclasses.replace(stmt, aliases=tuple(self._aliases(stmt.mutates)))
            self._run(stmt, len(self.stmts))
        except Rejected as exc:
            self._rollback(stmt)
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - invalid in eager: the generator picks another op
            self._rollback(stmt)
            return f"eager: {type(exc).__name__}: {str(exc)[:200]}"
        self.stmts.append(stmt)
        return None

    def undo_last(self) -> None:
        self._rollback(self.stmts.pop())

    def _rollback(self, stmt: Stmt) -> None:
        if stmt.mutates is None:
            for env in self.envs.values():
                for d in stmt.defs:
                    env.pop(d, None)
            return
        self._reset()  # an in-place op may have changed tensors: replay from the inputs
        for i, s in enumerate(self.stmts):
            self._run(s, i)

    def _run(self, stmt: Stmt, position: int) -> None:
        for chk in stmt.checks:
            self._check_margin(chk)
        for env in self.envs.values():
            exec(stmt.text, env)
        changed = list(stmt.defs)
        if stmt.mutates is not None:
            aliases = self._aliases(stmt.mutates)
            changed += aliases
            self.mutated.update(aliases)
        for name in changed:
            self._check_values(name)
        if stmt.noise:
            self._perturb(stmt, position)
        dep = max((self.depth[u] for u in stmt.uses), default=0.0) + stmt.weight
        exact = all(self.exact[u] for u in stmt.uses) and not stmt.noise
        for name in changed:
            self.depth[name] = max(self.depth.get(name, 0.0), dep)
            self.exact[name] = self.exact.get(name, True) and exact
            self.dev[name] = self._deviation(name)

    def _aliases(self, name: str) -> list[str]:
        """Every name sharing storage with ``name`` in the eager run (an in-place op changes them all)."""
        env = self.envs["ft"]
        ptr = env[name].untyped_storage().data_ptr()
        return [k for k, v in env.items() if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == ptr]

    def _perturb(self, stmt: Stmt, position: int) -> None:
        """The noisy run: add up to NOISE_ULPS roundoffs of |result| (+ the op's error scale) to each result."""
        env, eps = self.envs["noisy"], EPS[self.ft] * NOISE_ULPS
        scale = 0.0 if stmt.noise == "pw" else float(eval(stmt.noise, {**self.envs["exact"], **NOISE_HELPERS}))
        gen = torch.Generator().manual_seed(self.seed * 1000 + position)
        targets = [stmt.mutates] if stmt.mutates is not None else list(stmt.defs)
        for name in targets:
            t = env[name]
            if not t.is_floating_point() or t.numel() == 0:
                continue
            u = torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1
            noise = u * eps * (t.abs().nan_to_num(0.0, 0.0, 0.0) + scale)
            t.add_(noise.to(t.dtype))

    # ---------------------------------------------------------------------------------------- checks

    def _check_values(self, name: str) -> None:
        vals = {k: env[name] for k, env in self.envs.items()}
        t = vals["ft"]
        if not isinstance(t, torch.Tensor):
            raise Rejected(f"{name} is not a tensor")
        if t.numel() > self.max_numel:
            raise Rejected(f"{name}: {t.numel()} elements")
        if t.is_floating_point():
            _check_float(name, vals, CAP[self.ft])
        elif not all(torch.equal(t, v) for v in vals.values()):
            raise Rejected(f"{name}: an int/bool result differs between float32 and float64 (a tie)")
        elif t.dtype != torch.bool and t.numel() and int(t.abs().max()) > INT_CAP:
            raise Rejected(f"{name}: int values beyond {INT_CAP}")

    def _deviation(self, name: str) -> tuple[float, float]:
        env = self.envs
        if not env["ft"][name].is_floating_point():
            return (0.0, 0.0)
        exact = env["exact"][name]
        return (_maxdiff(env["noisy"][name], exact), _maxdiff(env["ft"][name].double(), exact))

    def tol(self, name: str) -> tuple[float, float]:
        """The tolerance ``name``'s value is compared with, as it is now (see the module note)."""
        t = self.envs["ft"][name]
        if self.exact[name] or not t.is_floating_point():
            return (0.0, 0.0)
        r, a = BASE_TOL[self.ft]
        d = max(1.0, self.depth[name])
        noisy, ft = self.dev[name]
        return (r * d, max(a * d, 4 * noisy, 16 * ft))

    def _operand(self, text: str) -> tuple[torch.Tensor, torch.Tensor]:
        """An operand of a decision (a name or a number literal): its eager values and per-element tolerance."""
        if text in self.envs["ft"]:
            v = self.envs["ft"][text].double()
            r, a = self.tol(text)
            return v, a + r * v.abs()
        v = torch.tensor(float(text), dtype=torch.float64)
        return v, torch.zeros((), dtype=torch.float64)

    def _check_margin(self, chk: tuple[str, ...]) -> None:
        kind = chk[0]
        if kind == "gap":
            return self._check_gap(*chk[1:])
        v, tol = self._operand(chk[1])
        if kind == "cmp":
            w, tol2 = self._operand(chk[2])
            margin, tol = (v - w).abs(), tol + tol2
        else:
            k = float(chk[2]) if len(chk) > 2 else 1.0
            x, tol = v * k, tol * abs(k)
            margin = {"int": lambda: (x - x.round()).abs(), "half": lambda: (x - x.floor() - 0.5).abs(),
                      "zero": lambda: x.abs()}[kind]()
        if margin.numel() and bool((tol > 0).any()) and bool((margin <= 2 * tol).any()):
            raise Rejected(f"{kind} decision on {chk[1:]} is within twice its tolerance of the boundary")

    def _check_gap(self, name: str, dim: str, sense: str, strict: str = "") -> None:
        """argmax/max(dim).indices: the best value must beat the second by more than their tolerances; ties
        are kept only for exact values and where eager's first-index rule is documented (not ``strict``)."""
        v, tol = self._operand(name)
        v = -v if sense == "min" else v
        if dim == "None":
            v, tol = v.flatten(), tol.flatten()
            d = 0
        else:
            d = int(dim)
        if v.dim() == 0 or v.shape[d] < 2 or v.numel() == 0:
            return
        top = v.topk(2, dim=d).values
        gap = top.select(d, 0) - top.select(d, 1)
        limit = 4 * float(tol.max()) if tol.numel() else 0.0
        if (limit > 0 or strict) and bool((gap <= limit).any()):
            raise Rejected(f"argmax of {name} along {dim}: a near-tie")


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    fin = torch.isfinite(a) & torch.isfinite(b)
    return float((a[fin] - b[fin]).abs().max()) if bool(fin.any()) else 0.0


def _check_float(name: str, vals: dict[str, torch.Tensor], cap: float) -> None:
    t, e = vals["ft"], vals["exact"]
    for k, v in vals.items():
        if bool(v.isnan().any()):
            raise Rejected(f"{name}: NaN ({k})")
    inf = t.isinf()
    if not all(torch.equal(inf, v.isinf()) for v in vals.values()) or \
            not torch.equal(t[inf].double(), e[inf]):
        raise Rejected(f"{name}: infinities differ between the dtypes (overflow)")
    if mx(t) > cap or mx(e) > cap:
        raise Rejected(f"{name}: values beyond {cap:g}")


NOISE_HELPERS = {"mx": mx, "mn": mn, "sq": sq, "inv_std": inv_std}


def make_input(spec: InputSpec, seed: int, ft: str) -> torch.Tensor:
    """The tensor ``make_inputs`` makes for ``spec`` (the same expression, evaluated alone)."""
    ns = {"torch": torch, "FT": getattr(torch, ft), "seed": seed,
          "g": lambda i: torch.Generator().manual_seed(i)}
    return eval(spec.source().split(" = ", 1)[1].split("  #")[0], ns)
