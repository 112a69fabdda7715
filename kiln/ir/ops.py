"""The graph IR's operator set: one enum, category sets, and the shape/dtype rules.

Passes and code generators ask categories (``op in ELEMENTWISE``) instead of testing classes.  Composite
ATen operators (softmax, layer_norm, gelu, ...) are lowered into these primitives by ``frontend/aten.py``;
whatever has no lowering becomes ``EXTERN`` and runs the ATen op itself at run time.
"""
from __future__ import annotations

import enum
import math
from typing import Any

import torch

from kiln.ir.sym import Size, SizeExpr, is_symbolic, size


class Op(enum.Enum):
    # sources
    INPUT = "input"          # attrs: index
    CONSTANT = "constant"    # attrs: value (ConstRef), a frozen tensor (weights, folded values)
    FULL = "full"            # attrs: value (python scalar); any shape, usually () then EXPAND
    IOTA = "iota"            # 1-D: attrs start, step -> start + step * i
    # unary elementwise
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXPM1 = "expm1"
    LOG = "log"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    ERF = "erf"
    ERFC = "erfc"
    NDTR = "ndtr"            # the standard normal CDF, Phi(x) (torch.special.ndtr)
    GELU = "gelu"            # the exact (erf) GELU, x * Phi(x) (F.gelu, approximate="none"); CPU lowering only
    TANH = "tanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    TRUNC = "trunc"
    SIGN = "sign"
    ISNAN = "isnan"
    LOGICAL_NOT = "logical_not"
    BITWISE_NOT = "bitwise_not"
    CAST = "cast"            # to node.dtype
    # binary elementwise
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"              # true division (floats)
    FLOORDIV = "floordiv"    # integer / float floor division (python semantics)
    REM = "rem"              # python-style remainder (sign of divisor), like torch.remainder
    FMOD = "fmod"            # C-style remainder (sign of dividend), like torch.fmod
    POW = "pow"
    MAXIMUM = "maximum"      # NaN-propagating
    MINIMUM = "minimum"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_XOR = "logical_xor"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    # ternary
    WHERE = "where"
    # reductions: attrs axes (sorted tuple), keepdim
    SUM = "sum"
    PROD = "prod"
    AMAX = "amax"
    AMIN = "amin"
    ARGMAX = "argmax"        # attrs axes (one axis), keepdim; int64 result
    ARGMIN = "argmin"
    # movement (views: index maps, never copies)
    RESHAPE = "reshape"      # attrs shape
    PERMUTE = "permute"      # attrs dims
    EXPAND = "expand"        # attrs shape (numpy broadcasting from the right)
    SLICE = "slice"          # attrs dim, start, step  (length from node.shape)
    PAD = "pad"              # attrs pads ((before, after) per dim), value
    CAT = "cat"              # attrs dim
    # indirect
    TAKE = "take"            # inputs (x, index); attrs dim: x.shape[:dim] + index.shape + x.shape[dim+1:]
    GATHER = "gather"        # inputs (x, index); attrs dim: torch.gather
    # anything else: the ATen op at run time
    EXTERN = "extern"        # attrs target (OpOverload), template (args/kwargs with InputRef), out_index


UNARY = frozenset({
    Op.NEG, Op.ABS, Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.SQRT, Op.RSQRT, Op.RECIPROCAL, Op.ERF, Op.ERFC,
    Op.NDTR, Op.GELU, Op.TANH, Op.SIGMOID, Op.RELU, Op.SIN, Op.COS, Op.FLOOR, Op.CEIL, Op.ROUND, Op.TRUNC, Op.SIGN,
    Op.ISNAN, Op.LOGICAL_NOT, Op.BITWISE_NOT, Op.CAST,
})
BINARY = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FLOORDIV, Op.REM, Op.FMOD, Op.POW, Op.MAXIMUM, Op.MINIMUM,
    Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR,
    Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR,
})
TERNARY = frozenset({Op.WHERE})
ELEMENTWISE = UNARY | BINARY | TERNARY
COMPARISON = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.ISNAN})
LOGICAL = frozenset({Op.LOGICAL_NOT, Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR})
BOOL_RESULT = COMPARISON | LOGICAL
COMMUTATIVE = frozenset({Op.ADD, Op.MUL, Op.MAXIMUM, Op.MINIMUM, Op.EQ, Op.NE, Op.LOGICAL_AND, Op.LOGICAL_OR,
                         Op.LOGICAL_XOR, Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR})
