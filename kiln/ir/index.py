"""Integer index expressions for kernel loads and stores, with the simplifier that keeps views cheap.

An expression is a ``Lin``: ``const + sum(coef * atom)``.  Atoms are loop variables (``Var``, with a known
range ``[0, size)``), ``FloorDiv(lin, k)``, ``Mod(lin, k)`` and ``Dyn`` (a value loaded at run time, for
gathers).  Views compose into these expressions; the simplifier removes the div/mod that a reshape introduces
whenever ranges prove them redundant, e.g. for a reshape [B, H*W] -> [B, H, W] -> [B, H*W]::

    (p // W) * W + p % W        ->  p
    (b * H + p // W) % H        ->  p // W      (since 0 <= p // W < H)
    (b * HW + p) // HW          ->  b           (since 0 <= p < HW)

[Note: symbolic indices] With dynamic shapes (docs/dynamic_shapes.md, layer 3) a loop extent, a coefficient
(a stride ``768*s0``), a constant (a cat part's offset ``s0``) and a divisor may be a size expression
(``kiln.ir.sym.SizeExpr``).  The rules stay the same; each test that had compared integers asks what holds for
every size in the symbols' ranges (``sym.provably_*``), and "not provable" keeps the division - correct for every
size, only less simple.  With ``T`` symbolic::

    (b * T + t) // T            ->  b           (since 0 <= t <= T - 1 < T)
    (768*T*b + 768*t + c) % 768 ->  c

Bounds may be ``None`` (unknown: a coefficient of unknown sign).  Static kernels never see a size expression, and
every operation tries plain ``int`` arithmetic first: a static compile builds ~10^5 of these expressions.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Optional

from kiln.ir import sym

Size = sym.Size
Bound = Optional[Size]  # None: not known


def _num(x: Any) -> bool:
    """Is ``x`` a plain integer (the fast path)?"""
    return type(x) is int


def _in_range(lo: Bound, hi: Bound, k: Size) -> bool:
    """``0 <= lo`` and ``hi < k`` for every size (bounds of an expression against a divisor)."""
    if type(lo) is int and type(hi) is int and type(k) is int:
        return lo >= 0 and hi < k
    return lo is not None and hi is not None and sym.provably_le(0, lo) and sym.provably_lt(hi, k)





def _nonneg(c: Size) -> bool | None:
    """Sign of a coefficient: True (>= 0 always), False (<= 0 always), None (unknown)."""
    if _num(c):
        return c >= 0
    if sym.provably_le(0, c):
        return True
    if sym.provably_le(c, 0):
        return False
    return None


@dataclasses.dataclass(frozen=True)
class Var:
    name: str
    size: Size

    def bounds(self) -> tuple[Size, Size]:
        if _num(self.size):
            return 0, max(self.size - 1, 0)
        return 0, self.size - 1  # (an extent of 0 runs no iteration, so no index is evaluated there)


def _once(atom: Any, name: str, compute: Callable[[Any], Any]) -> Any:
    """``compute(atom)``, kept on the (immutable) atom under ``name`` after the first call."""
    found = atom.__dict__.get(name)
    if found is None:
        found = compute(atom)
        object.__setattr__(atom, name, found)
    return found


def _memoized(cls: Any) -> Any:
    """``cls`` (a frozen dataclass atom) with its ``repr`` and ``hash`` computed once per object.  Both recurse
    through the atom's expression (a ``Dyn`` holds a whole loaded-index expression tree), and every ``Lin`` built
    sorts its terms by ``repr`` and keys them by hash: Swin's relative-position gathers made that sort 40% of
    its compile (116,000 reprs of nested gather expressions)."""
    plain_repr, plain_hash = cls.__repr__, cls.__hash__
    cls.__repr__ = lambda self: _once(self, "_repr", plain_repr)
    cls.__hash__ = lambda self: _once(self, "_hash", plain_hash)
    return cls


@_memoized
@dataclasses.dataclass(frozen=True)
class FloorDiv:
    arg: "Lin"
    k: Size  # positive

    def bounds(self) -> tuple[Bound, Bound]:
        lo, hi = self.arg.bounds()
        if _num(lo) and _num(hi) and _num(self.k):
            return lo // self.k, hi // self.k
        return (None if lo is None else sym.floordiv(lo, self.k)), (None if hi is None else sym.floordiv(hi, self.k))


@_memoized
@dataclasses.dataclass(frozen=True)
class Mod:
    arg: "Lin"
    k: Size  # positive

    def bounds(self) -> tuple[Bound, Bound]:
        lo, hi = self.arg.bounds()
        if _in_range(lo, hi, self.k):
            return lo, hi
        return 0, self.k - 1


@_memoized
@dataclasses.dataclass(frozen=True)
class Dyn:
    """An index read from memory at run time (gather/take); assumed within [0, size)."""
    expr: Any
    size: Size

    def bounds(self) -> tuple[Size, Size]:
        return (0, max(self.size - 1, 0)) if _num(self.size) else (0, self.size - 1)


Atom = Var | FloorDiv | Mod | Dyn


@dataclasses.dataclass(frozen=True)
class Lin:
    const: Size = 0
    terms: tuple[tuple[Atom, Size], ...] = ()   # sorted by repr of atom, coefficients non-zero

    # ------------------------------------------------------------------ construction
    @staticmethod
    def of(x: "Lin | Atom | Size") -> "Lin":
        if isinstance(x, Lin):
            return x
        if isinstance(x, int):
            return Lin(x)
        if sym.is_symbolic(x):
            return Lin(sym.size(x))
        return Lin(0, ((x, 1),))

    def __add__(self, other: "Lin | Atom | int") -> "Lin":
        o = Lin.of(other)
        acc: dict[Atom, int] = dict(self.terms)
        for a, c in o.terms:
            acc[a] = acc.get(a, 0) + c
        return _make(self.const + o.const, acc)

    __radd__ = __add__

    def __mul__(self, k: Size) -> "Lin":
        if k == 0:
            return Lin(0)
        if k == 1:
            return self
        return _make(self.const * k, {a: c * k for a, c in self.terms})

    __rmul__ = __mul__

    def __sub__(self, other: "Lin | Atom | int") -> "Lin":
        return self + Lin.of(other) * -1

    def floordiv(self, k: Size) -> "Lin":
        return floordiv(self, k)

    def mod(self, k: Size) -> "Lin":
        return mod(self, k)

    # ------------------------------------------------------------------ analysis
    def bounds(self) -> tuple[Bound, Bound]:
        """The smallest and largest value over the atoms' ranges (ints, size expressions, or None: unknown)."""
        lo: Bound = self.const
        hi: Bound = self.const
        for a, c in self.terms:
            alo, ahi = a.bounds()
            if type(c) is int and type(alo) is int and type(ahi) is int and type(lo) is int and type(hi) is int:
                lo += min(c * alo, c * ahi)
                hi += max(c * alo, c * ahi)
                continue
            sign = _nonneg(c)
            if sign is None or alo is None or ahi is None:
                return None, None
            tlo, thi = (c * alo, c * ahi) if sign else (c * ahi, c * alo)
            lo = None if lo is None else sym.size(lo + tlo)
            hi = None if hi is None else sym.size(hi + thi)
        return lo, hi

    def is_symbolic(self) -> bool:
        """Does the expression hold a size expression (as a coefficient, the constant, or inside an atom)?"""
        return not _num(self.const) or any(
            not _num(c) or (isinstance(a, (FloorDiv, Mod)) and (not _num(a.k) or a.arg.is_symbolic()))
            or (isinstance(a, (Var, Dyn)) and not _num(a.size)) for a, c in self.terms)

    def coefficient(self, atom: Atom) -> Size:
        for a, c in self.terms:
            if a == atom:
                return c
        return 0

    def atoms(self) -> Iterable[Atom]:
        return (a for a, _ in self.terms)

    def is_const(self) -> bool:
        return not self.terms

    def substitute(self, mapping: dict[Var, "Lin"]) -> "Lin":
        out = Lin(self.const)
        for a, c in self.terms:
            out = out + _subst_atom(a, mapping) * c
        return out

    def __str__(self) -> str:
        return render(self, lambda d: f"<{d.expr}>")


