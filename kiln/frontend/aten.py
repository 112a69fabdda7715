"""The lowering table: ATen ops (after kiln's decompositions) -> graph IR.

``LOWERINGS`` maps an ``OpOverloadPacket`` (or an op's qualified name, ``"prims::fma"``, for ops registered late) to a
function ``(L, fx_node, *args, **kwargs) -> Node | tuple``.
Each lowering reproduces the ATen result's dtype and shape (taken from ``fx_node.meta["val"]``).  A lowering
that raises ``Unsupported`` - or an op with no entry - becomes an EXTERN node that calls the ATen op at run
time, so no model is refused; the report lists those ops.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import torch

from kiln.frontend.lowering_base import Lowerer, Unsupported, meta_shape, meta_val, norm_dim, result_dtype
from kiln.ir.sym import Size
from kiln.ir.graph import Node
from kiln.ir.ops import Op, broadcast_shapes, numel

aten = torch.ops.aten
LOWERINGS: dict[Any, Callable[..., Any]] = {}


def register(*packets: Any) -> Callable:
    """Register ``fn`` as the lowering of ``packets``.  Results with zero elements become FULL nodes: they have
    no values to compute, and kernels never loop over empty index spaces."""
    def deco(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        def lower(L: Lowerer, n: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                signature.bind(L, n, *args, **kwargs)
            except TypeError as exc:  # an overload this lowering does not know: leave it to ATen
                raise Unsupported(f"{n.target}: {exc}") from exc
            val = meta_val(n)
            vals = list(val) if isinstance(val, (list, tuple)) else [val]
            if vals and all(_empty(v) for v in vals):
                empties = [L.full(0, meta_shape(v), v.dtype) for v in vals]
                return empties[0] if isinstance(val, torch.Tensor) else tuple(empties)
            out = fn(L, n, *args, **kwargs)
            if isinstance(val, (list, tuple)) and isinstance(out, (list, tuple)) and len(out) == len(val):
                out = tuple(L.full(0, meta_shape(v), v.dtype) if _empty(v) and isinstance(o, Node) else o
                            for o, v in zip(out, val))
            return out
        lower.__name__ = fn.__name__
        lower.__wrapped__ = fn  # type: ignore[attr-defined]
        for p in packets:
            LOWERINGS[p] = lower
        return fn
    return deco


def out_dtype(fx_node: Any) -> torch.dtype:
    return meta_val(fx_node).dtype


def _empty(v: Any) -> bool:
    """Is traced value ``v`` a tensor with no elements?  Asked of kiln's sizes: ``numel() == 0`` on a symbolic
    fake tensor would make Dynamo guard on it (a symbolic size is never 0: Dynamo specializes 0)."""
    return isinstance(v, torch.Tensor) and numel(meta_shape(v)) == 0


def out_shape(fx_node: Any) -> tuple[Size, ...]:
    return meta_shape(meta_val(fx_node))


# ------------------------------------------------------------------------------------------- elementwise

_UNARY = {
    aten.neg: Op.NEG, aten.abs: Op.ABS, aten.exp: Op.EXP, aten.expm1: Op.EXPM1, aten.log: Op.LOG,
    aten.log1p: Op.LOG1P, aten.sqrt: Op.SQRT, aten.rsqrt: Op.RSQRT, aten.reciprocal: Op.RECIPROCAL,
    aten.erf: Op.ERF, aten.erfc: Op.ERFC, aten.special_ndtr: Op.NDTR, aten.tanh: Op.TANH,
    aten.sigmoid: Op.SIGMOID, aten.relu: Op.RELU,
    aten.sin: Op.SIN, aten.cos: Op.COS, aten.floor: Op.FLOOR, aten.ceil: Op.CEIL, aten.trunc: Op.TRUNC,
    aten.bitwise_not: Op.BITWISE_NOT,
}


def _unary(op: Op) -> Callable:
    def lower(L: Lowerer, n: Any, x: Node) -> Node:
        dtype = out_dtype(n)
        if op in (Op.FLOOR, Op.CEIL, Op.TRUNC) and not dtype.is_floating_point:
            return x
        if op is Op.BITWISE_NOT and dtype == torch.bool:
            return L.elementwise(Op.LOGICAL_NOT, (x,), torch.bool)
        if op is Op.ABS and dtype == torch.bool:
            return x
        return L.elementwise(op, (x,), dtype)
    return lower


for _packet, _op in _UNARY.items():
    register(_packet)(_unary(_op))


@register(aten.round)
def _round(L: Lowerer, n: Any, x: Node, decimals: int = 0) -> Node:
    dtype = out_dtype(n)
    if not dtype.is_floating_point:
        if decimals:
            raise Unsupported("round of integers with decimals")
        return x
    if not decimals:
        return L.elementwise(Op.ROUND, (x,), dtype)
    # ATen: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d for d < 0, in the tensor's dtype
    ten_pow = float(10.0 ** abs(decimals))
    if decimals > 0:
        return L.binary(Op.DIV, L.b.add(Op.ROUND, (L.binary(Op.MUL, x, ten_pow, dtype),)), ten_pow, dtype)
    return L.binary(Op.MUL, L.b.add(Op.ROUND, (L.binary(Op.DIV, x, ten_pow, dtype),)), ten_pow, dtype)


@register(aten.sign)
def _sign(L: Lowerer, n: Any, x: Node) -> Node:
    """ATen's ``(0 < x) - (x < 0)``: NaN gives 0 (the SIGN op's NaN behaviour differs between back ends)."""
    dtype = out_dtype(n)
    if dtype == torch.bool:
        return x
    pos = L.cast(L.binary(Op.GT, x, 0, x.dtype), dtype)
    neg = L.cast(L.binary(Op.LT, x, 0, x.dtype), dtype)
    return L.b.add(Op.SUB, (pos, neg))


@register(aten.isinf)
def _isinf(L: Lowerer, n: Any, x: Node) -> Node:
    if not x.dtype.is_floating_point:
        return L.full(False, x.shape, torch.bool)
    return L.binary(Op.EQ, L.b.add(Op.ABS, (x,)), math.inf, x.dtype)


def _float_unary(L: Lowerer, n: Any, x: Node) -> tuple[Node, torch.dtype]:
    dtype = out_dtype(n)
    if not dtype.is_floating_point:
        raise Unsupported(f"{n.target} with a {dtype} result")
    return L.cast(x, dtype), dtype


@register(aten.log2, aten.log10)
def _log_base(L: Lowerer, n: Any, x: Node) -> Node:
    x, dtype = _float_unary(L, n, x)
    base = 2.0 if n.target.overloadpacket is aten.log2 else 10.0
    return L.binary(Op.MUL, L.b.add(Op.LOG, (x,)), 1.0 / math.log(base), dtype)


@register(aten.exp2)
def _exp2(L: Lowerer, n: Any, x: Node) -> Node:
    x, dtype = _float_unary(L, n, x)
    return L.binary(Op.POW, 2.0, x, dtype)


@register(aten.tan)
def _tan(L: Lowerer, n: Any, x: Node) -> Node:
    x, dtype = _float_unary(L, n, x)
    return L.b.add(Op.DIV, (L.b.add(Op.SIN, (x,)), L.b.add(Op.COS, (x,))))


def _odd(L: Lowerer, x: Node, magnitude: Node, dtype: torch.dtype) -> Node:
    """``magnitude`` (a function of |x|) with the sign of x; NaN stays NaN."""
    return L.b.add(Op.WHERE, (L.binary(Op.LT, x, 0, dtype), L.b.add(Op.NEG, (magnitude,)), magnitude))


@register(aten.sinh, aten.cosh)
def _sinh_cosh(L: Lowerer, n: Any, x: Node) -> Node:
    """sinh |x| = (expm1(|x|) - expm1(-|x|)) / 2 (no cancellation near 0), cosh = (e^|x| + e^-|x|) / 2;
    for |x| >= 20 both are (e/2) * e with e = exp(|x|/2), which stays finite up to the true overflow."""
    x, dtype = _float_unary(L, n, x)
    ax = L.b.add(Op.ABS, (x,))
    nax = L.b.add(Op.NEG, (ax,))
    e = L.b.add(Op.EXP, (L.binary(Op.MUL, ax, 0.5, dtype),))
    big = L.b.add(Op.MUL, (L.binary(Op.MUL, e, 0.5, dtype), e))
    if n.target.overloadpacket is aten.sinh:
        small = L.binary(Op.MUL, L.b.add(Op.SUB, (L.b.add(Op.EXPM1, (ax,)), L.b.add(Op.EXPM1, (nax,)))), 0.5, dtype)
    else:
        small = L.binary(Op.MUL, L.b.add(Op.ADD, (L.b.add(Op.EXP, (ax,)), L.b.add(Op.EXP, (nax,)))), 0.5, dtype)
    mag = L.b.add(Op.WHERE, (L.binary(Op.LT, ax, 20.0, dtype), small, big))
    return _odd(L, x, mag, dtype) if n.target.overloadpacket is aten.sinh else mag


def _log2x_from(dtype: torch.dtype) -> float:
    """Where asinh / acosh switch to log(2x): the dropped 1 / (4 x^2) is below the dtype's rounding, and x^2
    does not overflow yet."""
    return 1e4 if dtype == torch.float32 else 1e8


@register(aten.asinh)
def _asinh(L: Lowerer, n: Any, x: Node) -> Node:
    """asinh |x| = log1p(|x| + x^2 / (1 + sqrt(x^2 + 1))), and log(|x|) + log 2 for large |x|."""
    x, dtype = _float_unary(L, n, x)
    ax = L.b.add(Op.ABS, (x,))
    sq = L.b.add(Op.MUL, (ax, ax))
    root = L.binary(Op.ADD, L.b.add(Op.SQRT, (L.binary(Op.ADD, sq, 1.0, dtype),)), 1.0, dtype)
    small = L.b.add(Op.LOG1P, (L.b.add(Op.ADD, (ax, L.b.add(Op.DIV, (sq, root)))),))
    big = L.binary(Op.ADD, L.b.add(Op.LOG, (ax,)), math.log(2.0), dtype)
    mag = L.b.add(Op.WHERE, (L.binary(Op.GT, ax, _log2x_from(dtype), dtype), big, small))
    return _odd(L, x, mag, dtype)


@register(aten.acosh)
def _acosh(L: Lowerer, n: Any, x: Node) -> Node:
    """acosh x = log1p((x - 1) + sqrt((x - 1)(x + 1))), and log(x) + log 2 for large x; x < 1 gives NaN."""
    x, dtype = _float_unary(L, n, x)
    xm1 = L.binary(Op.SUB, x, 1.0, dtype)
    root = L.b.add(Op.SQRT, (L.b.add(Op.MUL, (xm1, L.binary(Op.ADD, x, 1.0, dtype))),))
    small = L.b.add(Op.LOG1P, (L.b.add(Op.ADD, (xm1, root)),))
    big = L.binary(Op.ADD, L.b.add(Op.LOG, (x,)), math.log(2.0), dtype)
    return L.b.add(Op.WHERE, (L.binary(Op.GT, x, _log2x_from(dtype), dtype), big, small))


@register(aten.atanh)
def _atanh(L: Lowerer, n: Any, x: Node) -> Node:
    """atanh x = (log1p(x) - log1p(-x)) / 2: exact near 0, +-inf at +-1, NaN beyond."""
    x, dtype = _float_unary(L, n, x)
    diff = L.b.add(Op.SUB, (L.b.add(Op.LOG1P, (x,)), L.b.add(Op.LOG1P, (L.b.add(Op.NEG, (x,)),))))
    return L.binary(Op.MUL, diff, 0.5, dtype)


@register(aten.isnan)
def _isnan(L: Lowerer, n: Any, x: Node) -> Node:
    if not x.dtype.is_floating_point:
        return L.full(False, x.shape, torch.bool)
    return L.b.add(Op.ISNAN, (x,))


@register(aten.logical_not)
def _logical_not(L: Lowerer, n: Any, x: Node) -> Node:
    return L.cast(L.b.add(Op.LOGICAL_NOT, (L.cast(x, torch.bool),)), out_dtype(n))


_BINARY = {
    aten.mul: Op.MUL, aten.maximum: Op.MAXIMUM, aten.minimum: Op.MINIMUM, aten.remainder: Op.REM,
    aten.fmod: Op.FMOD, aten.bitwise_and: Op.BITWISE_AND, aten.bitwise_or: Op.BITWISE_OR,
    aten.bitwise_xor: Op.BITWISE_XOR,
}
_COMPARE = {aten.eq: Op.EQ, aten.ne: Op.NE, aten.lt: Op.LT, aten.le: Op.LE, aten.gt: Op.GT, aten.ge: Op.GE}
_LOGICAL = {aten.logical_and: Op.LOGICAL_AND, aten.logical_or: Op.LOGICAL_OR, aten.logical_xor: Op.LOGICAL_XOR}


def _binary(op: Op) -> Callable:
    def lower(L: Lowerer, n: Any, a: Any, b: Any) -> Node:
        dtype = out_dtype(n)
        if dtype == torch.bool and op in (Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR):
            op2 = {Op.BITWISE_AND: Op.LOGICAL_AND, Op.BITWISE_OR: Op.LOGICAL_OR, Op.BITWISE_XOR: Op.LOGICAL_XOR}[op]
            return L.binary(op2, a, b, torch.bool)
        if dtype == torch.bool and op is Op.MUL:
            return L.binary(Op.LOGICAL_AND, a, b, torch.bool)
        if dtype == torch.bool and op in (Op.REM, Op.FMOD):
            raise Unsupported("remainder of bools")
        return L.binary(op, a, b, dtype)
    return lower


def _compare(op: Op) -> Callable:
    def lower(L: Lowerer, n: Any, a: Any, b: Any) -> Node:
        return L.elementwise(op, (a, b), result_dtype(a, b))
    return lower


def _logical(op: Op) -> Callable:
    def lower(L: Lowerer, n: Any, a: Any, b: Any) -> Node:
        return L.cast(L.elementwise(op, (a, b), torch.bool), out_dtype(n))
    return lower


for _packet, _op in _BINARY.items():
    register(_packet)(_binary(_op))
for _packet, _op in _COMPARE.items():
    register(_packet)(_compare(_op))
for _packet, _op in _LOGICAL.items():
    register(_packet)(_logical(_op))


def _scaled(L: Lowerer, b: Any, alpha: Any, dtype: torch.dtype) -> Any:
    if alpha is None or alpha == 1:
        return b
    if isinstance(b, Node):
        return L.binary(Op.MUL, b, alpha, dtype)
    return b * alpha


@register(aten.add)
def _add(L: Lowerer, n: Any, a: Any, b: Any, alpha: Any = None) -> Node:
    dtype = out_dtype(n)
    if dtype == torch.bool:
        return L.binary(Op.LOGICAL_OR, a, b, torch.bool)
    return L.binary(Op.ADD, a, _scaled(L, b, alpha, dtype), dtype)


@register(aten.sub, aten.rsub)
def _sub(L: Lowerer, n: Any, a: Any, b: Any, alpha: Any = None) -> Node:
    dtype = out_dtype(n)
    if n.target.overloadpacket is aten.rsub:
        a, b = b, a
        return L.binary(Op.SUB, a, _scaled(L, b, alpha, dtype), dtype)
    return L.binary(Op.SUB, a, _scaled(L, b, alpha, dtype), dtype)


def _float_floordiv(L: Lowerer, a: Any, b: Any, dtype: torch.dtype) -> Node:
    """ATen's ``div_floor_floating``: floor((a - fmod(a, b)) / b) with its corrections, so that e.g.
    1 // 0.1 is 9 (floor(a / b) would give 10 when a / b rounds up to an integer); b == 0 gives a / b."""
    shapes = [x.shape for x in (a, b) if isinstance(x, Node)]
    shape = broadcast_shapes(*shapes)
    a, b = L.operand(a, dtype, shape), L.operand(b, dtype, shape)
    zero = L.full(0.0, shape, dtype)
    mod = L.b.add(Op.FMOD, (a, b))
    div = L.b.add(Op.DIV, (L.b.add(Op.SUB, (a, mod)), b))
    fix = L.b.add(Op.LOGICAL_AND, (L.b.add(Op.NE, (mod, zero)),
                                   L.b.add(Op.NE, (L.b.add(Op.LT, (b, zero)), L.b.add(Op.LT, (mod, zero))))))
    div = L.b.add(Op.WHERE, (fix, L.binary(Op.SUB, div, 1.0, dtype), div))
    fl = L.b.add(Op.FLOOR, (div,))
    up = L.binary(Op.GT, L.b.add(Op.SUB, (div, fl)), 0.5, dtype)
    fl = L.b.add(Op.WHERE, (up, L.binary(Op.ADD, fl, 1.0, dtype), fl))
    fl = L.b.add(Op.WHERE, (L.b.add(Op.EQ, (div, zero)), zero, fl))  # ATen: copysign(0, a / b)
    return L.b.add(Op.WHERE, (L.b.add(Op.EQ, (b, zero)), L.b.add(Op.DIV, (a, b)), fl))


