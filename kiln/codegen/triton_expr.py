"""Triton text for kernel expressions: types, literals, operators, and a printer with masked loads.

Values are blocks (``[XBLOCK]`` for pointwise kernels, ``[XBLOCK, RBLOCK]`` inside reductions).  Half-precision
values (bf16, fp16) are computed in fp32, as ATen's own kernels do; a cast *to* a half type rounds
(``.to(bf16).to(fp32)``) so results match eager, and stores convert to the buffer's type.

A load runs under the conjunction of the block mask and every ``where`` condition above it: both branches of
a ``tl.where`` are evaluated, so a load that is only valid when its condition holds (padding, concatenation)
must be masked by it, or it would read out of bounds.  The printer therefore keys its shared temporaries by
(expression, guard).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from kiln.ir.index import Dyn, FloorDiv, Lin, Mod, Var
from kiln.ir.kernel import KConst, KExpr, KIndex, KLoad, KOp, KVar
from kiln.ir.ops import HALF, Op, compute_dtype  # noqa: F401  (re-exported for triton.py)

TL_TYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.bfloat16: "tl.bfloat16",
    torch.float16: "tl.float16", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def tl_type(dtype: torch.dtype) -> str:
    return TL_TYPES[dtype]


def literal(value: Any, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return f'float("{"-" if v < 0 else ""}inf")'
        return repr(v)
    return str(int(value))


_INFIX = {
    Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">",
    Op.GE: ">=", Op.LOGICAL_AND: "&", Op.LOGICAL_OR: "|", Op.LOGICAL_XOR: "^", Op.BITWISE_AND: "&",
    Op.BITWISE_OR: "|", Op.BITWISE_XOR: "^",
}
_UNARY_FN = {
    Op.EXP: "tl.exp", Op.LOG: "tl.log", Op.SQRT: "tl.sqrt", Op.RSQRT: "tl.rsqrt", Op.SIN: "tl.sin",
    Op.COS: "tl.cos", Op.ABS: "tl.abs", Op.FLOOR: "tl.floor", Op.CEIL: "tl.ceil", Op.SIGMOID: "tl.sigmoid",
    Op.ERF: "km.erf", Op.ERFC: "km.erfc", Op.TANH: "km.tanh", Op.EXPM1: "km.expm1", Op.LOG1P: "km.log1p",
    Op.TRUNC: "km.trunc", Op.ROUND: "km.nearbyint",
}


def op_text(op: Op, args: list[str], dtype: torch.dtype, arg_dtype: torch.dtype) -> str:
    """Triton for one operator on already-printed operands (in their compute types)."""
    a = args[0]
    fp = arg_dtype.is_floating_point
    if op in _INFIX:
        return f"({a} {_INFIX[op]} {args[1]})"
    if op is Op.TANH and fp and dtype in HALF:  # rounded to half precision anyway: the fast hardware tanh
        return f"km.tanh_half({a})"
    if op in _UNARY_FN and fp:
        return f"{_UNARY_FN[op]}({a})"
    if op in (Op.FLOOR, Op.CEIL, Op.TRUNC, Op.ROUND) and not fp:
        return a
    if op is Op.ABS:
        return f"tl.where({a} < 0, -{a}, {a})"
    if op is Op.NEG:
        return f"(-{a})"
    if op is Op.RECIPROCAL:
        return f"(1.0 / {a})"
    if op is Op.DIV:
        return f"({a} / {args[1]})"
    if op is Op.FLOORDIV:
        if fp:
            return f"tl.floor({a} / {args[1]})"
        b = args[1]  # Triton's // truncates like C: step down when the signs differ and it is inexact
        return f"(({a} // {b}) - ((({a} % {b}) != 0) & (({a} < 0) != ({b} < 0))).to({tl_type(dtype)}))"
    if op is Op.REM:
        r = f"km.fmod({a}, {args[1]})" if fp else f"({a} % {args[1]})"
        return f"tl.where(({r} != 0) & (({r} < 0) != ({args[1]} < 0)), {r} + {args[1]}, {r})"
    if op is Op.FMOD:
        return f"km.fmod({a}, {args[1]})" if fp else f"({a} % {args[1]})"
    if op is Op.POW:
        return f"km.pow({a}, {args[1]})"
    if op in (Op.MAXIMUM, Op.MINIMUM):
        fn = "tl.maximum" if op is Op.MAXIMUM else "tl.minimum"
        nan = ", propagate_nan=tl.PropagateNan.ALL" if fp else ""
        return f"{fn}({a}, {args[1]}{nan})"
    if op is Op.WHERE:
        return f"tl.where({a}, {args[1]}, {args[2]})"
    if op is Op.RELU:
        return f"tl.where(({a} > 0) | ({a} != {a}), {a}, 0)" if fp else f"tl.where({a} > 0, {a}, 0)"
    if op is Op.SIGN:
        if fp:
            return f"tl.where({a} > 0, 1.0, tl.where({a} < 0, -1.0, {a}))"
        return f"(({a} > 0).to({tl_type(dtype)}) - ({a} < 0).to({tl_type(dtype)}))"
    if op is Op.ISNAN:
        return f"({a} != {a})"
    if op is Op.LOGICAL_NOT:
        return f"({a} == 0)"
    if op is Op.BITWISE_NOT:
        return f"(~{a})"
    if op is Op.CAST:
        if dtype in HALF:  # round to the half type, keep computing in fp32
            return f"{a}.to({tl_type(dtype)}).to(tl.float32)"
        if dtype == torch.bool:
            return f"({a} != 0)"
        return f"{a}.to({tl_type(dtype)})"
    raise NotImplementedError(f"Triton codegen: no rule for {op.value}")


def render_index(e: Lin, dyn) -> str:
    """Python/Triton text of an index (operands are non-negative, so // and % agree with C)."""
    parts = []
    for a, c in e.terms:
        if isinstance(a, Var):
            s = a.name
        elif isinstance(a, FloorDiv):
            s = f"(({render_index(a.arg, dyn)}) // {a.k})"
        elif isinstance(a, Mod):
            s = f"(({render_index(a.arg, dyn)}) % {a.k})"
        else:
            s = dyn(a)
        parts.append(s if c == 1 else f"{c} * {s}")
    if e.const or not parts:
        parts.append(str(e.const))
    return " + ".join(parts).replace("+ -", "- ")


class TritonPrinter:
    """Prints the expressions of one block body as ``tN = ...`` lines; shared by (expression, guard)."""

    def __init__(self, lines: list[str], indent: str, mask: str, scratch: dict[str, KExpr] | None = None,
                 names: dict[Any, str] | None = None, counter: list[int] | None = None):
        self.lines = lines
        self.indent = indent
        self.mask = mask                  # the block mask every load and store carries
        self.scratch = scratch or {}      # row-scratch buffer -> the value it holds (recomputed, not stored)
        self.names: dict[Any, str] = dict(names or {})
        self.counter = counter if counter is not None else [0]

    def child(self, lines: list[str], indent: str, mask: str) -> "TritonPrinter":
        return TritonPrinter(lines, indent, mask, self.scratch, self.names, self.counter)

    def index(self, e: Lin, guard: str | None = None) -> str:
        return render_index(e, lambda d: self._dyn(d, guard))

    def _dyn(self, d: Dyn, guard: str | None) -> str:
        return f"({self.expr(d.expr, guard)})"

    def load_mask(self, guard: str | None) -> str:
        return self.mask if guard is None else f"{self.mask} & {guard}"

    def expr(self, e: KExpr, guard: str | None = None) -> str:
        key = (e, guard)
        if key in self.names:
            return self.names[key]
        if (e, None) in self.names:  # computed without a guard: valid under any guard
            return self.names[(e, None)]
        if isinstance(e, KConst):
            return literal(e.value, e.dtype)
        if isinstance(e, KVar):
            return e.name
        if isinstance(e, KIndex):
            text = f"({self.index(e.index, guard)})"
        elif isinstance(e, KLoad):
            if e.buf in self.scratch:
                return self.expr(self.scratch[e.buf], guard)
            if e.index.is_const():  # one element for the whole block (a 0-d buffer): a scalar load, in bounds
                text = f"tl.load({e.buf} + ({self.index(e.index, guard)}))"
            else:
                text = f"tl.load({e.buf} + ({self.index(e.index, guard)}), mask={self.load_mask(guard)}, other=0)"
            if e.dtype in HALF:
                text += ".to(tl.float32)"
        elif isinstance(e, KOp) and e.op is Op.WHERE:
            cond = self.expr(e.args[0], guard)
            g_true = cond if guard is None else f"{guard} & {cond}"
            g_false = f"({cond} == 0)" if guard is None else f"{guard} & ({cond} == 0)"
            text = f"tl.where({cond}, {self.expr(e.args[1], g_true)}, {self.expr(e.args[2], g_false)})"
        else:
            assert isinstance(e, KOp)
            args = [self.expr(a, guard) for a in e.args]
            if e.op in (Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR, Op.LOGICAL_NOT):
                args = [x if a.dtype == torch.bool else f"({x} != 0)" for x, a in zip(args, e.args)]
            arg_dtype = e.args[0].dtype if e.args else e.dtype
            text = op_text(e.op, args, e.dtype, arg_dtype)
        name = f"t{self.counter[0]}"
        self.counter[0] += 1
        self.lines.append(f"{self.indent}{name} = {text}")
        self.names[key] = name
        return name
