"""``generate(seed) -> Program``: a seeded random program, valid in eager and well-conditioned by construction.

The generator keeps the program's values symbolically (name, dtype, shape) to choose operands and parameters
that fit, and runs each proposed statement at once in ``fuzz_numerics.Analysis`` (eager, three precisions):
a statement that eager rejects or that is ill-conditioned is dropped and another op is drawn, so the shape
rules of the op table can stay simple.  Everything it draws comes from ``random.Random(seed)`` and from
eager results on inputs made by seeded generators, so the same seed gives the same text on the same torch.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import random
import warnings
from typing import Any, Callable, Sequence

import torch

from kiln.testing import fuzz_ops as P
from kiln.testing import fuzz_ops_nn as N
from kiln.testing import fuzz_ops_views as V
from kiln.testing.fuzz_numerics import Analysis, mx
from kiln.testing.fuzz_program import InputSpec, Program, Stmt, live_stmts

# (op, weight): pointwise work dominates, as in models; every family appears in a few hundred programs
OPS: list[tuple[Callable[[Any], Stmt | None], int]] = [
    (P.unary, 14), (P.binary, 12), (P.discrete, 2), (P.compare, 5), (P.logical, 2), (P.where, 4),
    (P.masked_fill, 3), (P.cast, 3), (P.int_op, 2), (P.size_arith, 2), (P.constant, 1),
    (P.reduce, 8), (P.max_dim, 4), (P.softmax, 4), (P.norm, 3),
    (V.reshape, 5), (V.permute, 4), (V.expand, 3), (V.slice_, 5), (V.reshape_misc, 4), (V.split, 3), (V.cat, 3),
    (V.gather, 3), (V.inplace, 4), (N.matmul, 5), (N.conv, 3), (N.pool, 2), (N.attention, 2),
]


@dataclasses.dataclass(frozen=True)
class Size:
    """How big programs get: statements, dims (a few large ones so vector loops run full and tail
    iterations), elements per tensor, inputs."""

    stmts: tuple[int, int]
    max_dim: int
    big_dims: tuple[int, ...]
    big_p: float
    max_numel: int
    max_inputs: int
    max_outputs: int


SIZES = {"ci": Size((4, 10), 8, (16, 17), 0.08, 512, 6, 5),
         "full": Size((6, 16), 12, (16, 17, 24, 33, 64), 0.12, 4096, 8, 6)}
HALF_SHARE = 0.2  # --dtype all: the share of half-precision (float16/bfloat16) programs


@dataclasses.dataclass(frozen=True)
class Var:
    name: str
    dtype: str  # "float" (the program's FT), "int64", "bool"
    shape: tuple[int, ...]

    def numel(self) -> int:
        return math.prod(self.shape)


def _dtype_name(t: torch.Tensor) -> str:
    if t.is_floating_point():
        return "float"
    return {torch.int64: "int64", torch.bool: "bool"}.get(t.dtype, str(t.dtype))


class Gen:
    """The generator's state and the helpers the op table uses (``fuzz_ops*.py``)."""

    def __init__(self, seed: int, ft: str, size: Size, rng: random.Random):
        self.seed, self.ft, self.size, self.rng = seed, ft, size, rng
        self.max_numel = size.max_numel
        self.analysis = Analysis(seed, ft, [])
        self.analysis.max_numel = size.max_numel
        self.vars: list[Var] = []
        self.n_values = 0
        self.stats: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------------------------ randomness

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.rng.randrange(len(seq))]

    def dim(self) -> int:
        if self.rng.random() < self.size.big_p:
            return self.choice(self.size.big_dims)
        return 1 if self.rng.random() < 0.15 else self.rng.randint(2, self.size.max_dim)

    def rand_shape(self, rank: int) -> tuple[int, ...]:
        shape = [self.dim() for _ in range(rank)]
        while math.prod(shape) > self.max_numel // 4:
            i = max(range(rank), key=lambda j: shape[j])
            shape[i] = max(1, shape[i] // 2)
        return tuple(shape)

    # ------------------------------------------------------------------------------------ values

    def pick(self, dtypes: str | tuple[str, ...] | None, pred: Callable[[Var], bool] | None = None) -> Var | None:
        """A value of one of ``dtypes`` satisfying ``pred``.  Computed values, recent ones most, are far likelier
        than inputs: deep chains of ops on intermediates are where fusion, views and in-place writes meet."""
        if isinstance(dtypes, str):
            dtypes = (dtypes,)
        cands = [(i, v) for i, v in enumerate(self.vars)
                 if (dtypes is None or v.dtype in dtypes) and (pred is None or pred(v))]
        if not cands:
            return None
        weights = [1.0 if v.name.startswith("x") else 4.0 + (1 + i) ** 2 for i, v in cands]
        return self.rng.choices([v for _, v in cands], weights)[0]

    def new_input(self, dtype: str, shape: tuple[int, ...], kind: str | None = None,
                  layout: str | None = None) -> Var:
        """A new input of ``fn`` (made in ``make_inputs``), laid out at random unless ``layout`` is given."""
        shape = tuple(shape)
        if kind is None:
            kind = {"float": self.choice(["uniform", "uniform", "normal", "positive", "small", "ties"]),
                    "int64": "int", "bool": f"mask:{self.choice([30, 50, 70])}"}[dtype]
        if layout is None:
            options = ["contiguous"] * 6 + ["sliced", "offset"] * (len(shape) >= 1) + \
                ["transposed"] * (len(shape) >= 2) + ["expanded"] * (len(shape) >= 2) + \
                ["channels_last"] * (len(shape) == 4)
            layout = self.choice(options)
        idx = len(self.analysis.inputs)
        spec = InputSpec(f"x{idx}", idx, dtype, shape, layout, kind)
        self.analysis.add_input(spec)
        var = Var(spec.name, dtype, shape)
        self.vars.append(var)
        return var

    def operand(self, shape: tuple[int, ...], dtype: str, kind: str | None = None) -> Var:
        """A value of exactly ``shape``: an existing one or a new input."""
        v = self.pick(dtype, lambda w: w.shape == tuple(shape))
        return v if v is not None and self.rng.random() < 0.5 else self.new_input(dtype, tuple(shape), kind)

    def index(self, shape: tuple[int, ...], hi: int, pred: Callable[[Var], bool]) -> Var:
        """int64 indices in [0, hi): from the program when some fit (an argmax, a cast), else a new input."""
        def fits(v: Var) -> bool:
            t = self.val(v)
            return pred(v) and (t.numel() == 0 or (int(t.min()) >= 0 and int(t.max()) < hi))
        v = self.pick("int64", fits)
        if v is not None and self.rng.random() < 0.6:
            return v
        return self.new_input("int64", shape, kind=f"index:{max(hi, 1)}", layout="contiguous")

    def partner(self, a: Var, dtypes: tuple[str, ...]) -> Var | None:
        """A second operand whose shape broadcasts with ``a``'s."""
        v = self.pick(dtypes, lambda w: w.name != a.name and self.broadcastable(a.shape, w.shape) and
                      math.prod(self.bshape(a.shape, w.shape)) <= self.max_numel)
        if v is not None and self.rng.random() < 0.6:
            return v
        shape = a.shape if self.rng.random() < 0.4 else self.reduced_shape(a.shape)
        return self.new_input(self.choice(dtypes), shape)

    def reduced_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts to ``shape``: some leading dims dropped, some dims 1."""
        s = list(shape[self.rng.randint(0, len(shape)) // 2:]) if shape else []
        return tuple(1 if self.rng.random() < 0.35 else d for d in s)

    @staticmethod
    def bshape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
        try:
            return tuple(torch.broadcast_shapes(tuple(a), tuple(b)))
        except RuntimeError:
            return None

    def broadcastable(self, a: Sequence[int], b: Sequence[int]) -> bool:
        return self.bshape(a, b) is not None

    def val(self, v: Var) -> torch.Tensor:
        return self.analysis.value(v.name)

    def mag(self, v: Var) -> float:
        return mx(self.val(v))

    def writable(self, v: Var) -> bool:
        """An in-place op may write ``v``: no element of it shares memory with another."""
        t = self.val(v)
        return t.numel() > 0 and torch._debug_has_internal_overlap(t) == 0

    def same_storage(self, a: Var, b: Var) -> bool:
        return self.val(a).untyped_storage().data_ptr() == self.val(b).untyped_storage().data_ptr()

    def aliases_input(self, v: Var) -> bool:
        ptr = self.val(v).untyped_storage().data_ptr()
        return any(self.analysis.value(i.name).untyped_storage().data_ptr() == ptr for i in self.analysis.inputs)

    def reduce_dims(self, shape: tuple[int, ...], single: bool = False, required: bool = False) -> list[int] | None:
        r = len(shape)
        if not required and self.rng.random() < 0.2:
            return None
        if single or r < 2 or self.rng.random() < 0.6:
            return [self.rng.randrange(-r, r)]
        return sorted(self.rng.sample(range(r), 2))

    @staticmethod
    def numel_over(shape: tuple[int, ...], dims: list[int] | None) -> int:
        if dims is None:
            return math.prod(shape)
        return math.prod(shape[d] for d in {d % len(shape) for d in dims})

    def names(self, k: int) -> list[str]:
        return [f"v{self.n_values + i}" for i in range(k)]

    # ------------------------------------------------------------------------------------ the loop

    def step(self) -> bool:
        """Draw an op and try it; True when a statement was added."""
        op = self.rng.choices([o for o, _ in OPS], [w for _, w in OPS])[0]
        n_inputs, n_vars = len(self.analysis.inputs), len(self.vars)
        try:
            stmt = op(self)
        except Exception as exc:  # noqa: BLE001 - a bug of the op table: counted (tests require none), not fatal
            stmt, why = None, f"GENERATOR BUG {type(exc).__name__}: {exc}"
        else:
            why = "no operands" if stmt is None else self.analysis.try_stmt(stmt)
        if why is None and len(self.analysis.inputs) <= self.size.max_inputs:
            self._commit(stmt)
            return True
        if why is None:  # too many inputs: undo the statement too
            self.analysis.undo_last()
        self.stats[f"{op.__name__}: {_reason(why or 'too many inputs')}"] += 1
        for spec in self.analysis.inputs[n_inputs:]:
            self.analysis.remove_input(spec.name)
        del self.vars[n_vars:]
        return False

    def _commit(self, stmt: Stmt) -> None:
        for d in stmt.defs:
            t = self.analysis.value(d)
            self.vars.append(Var(d, _dtype_name(t), tuple(t.shape)))
        self.n_values += len(stmt.defs)
        self.stats[f"ok {stmt.op}"] += 1


def _reason(why: str) -> str:
    """The kind of a rejection, for statistics: its message without names and numbers."""
    import re
    return re.sub(r"\b[xv]\d+\b|\d+(\.\d+)?", "#", why)[:90]


def _initial_inputs(g: Gen) -> None:
    zero = g.rng.random() < 0.03  # size-0 dims, rarely
    for i in range(g.rng.randint(1, 3)):
        rank = g.rng.choices([0, 1, 2, 3, 4], [2, 15, 40, 25, 18])[0]
        shape = list(g.rand_shape(rank))
        if zero and i == 0 and rank:
            shape[g.rng.randrange(rank)] = 0
        dtype = g.rng.choices(["float", "int64", "bool"], [85, 10, 5])[0]
        g.new_input(dtype, tuple(shape))


def float_type(seed: int, dtype: str) -> str:
    """The float dtype of ``seed``'s program (cheap: the driver groups programs of one dtype together).  Drawn
    from a stream of its own: with ``dtype="all"``, a seed's float32 programs are those of ``dtype="fp32"``."""
    rng = random.Random(f"kiln-fuzz-dtype-{seed}")
    if dtype == "fp32":
        return "float32"
    if dtype == "half" or rng.random() < HALF_SHARE:
        return rng.choice(["float16", "bfloat16"])
    return "float32"


def generate(seed: int, dtype: str = "fp32", size: str = "ci", stats: collections.Counter | None = None) -> Program:
    """The program of ``seed``.  ``dtype``: "fp32", "half" (float16/bfloat16) or "all" (a share of half
    programs); ``size``: "ci" (4-10 statements, small shapes) or "full"."""
    rng = random.Random(f"kiln-fuzz-{seed}-{size}")
    sz = SIZES[size]
    g = Gen(seed, float_type(seed, dtype), sz, rng)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # eager's reductions in one order, whatever the machine
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _initial_inputs(g)
            target, tries = rng.randint(*sz.stmts), 0
            while len(g.analysis.stmts) < target and tries < 12 * target:
                g.step()
                tries += 1
            program = _finish(g)
    finally:
        torch.set_num_threads(threads)
    if stats is not None:
        stats.update(g.stats)
    return program


def _finish(g: Gen) -> Program:
    """Choose the outputs (every value nothing reads, a few others), drop dead statements and unused inputs,
    and compute the tolerances."""
    a = g.analysis
    used = {u for s in a.stmts for u in s.uses}
    defs = [d for s in a.stmts for d in s.defs]
    leaves = [d for d in defs if d not in used]
    outputs = leaves[-g.size.max_outputs:]
    others = [d for d in defs if d not in outputs]
    for _ in range(g.rng.choice([0, 1, 1, 2])):  # values that are also read later: kiln must realize them
        if others:
            outputs.append(others.pop(g.rng.randrange(len(others))))
    if not outputs or g.rng.random() < 0.05:
        outputs.append(g.choice(a.inputs).name)
    stmts = live_stmts(a.stmts, outputs, {i.name for i in a.inputs})
    live = {u for s in stmts for u in s.uses} | set(outputs)
    inputs = [i for i in a.inputs if i.name in live]
    out_tol = [a.tol(o) for o in outputs]
    input_tol = [a.tol(i.name) if i.name in a.mutated else None for i in inputs]
    var_info = {i.name: (i.dtype, i.shape) for i in inputs}
    for s in stmts:
        for d in s.defs:
            var_info[d] = (_dtype_name(a.value(d)), tuple(a.value(d).shape))
    return Program(g.seed, g.ft, inputs, stmts, outputs, out_tol, input_tol, var_info)
