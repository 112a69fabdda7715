"""Integer index expressions for kernel loads and stores, with the simplifier that keeps views cheap.

An expression is a ``Lin``: ``const + sum(coef * atom)``.  Atoms are loop variables (``Var``, with a known
range ``[0, size)``), ``FloorDiv(lin, k)``, ``Mod(lin, k)`` and ``Dyn`` (a value loaded at run time, for
gathers).  Views compose into these expressions; the simplifier removes the div/mod that a reshape introduces
whenever ranges prove them redundant, e.g. for a reshape [B, H*W] -> [B, H, W] -> [B, H*W]::

    (p // W) * W + p % W        ->  p
    (b * H + p // W) % H        ->  p // W      (since 0 <= p // W < H)
    (b * HW + p) // HW          ->  b           (since 0 <= p < HW)
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable


@dataclasses.dataclass(frozen=True)
class Var:
    name: str
    size: int

    def bounds(self) -> tuple[int, int]:
        return 0, max(self.size - 1, 0)


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
    k: int

    def bounds(self) -> tuple[int, int]:
        lo, hi = self.arg.bounds()
        return lo // self.k, hi // self.k


@_memoized
@dataclasses.dataclass(frozen=True)
class Mod:
    arg: "Lin"
    k: int

    def bounds(self) -> tuple[int, int]:
        lo, hi = self.arg.bounds()
        if lo >= 0 and hi < self.k:
            return lo, hi
        return 0, self.k - 1


@_memoized
@dataclasses.dataclass(frozen=True)
class Dyn:
    """An index read from memory at run time (gather/take); assumed within [0, size)."""
    expr: Any
    size: int

    def bounds(self) -> tuple[int, int]:
        return 0, max(self.size - 1, 0)


Atom = Var | FloorDiv | Mod | Dyn


@dataclasses.dataclass(frozen=True)
class Lin:
    const: int = 0
    terms: tuple[tuple[Atom, int], ...] = ()   # sorted by repr of atom, coefficients non-zero

    # ------------------------------------------------------------------ construction
    @staticmethod
    def of(x: "Lin | Atom | int") -> "Lin":
        if isinstance(x, Lin):
            return x
        if isinstance(x, int):
            return Lin(x)
        return Lin(0, ((x, 1),))

    def __add__(self, other: "Lin | Atom | int") -> "Lin":
        o = Lin.of(other)
        acc: dict[Atom, int] = dict(self.terms)
        for a, c in o.terms:
            acc[a] = acc.get(a, 0) + c
        return _make(self.const + o.const, acc)

    __radd__ = __add__

    def __mul__(self, k: int) -> "Lin":
        if k == 0:
            return Lin(0)
        return _make(self.const * k, {a: c * k for a, c in self.terms})

    __rmul__ = __mul__

    def __sub__(self, other: "Lin | Atom | int") -> "Lin":
        return self + Lin.of(other) * -1

    def floordiv(self, k: int) -> "Lin":
        return floordiv(self, k)

    def mod(self, k: int) -> "Lin":
        return mod(self, k)

    # ------------------------------------------------------------------ analysis
    def bounds(self) -> tuple[int, int]:
        lo = hi = self.const
        for a, c in self.terms:
            alo, ahi = a.bounds()
            lo += min(c * alo, c * ahi)
            hi += max(c * alo, c * ahi)
        return lo, hi

    def coefficient(self, atom: Atom) -> int:
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


def _make(const: int, acc: dict[Atom, int]) -> Lin:
    acc = {a: c for a, c in acc.items() if c != 0}
    acc = _recombine(acc)
    return Lin(const, tuple(sorted(acc.items(), key=lambda t: repr(t[0]))))


def _quotient(a: Mod) -> Lin:
    """``a.arg // a.k``, simplified, computed once per Mod atom (every ``Lin`` built looks for it)."""
    return _once(a, "_quotient", lambda m: floordiv(m.arg, m.k))


