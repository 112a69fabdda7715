"""C++ text for kernel expressions: types, literals, operators, and a printer that shares subexpressions.

``ExprPrinter`` emits one ``const T tN = ...;`` per distinct subexpression of a loop body (hash-consing on
the frozen ``KExpr`` trees), so a value used twice - ``x`` in ``x * sigmoid(x)`` - is computed once.  The
branches of a ``where`` are printed inline instead: they may hold loads that are only valid when their
condition holds (padding, concatenation), and hoisting them would read out of bounds.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from kiln.ir.index import Dyn, Lin, render
from kiln.ir.kernel import KConst, KExpr, KIndex, KLoad, KOp, KVar
from kiln.ir.ops import HALF, Op, compute_dtype, reduction_identity
from kiln.ir.sym import Size, is_symbolic, render as render_size
from kiln.codegen.printing import OpTable, Rule, Temporaries

CPP_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
    torch.bfloat16: "uint16_t", torch.float16: "uint16_t",  # in memory; computed in float (HALF_NAMES)
}

# float32 functions come from the vectorizable prelude (k_*); double uses libm.
_MATH = {
    Op.EXP: "exp", Op.EXPM1: "expm1", Op.LOG: "log", Op.LOG1P: "log1p", Op.ERF: "erf", Op.ERFC: "erfc", Op.TANH: "tanh",
    Op.SIN: "sin", Op.COS: "cos",
}
_INFIX = {
    Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">",
    Op.GE: ">=", Op.LOGICAL_AND: "&&", Op.LOGICAL_OR: "||", Op.BITWISE_AND: "&", Op.BITWISE_OR: "|",
    Op.BITWISE_XOR: "^",
}

# small helpers every translation unit carries after the prelude
HELPERS = r"""
using namespace kiln_rt;
// NaN-propagating max/min.  The form matters: GCC 12 vectorizes chains of these (pooling windows) only when
// the comparison select comes first and the NaN select second (no short-circuit ||, no nested select first).
template <class T> static inline T kiln_max(T a, T b) { const T m = a > b ? a : b; return a != a ? a : m; }
template <class T> static inline T kiln_min(T a, T b) { const T m = a < b ? a : b; return a != a ? a : m; }
template <class T> static inline T kiln_remf(T a, T b) {
  T r = std::fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
template <class T> static inline T kiln_remi(T a, T b) {
  T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
template <class T> static inline T kiln_floordivi(T a, T b) {
  T q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
// Half precision in memory, float in registers (as ATen computes): each value is read as float, and each op's
// result rounded to nearest even where ATen rounds it.  Integer arithmetic only, branch-free and inlined, so
// GCC vectorizes these loops like float ones (GCC 12 vectorizes no _Float16 conversion without AVX512-FP16).
#define KILN_HALF static inline __attribute__((always_inline))
KILN_HALF float kiln_bf16_load(uint16_t h) { return __builtin_bit_cast(float, uint32_t(h) << 16); }
KILN_HALF uint16_t kiln_bf16_store(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  const uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet : nearest);  // NaN stays a quiet NaN
}
KILN_HALF float kiln_bf16_round(float f) { return kiln_bf16_load(kiln_bf16_store(f)); }
KILN_HALF float kiln_f16_load(uint16_t h) {
  // (int32 throughout: GCC vectorizes selects between signed 32-bit lanes, not every unsigned pattern)
  const int32_t exp = h & 0x7c00, em = int32_t(h & 0x7fff) << 13, sign = int32_t(h & 0x8000) << 16;
  // normal: exponent rebiased (+112); subnormal: mantissa x 2^-24 (an int conversion: no denormal float
  // arithmetic, which costs a microcode assist per lane); infinities and NaNs: float's top exponent
  const int32_t normal = em + 0x38000000, inf_nan = em | 0x7f800000;
  const int32_t sub = __builtin_bit_cast(int32_t, float(int32_t(h & 0x3ff)) * 0x1p-24f);
  const int32_t mag = exp == 0x7c00 ? inf_nan : (exp == 0 ? sub : normal);
  return __builtin_bit_cast(float, mag | sign);
}
KILN_HALF uint16_t kiln_f16_store(float x) {
  const int32_t u = __builtin_bit_cast(int32_t, x), f = u & 0x7fffffff, sign = (u >> 16) & 0x8000;
  const int32_t big = f > 0x7f800000 ? 0x7e00 : 0x7c00;                    // NaN, or overflow to infinity
  const int32_t sub = __builtin_bit_cast(int32_t, __builtin_bit_cast(float, f) + 0.5f) - 0x3f000000;
  const int32_t normal = (f - 0x37fff001 + ((f >> 13) & 1)) >> 13;          // rebias, round to nearest even
  const int32_t mag = f >= 0x47800000 ? big : (f < 0x38800000 ? sub : normal);
  return uint16_t(mag | sign);
}
KILN_HALF float kiln_f16_round(float x) {  // kiln_f16_load(kiln_f16_store(x)) in half the operations
  const int32_t u = __builtin_bit_cast(int32_t, x), f = u & 0x7fffffff, sign = u ^ f;
  const int32_t normal = (f + 0xfff + ((f >> 13) & 1)) & ~0x1fff;            // 10 mantissa bits, to nearest even
  const int32_t sub = __builtin_bit_cast(int32_t, (__builtin_bit_cast(float, f) + 0.5f) - 0.5f);  // k x 2^-24
  int32_t mag = f < 0x38800000 ? sub : normal;
  mag = normal > 0x477fe000 ? 0x7f800000 : mag;                                // past 65504: infinity
  mag = f > 0x7f800000 ? f : mag;                                              // NaN stays NaN
  return __builtin_bit_cast(float, mag | sign);
}
"""


def ctype(dtype: torch.dtype) -> str:
    return CPP_TYPES[dtype]


HALF_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16"}
# ops whose result is one of their operands, or exact on them: nothing to round
_EXACT = {Op.WHERE, Op.NEG, Op.ABS, Op.MAXIMUM, Op.MINIMUM, Op.RELU, Op.SIGN}


def value_type(dtype: torch.dtype) -> str:
    """The C++ type a value of ``dtype`` is held in while computing (float for half precision)."""
    return ctype(compute_dtype(dtype))


def to_memory(value: str, dtype: torch.dtype) -> str:
    """``value`` (held as ``value_type(dtype)``) as the bits a ``dtype`` buffer holds."""
    return f"kiln_{HALF_NAMES[dtype]}_store({value})" if dtype in HALF else value


def from_memory(value: str, dtype: torch.dtype) -> str:
    return f"kiln_{HALF_NAMES[dtype]}_load({value})" if dtype in HALF else value


def rounded(value: str, dtype: torch.dtype) -> str:
    """A float ``value`` rounded to ``dtype`` (a half type), kept as float."""
    return f"kiln_{HALF_NAMES[dtype]}_round({value})" if dtype in HALF else value


def literal(value: Any, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        suffix = "f" if compute_dtype(dtype) == torch.float32 else ""
        v = float(value)
        if math.isnan(v):
            return f"{value_type(dtype)}(__builtin_nan(\"\"))"
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}{value_type(dtype)}(__builtin_inf())"
        return f"{v!r}{suffix}" if ("e" in repr(v) or "." in repr(v)) else f"{v!r}.0{suffix}"
    v = int(value)
    if dtype == torch.int64:
        return f"INT64_C({v})" if v != -(1 << 63) else "INT64_MIN"
    return f"{ctype(dtype)}({v})"


def _math(name: str) -> Rule:
    # float32: the prelude's vectorizable k_*; double: libm
    return lambda a, d, ad: f"k_{name}({a[0]})" if ad == torch.float32 else f"std::{name}({a[0]})"


def _t(d: torch.dtype) -> str:
    return ctype(d)


CPP_OPS = OpTable("C++", _INFIX, {
    **{op: _math(name) for op, name in _MATH.items()},
    Op.FLOORDIV: lambda a, d, ad: f"std::floor({a[0]} / {a[1]})" if ad.is_floating_point
    else f"kiln_floordivi<{_t(d)}>({a[0]}, {a[1]})",
    Op.REM: lambda a, d, ad: f"kiln_remf<{_t(d)}>({a[0]}, {a[1]})" if ad.is_floating_point
    else f"kiln_remi<{_t(d)}>({a[0]}, {a[1]})",
    Op.FMOD: lambda a, d, ad: f"std::fmod({a[0]}, {a[1]})" if ad.is_floating_point else f"({a[0]} % {a[1]})",
    Op.POW: lambda a, d, ad: f"k_pow({a[0]}, {a[1]})" if ad == torch.float32
    else f"{_t(d)}(std::pow({a[0]}, {a[1]}))",
    Op.MAXIMUM: lambda a, d, ad: f"kiln_max<{_t(d)}>({a[0]}, {a[1]})",
    Op.MINIMUM: lambda a, d, ad: f"kiln_min<{_t(d)}>({a[0]}, {a[1]})",
    Op.LOGICAL_XOR: lambda a, d, ad: f"(bool({a[0]}) != bool({a[1]}))",
    Op.WHERE: lambda a, d, ad: f"({a[0]} ? {a[1]} : {a[2]})",
    Op.ABS: lambda a, d, ad: f"std::fabs({a[0]})" if ad.is_floating_point
    else f"({a[0]} < 0 ? {_t(d)}(-{a[0]}) : {a[0]})",
    Op.SQRT: lambda a, d, ad: f"std::sqrt({a[0]})",
    Op.RSQRT: lambda a, d, ad: f"({_t(d)}(1) / std::sqrt({a[0]}))",
    Op.RECIPROCAL: lambda a, d, ad: f"({_t(d)}(1) / {a[0]})",
    Op.NDTR: lambda a, d, ad: f"k_ndtr({a[0]})",  # (the prelude's, float and double)
    Op.GELU: lambda a, d, ad: f"k_gelu_erf({a[0]})",
    Op.SIGMOID: lambda a, d, ad: f"k_sigmoid({a[0]})" if ad == torch.float32
    else f"({_t(d)}(1) / ({_t(d)}(1) + std::exp(-{a[0]})))",
    # NaN > 0 is false: written so that NaN passes through (and GCC if-converts it)
    Op.RELU: lambda a, d, ad: f"(!({a[0]} <= 0) ? {a[0]} : {_t(d)}(0))" if ad.is_floating_point
    else f"({a[0]} > 0 ? {a[0]} : {_t(d)}(0))",
    **{op: (lambda a, d, ad, name=op.value: f"std::{name}({a[0]})") for op in (Op.FLOOR, Op.CEIL, Op.TRUNC)},
    Op.ROUND: lambda a, d, ad: f"std::nearbyint({a[0]})",
    Op.SIGN: lambda a, d, ad: f"({a[0]} > 0 ? {_t(d)}(1) : ({a[0]} < 0 ? {_t(d)}(-1) : {a[0]}))"
    if ad.is_floating_point else f"{_t(d)}(({a[0]} > 0) - ({a[0]} < 0))",
    Op.LOGICAL_NOT: lambda a, d, ad: f"(!{a[0]})",
    Op.BITWISE_NOT: lambda a, d, ad: f"{_t(d)}(~{a[0]})",
}, cast=lambda a, d, ad: f"static_cast<{_t(d)}>({a[0]})")


def op_text(op: Op, args: list[str], dtype: torch.dtype, arg_dtype: torch.dtype) -> str:
    """C++ for one operator applied to already-printed operands (half-precision ones already read as float: the
    operator computes in float, and the result is rounded where it is bound or stored)."""
    if dtype in HALF and op not in _EXACT:  # (a cast to a half type is its rounding)
        return rounded(op_text(op, args, torch.float32, compute_dtype(arg_dtype)), dtype)
    return CPP_OPS.text(op, args, compute_dtype(dtype), compute_dtype(arg_dtype))


# [Note: gather index from a comparison]
# GCC 12 (12.2, Debian) vectorizing for AVX-512 (-march=native on an AVX-512 machine, any AVX-512 target; right
# for AVX2) computes an indexed load whose index is a comparison's result - ``buf[(int64_t)(a >= b)]``, a
# gather over a fused ``ge`` and ``cast`` (fuzz seed 44460: gather(v, v) of v = (layer_norm(x) >= x)) - from the
# bits of the comparison's mask register read as bytes: wrong indices, different from call to call
# (tests/fuzz/found/gather_index_from_comparison.cpp, standalone).  Neither writing the cast as a select nor
# through int32 nor asking for hardware gathers avoids it.  Such an index goes through ``k_opaque_index`` (an
# empty asm: GCC does not vectorize that loop); indices loaded from memory or computed from non-boolean values
# (embeddings, index_select, arange arithmetic) vectorize as before.
def size_text(x: Size) -> str:
    """A loop extent, work count or constant as C++: an int, or a size expression over the size symbols a
    symbolic kernel declares from the call's size table (``kiln_sizes``)."""
    return str(x) if type(x) is int else render_size(x, "cpp")


def vector_lanes(dtype: torch.dtype) -> int:
    """Vector lanes of a 512-bit register for ``dtype`` (the schedule's vector width)."""
    return max(1, 64 // max(torch.empty((), dtype=dtype).element_size(), 1))


def identity_literal(kind: Op, dtype: torch.dtype) -> str:
    """The C++ literal a ``kind`` reduction's accumulator starts from."""
    return literal(reduction_identity(kind, dtype), dtype)


# a reduction combines partial results with the elementwise op of the same meaning
_COMBINE_OP = {Op.SUM: Op.ADD, Op.PROD: Op.MUL, Op.AMAX: Op.MAXIMUM, Op.AMIN: Op.MINIMUM}


def combine_text(kind: Op, acc: str, v: str, dtype: torch.dtype) -> str:
    """``acc`` combined with ``v`` by a ``kind`` reduction (half precision accumulates in float, unrounded, as
    ATen does)."""
    dtype = compute_dtype(dtype)
    return op_text(_COMBINE_OP[kind], [acc, v], dtype, dtype)


def _from_comparison(e: KExpr) -> bool:
    """Is ``e`` (an integer index) computed from a boolean turned into a number (a cast of a comparison, a
    logical op or a loaded bool)?  A ``where``'s condition chooses between values and does not count: the
    negative-index wrap ``i < 0 ? i + n : i`` of every gather keeps it vectorized."""
    if not isinstance(e, KOp):
        return False
    values = e.args[1:] if e.op is Op.WHERE else e.args
    if e.dtype is not torch.bool and any(a.dtype is torch.bool for a in values):
        return True
    return any(_from_comparison(a) for a in values)


class ExprPrinter(Temporaries):
    """Prints expressions of one loop body, emitting shared subexpressions as temporaries (named by
    ``printing.Temporaries``, keyed by the expression)."""

    def __init__(self, lines: list[str], indent: str, names: dict[KExpr, str] | None = None,
                 counter: list[int] | None = None):
        super().__init__(names, counter)
        self.lines = lines
        self.indent = indent

    def child(self, lines: list[str], indent: str) -> "ExprPrinter":
        """A printer for a nested loop body: sees the outer temporaries, adds its own."""
        return ExprPrinter(lines, indent, self.names, self.counter)

    def index(self, e: Lin, inline: bool = False) -> str:
        return render(e, lambda d: self._dyn(d, inline))

    def _dyn(self, d: Dyn, inline: bool) -> str:
        text = self.expr(d.expr, inline)
        return f"k_opaque_index({text})" if _from_comparison(d.expr) else text

    def expr(self, e: KExpr, inline: bool = False) -> str:
        if e in self.names:
            return self.names[e]
        if isinstance(e, KConst):
            if is_symbolic(e.value):  # (a size used as a value: the call's size, read from the size table)
                return f"static_cast<{value_type(e.dtype)}>({size_text(e.value)})"
            return literal(e.value, e.dtype)
        if isinstance(e, KVar):
            return e.name
        if isinstance(e, KIndex):
            text = f"int64_t({self.index(e.index, inline)})"
            return text if inline or e.index.is_const() else self._bind(e, text)
        if isinstance(e, KLoad):
            text = from_memory(f"{e.buf}[{self.index(e.index, inline)}]", e.dtype)
        else:
            assert isinstance(e, KOp)
            if e.op is Op.WHERE:
                cond = self.expr(e.args[0], inline)
                text = f"({cond} ? {self.expr(e.args[1], True)} : {self.expr(e.args[2], True)})"
            else:
                args = [self.expr(a, inline) for a in e.args]
                arg_dtype = e.args[0].dtype if e.args else e.dtype
                text = op_text(e.op, args, e.dtype, arg_dtype)
        return text if inline else self._bind(e, text)

    def _bind(self, e: KExpr, text: str) -> str:
        name = self.fresh()
        self.lines.append(f"{self.indent}const {value_type(e.dtype)} {name} = {text};")
        self.names[e] = name
        return name