@register(aten.div)
def _div(L: Lowerer, n: Any, a: Any, b: Any, rounding_mode: str | None = None) -> Node:
    dtype = out_dtype(n)
    if rounding_mode is None:
        return L.binary(Op.DIV, a, b, dtype)
    if dtype == torch.bool:
        raise Unsupported("division of bools")
    if rounding_mode == "floor":
        if dtype.is_floating_point:
            return _float_floordiv(L, a, b, dtype)
        return L.binary(Op.FLOORDIV, a, b, dtype)
    if dtype.is_floating_point:
        return L.b.add(Op.TRUNC, (L.binary(Op.DIV, a, b, dtype),))
    return L.binary(Op.DIV, a, b, dtype)  # integer DIV truncates, like C


@register(aten.floor_divide)
def _floor_divide(L: Lowerer, n: Any, a: Any, b: Any) -> Node:
    dtype = out_dtype(n)
    if dtype == torch.bool:
        raise Unsupported("floor_divide of bools")
    if dtype.is_floating_point:
        return _float_floordiv(L, a, b, dtype)
    return L.binary(Op.FLOORDIV, a, b, dtype)


@register("prims::fma")  # (by name: the op exists once torch._inductor's prims are imported, which Dynamo does)
def _fma(L: Lowerer, n: Any, a: Any, b: Any, c: Any) -> Node:
    """``prims.fma(a, b, c)`` - from ``lerp``'s decomposition (an optimizer's moving averages, ``exp_avg.lerp_``):
    ``a * b + c`` as two kernel ops (within one rounding of the fused form; the per-op fp32 tolerance); before,
    each ran as a Python extern per parameter."""
    dtype = out_dtype(n)
    if not dtype.is_floating_point:
        raise Unsupported("fma of integers")
    return L.binary(Op.ADD, L.binary(Op.MUL, a, b, dtype), c, dtype)