# elementwise ops whose cost is dominated by a transcendental evaluation: the fusion cost model
# weighs them when deciding whether recomputing a shared producer is cheaper than storing it.
TRANSCENDENTAL = frozenset({Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.ERF, Op.ERFC, Op.NDTR, Op.GELU, Op.TANH,
                            Op.SIGMOID, Op.SIN, Op.COS, Op.POW})
REDUCTION = frozenset({Op.SUM, Op.PROD, Op.AMAX, Op.AMIN, Op.ARGMAX, Op.ARGMIN})
VIEW = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE})
MOVEMENT = VIEW | frozenset({Op.PAD, Op.CAT})
INDIRECT = frozenset({Op.TAKE, Op.GATHER})
SOURCE = frozenset({Op.INPUT, Op.CONSTANT, Op.FULL, Op.IOTA})
# ops that a generated kernel can compute as an index function (inlined into consumers)
INLINABLE = ELEMENTWISE | MOVEMENT | INDIRECT | frozenset({Op.FULL, Op.IOTA})


def dim(s: Any) -> Size:
    """One dimension of a shape: an ``int`` (from any integer-like: numpy, torch), or a size expression kept as is
    (a graph traced with dynamic shapes, ir/sym.py)."""
    if is_symbolic(s):
        return size(s)
    if isinstance(s, torch.SymInt):  # int() would make Dynamo guard on (specialize) the size
        raise TypeError(f"a torch.SymInt ({s}) reached a kiln shape: convert it with lowering_base.sym_size")
    return int(s)


def reduced_shape(shape: tuple[Size, ...], axes: tuple[int, ...], keepdim: bool) -> tuple[Size, ...]:
    """Shape after reducing ``axes`` of ``shape``."""
    if keepdim:
        return tuple(1 if d in axes else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in axes)


def broadcast_shapes(*shapes: tuple[Size, ...]) -> tuple[Size, ...]:
    """Numpy broadcasting; raises ValueError naming the shapes.  A symbolic size broadcasts with 1 and with
    itself (the same expression) only: Dynamo has already replaced sizes it proved equal."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        sizes = {s[d - ndim + len(s)] for s in shapes if d - ndim + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def numel(shape: tuple[Size, ...]) -> Size:
    n: Size = 1
    for s in shape:
        n = n * s
    return n


def contiguous_strides(shape: tuple[Size, ...]) -> tuple[Size, ...]:
    """Row-major strides (a dimension of size 0 counts as 1; a symbolic one is at least 2, Dynamo specializing 0
    and 1)."""
    strides = []
    acc: Size = 1
    for s in reversed(shape):
        strides.append(acc)
        acc = acc * (s if isinstance(s, SizeExpr) else max(s, 1))
    return tuple(reversed(strides))


# Half-precision element types: kernels load and store them, and compute in fp32 (C++ and Triton alike).
HALF = (torch.bfloat16, torch.float16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type a kernel computes a value of ``dtype`` in: fp32 for half precision, else the type itself."""
    return torch.float32 if dtype in HALF else dtype


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of an NCHW-shaped value stored NHWC (channels innermost)."""
    n, c, h, w = shape
    return (c * h * w, 1, w * c, c)


def reduction_identity(kind: "Op", dtype: torch.dtype) -> float | int | bool:
    """The value a reduction's accumulator starts from (each code generator prints it as its literal): 0 for a
    sum, 1 for a product, the lowest value for a max (-inf; the type's minimum for integers), the highest for a
    min."""
    if kind is Op.SUM:
        return 0
    if kind is Op.PROD:
        return 1
    high = kind in (Op.AMIN, Op.ARGMIN)
    if dtype.is_floating_point:
        return math.inf if high else -math.inf
    if dtype == torch.bool:
        return high
    info = torch.iinfo(dtype)
    return info.max if high else info.min
