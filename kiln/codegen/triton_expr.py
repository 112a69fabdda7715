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

import os

import math
import re
from typing import Any

import torch

from kiln.ir.index import Dyn, FloorDiv, Lin, Mod, Var, render
from kiln.ir.sym import SizeExpr, Symbol, is_symbolic, render as render_size
from kiln.ir.kernel import KConst, KExpr, KIndex, KLoad, KOp, KVar, subexprs
from kiln.codegen.printing import OpTable, Rule, Temporaries
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
        return "True" if value else "False"  # (Triton: an i1 constant; "1" would be i32 and turn a mask into an int)
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
    Op.EXP: "tl.exp", Op.LOG: "tl.log", Op.SQRT: "tl.sqrt", Op.RSQRT: "km.rsqrt", Op.SIN: "tl.sin",
    Op.COS: "tl.cos", Op.ABS: "tl.abs", Op.FLOOR: "tl.floor", Op.CEIL: "tl.ceil", Op.SIGMOID: "tl.sigmoid",
    Op.ERF: "km.erf", Op.ERFC: "km.erfc", Op.NDTR: "km.ndtr", Op.TANH: "km.tanh", Op.EXPM1: "km.expm1",
    Op.LOG1P: "km.log1p",
    Op.TRUNC: "km.trunc", Op.ROUND: "km.nearbyint",
}


def _unary(op: Op, fn: str) -> Rule:
    """A function of a floating block; on integers the rounding ops are the identity and ``abs`` a select."""
    def rule(a: list[str], d: torch.dtype, ad: torch.dtype) -> str:
        if ad.is_floating_point:
            # (a constant operand made a 0-d tensor: kiln's math functions call ``.to`` on theirs - ``erf`` of a
            # ``full`` crashed the interpreter and would not compile: Triton-target fuzz seed 11502)
            x = f"tl.cast({a[0]}, tl.float32)" if _LITERAL.match(a[0]) else a[0]
            if op is Op.TANH and d in HALF:  # rounded to half precision anyway: the fast hardware tanh
                return f"km.tanh_half({x})"
            return f"{fn}({x})"
        if op in (Op.FLOOR, Op.CEIL, Op.TRUNC, Op.ROUND):
            return a[0]
        if op is Op.ABS:
            return f"tl.where({a[0]} < 0, -{a[0]}, {a[0]})"
        raise NotImplementedError(f"Triton codegen: no rule for {op.value}")
    return rule


def _floordiv(a: list[str], d: torch.dtype, ad: torch.dtype) -> str:
    if ad.is_floating_point:
        return f"tl.floor({a[0]} / {a[1]})"
    x, b = a[0], a[1]  # Triton's // truncates like C: step down when the signs differ and it is inexact
    return f"(({x} // {b}) - ((({x} % {b}) != 0) & (({x} < 0) != ({b} < 0))).to({tl_type(d)}))"


def _rem(a: list[str], d: torch.dtype, ad: torch.dtype) -> str:
    r = f"km.fmod({a[0]}, {a[1]})" if ad.is_floating_point else f"({a[0]} % {a[1]})"
    return f"tl.where(({r} != 0) & (({r} < 0) != ({a[1]} < 0)), {r} + {a[1]}, {r})"


def _extremum(fn: str) -> Rule:
    def rule(a: list[str], d: torch.dtype, ad: torch.dtype) -> str:
        nan = ", propagate_nan=tl.PropagateNan.ALL" if ad.is_floating_point else ""
        return f"{fn}({a[0]}, {a[1]}{nan})"
    return rule


def _interpreted() -> bool:
    """Will the kernel being written run under Triton's interpreter?  Read when the text is written, not when this
    module is imported: a generated module is decorated by ``triton.jit`` right after its text is written, and
    ``triton.jit`` reads ``TRITON_INTERPRET`` then.  (A flag taken at import was stale when kiln's code generator
    was imported before the environment set it - pytest collecting a CPU test module that imports
    kiln.runtime.triton_module before tests/gpu/conftest.py sets it: ints cast to bf16 by their bits.)"""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_LITERAL = re.compile(r'^\(?-?(\d+(\.\d*)?(e[-+]?\d+)?|float\("-?(inf|nan)"\)|True|False)\)?$')