@register(aten.fmax, aten.fmin)
def _fmax(L: Lowerer, n: Any, a: Any, b: Any) -> Node:
    """NaN-ignoring maximum/minimum: the other operand where one is NaN."""
    dtype = out_dtype(n)
    op = Op.MAXIMUM if n.target.overloadpacket is aten.fmax else Op.MINIMUM
    if dtype == torch.bool:
        raise Unsupported("fmax of bools")
    m = L.binary(op, a, b, dtype)
    if not dtype.is_floating_point:
        return m
    a, b = L.operand(a, dtype, m.shape), L.operand(b, dtype, m.shape)
    m = L.b.add(Op.WHERE, (L.b.add(Op.ISNAN, (b,)), a, m))
    return L.b.add(Op.WHERE, (L.b.add(Op.ISNAN, (a,)), b, m))


@register(aten.pow)
def _pow(L: Lowerer, n: Any, a: Any, b: Any) -> Node:
    dtype = out_dtype(n)
    if dtype == torch.bool:
        raise Unsupported("pow of bools")
    if not dtype.is_floating_point and isinstance(b, Node):
        raise Unsupported("integer pow with tensor exponent")
    if not isinstance(b, Node) and b == 2:
        x = L.cast(a, dtype)
        return L.b.add(Op.MUL, (x, x))
    if not isinstance(b, Node) and b == 0.5 and dtype.is_floating_point:
        return L.elementwise(Op.SQRT, (a,), dtype)
    if not isinstance(b, Node) and b == 1:
        return L.cast(a, dtype)
    return L.binary(Op.POW, a, b, dtype)