def _subst_atom(a: Atom, mapping: dict[Var, Lin]) -> Lin:
    if isinstance(a, Var):
        return mapping.get(a, Lin.of(a))
    if isinstance(a, FloorDiv):
        return floordiv(a.arg.substitute(mapping), a.k)
    if isinstance(a, Mod):
        return mod(a.arg.substitute(mapping), a.k)
    return Lin.of(a)


def _make(const: Size, acc: dict[Atom, Size]) -> Lin:
    acc = {a: c for a, c in acc.items() if c != 0}
    acc = _recombine(acc)
    return Lin(const, tuple(sorted(acc.items(), key=lambda t: repr(t[0]))))


def _quotient(a: Mod) -> Lin:
    """``a.arg // a.k``, simplified, computed once per Mod atom (every ``Lin`` built looks for it)."""
    return _once(a, "_quotient", lambda m: floordiv(m.arg, m.k))


def _recombine(acc: dict[Atom, Size]) -> dict[Atom, Size]:
    """Undo the split that a reshape round trip introduces:

        c*k*(x // k) + c*(x % k)          ->  c*x
        c*k*((x // k) % m) + c*(x % k)    ->  c*(x % (k*m))

    The second is a reduction over the last two dims of NCHW flattened into one index ``r`` and unflattened
    again: ``48*((r / 48) % 48) + r % 48`` is ``r % 2304`` - one remainder instead of two, and a remainder by a
    multiple of the vector width (see [Note: reduction index blocked by the vector], codegen/cpp.py) where 48 is
    not."""
    changed = True
    while changed:
        changed = False
        for a, c in list(acc.items()):
            if not isinstance(a, Mod) or a.arg.const:
                continue
            q = _quotient(a)
            if q.const or len(q.terms) != 1 or q.terms[0][1] != 1:
                continue
            partner = q.terms[0][0]
            outer = sym.size(c * a.k)
            if acc.get(partner) == outer:  # c*k*(x // k) + c*(x % k)
                other, joined = partner, a.arg
            else:  # c*k*((x // k) % m) + c*(x % k)
                other = next((m for m, d in acc.items() if isinstance(m, Mod) and d == outer and m.arg == q), None)
                if other is None:
                    continue
                joined = mod(a.arg, sym.size(a.k * other.k))
                if joined.const:
                    continue
            del acc[a], acc[other]
            for b, d in joined.terms:
                acc[b] = acc.get(b, 0) + d * c
            acc = {b: d for b, d in acc.items() if d != 0}
            changed = True
            break
    return acc