def converted(text: str, to: str) -> str:
    """``text`` (an expression) converted to the Triton type ``to``: ``.to`` for a block, ``tl.cast`` for a
    Python number - a constant has no ``.to`` (``3.to(tl.int64)`` does not even parse: an int64 ``full`` a
    training graph returned; ``0.5.to(tl.bfloat16)``: a constant a reduction stored)."""
    return f"tl.cast({text}, {to})" if _LITERAL.match(text) else f"{text}.to({to})"


def _cast(a: list[str], d: torch.dtype, ad: torch.dtype) -> str:
    x = a[0]
    if _LITERAL.match(x):  # (a constant: see ``converted``)
        x = f"tl.cast({x}, {tl_type(ad)})"
    if d in HALF and ad == torch.bool:  # 0 and 1 are exact (and Triton's interpreter made a bool's bf16 zero:
        return f"{x}.to(tl.float32)"   # fuzz_symbolic --target triton, seed 594)
    if d == torch.bfloat16 and not ad.is_floating_point and _interpreted():
        # Triton 3.6's interpreter converts an int to bf16 by its bits (1 -> 9.2e-41): through fp32 there, which
        # rounds twice only past 2**24 (the GPU's text converts directly)
        return f"{x}.to(tl.float32).to(tl.bfloat16).to(tl.float32)"
    if d in HALF:  # round to the half type, keep computing in fp32
        return f"{x}.to({tl_type(d)}).to(tl.float32)"
    return f"{x}.to({tl_type(d)})"


TRITON_OPS = OpTable("Triton", _INFIX, {
    **{op: _unary(op, fn) for op, fn in _UNARY_FN.items()},
    Op.RECIPROCAL: lambda a, d, ad: f"(1.0 / {a[0]})",
    Op.FLOORDIV: _floordiv,
    Op.REM: _rem,
    Op.FMOD: lambda a, d, ad: f"km.fmod({a[0]}, {a[1]})" if ad.is_floating_point else f"({a[0]} % {a[1]})",
    # (float64: libdevice's pow takes two doubles, and a literal exponent is fp32 - broadcast it to the base's type)
    Op.POW: lambda a, d, ad: f"km.pow({a[0]}, {a[1]} + tl.zeros_like({a[0]}))" if ad == torch.float64
    else f"km.pow({a[0]}, {a[1]})",
    Op.MAXIMUM: _extremum("tl.maximum"),
    Op.MINIMUM: _extremum("tl.minimum"),
    Op.WHERE: lambda a, d, ad: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    Op.RELU: lambda a, d, ad: f"tl.where(({a[0]} > 0) | ({a[0]} != {a[0]}), {a[0]}, 0)" if ad.is_floating_point
    else f"tl.where({a[0]} > 0, {a[0]}, 0)",
    Op.SIGN: lambda a, d, ad: f"tl.where({a[0]} > 0, 1.0, tl.where({a[0]} < 0, -1.0, {a[0]}))"
    if ad.is_floating_point else f"(({a[0]} > 0).to({tl_type(d)}) - ({a[0]} < 0).to({tl_type(d)}))",
    Op.LOGICAL_NOT: lambda a, d, ad: f"({a[0]} == 0)",
    Op.BITWISE_NOT: lambda a, d, ad: f"(~{a[0]})",
}, cast=_cast)


def op_text(op: Op, args: list[str], dtype: torch.dtype, arg_dtype: torch.dtype) -> str:
    """Triton for one operator on already-printed operands (in their compute types)."""
    return TRITON_OPS.text(op, args, dtype, arg_dtype)


def render_index(e: Lin, dyn) -> str:
    """Python/Triton text of an index (``ir/index.render`` with Python's floor division)."""
    return render(e, dyn, floordiv="//", times=" * ")