@register(aten.clamp, aten.clamp_min, aten.clamp_max)
def _clamp(L: Lowerer, n: Any, x: Node, lo: Any = None, hi: Any = None) -> Node:
    dtype = out_dtype(n)
    packet = n.target.overloadpacket
    if packet is aten.clamp_max:
        lo, hi = None, lo
    out = L.cast(x, dtype)
    if lo is not None:
        out = L.binary(Op.MAXIMUM, out, lo, dtype)
    if hi is not None:
        out = L.binary(Op.MINIMUM, out, hi, dtype)
    return out


@register(aten.where)
def _where(L: Lowerer, n: Any, cond: Node, a: Any = None, b: Any = None) -> Node:
    if a is None or b is None or not isinstance(meta_val(n), torch.Tensor):
        raise Unsupported("where(condition) (nonzero): data-dependent shape")
    dtype = out_dtype(n)
    shapes = [x.shape for x in (cond, a, b) if isinstance(x, Node)]
    shape = broadcast_shapes(*shapes)
    c = L.operand(cond, torch.bool, shape)
    return L.b.add(Op.WHERE, (c, L.operand(a, dtype, shape), L.operand(b, dtype, shape)))


@register(aten.masked_fill)
def _masked_fill(L: Lowerer, n: Any, x: Node, mask: Node, value: Any) -> Node:
    if isinstance(value, Node) and value.shape:
        raise Unsupported("masked_fill with a non-scalar tensor value")
    return _where(L, n, mask, value, x)


@register(aten.sigmoid_backward, aten.threshold_backward)
def _no_backward(L: Lowerer, n: Any, *args: Any) -> Node:
    raise Unsupported("backward ops run eagerly")