def _recombine(acc: dict[Atom, int]) -> dict[Atom, int]:
    """c*k*(x // k) + c*(x % k)  ->  c*x : undoes the split that a reshape round trip introduces."""
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
            if acc.get(partner) == c * a.k:
                del acc[a], acc[partner]
                for b, d in a.arg.terms:
                    acc[b] = acc.get(b, 0) + d * c
                acc = {b: d for b, d in acc.items() if d != 0}
                changed = True
                break
    return acc


def floordiv(e: Lin, k: int) -> Lin:
    """floor(e / k) for k > 0, simplified using term divisibility and ranges."""
    assert k > 0
    if k == 1:
        return e
    q_terms = {a: c // k for a, c in e.terms if c % k == 0}
    r = Lin(e.const % k, tuple((a, c) for a, c in e.terms if c % k != 0))
    q = _make(e.const // k, q_terms)
    lo, hi = r.bounds()
    if lo >= 0 and hi < k:
        return q
    if len(r.terms) == 1 and r.const == 0:
        atom, c = r.terms[0]
        if isinstance(atom, FloorDiv) and c == 1:
            return q + Lin.of(FloorDiv(atom.arg, atom.k * k))
    split = _split_common_factor(r, k)
    if split is not None:  # (g*A + B) // k == A // (k/g)  when 0 <= B < g
        a, _b, g = split
        return q + floordiv(a, k // g)
    return q + Lin.of(FloorDiv(r, k))


def _split_common_factor(r: Lin, k: int) -> tuple[Lin, Lin, int] | None:
    """Write r = g*A + B with g | k, g > 1 and 0 <= B < g, for the largest such g."""
    for g in sorted({math.gcd(k, c) for _, c in r.terms}, reverse=True):
        if g <= 1 or g == k:
            continue
        a = _make(r.const // g, {t: c // g for t, c in r.terms if c % g == 0})
        b = Lin(r.const % g, tuple((t, c) for t, c in r.terms if c % g != 0))
        lo, hi = b.bounds()
        if lo >= 0 and hi < g:
            return a, b, g
    return None


def mod(e: Lin, k: int) -> Lin:
    """e mod k (non-negative e), dropping multiples of k and proving the remainder already in range."""
    assert k > 0
    if k == 1:
        return Lin(0)
    r = Lin(e.const % k, tuple((a, c) for a, c in e.terms if c % k != 0))
    lo, hi = r.bounds()
    if lo >= 0 and hi < k:
        return r
    split = _split_common_factor(r, k)
    if split is not None:  # (g*A + B) % k == g*(A % (k/g)) + B  when 0 <= B < g
        a, b, g = split
        return mod(a, k // g) * g + b
    return Lin.of(Mod(r, k))


def linearize(index: Iterable[Lin], strides: Iterable[int]) -> Lin:
    out = Lin(0)
    for i, s in zip(index, strides):
        out = out + i * s
    return out


def unflatten(flat: Lin, shape: tuple[int, ...]) -> list[Lin]:
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


def render(e: Lin, dyn: Callable[[Dyn], str], floordiv: str = "/", times: str = "*") -> str:
    """The index as text, the one renderer of both code generators: C++ with the defaults; Triton (Python) with
    ``floordiv="//"`` - C's ``/`` truncates and Python's ``//`` floors, which agree here because index operands
    are never negative.  ``dyn`` prints a data-dependent atom (a loaded index)."""
    parts: list[str] = []
    for a, c in e.terms:
        if isinstance(a, Var):
            s = a.name
        elif isinstance(a, FloorDiv):
            s = f"(({render(a.arg, dyn, floordiv, times)}) {floordiv} {a.k})"
        elif isinstance(a, Mod):
            s = f"(({render(a.arg, dyn, floordiv, times)}) % {a.k})"
        else:
            s = dyn(a)
        parts.append(s if c == 1 else f"{c}{times}{s}")
    if e.const or not parts:
        parts.append(str(e.const))
    return " + ".join(parts).replace("+ -", "- ")