class TritonPrinter(Temporaries):
    """Prints the expressions of one block body as ``tN = ...`` lines (named by ``printing.Temporaries``),
    shared by (expression, guard)."""

    def __init__(self, lines: list[str], indent: str, mask: str, scratch: dict[str, KExpr] | None = None,
                 names: dict[Any, str] | None = None, counter: list[int] | None = None,
                 stored: frozenset[KExpr] = frozenset()):
        super().__init__(names, counter)
        self.lines = lines
        self.indent = indent
        self.mask = mask                  # the block mask every load and store carries
        self.scratch = scratch or {}      # row-scratch buffer -> the value it holds (recomputed, not stored)
        self.stored = stored              # half-precision values the kernel stores ([Note: stored values as stored])
        self._unguarded: set[KExpr] = set()

    def child(self, lines: list[str], indent: str, mask: str) -> "TritonPrinter":
        return TritonPrinter(lines, indent, mask, self.scratch, self.names, self.counter, self.stored)

    def index(self, e: Lin, guard: str | None = None) -> str:
        return render_index(e, lambda d: self._dyn(d, guard))

    def _loads(self, e: KExpr) -> bool:
        """Does evaluating ``e`` still need a load (one not yet printed without a guard, which any guard may
        reuse)?  Gather indices count; so does a row-scratch value, which stands for its loads."""
        if e in self._unguarded:
            return False
        if any(isinstance(x, KLoad) and (x, None) not in self.names for x in subexprs(e)):
            return True
        self._unguarded.add(e)  # (names only grow: once true, it stays true)
        return False

    def _dyn(self, d: Dyn, guard: str | None) -> str:
        return f"({self.expr(d.expr, guard)})"

    def load_mask(self, guard: str | None) -> str:
        return self.mask if guard is None else f"{self.mask} & {guard}"

    def expr(self, e: KExpr, guard: str | None = None) -> str:
        if guard is not None and not self._loads(e):
            guard = None  # nothing here reads memory: its value is the same under every guard, computed once
        key = (e, guard)
        if key in self.names:
            return self.names[key]
        if (e, None) in self.names:  # computed without a guard: valid under any guard
            return self.names[(e, None)]
        if isinstance(e, KConst):
            if is_symbolic(e.value):  # a size used as a value: the kernel's size parameters (ints)
                if not isinstance(e.value, (int, SizeExpr, Symbol)):
                    # (the writer names each float computed from sizes as a parameter: reaching here is a bug)
                    raise NotImplementedError(f"Triton codegen: a float computed from sizes ({e.value})")
                text = f"({render_size(e.value, 'py')})"
                return f"({text} * 1.0)" if e.dtype.is_floating_point else text  # (1.0: a constexpr size too)
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
                offset = self.index(e.index, guard)
                if not _has_position(e.index):
                    # positions from loaded values alone (a gather whose index is one element): the pointer may be
                    # a scalar, which tl.load takes with no block mask; made a block of the mask's shape (fuzz
                    # seed 247 of fuzz_symbolic --target triton)
                    offset += f" + 0 * ({self.load_mask(guard)}).to(tl.int32)"
                text = f"tl.load({e.buf} + ({offset}), mask={self.load_mask(guard)}, other=0)"
            if e.dtype in HALF:
                text += ".to(tl.float32)"
        elif isinstance(e, KOp) and e.op is Op.WHERE:
            cond = self.expr(e.args[0], guard)
            if e.args[0].dtype != torch.bool:  # a mask must be i1: Triton rejects a load masked by an integer
                cond = f"({cond} != 0)"
            g_true = cond if guard is None else f"{guard} & {cond}"
            g_false = f"({cond} == 0)" if guard is None else f"{guard} & ({cond} == 0)"
            text = f"tl.where({cond}, {self.expr(e.args[1], g_true)}, {self.expr(e.args[2], g_false)})"
        else:
            assert isinstance(e, KOp)
            args = [self.expr(a, guard) for a in e.args]
            if e.op in (Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR, Op.LOGICAL_NOT):
                args = [x if a.dtype == torch.bool else f"({x} != 0)" for x, a in zip(args, e.args)]
            elif e.op in _COMPARISONS or e.op is Op.CAST and e.args[0].dtype in HALF:
                # (a cast observes its operand as eager holds it: ``erf(x).float()`` of an fp16 ``erf`` is the
                # rounded value - a LayerNorm's saved mean, taken of the unrounded one, differed from its
                # backward's recomputation by the rounding, and the normalized size-1 row's gradient was 0.8 off:
                # Triton-target fuzz seed 12073)
                args = [_rounded(x, a, self.scratch) for x, a in zip(args, e.args)]
            arg_dtype = e.args[0].dtype if e.args else e.dtype
            text = op_text(e.op, args, e.dtype, arg_dtype)
        if e in self.stored and isinstance(e, KOp) and e.op is not Op.CAST:  # (a cast to half has rounded)
            # (tl.cast: a KOp of constants alone may be a Python number at run time - no ``.to``: CI seed 8070)
            text = f"tl.cast(tl.cast({text}, {tl_type(e.dtype)}), tl.float32)"
        name = self.fresh()
        self.lines.append(f"{self.indent}{name} = {text}")
        self.names[key] = name
        return name