@register(aten.gelu)
def _gelu(L: Lowerer, n: Any, x: Node, approximate: str = "none") -> Node:
    dtype = out_dtype(n)
    x = L.cast(x, dtype)
    if approximate == "tanh":
        inner = L.binary(Op.MUL, L.binary(Op.ADD, x, L.binary(Op.MUL, L.binary(Op.MUL, x, x, dtype),
                                                                    L.binary(Op.MUL, x, 0.044715, dtype), dtype),
                                          dtype), math.sqrt(2.0 / math.pi), dtype)
        cdf = L.binary(Op.ADD, L.b.add(Op.TANH, (inner,)), 1.0, dtype)
    elif L.triton:
        # ATen's CUDA form, 1 + erf(x/sqrt(2)): libdevice's erf costs less than its erfc (exact GELU over a
        # [4096, 3072] bf16 tensor on the H200: 21.1 against 28.2 us, benchmarks/gpu_gelu_forms.py), and the
        # results are eager's, which round x * Phi(x) to 0 for x << 0 the same way
        cdf = L.binary(Op.ADD, L.b.add(Op.ERF, (L.binary(Op.MUL, x, math.sqrt(0.5), dtype),)), 1.0, dtype)
    else:
        # one op: the C++ prelude's k_gelu_erf (a rational Phi without an exponential, 0.30 against 0.61 ns per
        # element for x * ndtr(x)), which kiln's GEMM also applies as its epilogue (library/gemm/epilogue.py)
        return L.b.add(Op.GELU, (x,))
    return L.binary(Op.MUL, L.binary(Op.MUL, x, 0.5, dtype), cdf, dtype)


@register(aten.silu)
def _silu(L: Lowerer, n: Any, x: Node) -> Node:
    x = L.cast(x, out_dtype(n))
    return L.b.add(Op.MUL, (x, L.b.add(Op.SIGMOID, (x,))))


@register(aten.hardtanh)
def _hardtanh(L: Lowerer, n: Any, x: Node, lo: float = -1.0, hi: float = 1.0) -> Node:
    dtype = out_dtype(n)
    return L.binary(Op.MINIMUM, L.binary(Op.MAXIMUM, x, lo, dtype), hi, dtype)


