"""Size expressions: tensor sizes over the size symbols of a graph traced with dynamic shapes (docs/dynamic_shapes.md).

A ``SizeExpr`` is an immutable polynomial with integer coefficients in *atoms*: size symbols (``Symbol``, with
the range Dynamo proved for them), and floor divisions and remainders of expressions by a positive integer or
expression (``SymFloorDiv``, ``SymMod``).  Arithmetic keeps it canonical - terms merged, zero terms dropped,
monomials ordered - so two expressions for the same polynomial compare equal and hash alike; a result without a
symbol is a plain ``int`` (``size(...)`` normalizes), so static graphs never see a ``SizeExpr``::

    T = Symbol("s27", 2)            B = Symbol("s77", 2)
    n = 32 * B * T                  -> SizeExpr 32*s27*s77
    n // 8                          -> 4*s27*s77          (exact: every coefficient divisible)
    (B * T + 3) // T                -> (s27*s77 + 3) // s27  (not exact: an atom)
    (n + 5) - n                     -> 5                  (an int)

Comparisons ask what holds for every size in the symbols' ranges (``provably_lt`` / ``_le`` / ``_eq``), from the
interval of the difference; "not provable" is False, so callers keep the general case.  Symbols are never negative
(Dynamo's ranges start at 0 or 2), which makes each monomial's interval the product of its atoms' intervals; an
expression may be (Dynamo writes a convolution's output height as ``(-s) // 2 + 3``), so division and remainder
are Python's floor versions, simplified only where the argument is provably non-negative.

Dynamo's own expressions (sympy) are converted once, by ``from_sympy``; kernel IR arithmetic runs on these objects,
which are small tuples (sympy would cost ~100x per operation).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Union

INF = math.inf


class _Arithmetic:
    """Atoms take part in size arithmetic as the expressions they stand for (``2 * T + 1``)."""

    def _e(self) -> "SizeExpr":
        return SizeExpr.of(self)  # type: ignore[arg-type]

    def __add__(self, o: Any) -> "Size":
        return self._e() + o

    __radd__ = __add__

    def __sub__(self, o: Any) -> "Size":
        return self._e() - o

    def __rsub__(self, o: Any) -> "Size":
        return SizeExpr.of(o) - self._e()

    def __mul__(self, o: Any) -> "Size":
        return self._e() * o

    __rmul__ = __mul__

    def __floordiv__(self, o: Any) -> "Size":
        return floordiv(self, o)

    def __rfloordiv__(self, o: int) -> "Size":
        return floordiv(o, self)

    def __mod__(self, o: Any) -> "Size":
        return mod(self, o)

    def __rmod__(self, o: int) -> "Size":
        return mod(o, self)

    def __neg__(self) -> "Size":
        return -self._e()


@dataclasses.dataclass(frozen=True, eq=False)
class Symbol(_Arithmetic):
    """A size symbol and its range ``[lo, hi]`` (``hi`` None: unbounded); ``hint``: the value it had when the graph
    was traced (for heuristics that need a number: ``size_hint``).  Equal by name."""
    name: str
    lo: int = 0
    hi: int | None = None
    hint: int | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Symbol) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("sym", self.name))

    def bounds(self) -> tuple[float, float]:
        return float(self.lo), INF if self.hi is None else float(self.hi)

    def __repr__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class SymFloorDiv(_Arithmetic):
    """``floor(arg / k)`` for a positive ``k`` (Python's ``//``: Dynamo's expressions hold negative arguments too,
    ``(-s) // 2`` in a convolution's output size)."""
    arg: "SizeExpr"
    k: "Size"

    def bounds(self) -> tuple[float, float]:
        lo, hi = _bounds(self.arg)
        klo = max(_bounds(self.k)[0], 1.0)  # (a divisor is positive)
        khi = max(_bounds(self.k)[1], klo)
        if lo >= 0:
            low = float(math.floor(lo / khi)) if khi < INF else 0.0
        else:
            low = float(math.floor(lo / klo)) if math.isfinite(lo) else -INF
        if hi >= 0:
            high = float(math.floor(hi / klo)) if math.isfinite(hi) else INF
        else:
            high = float(math.floor(hi / khi)) if khi < INF else -1.0
        return low, high

    def __repr__(self) -> str:
        return f"({self.arg} // {self.k})"


@dataclasses.dataclass(frozen=True)
class SymMod(_Arithmetic):
    """``arg % k`` for a positive ``k`` (Python's: in ``[0, k)`` whatever the argument's sign)."""
    arg: "SizeExpr"
    k: "Size"

    def bounds(self) -> tuple[float, float]:
        lo, hi = _bounds(self.arg)
        khi = _bounds(self.k)[1]
        return 0.0, (min(hi, khi - 1) if lo >= 0 else khi - 1)

    def __repr__(self) -> str:
        return f"({self.arg} % {self.k})"


@dataclasses.dataclass(frozen=True)
class SymExtreme(_Arithmetic):
    """The least (``smallest``) or greatest of ``args``, where no one of them is so at every size: a diagonal's
    length ``Min(s0, s1)`` over a matrix of two unrelated sizes, ``Max(s0, s1)`` of a broadcast-like size.  Made by
    ``extreme`` (canonical: flattened, deduplicated, dominated arguments dropped, ordered), which returns the
    argument itself where one provably is the extreme.  C++ renders it as nested conditionals; the Triton kernels
    do not take it (``has_extreme``: such a graph gets a module per size)."""
    args: tuple["Size", ...]
    smallest: bool

    def bounds(self) -> tuple[float, float]:
        pick = min if self.smallest else max
        intervals = [_bounds(a) for a in self.args]
        return pick(lo for lo, _ in intervals), pick(hi for _, hi in intervals)

    def __repr__(self) -> str:
        return f"{'Min' if self.smallest else 'Max'}({', '.join(repr(a) for a in self.args)})"


def extreme(args: list["Size"], smallest: bool) -> "Size":
    """``min(args)`` (``smallest``) or ``max(args)`` as a size: the argument that provably is the extreme, else a
    ``SymExtreme`` of the arguments no other provably beats (nested extremes of the same kind flattened)."""
    flat: list[Size] = []
    for a in args:
        a = size(a)
        inner = _only_atom(a)
        if isinstance(inner, SymExtreme) and inner.smallest == smallest:
            flat.extend(inner.args)
        else:
            flat.append(a)
    unique = list(dict.fromkeys(flat))
    picked = _provable_extreme(unique, smallest)
    if picked is not None:
        return picked

    def beaten(a: Size) -> bool:  # another argument is provably at least as extreme at every size
        return any(b != a and (provably_le(b, a) if smallest else provably_le(a, b)) for b in unique)
    kept = [a for a in unique if not beaten(a)]
    if len(kept) == 1:
        return kept[0]
    return SizeExpr.of(SymExtreme(tuple(sorted(kept, key=repr)), smallest))


def _only_atom(x: "Size") -> Any:
    """The atom ``x`` is, when it is one atom alone (coefficient 1, power 1, no constant)."""
    if isinstance(x, SizeExpr) and not x.const and len(x.terms) == 1:
        (monomial, coef), = x.terms
        if coef == 1 and len(monomial) == 1 and monomial[0][1] == 1:
            return monomial[0][0]
    return None


def has_extreme(x: Any) -> bool:
    """Does size ``x`` (or any size in a list or tuple) hold a ``SymExtreme``?"""
    if isinstance(x, (list, tuple)):
        return any(has_extreme(v) for v in x)
    if isinstance(x, SymExtreme):
        return True
    if isinstance(x, (SymFloorDiv, SymMod)):
        return has_extreme(x.arg) or has_extreme(x.k)
    if isinstance(x, FloatSize):
        return any(has_extreme(a) for a in x.args)
    if isinstance(x, SizeExpr):
        return any(has_extreme(a) for a in x.atoms())
    return False


@dataclasses.dataclass(frozen=True)
class FloatSize:
    """A float computed from sizes (Dynamo's ``SymFloat``: the scale ``1 / sqrt(D)`` of attention over a symbolic
    head size): ``op`` applied to ``args`` (sizes, ``FloatSize``s, Python numbers).  ``op``: ``float`` (an int size
    as a float), ``pow``, ``truediv``, ``mul``, ``add``, ``sub``, ``neg``.  Evaluated in double precision, as
    Python evaluates Dynamo's expression."""
    op: str
    args: tuple

    def __repr__(self) -> str:
        return render(self, "py")


_FLOAT_OPS = {"pow": lambda a, b: a ** b, "truediv": lambda a, b: a / b, "mul": lambda a, b: a * b,
              "add": lambda a, b: a + b, "sub": lambda a, b: a - b}


Atom = Union[Symbol, SymFloorDiv, SymMod, SymExtreme]
Monomial = tuple[tuple[Atom, int], ...]  # (atom, power >= 1), ordered by repr
Size = Union[int, "SizeExpr"]


def _order(atom: Atom) -> str:
    return repr(atom)


@dataclasses.dataclass(frozen=True)
class SizeExpr:
    """``const + sum(coef * monomial)``; build with arithmetic on ``Symbol``-based expressions or ``size()``."""
    const: int = 0
    terms: tuple[tuple[Monomial, int], ...] = ()

    # ------------------------------------------------------------------ construction
    @staticmethod
    def of(x: "Size | Atom") -> "SizeExpr":
        if isinstance(x, SizeExpr):
            return x
        if isinstance(x, int):
            return SizeExpr(x)
        return SizeExpr(0, ((((x, 1),), 1),))

    def __add__(self, other: "Size | Atom") -> Size:
        o = SizeExpr.of(other)
        acc = dict(self.terms)
        for m, c in o.terms:
            acc[m] = acc.get(m, 0) + c
        return _make(self.const + o.const, acc)

    __radd__ = __add__

    def __neg__(self) -> Size:
        return _make(-self.const, {m: -c for m, c in self.terms})

    def __sub__(self, other: "Size | Atom") -> Size:
        return self + (-SizeExpr.of(other))

    def __rsub__(self, other: "Size | Atom") -> Size:
        return SizeExpr.of(other) + (-self)

    def __mul__(self, other: "Size | Atom") -> Size:
        o = SizeExpr.of(other)
        acc: dict[Monomial, int] = {}
        const = self.const * o.const
        for m, c in self.terms:
            if o.const:
                acc[m] = acc.get(m, 0) + c * o.const
        for m, c in o.terms:
            if self.const:
                acc[m] = acc.get(m, 0) + c * self.const
            for m2, c2 in self.terms:
                p = _monomial_product(m, m2)
                acc[p] = acc.get(p, 0) + c * c2
        return _make(const, acc)

    __rmul__ = __mul__

    def __floordiv__(self, k: "Size | Atom") -> Size:
        return floordiv(self, k)

    def __rfloordiv__(self, other: int) -> Size:
        return floordiv(other, self)

    def __mod__(self, k: "Size | Atom") -> Size:
        return mod(self, k)

    def __rmod__(self, other: int) -> Size:
        return mod(other, self)

    # ------------------------------------------------------------------ queries
    def atoms(self) -> set[Atom]:
        return {a for m, _ in self.terms for a, _ in m}

    def symbols(self) -> set[Symbol]:
        found: set[Symbol] = set()
        for a in self.atoms():
            if isinstance(a, Symbol):
                found.add(a)
            elif isinstance(a, SymExtreme):
                found = found.union(*(symbols_of(v) for v in a.args))
            else:
                found |= symbols_of(a.arg) | symbols_of(a.k)
        return found

    def __repr__(self) -> str:
        return render(self, "py")


def _monomial_product(a: Monomial, b: Monomial) -> Monomial:
    powers: dict[Atom, int] = dict(a)
    for atom, p in b:
        powers[atom] = powers.get(atom, 0) + p
    return tuple(sorted(powers.items(), key=lambda t: _order(t[0])))


def _make(const: int, acc: dict[Monomial, int]) -> Size:
    terms = tuple(sorted(((m, c) for m, c in acc.items() if c), key=lambda t: repr(t[0])))
    return SizeExpr(const, terms) if terms else const


def size(x: "Size | Atom") -> Size:
    """``x`` in canonical form: an ``int`` when it holds no symbol."""
    if isinstance(x, int):
        return x
    e = SizeExpr.of(x)
    return e if e.terms else e.const


def is_symbolic(x: Any) -> bool:
    return isinstance(x, (SizeExpr, Symbol, SymFloorDiv, SymMod, SymExtreme, FloatSize))


def as_symbol(x: Any) -> Symbol | None:
    """The symbol ``x`` is, when it is one symbol alone (``s27``, not ``2*s27`` or ``s27 + 1``)."""
    atom = _only_atom(x)
    return atom if isinstance(atom, Symbol) else None


def symbols_of(x: "Size | Atom") -> set[Symbol]:
    if isinstance(x, FloatSize):
        return set().union(*(symbols_of(a) for a in x.args))
    return SizeExpr.of(x).symbols() if is_symbolic(x) else set()


# ------------------------------------------------------------------ division
def _divisible(x: Size, k: int) -> bool:
    """Is every value of ``x`` a multiple of ``k`` (by its coefficients: sufficient, not necessary)?"""
    e = SizeExpr.of(x)
    return e.const % k == 0 and all(c % k == 0 for _, c in e.terms)


def _exact_quotient(x: SizeExpr, k: SizeExpr) -> Size | None:
    """``x / k`` when ``k`` is one monomial (times a coefficient) dividing every term of ``x`` exactly."""
    if k.const or len(k.terms) != 1 or x.const:
        return None
    (km, kc), = k.terms
    acc: dict[Monomial, int] = {}
    for m, c in x.terms:
        powers = dict(m)
        for atom, p in km:
            if powers.get(atom, 0) < p:
                return None
            powers[atom] -= p
        if c % kc:
            return None
        q = tuple(sorted(((a, p) for a, p in powers.items() if p), key=lambda t: _order(t[0])))
        acc[q] = acc.get(q, 0) + c // kc
    const = acc.pop((), 0)
    return _make(const, acc)


def floordiv(x: "Size | Atom", k: "Size | Atom") -> Size:
    """``x // k`` (Python's floor) for a positive ``k``: exact where the coefficients allow, zero where
    ``0 <= x < k`` provably, else an atom."""
    x, k = size(x), size(k)
    if x == 0:
        return 0
    if isinstance(k, int):
        if k <= 0:
            raise ValueError(f"size division by {k}")
        if k == 1:
            return x
        if isinstance(x, int):
            return x // k
        if _divisible(x, k):
            return _make(x.const // k, {m: c // k for m, c in x.terms})
    else:
        if x == k:
            return 1
        q = _exact_quotient(SizeExpr.of(x), k)
        if q is not None:
            return q
    if provably_le(0, x) and provably_lt(x, k):
        return 0
    return size(SymFloorDiv(SizeExpr.of(x), k))


def mod(x: "Size | Atom", k: "Size | Atom") -> Size:
    """``x % k`` (Python's, in ``[0, k)``) for a positive ``k``."""
    x, k = size(x), size(k)
    if isinstance(k, int) and k <= 0:
        raise ValueError(f"size remainder by {k}")
    if isinstance(x, int) and isinstance(k, int):
        return x % k
    if x == 0 or k == 1 or (isinstance(k, int) and _divisible(x, k)) or x == k:
        return 0
    if not isinstance(k, int) and _exact_quotient(SizeExpr.of(x), SizeExpr.of(k)) is not None:
        return 0
    if provably_le(0, x) and provably_lt(x, k):
        return x
    return size(SymMod(SizeExpr.of(x), k))


# ------------------------------------------------------------------ ranges and comparisons
def _mul(a: float, b: float) -> float:
    return 0.0 if a == 0 or b == 0 else a * b  # (0 * inf is 0 here: a zero factor zeroes the term)


def _interval_product(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    products = [_mul(x, y) for x in a for y in b]
    return min(products), max(products)


def _interval_power(a: tuple[float, float], p: int) -> tuple[float, float]:
    result = (1.0, 1.0)
    for _ in range(p):
        result = _interval_product(result, a)
    if p % 2 == 0:  # (an even power is never negative, though the product of intervals may say so)
        result = (max(result[0], 0.0), result[1])
    return result


def _bounds(x: "Size | Atom") -> tuple[float, float]:
    """Interval of ``x`` over the symbols' ranges (interval arithmetic: an enclosure, not always the tightest)."""
    if isinstance(x, int):
        return float(x), float(x)
    if not isinstance(x, SizeExpr):
        return x.bounds()
    lo = hi = float(x.const)
    for m, c in x.terms:
        interval = (1.0, 1.0)
        for atom, p in m:
            interval = _interval_product(interval, _interval_power(atom.bounds(), p))
        tlo, thi = _interval_product(interval, (float(c), float(c)))
        lo, hi = lo + tlo, hi + thi
        lo, hi = (-INF if lo != lo else lo), (INF if hi != hi else hi)  # (inf - inf: unknown)
    return lo, hi


def bounds(x: "Size | Atom") -> tuple[float, float]:
    """The smallest and largest value ``x`` takes over its symbols' ranges (``math.inf`` if unbounded)."""
    return _bounds(x)


def provably_lt(a: "Size | Atom", b: "Size | Atom") -> bool:
    """``a < b`` for every size in the symbols' ranges (False: not provable here)."""
    return _bounds(size(b) - size(a) if is_symbolic(a) or is_symbolic(b) else b - a)[0] >= 1


def provably_le(a: "Size | Atom", b: "Size | Atom") -> bool:
    return _bounds(size(b) - size(a) if is_symbolic(a) or is_symbolic(b) else b - a)[0] >= 0


def provably_eq(a: "Size | Atom", b: "Size | Atom") -> bool:
    """The same polynomial (equal for every size)."""
    return size(a) == size(b)


# ------------------------------------------------------------------ evaluation and text
def evaluate(x: "Size | Atom", env: dict[str, int]) -> int:
    """The value of ``x`` with each symbol ``name`` bound to ``env[name]``."""
    if isinstance(x, (int, float)):
        return x
    if isinstance(x, FloatSize):
        values = [float(evaluate(a, env)) for a in x.args]
        if x.op == "float":
            return values[0]
        if x.op == "neg":
            return -values[0]
        return float(_FLOAT_OPS[x.op](*values))
    if isinstance(x, Symbol):
        return env[x.name]
    if isinstance(x, SymFloorDiv):
        return evaluate(x.arg, env) // evaluate(x.k, env)
    if isinstance(x, SymMod):
        return evaluate(x.arg, env) % evaluate(x.k, env)
    if isinstance(x, SymExtreme):
        return (min if x.smallest else max)(evaluate(a, env) for a in x.args)
    total = x.const
    for m, c in x.terms:
        v = c
        for atom, p in m:
            v *= evaluate(atom, env) ** p
        total += v
    return total


class PerSize:
    """A value chosen per call's sizes rather than computed from them: a library call's schedule tuned per size
    bucket (``library/gemm/tune.py`` ``BucketSchedules``).  It sits in a node's attributes like a size expression
    and is made concrete with them - ``at(env)`` when a size's Program is made (``schedule/specialize.py``) or the
    reference interpreter runs the graph at some sizes - but is not an expression: nothing renders or compares it.
    Subclasses answer ``at``; ``repr`` is what a printed graph shows."""

    def at(self, env: dict[str, int]) -> Any:
        raise NotImplementedError


def concrete(x: Any, env: dict[str, int] | None) -> Any:
    """``x`` with its symbols bound (``evaluate``) when it is a size expression and ``env`` is given (a ``PerSize``
    value: its value at ``env``); lists and tuples item by item; anything else as it is."""
    if env is None:
        return x
    if is_symbolic(x):
        return evaluate(x, env)
    if isinstance(x, PerSize):
        return x.at(env)
    if isinstance(x, (list, tuple)):
        return type(x)(concrete(v, env) for v in x)
    return x


def bucket(n: int) -> int:
    """The size bucket of ``n``: the next power of two (1, 2, 4, ... 64, 128, ...).  Measured choices and schedules
    for sizes known per call only are kept per bucket: what runs fastest moves with a size's order of magnitude,
    not with each value (docs/dynamic_shapes.md, layer 7)."""
    return 1 << max(0, n - 1).bit_length()


def bucket_hint(x: "Size | Atom") -> int:
    """The size a measured choice is made at: ``x`` itself when static, else the bucket of its traced value - so
    graphs traced at 37 and 50 tokens share one measurement (and one tuning record) at 64."""
    return x if isinstance(x, int) else bucket(size_hint(x))


def size_hint(x: "Size | Atom") -> int:
    """A typical value of ``x``: its symbols at the values they were traced with (else their lower bound).  For
    heuristics only (an order, a first guess); a decision that must hold for every size uses ``provably_*``."""
    if isinstance(x, int):
        return x
    syms = SizeExpr.of(x).symbols() if isinstance(x, SizeExpr) else symbols_of(x)  # (a FloatSize: a float)
    return evaluate(x, {s.name: s.hint if s.hint is not None else max(s.lo, 2) for s in syms})


def render(x: "Size | Atom", lang: str = "cpp", name: Callable[[Symbol], str] | None = None) -> str:
    """``x`` as C++ (``int64_t`` arithmetic; operands are non-negative, so ``/`` is the floor) or Python text;
    ``name`` spells a symbol (default: its own name)."""
    spell = name or (lambda s: s.name)
    div = "/" if lang == "cpp" else "//"
    if isinstance(x, float):
        return repr(x) if lang != "cpp" or math.isfinite(x) else ("(1.0 / 0.0)" if x > 0 else "(-1.0 / 0.0)")
    if isinstance(x, FloatSize):
        a = [render(v, lang, name) for v in x.args]
        if x.op == "float":
            return f"static_cast<double>({a[0]})" if lang == "cpp" else f"float({a[0]})"
        if x.op == "neg":
            return f"(-{a[0]})"
        if x.op == "pow":
            return f"std::pow(static_cast<double>({a[0]}), static_cast<double>({a[1]}))" if lang == "cpp" \
                else f"({render_factor(x.args[0], lang, name)} ** {render_factor(x.args[1], lang, name)})"
        sign = {"truediv": "/", "mul": "*", "add": "+", "sub": "-"}[x.op]
        # the right operand binds as one factor: ``A / s0*s1`` would divide by s0 and multiply by s1 (an
        # instance norm's ``1 / (N*C*H*W / (N*C))`` over symbolic sizes came out (H*W)^-1 * (N*C)^-2 times too small)
        right = a[1] if x.op in ("add", "mul") else render_factor(x.args[1], lang, name)
        return f"(static_cast<double>({a[0]}) {sign} {right})" if lang == "cpp" else f"({a[0]} {sign} {right})"
    if isinstance(x, int):
        return str(x) if lang != "cpp" or abs(x) < 2**31 else f"INT64_C({x})"
    if isinstance(x, Symbol):
        return spell(x)
    if isinstance(x, SymExtreme):
        parts = [render(a, lang, name) for a in x.args]
        if lang != "cpp":
            return f"{'min' if x.smallest else 'max'}({', '.join(parts)})"
        text, sign = parts[0], "<" if x.smallest else ">"
        for p in parts[1:]:  # (nested conditionals: no header needed, each operand a plain int64 expression)
            text = f"(({text}) {sign} ({p}) ? ({text}) : ({p}))"
        return text
    if isinstance(x, (SymFloorDiv, SymMod)):
        a, k = render(x.arg, lang, name), render_factor(x.k, lang, name)
        if lang == "cpp" and _bounds(x.arg)[0] < 0:  # (C's / and % truncate: the prelude's floor versions)
            return f"kiln_{'floordivi' if isinstance(x, SymFloorDiv) else 'remi'}<int64_t>({a}, {k})"
        if lang == "py" and _bounds(x.arg)[0] < 0:
            # Triton's // and % truncate as C's do (Python's floor): a possibly negative numerator gets the floor
            # remainder ((a % k) + k) % k, the same in both languages, and an exact division by k after it
            # (``(2*s1 - s0) // 2`` kept as ``s1 + (-s0 // 2)``: a convolution's output size; fuzz_symbolic
            # --target triton seed 251 wrote past its buffers)
            rem = f"((({a}) % {k} + {k}) % {k})"
            return rem if isinstance(x, SymMod) else f"((({a}) - {rem}) // {k})"
        return f"({a} {div if isinstance(x, SymFloorDiv) else '%'} {k})"
    parts = []
    for m, c in x.terms:
        factors = [render(a, lang, name) for a, p in m for _ in range(p)]
        text = "*".join(factors)
        parts.append(text if c == 1 else (f"-{text}" if c == -1 else f"{c}*{text}"))
    if x.const or not parts:
        parts.append(str(x.const))
    text = " + ".join(parts).replace("+ -", "- ")
    return f"({text})" if len(parts) > 1 else text


def render_factor(x: "Size | Atom", lang: str = "cpp", name: Callable[[Symbol], str] | None = None) -> str:
    """``x`` as text that binds as one operand of ``*``, ``/`` or ``%``: a product is parenthesized (``a / s0*s1``
    would divide by ``s0`` only)."""
    text = render(x, lang, name)
    return text if isinstance(x, (int, Symbol)) or as_symbol(x) is not None or text.startswith("(") and \
        _balanced_outer(text) else f"({text})"


def _balanced_outer(text: str) -> bool:
    """Does the opening parenthesis of ``text`` close at its end (``(a + b)``, not ``(a) * (b)``)?"""
    depth = 0
    for k, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return k == len(text) - 1
    return False


# ------------------------------------------------------------------ from Dynamo's sympy expressions
class UnsupportedSize(ValueError):
    """A size expression kiln has no form for (a ``Max``, a non-integer power, ...)."""


def symbols_of_shape_env(shape_env: Any) -> dict[str, Symbol]:
    """kiln's ``Symbol`` for each size symbol of a Dynamo ``ShapeEnv``, with the range Dynamo proved for it."""
    import sympy
    found = {}
    hints = getattr(shape_env, "backed_var_to_val", None)  # (torch 2.13; var_to_val before, deprecated since)
    if hints is None:
        hints = getattr(shape_env, "var_to_val", {})
    for s, r in shape_env.var_to_range.items():
        lo = int(r.lower) if isinstance(r.lower, sympy.Integer) else 0
        hi = int(r.upper) if isinstance(r.upper, sympy.Integer) else None  # (torch's int_oo is no Integer)
        hint = hints.get(s)
        found[s.name] = Symbol(s.name, max(lo, 0), hi, int(hint) if isinstance(hint, sympy.Integer) else None)
    return found


def _is_float(x: Any) -> bool:
    return isinstance(x, (float, FloatSize))


def from_sympy(expr: Any, symbols: dict[str, Symbol]) -> Size:
    """Dynamo's size expression (sympy, with torch's ``FloorDiv``/``ModularIndexing``/``CleanDiv``) as a ``Size``;
    ``symbols`` maps each symbol's name to kiln's ``Symbol`` (with its range)."""
    import sympy
    if isinstance(expr, int):
        return expr
    if isinstance(expr, sympy.Integer) or (isinstance(expr, sympy.Number) and expr == int(expr)):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        if expr.name not in symbols:
            raise UnsupportedSize(f"unknown size symbol {expr.name}")
        s = symbols[expr.name]
        return s.lo if s.hi == s.lo else SizeExpr.of(s)  # (a range of one value: Dynamo proved it static)
    if isinstance(expr, sympy.Float):
        return float(expr)
    args = [from_sympy(a, symbols) for a in expr.args]
    kind = type(expr).__name__
    if any(_is_float(a) for a in args) and isinstance(expr, (sympy.Add, sympy.Mul)):
        result = args[0]
        for a in args[1:]:
            result = FloatSize("add" if isinstance(expr, sympy.Add) else "mul", (result, a))
        return result
    if isinstance(expr, sympy.Pow) and any(_is_float(a) for a in args):
        return FloatSize("pow", tuple(args))
    if isinstance(expr, sympy.Add):
        total: Size = 0
        for a in args:
            total = size(SizeExpr.of(total) + a)
        return total
    if isinstance(expr, sympy.Mul):
        product: Size = 1
        for a in args:
            product = size(SizeExpr.of(product) * a)
        return product
    if isinstance(expr, sympy.Pow) and isinstance(args[1], int) and args[1] >= 0:
        result: Size = 1
        for _ in range(args[1]):
            result = size(SizeExpr.of(result) * args[0])
        return result
    if kind == "ToFloat" and len(args) == 1:
        return FloatSize("float", (args[0],))
    if kind in ("FloatPow", "PowByNatural") and len(args) == 2 and _is_float(args[0]):
        return FloatSize("pow", tuple(args))
    if kind in ("FloatTrueDiv", "IntTrueDiv") and len(args) == 2:  # (IntTrueDiv: ``n / 3`` of int sizes, a float)
        return FloatSize("truediv", tuple(args))
    if kind in ("FloorDiv", "CleanDiv") and len(args) == 2:
        return floordiv(args[0], args[1])
    if kind == "ModularIndexing" and len(args) == 3:
        return mod(floordiv(args[0], args[1]), args[2])
    if kind in ("Mod", "PythonMod") and len(args) == 2:
        return mod(args[0], args[1])
    if kind in ("Min", "Max") and args and not any(_is_float(a) for a in args):
        return extreme(args, kind == "Min")
    if kind in ("TruncToInt", "FloorToInt", "CeilToInt") and len(args) == 1:
        rounded = _rounded_dyadic_multiple(args[0], ceil=kind == "CeilToInt")
        if rounded is not None:
            return rounded
    raise UnsupportedSize(f"size expression {expr} ({kind})")


def _scaled_size(x: Any) -> tuple[float, "Size"] | None:
    """``(c, e)`` where the float ``x`` is ``c * float(e)`` for an integer size ``e`` and a number ``c``
    (``1.5*ToFloat(s0)``: an interpolation's output size at a scale factor), else None."""
    if isinstance(x, FloatSize) and x.op == "float" and not _is_float(x.args[0]):
        return 1.0, x.args[0]
    if isinstance(x, FloatSize) and x.op == "mul" and len(x.args) == 2:
        for c, rest in ((x.args[0], x.args[1]), (x.args[1], x.args[0])):
            inner = _scaled_size(rest)
            if isinstance(c, (int, float)) and inner is not None:
                return c * inner[0], inner[1]
    return None


def _dyadic_ratio(c: float) -> tuple[int, int] | None:
    """``c`` as ``p / q`` with ``q`` a small power of two (1.5 = 3/2, 0.25 = 1/4), or None: then ``c * n`` in
    double precision is exactly ``p * n / q`` for every size ``n`` below 2**40, and floors agree with the
    integer division."""
    if not math.isfinite(c) or c < 0:
        return None
    p, q = float(c).as_integer_ratio()
    return (p, q) if q <= 1 << 12 and abs(p) < 1 << 20 else None


def _rounded_dyadic_multiple(x: Any, ceil: bool) -> "Size | None":
    """``trunc``/``floor``/``ceil`` of ``c * float(e)`` as integer arithmetic, where ``c`` is dyadic and ``e`` is a
    size (non-negative: trunc is floor): an interpolation with ``scale_factor=1.5`` over a symbolic height."""
    scaled = _scaled_size(x)
    if scaled is None:
        return None
    ratio = _dyadic_ratio(scaled[0])
    if ratio is None or _bounds(scaled[1])[0] < 0:
        return None
    p, q = ratio
    numerator = size(SizeExpr.of(scaled[1]) * p)
    return floordiv(numerator + (q - 1), q) if ceil else floordiv(numerator, q)


def _provable_extreme(args: list[Size], smallest: bool) -> Size | None:
    """The least (greatest) of ``args`` where one is provably so at every size in the symbols' ranges: they
    differ by constants (``Min(s0, s0 - 1)`` - a diagonal's length over a square matrix, which sympy leaves
    unsimplified) or the ranges decide (``Max(0, s0 - 2)`` with ``s0 >= 2``).  None otherwise (a ``Min`` of two
    unrelated sizes has no form here)."""
    for pick in args:
        if all(provably_le(pick, other) if smallest else provably_le(other, pick) for other in args):
            return pick
    return None