_COMPARISONS = (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE)


# [Note: stored values as stored]
# Half-precision values are computed in fp32 and rounded where stored.  A value a kernel stores *and* uses
# further was used unrounded: what the kernel computed from it differed from what another kernel computes from
# the stored value.  A training step's partition cuts exactly there: the forward computed ``amax(cos(v))`` from
# ``v`` unrounded and stored ``v`` for the backward, whose recomputed ``cos(v)`` (from the rounded ``v``) was
# then never equal to the saved maximum - amax's backward divided by a count of 0: NaN gradients (gradient fuzz
# seed 9185, bf16).  A stored half value is used as stored, rounded once where it is computed.
def stored_half_values(stores: Any, dtype_of: dict[str, torch.dtype]) -> frozenset[KExpr]:
    """The computed half-precision values among ``stores`` that go to half-precision buffers: a store of a row
    scratch's value (the value computed again where read, kernel_build's [Note: row scratch]) counts as one of
    the value itself; writes of the scratch do not."""
    scratch = {st.buf: st.value for st in stores if st.buf not in dtype_of}
    values = set()
    for st in stores:
        value = st.value
        while isinstance(value, KLoad) and value.buf in scratch:
            value = scratch[value.buf]
        if isinstance(value, KOp) and value.dtype in HALF and dtype_of.get(st.buf) in HALF:
            values.add(value)
    return frozenset(values)


def _rounded(text: str, a: KExpr, scratch: dict[str, KExpr]) -> str:
    """A comparison's (or a cast's) operand as eager compares (converts) it: a half-precision value computed here
    (kept in fp32 while computing, as Inductor does) rounded to its type first.  A recomputed ``x * -1.25``
    compared with its saved ``amin`` (which the forward stored rounded) was never equal in fp16: amin's backward
    divided by a count of 0 - NaN gradients (fuzz seed 2003 with gradients).  Loads and constants are the type's already
    (an accumulator is rounded too: a reduction's result is compared as it is stored; and a load of a row-scratch
    buffer, which stands for the value computed again: fuzz seed 257, amax's mask beside the amax)."""
    if a.dtype in HALF and (isinstance(a, (KOp, KVar)) or isinstance(a, KLoad) and a.buf in scratch):
        # (tl.cast: the text may be a Python number)
        return f"tl.cast(tl.cast({text}, {tl_type(a.dtype)}), tl.float32)"
    return text


def _has_position(index: Lin) -> bool:
    """Does ``index`` depend on a loop position (a block), not only on loaded values (``Dyn``) and constants?"""
    return any(isinstance(a, Var) or (isinstance(a, (FloorDiv, Mod)) and _has_position(a.arg))
               for a in index.atoms())