@register(aten.elu)
def _elu(L: Lowerer, n: Any, x: Node, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Node:
    """ATen: x > 0 ? x * scale : expm1(x * input_scale) * alpha * scale (NaN goes the positive way)."""
    x, dtype = _float_unary(L, n, x)
    neg = L.binary(Op.MUL, L.b.add(Op.EXPM1, (L.binary(Op.MUL, x, input_scale, dtype),)), alpha * scale, dtype)
    return L.b.add(Op.WHERE, (L.binary(Op.LE, x, 0.0, dtype), neg, L.binary(Op.MUL, x, scale, dtype)))


@register(aten.leaky_relu)
def _leaky_relu(L: Lowerer, n: Any, x: Node, slope: float = 0.01) -> Node:
    dtype = out_dtype(n)
    pos = L.binary(Op.GT, x, 0, x.dtype)
    return L.b.add(Op.WHERE, (pos, L.cast(x, dtype), L.binary(Op.MUL, x, slope, dtype)))


@register(aten._to_copy)
def _to_copy(L: Lowerer, n: Any, x: Node, **kwargs: Any) -> Node:
    # ``.to(device=x.device, dtype=...)`` names the device it already is on: only a move between devices is a
    # transfer (on a GPU every such cast of a transformers model had run as an ATen call)
    value = meta_val(n.args[0]) if hasattr(n.args[0], "meta") else None
    source = value.device if isinstance(value, torch.Tensor) else meta_val(n).device
    if meta_val(n).device != source:
        raise Unsupported(f"device transfer {source} -> {meta_val(n).device}")
    return L.cast(x, out_dtype(n))


@register("prims::convert_element_type")
def _convert_element_type(L: Lowerer, n: Any, x: Node, dtype: torch.dtype) -> Node:
    """``prims.convert_element_type(x, dtype)``: a cast.  The training partition writes it where a recomputed
    norm's float32 result goes back to the activation's type (frontend/partition.py ``_emit_normalized``); without
    this lowering each ran as an ATen call between two kernels (ResNet-18's backward on the GPU: four a step)."""
    return L.cast(x, out_dtype(n))


@register(aten.copy)
def _copy(L: Lowerer, n: Any, x: Node, src: Any, non_blocking: bool = False) -> Node:
    """Functional copy_: ``src`` broadcast to ``x``'s shape in ``x``'s dtype."""
    return L.operand(src, out_dtype(n), out_shape(n))


@register(aten.clone, aten.alias, aten.detach, aten.lift_fresh_copy, aten.contiguous)
def _identity(L: Lowerer, n: Any, x: Node, *args: Any, **kwargs: Any) -> Node:
    return x


# ------------------------------------------------------------------------------------------- reductions

def _dims(x: Node, dim: Any) -> tuple[int, ...]:
    if dim is None or dim == [] or dim == ():
        return tuple(range(len(x.shape)))
    if not x.shape:  # a 0-d tensor accepts dim 0 / -1 and has nothing to reduce over
        for d in ([dim] if isinstance(dim, int) else dim):
            norm_dim(d, 0)
        return ()
    if isinstance(dim, int):
        dim = [dim]
    return tuple(norm_dim(d, len(x.shape)) for d in dim)


@register(aten.sum)
def _sum(L: Lowerer, n: Any, x: Node, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    odt = out_dtype(n)
    return L.reduce(Op.SUM, L.cast(x, odt), _dims(x, dim), keepdim)


@register(aten.mean)
def _mean(L: Lowerer, n: Any, x: Node, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    odt = out_dtype(n)
    axes = _dims(x, dim)
    count = numel(tuple(x.shape[a] for a in axes))
    total = L.reduce(Op.SUM, L.cast(x, odt), axes, keepdim)
    return L.binary(Op.DIV, total, count, odt)


@register(aten.prod)
def _prod(L: Lowerer, n: Any, x: Node, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    return L.reduce(Op.PROD, L.cast(x, out_dtype(n)), _dims(x, dim), keepdim)


@register(aten.amax, aten.amin)
def _amax(L: Lowerer, n: Any, x: Node, dim: Any = (), keepdim: bool = False) -> Node:
    op = Op.AMAX if n.target.overloadpacket is aten.amax else Op.AMIN
    if x.dtype == torch.bool:
        raise Unsupported("amax of bools")
    return L.reduce(op, x, _dims(x, dim), keepdim)


@register(aten.any, aten.all)
def _any(L: Lowerer, n: Any, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
    op = Op.AMAX if n.target.overloadpacket is aten.any else Op.AMIN
    b = L.cast(x, torch.bool) if x.dtype == torch.bool else L.binary(Op.NE, x, 0, x.dtype)
    return L.cast(L.reduce(op, L.cast(b, torch.uint8), _dims(x, dim), keepdim), out_dtype(n))


@register(aten.argmax, aten.argmin)
def _argmax(L: Lowerer, n: Any, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
    op = Op.ARGMAX if n.target.overloadpacket is aten.argmax else Op.ARGMIN
    if x.dtype == torch.bool:
        raise Unsupported("argmax of bools")
    if dim is None:
        flat = L.reshape(x, (x.numel,))
        out = L.reduce(op, flat, (0,), False)
        return L.reshape(out, out_shape(n))
    return L.reduce(op, x, (norm_dim(dim, len(x.shape)),), keepdim)


@register(aten.max, aten.min)
def _max(L: Lowerer, n: Any, x: Node, dim: Any = None, keepdim: bool = False) -> Any:
    is_max = n.target.overloadpacket is aten.max
    if isinstance(dim, Node):
        return L.binary(Op.MAXIMUM if is_max else Op.MINIMUM, x, dim, out_dtype(n))
    if x.dtype == torch.bool:
        raise Unsupported("max of bools")
    if dim is None:
        return L.reduce(Op.AMAX if is_max else Op.AMIN, x, _dims(x, None), False)
    d = norm_dim(dim, len(x.shape))
    values = L.reduce(Op.AMAX if is_max else Op.AMIN, x, (d,), keepdim)
    index = L.reduce(Op.ARGMAX if is_max else Op.ARGMIN, x, (d,), keepdim)
    return values, index


def _variance(L: Lowerer, x: Node, axes: tuple[int, ...], correction: float, keepdim: bool,
              dtype: torch.dtype, shifted: bool = False) -> tuple[Node, Node]:
    """(var, mean) with the two-pass formula: sum((x - mean)^2) / (N - correction).

    ``shifted`` ([Note: the variance of equal values]): the mean taken of the data shifted by each row's first
    element, ``mean = x0 + sum(x - x0) / N``, the deviations ``(x - x0) - sum(x - x0) / N``."""
    count = numel(tuple(x.shape[a] for a in axes))
    x = L.cast(x, dtype)
    if shifted and all(isinstance(x.shape[a], int) and x.shape[a] > 0 or not isinstance(x.shape[a], int)
                       for a in axes):
        first = _first_of_rows(L, x, axes)
        deviation = L.binary(Op.SUB, x, first, dtype)
        offset = L.binary(Op.DIV, L.reduce(Op.SUM, deviation, axes, True), count, dtype)
        mean = L.binary(Op.ADD, first, offset, dtype)
        centered = L.binary(Op.SUB, deviation, offset, dtype)
    else:
        mean = L.binary(Op.DIV, L.reduce(Op.SUM, x, axes, True), count, dtype)
        centered = L.binary(Op.SUB, x, mean, dtype)
    sq = L.b.add(Op.MUL, (centered, centered))
    var = L.binary(Op.DIV, L.reduce(Op.SUM, sq, axes, keepdim), max(count - correction, 0), dtype)
    if not keepdim:
        mean = L.reshape(mean, var.shape)
    return var, mean


# [Note: the variance of equal values]
# ATen's var and std (Welford's update) give exactly 0 for a row of equal values, and std's backward relies on
# it: its gradient is masked where ``std == 0`` and divides by ``2 * std`` elsewhere.  The plain two-pass formula
# rounds ``sum(x) / N`` off the common value (three equal fp32 values: 1 ulp), leaves deviations of ~1e-7 and a
# standard deviation of ~1e-7 - whose gradient, ``grad / (2 * std) * (x - mean)`` with the backward's own mean,
# came out ~0.6 where eager's is 0 (gradient fuzz seed 9304: ``torch.max(x, y).std(-1)`` over a row where ``y``
# wins every element).  Shifting the data by an element of the row makes the deviations of equal values exactly
# 0 (and cancels less wherever the mean is large against the spread), for an extra load of one element per row.
# The norms (layer, group and batch norm) too, though they add ``eps`` before the root: their *mean* must be the
# common value exactly, or ``x - mean`` of a row of equal values is +-1 ulp and the normalized output +-1 ulp
# times ``1 / sqrt(eps)`` (~2e-4) where eager's is exactly 0 - and an ``abs``, ``sign`` or ``relu`` after it
# passes a gradient of that sign, ~1000x the incoming one, where eager's is 0 (gradient fuzz seed 22888: a
# LayerNorm over an expanded input, then ``abs``).
def _first_of_rows(L: Lowerer, x: Node, axes: tuple[int, ...]) -> Node:
    """``x`` at index 0 of each axis in ``axes`` (kept as size-1 axes): an element of every row."""
    for a in axes:
        shape = list(x.shape)
        shape[a] = 1
        x = L.b.add(Op.SLICE, (x,), shape=tuple(shape), dim=a, start=0, step=1)
    return x


def _correction(correction: Any, unbiased: Any) -> float:
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased in (None, True) else 0.0


@register(aten.var)
def _var(L: Lowerer, n: Any, x: Node, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
         correction: Any = None) -> Node:
    if isinstance(dim, bool):
        unbiased, dim = dim, None
    return _variance(L, x, _dims(x, dim), _correction(correction, unbiased), keepdim, out_dtype(n), True)[0]


@register(aten.var_mean)
def _var_mean(L: Lowerer, n: Any, x: Node, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
              correction: Any = None) -> tuple[Node, Node]:
    if isinstance(dim, bool):
        unbiased, dim = dim, None
    dtype = meta_val(n)[0].dtype
    return _variance(L, x, _dims(x, dim), _correction(correction, unbiased), keepdim, dtype, True)


@register(aten.std)
def _std(L: Lowerer, n: Any, x: Node, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
         correction: Any = None) -> Node:
    if isinstance(dim, bool):
        unbiased, dim = dim, None
    var = _variance(L, x, _dims(x, dim), _correction(correction, unbiased), keepdim, out_dtype(n), True)[0]
    return L.b.add(Op.SQRT, (var,))


@register(aten._softmax, aten._log_softmax)
def _softmax(L: Lowerer, n: Any, x: Node, dim: int, half_to_float: bool = False) -> Node:
    dtype = out_dtype(n)
    x = L.cast(x, dtype)
    d = norm_dim(dim, len(x.shape))
    if not x.shape:
        return L.full(0.0 if n.target.overloadpacket is aten._log_softmax else 1.0, (), dtype)
    shifted = L.binary(Op.SUB, x, L.reduce(Op.AMAX, x, (d,), True), dtype)
    e = L.b.add(Op.EXP, (shifted,))
    total = L.reduce(Op.SUM, e, (d,), True)
    if n.target.overloadpacket is aten._log_softmax:
        return L.binary(Op.SUB, shifted, L.b.add(Op.LOG, (total,)), dtype)
    return L.binary(Op.DIV, e, total, dtype)


@register(aten.native_layer_norm)
def _layer_norm(L: Lowerer, n: Any, x: Node, normalized_shape: Any, weight: Any, bias: Any,
                eps: float) -> tuple[Node, Node, Node]:
    dtype = meta_val(n)[0].dtype
    k = len(normalized_shape)
    axes = tuple(range(len(x.shape) - k, len(x.shape)))
    var, mean = _variance(L, x, axes, 0.0, True, dtype, shifted=True)
    rstd = L.b.add(Op.RSQRT, (L.binary(Op.ADD, var, eps, dtype),))
    out = L.binary(Op.MUL, L.binary(Op.SUB, x, mean, dtype), rstd, dtype)
    if weight is not None:
        out = L.binary(Op.MUL, out, weight, dtype)
    if bias is not None:
        out = L.binary(Op.ADD, out, bias, dtype)
    stat_shape = meta_shape(meta_val(n)[1])
    return out, L.reshape(mean, stat_shape), L.reshape(rstd, stat_shape)


@register(aten.native_group_norm)
def _group_norm(L: Lowerer, n: Any, x: Node, weight: Any, bias: Any, N: int, C: int, HxW: int, group: int,
                eps: float) -> tuple[Node, Node, Node]:
    """Statistics over (C / group) * HxW elements per (sample, group), then the per-channel affine."""
    dtype = meta_val(n)[0].dtype
    if x.numel == 0 or not dtype.is_floating_point or C % group:
        raise Unsupported("group_norm of an empty tensor")
    g = L.reshape(L.cast(x, dtype), (N, group, (C // group) * HxW))
    var, mean = _variance(L, g, (2,), 0.0, True, dtype, shifted=True)
    rstd = L.b.add(Op.RSQRT, (L.binary(Op.ADD, var, eps, dtype),))
    out = L.reshape(L.binary(Op.MUL, L.binary(Op.SUB, g, mean, dtype), rstd, dtype), (N, C, HxW))
    if weight is not None:
        out = L.binary(Op.MUL, out, L.reshape(weight, (C, 1)), dtype)
    if bias is not None:
        out = L.binary(Op.ADD, out, L.reshape(bias, (C, 1)), dtype)
    stat = meta_shape(meta_val(n)[1])
    return L.reshape(out, x.shape), L.reshape(mean, stat), L.reshape(rstd, stat)


@register(aten.linalg_vector_norm)
def _vector_norm(L: Lowerer, n: Any, x: Node, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: Any = None) -> Node:
    odt = out_dtype(n)
    if not odt.is_floating_point or isinstance(ord, Node) or not isinstance(ord, (int, float)):
        raise Unsupported("vector_norm of a non-float tensor")
    axes = _dims(x, dim)
    x = L.cast(x, odt)
    if ord == 2:
        return L.b.add(Op.SQRT, (L.reduce(Op.SUM, L.b.add(Op.MUL, (x, x)), axes, keepdim),))
    a = L.b.add(Op.ABS, (x,))
    if ord == 1:
        return L.reduce(Op.SUM, a, axes, keepdim)
    if ord == math.inf:
        return L.reduce(Op.AMAX, a, axes, keepdim)
    if ord == -math.inf:
        return L.reduce(Op.AMIN, a, axes, keepdim)
    if ord == 0:
        return L.reduce(Op.SUM, L.cast(L.binary(Op.NE, x, 0.0, odt), odt), axes, keepdim)
    total = L.reduce(Op.SUM, L.binary(Op.POW, a, float(ord), odt), axes, keepdim)
    return L.binary(Op.POW, total, 1.0 / float(ord), odt)


def _channel(L: Lowerer, v: Node, ndim: int) -> Node:
    """A per-channel [C] vector as [C, 1, ..., 1] for broadcasting against [N, C, ...]."""
    return L.reshape(v, (v.shape[0],) + (1,) * (ndim - 2))


@register(aten._native_batch_norm_legit_no_training)
def _batch_norm_inference(L: Lowerer, n: Any, x: Node, weight: Any, bias: Any, mean: Node, var: Node,
                          momentum: float, eps: float) -> tuple[Node, Node, Node]:
    """y = x * scale + shift with scale = weight / sqrt(var + eps), shift = bias - mean * scale.

    With frozen weights, constant folding turns scale and shift into two constants, and the
    affine-folding pass then merges them into the preceding convolution."""
    dtype = meta_val(n)[0].dtype
    scale = L.b.add(Op.RSQRT, (L.binary(Op.ADD, L.cast(var, dtype), eps, dtype),))
    if weight is not None:
        scale = L.binary(Op.MUL, scale, weight, dtype)
    shift = L.binary(Op.MUL, L.b.add(Op.NEG, (L.cast(mean, dtype),)), scale, dtype)
    if bias is not None:
        shift = L.binary(Op.ADD, shift, bias, dtype)
    nd = len(x.shape)
    out = L.binary(Op.ADD, L.binary(Op.MUL, x, _channel(L, scale, nd), dtype), _channel(L, shift, nd), dtype)
    empty = [L.full(0.0, meta_shape(v), v.dtype) for v in meta_val(n)[1:]]
    return (out, *empty)


def _batch_norm_training(L: Lowerer, n: Any, x: Node, weight: Any, bias: Any, eps: float,
                         running: tuple[Node, Node, float] | None = None) -> tuple[Node, ...]:
    """Batch statistics over all dims but the channel dim: (out, mean, rstd[, new running mean, var]).

    Running statistics move by ``momentum`` towards the batch mean and the unbiased batch variance."""
    vals = meta_val(n)
    dtype = vals[0].dtype
    nd = len(x.shape)
    if nd < 2 or not dtype.is_floating_point:
        raise Unsupported("batch_norm of a < 2-d tensor")
    axes = (0,) + tuple(range(2, nd))
    count = x.numel // x.shape[1]
    var, mean = _variance(L, x, axes, 0.0, False, dtype, shifted=True)
    rstd = L.b.add(Op.RSQRT, (L.binary(Op.ADD, var, eps, dtype),))
    out = L.binary(Op.MUL, L.binary(Op.SUB, x, _channel(L, mean, nd), dtype), _channel(L, rstd, nd), dtype)
    if weight is not None:
        out = L.binary(Op.MUL, out, _channel(L, L.cast(weight, dtype), nd), dtype)
    if bias is not None:
        out = L.binary(Op.ADD, out, _channel(L, L.cast(bias, dtype), nd), dtype)
    stats = (out, L.cast(mean, vals[1].dtype), L.cast(rstd, vals[2].dtype))
    if running is None:
        return stats
    running_mean, running_var, momentum = running
    if count <= 1:
        raise Unsupported("batch_norm training statistics of one value per channel")
    rm_dtype, rv_dtype = vals[-2].dtype, vals[-1].dtype
    new_mean = L.binary(Op.ADD, L.binary(Op.MUL, running_mean, 1.0 - momentum, rm_dtype),
                        L.binary(Op.MUL, mean, momentum, rm_dtype), rm_dtype)
    unbiased = L.binary(Op.MUL, var, count / (count - 1), dtype)
    new_var = L.binary(Op.ADD, L.binary(Op.MUL, running_var, 1.0 - momentum, rv_dtype),
                       L.binary(Op.MUL, unbiased, momentum, rv_dtype), rv_dtype)
    return stats + (new_mean, new_var)


@register(aten._native_batch_norm_legit, aten.native_batch_norm)
def _batch_norm(L: Lowerer, n: Any, x: Node, weight: Any, bias: Any, *args: Any) -> Any:
    if n.target._overloadname == "no_stats":  # (training, momentum, eps): batch statistics, nothing to update
        training, momentum, eps = args
        return _batch_norm_training(L, n, x, weight, bias, eps)
    mean, var, training, momentum, eps = args
    if training is not False or not isinstance(mean, Node) or not isinstance(var, Node):
        # training mode here updates the running statistics in place (functional graphs use
        # _native_batch_norm_legit_functional instead)
        raise Unsupported("batch_norm in training mode with in-place running statistics")
    return _batch_norm_inference(L, n, x, weight, bias, mean, var, momentum, eps)


@register(aten._native_batch_norm_legit_functional)
def _batch_norm_functional(L: Lowerer, n: Any, x: Node, weight: Any, bias: Any, running_mean: Node,
                           running_var: Node, training: bool, momentum: float, eps: float) -> Any:
    if not training:
        vals = meta_val(n)
        if vals[1].numel() or vals[2].numel():
            raise Unsupported("batch_norm statistics in eval mode")
        out = _batch_norm_inference(L, n, x, weight, bias, running_mean, running_var, momentum, eps)[0]
        return (out, L.full(0, meta_shape(vals[1]), vals[1].dtype), L.full(0, meta_shape(vals[2]), vals[2].dtype),
                L.cast(running_mean, vals[3].dtype), L.cast(running_var, vals[4].dtype))
    return _batch_norm_training(L, n, x, weight, bias, eps, (running_mean, running_var, momentum))


@register(aten._batch_norm_with_update_functional)
def _batch_norm_with_update(L: Lowerer, n: Any, x: Node, weight: Any, bias: Any, running_mean: Node,
                            running_var: Node, momentum: float, eps: float) -> Any:
    out, mean, rstd, new_mean, new_var = _batch_norm_training(L, n, x, weight, bias, eps,
                                                              (running_mean, running_var, momentum))
    reserve = meta_val(n)[3]
    return out, mean, rstd, L.full(0, tuple(reserve.shape), reserve.dtype), new_mean, new_var
