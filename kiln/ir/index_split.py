"""Index-set splitting: run the parts of a loop where bounds checks are known without the checks.

Padding and concatenation become conditions on loop indices inside a kernel (``where(0 <= h < H, load,
fill)``).  Checked in every iteration they cost time, and worse, a load under a condition must be a masked
load, which GCC cannot vectorize when the access is strided (pooling windows, strided convolutions).  But
each condition has a constant value on most of the loop range: all of a pooling window lies inside the
input except at the borders.  This module finds, for the innermost loop ``v``, the sub-ranges on which every
condition has a known value, and rewrites the kernel's expressions for each (``specialize``).

    before (max pooling 3x3/2, pad 1, innermost loop i2 < 56):
      out = max(where(2*i1 >= 1 && 2*i2 >= 1, x[.. 2*i2 - 1], -inf), ...)
    after:
      i2 in [0, 1):   the expression as it was
      i2 in [1, 56):  max(where(2*i1 >= 1, x[.. 2*i2 - 1], -inf), ...)      (the i2 checks are gone)
    and for outer-loop conditions (here 2*i1 >= 1), a guard chooses per outer iteration between the fully
    specialized inner loops and the general one.

Conditions are comparisons ``index <op> constant`` (``KOp(LT|LE|GT|GE, (KIndex, KConst))``), the forms the
kernel builder emits for padding and concatenation.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from kiln.ir.index import Lin, Var
from kiln.ir.kernel import KConst, KExpr, KIndex, KOp
from kiln.ir.ops import Op
from kiln.ir.sym import is_symbolic

_CMP = (Op.LT, Op.LE, Op.GT, Op.GE)
MIN_SEGMENT = 8  # shorter sub-ranges are not worth a loop of their own: they run the general body


def conditions(exprs: Iterable[KExpr]) -> list[KOp]:
    """The index-range conditions in ``exprs`` (not looking inside gather indices)."""
    seen: dict[KOp, None] = {}
    stack = list(exprs)
    visited: set[int] = set()
    while stack:
        e = stack.pop()
        if id(e) in visited:
            continue
        visited.add(id(e))
        if isinstance(e, KOp):
            if is_condition(e):
                seen[e] = None
            else:
                stack.extend(e.args)
    return list(seen)


def is_condition(e: KOp) -> bool:
    if e.op not in _CMP or len(e.args) != 2:
        return False
    a, b = e.args
    return (isinstance(a, KIndex) and isinstance(b, KConst) and (isinstance(b.value, int) or is_symbolic(b.value))
            and all(isinstance(t, Var) for t in a.index.atoms()))


def is_static(e: KOp) -> bool:
    """Is condition ``e`` free of size expressions (its bound and its index's coefficients and extents)?  Only
    those split a loop into segments; a symbolic one can still guard a whole outer iteration."""
    return isinstance(e.args[1].value, int) and not e.args[0].index.is_symbolic()


def _as_ge(e: KOp) -> tuple[Lin, int, bool]:
    """(lin, k, positive): the condition is ``lin >= k`` if positive, else ``lin < k``."""
    lin, k = e.args[0].index, e.args[1].value
    if e.op is Op.GE:
        return lin, k, True
    if e.op is Op.GT:
        return lin, k + 1, True
    if e.op is Op.LT:
        return lin, k, False
    return lin, k + 1, False  # LE


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _ge_interval(c: int, rlo: int, rhi: int, k: int, size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Sub-ranges of v in [0, size) where ``c*v + rest >= k`` holds for every rest in [rlo, rhi], and where it
    fails for every rest (each as [lo, hi), possibly empty)."""
    if c > 0:
        t_lo = max(_ceil_div(k - rlo, c), 0)          # c*v + rlo >= k
        f_hi = min(_ceil_div(k - rhi, c), size)       # c*v + rhi < k  <=>  v < (k - rhi) / c
        return (t_lo, size), (0, f_hi)
    n = -c
    t_hi = min((rlo - k) // n + 1, size)              # rlo - n*v >= k  <=>  v <= (rlo - k) / n
    f_lo = max((rhi - k) // n + 1, 0)                 # rhi - n*v < k   <=>  v > (rhi - k) / n
    return (0, t_hi), (f_lo, size)


def truth_ranges(cond: KOp, v: Var) -> tuple[tuple[int, int], tuple[int, int]]:
    """([lo, hi) where ``cond`` is surely true, [lo, hi) where surely false) for the loop variable ``v``;
    the other variables may take any value in their ranges."""
    lin, k, positive = _as_ge(cond)
    c = lin.coefficient(v)
    rest = lin - Lin.of(v) * c
    rlo, rhi = rest.bounds()
    true_r, false_r = _ge_interval(c, rlo, rhi, k, v.size)
    return (true_r, false_r) if positive else (false_r, true_r)


@dataclasses.dataclass
class Segment:
    lo: int
    hi: int
    facts: dict[KOp, bool]   # conditions with a known value on [lo, hi)


def inner_segments(conds: list[KOp], v: Var) -> list[Segment]:
    """Split [0, v.size) into segments on which the conditions using ``v`` have known values.

    Adjacent segments with the same facts are merged; segments shorter than ``MIN_SEGMENT`` lose their
    facts (they run the general body) and merge with their neighbours likewise."""
    using_v = [c for c in conds if c.args[0].index.coefficient(v) != 0]
    ranges = {c: truth_ranges(c, v) for c in using_v}
    cuts = {0, v.size}
    for (t_lo, t_hi), (f_lo, f_hi) in ranges.values():
        cuts |= {min(max(x, 0), v.size) for x in (t_lo, t_hi, f_lo, f_hi)}
    points = sorted(cuts)
    segs: list[Segment] = []
    for lo, hi in zip(points, points[1:]):
        facts: dict[KOp, bool] = {}
        for c, ((t_lo, t_hi), (f_lo, f_hi)) in ranges.items():
            if t_lo <= lo and hi <= t_hi:
                facts[c] = True
            elif f_lo <= lo and hi <= f_hi:
                facts[c] = False
        if hi - lo < MIN_SEGMENT:
            facts = {}
        if segs and segs[-1].facts == facts:
            segs[-1].hi = hi
        else:
            segs.append(Segment(lo, hi, facts))
    return segs


def specialize(e: KExpr, facts: dict[KOp, bool], memo: dict[KExpr, KExpr] | None = None) -> KExpr:
    """``e`` with the conditions in ``facts`` replaced by their values, and selects/logic folded."""
    memo = {} if memo is None else memo
    if e in memo:
        return memo[e]
    out = e
    if isinstance(e, KOp):
        if e in facts:
            out = KConst(facts[e], e.dtype)
        else:
            args = tuple(specialize(a, facts, memo) for a in e.args)
            out = _fold(KOp(e.op, args, e.dtype))
    memo[e] = out
    return out


def _const_bool(e: KExpr) -> bool | None:
    return bool(e.value) if isinstance(e, KConst) and e.dtype.is_floating_point is False and \
        isinstance(e.value, bool) else None


def _fold(e: KOp) -> KExpr:
    a = [_const_bool(x) for x in e.args]
    if e.op is Op.WHERE and a[0] is not None:
        return e.args[1] if a[0] else e.args[2]
    if e.op is Op.LOGICAL_AND:
        if False in a:
            return KConst(False, e.dtype)
        rest = [x for x, v in zip(e.args, a) if v is None]
        return rest[0] if len(rest) == 1 else (KConst(True, e.dtype) if not rest else e)
    if e.op is Op.LOGICAL_OR:
        if True in a:
            return KConst(True, e.dtype)
        rest = [x for x, v in zip(e.args, a) if v is None]
        return rest[0] if len(rest) == 1 else (KConst(False, e.dtype) if not rest else e)
    if e.op is Op.LOGICAL_NOT and a[0] is not None:
        return KConst(not a[0], e.dtype)
    return e