def floordiv(e: Lin, k: Size) -> Lin:
    """floor(e / k) for k > 0, simplified using term divisibility and ranges."""
    assert not _num(k) or k > 0
    if k == 1:
        return e
    # (on sizes ``%`` is 0 exactly where the coefficients prove divisibility, and ``//`` is then exact)
    q_terms = {a: c // k for a, c in e.terms if c % k == 0}
    r = Lin(e.const % k, tuple((a, c) for a, c in e.terms if c % k != 0))
    q = _make(e.const // k, q_terms)
    lo, hi = r.bounds()
    if _in_range(lo, hi, k):
        return q
    if len(r.terms) == 1 and r.const == 0:
        atom, c = r.terms[0]
        if isinstance(atom, FloorDiv) and c == 1:
            return q + Lin.of(FloorDiv(atom.arg, sym.size(atom.k * k)))
    split = _split_common_factor(r, k)
    if split is not None:  # (g*A + B) // k == A // (k/g)  when 0 <= B < g
        a, _b, g = split
        return q + floordiv(a, k // g)
    return q + Lin.of(FloorDiv(r, k))


def _split_common_factor(r: Lin, k: Size) -> tuple[Lin, Lin, int] | None:
    """Write r = g*A + B with g | k, g > 1 and 0 <= B < g, for the largest such g (integers only)."""
    if not (_num(k) and _num(r.const) and all(_num(c) for _, c in r.terms)):
        return None
    for g in sorted({math.gcd(k, c) for _, c in r.terms}, reverse=True):
        if g <= 1 or g == k:
            continue
        a = _make(r.const // g, {t: c // g for t, c in r.terms if c % g == 0})
        b = Lin(r.const % g, tuple((t, c) for t, c in r.terms if c % g != 0))
        lo, hi = b.bounds()
        if _in_range(lo, hi, g):
            return a, b, g
    return None


def mod(e: Lin, k: Size) -> Lin:
    """e mod k (non-negative e), dropping multiples of k and proving the remainder already in range."""
    assert not _num(k) or k > 0
    if k == 1:
        return Lin(0)
    r = Lin(e.const % k, tuple((a, c) for a, c in e.terms if c % k != 0))
    lo, hi = r.bounds()
    if _in_range(lo, hi, k):
        return r
    split = _split_common_factor(r, k)
    if split is not None:  # (g*A + B) % k == g*(A % (k/g)) + B  when 0 <= B < g
        a, b, g = split
        return mod(a, k // g) * g + b
    return Lin.of(Mod(r, k))


def linearize(index: Iterable[Lin], strides: Iterable[Size]) -> Lin:
    out = Lin(0)
    for i, s in zip(index, strides):
        out = out + i * s
    return out


def unflatten(flat: Lin, shape: tuple[Size, ...]) -> list[Lin]:
    """Multi-index of a row-major flat index over ``shape``."""
    out: list[Lin] = []
    if 0 in shape:  # an empty tensor: no loop iteration ever evaluates these
        return [Lin(0) for _ in shape]
    stride = 1
    strides = []
    for s in reversed(shape):
        strides.append(stride)
        stride *= s
    strides.reverse()
    for d, (s, st) in enumerate(zip(shape, strides)):
        v = floordiv(flat, st)
        if d > 0:
            v = mod(v, s)
        out.append(v if s != 1 else Lin(0))
    return out


def _size_text(x: Size, floordiv: str, divisor: bool = False) -> str:
    """A coefficient, constant or divisor as text in the target's syntax (a symbolic divisor parenthesized as a
    product: ``i / s0*s1`` would divide by ``s0`` only; a sum is parenthesized by ``sym.render``)."""
    if _num(x):
        return str(x)
    lang = "py" if floordiv == "//" else "cpp"
    return sym.render_factor(x, lang) if divisor else sym.render(x, lang)


def render(e: Lin, dyn: Callable[[Dyn], str], floordiv: str = "/", times: str = "*") -> str:
    """The index as text, the one renderer of both code generators: C++ with the defaults; Triton (Python) with
    ``floordiv="//"`` - C's ``/`` truncates and Python's ``//`` floors, which agree here because index operands
    are never negative.  ``dyn`` prints a data-dependent atom (a loaded index)."""
    parts: list[str] = []
    for a, c in e.terms:
        if isinstance(a, Var):
            s = a.name
        elif isinstance(a, FloorDiv):
            s = f"(({render(a.arg, dyn, floordiv, times)}) {floordiv} {_size_text(a.k, floordiv, True)})"
        elif isinstance(a, Mod):
            s = f"(({render(a.arg, dyn, floordiv, times)}) % {_size_text(a.k, floordiv, True)})"
        else:
            s = dyn(a)
        parts.append(s if c == 1 else f"{_size_text(c, floordiv)}{times}{s}")
    if e.const != 0 or not parts:
        parts.append(_size_text(e.const, floordiv))
    return " + ".join(parts).replace("+ -", "- ")


def evaluate(e: Lin, at: dict[str, int], sizes: dict[str, int] | None = None) -> int:
    """The value of ``e`` with each loop variable ``name`` at ``at[name]`` and each size symbol bound by ``sizes``
    (tests, and checks of the simplifier; a ``Dyn`` atom has no value here)."""
    env = sizes or {}

    def value(x: Size) -> int:
        return x if _num(x) else sym.evaluate(x, env)

    total = value(e.const)
    for a, c in e.terms:
        if isinstance(a, Var):
            v = at[a.name]
        elif isinstance(a, FloorDiv):
            v = evaluate(a.arg, at, sizes) // value(a.k)
        elif isinstance(a, Mod):
            v = evaluate(a.arg, at, sizes) % value(a.k)
        else:
            raise ValueError(f"a loaded index ({a}) has no value without memory")
        total += value(c) * v
    return total
