"""Sizes that are the least or greatest of others (``sym.SymExtreme``: Dynamo's ``Min``/``Max`` of unrelated sizes,
a diagonal's length over a matrix of two symbolic sizes): canonical construction, bounds, evaluation, C++ and
Python text, and conversion from Dynamo's sympy expressions."""
import sympy

from kiln.ir import sym
from kiln.ir.sym import Symbol, extreme, from_sympy, has_extreme


A, B, C = Symbol("s0", 2, 100, 7), Symbol("s1", 3, None, 5), Symbol("s2", 2, 10, 4)


def test_provable_extremes_stay_plain():
    assert extreme([A, A + 1], smallest=True) == sym.size(A)          # differ by a constant
    assert extreme([A + 0, 1], smallest=False) == sym.size(A)         # A >= 2 > 1
    assert extreme([C, 20], smallest=True) == sym.size(C)             # C's range ends at 10


def test_unrelated_sizes_make_one_canonical_atom():
    m1, m2 = extreme([A, B], True), extreme([B, A], True)
    assert m1 == m2 and hash(m1) == hash(m2) and has_extreme(m1)
    nested = extreme([extreme([A, B], True), C], True)
    assert repr(nested) == "min(s0, s1, s2)"  # (a SizeExpr prints as Python)
    assert extreme([A, B, B + 1], True) == m1                         # a dominated argument dropped
    assert not has_extreme(sym.size(A) * 2 + 1)


def test_bounds_evaluation_and_text():
    m, x = extreme([A, B], True), extreme([A, C], False)
    assert sym.bounds(m) == (2.0, 100.0) and sym.bounds(x) == (2.0, 100.0)
    env = {"s0": 7, "s1": 5, "s2": 9}
    assert sym.evaluate(m, env) == 5 and sym.evaluate(x, env) == 9 and sym.evaluate(2 * m + x, env) == 19
    assert eval(sym.render(2 * m + 1, "py"), {}, env) == 11
    cpp = sym.render(m, "cpp")
    assert cpp == "((s0) < (s1) ? (s0) : (s1))", cpp
    assert sym.symbols_of(m * C) == {A, B, C}


def test_from_dynamo_sympy():
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    symbols = {"s0": A, "s1": B}
    assert from_sympy(sympy.Min(s0, s1), symbols) == extreme([A, B], True)
    assert from_sympy(sympy.Max(s0, s1) - 1, symbols) == extreme([A, B], False) - 1
