"""Index expressions over symbolic sizes (kiln/ir/index.py, [Note: symbolic indices]): the simplifier's rules hold
for every size in the symbols' ranges, and a symbolic expression evaluated at a binding equals the one built
from the concrete sizes."""
import random

import pytest

from kiln.ir import sym
from kiln.ir.index import Lin, Var, evaluate, linearize, unflatten, render
from kiln.ir.ops import contiguous_strides

T = sym.Symbol("s0", 2, None, 7)
B = sym.Symbol("s1", 2, 64, 3)


def _e(x):
    return sym.SizeExpr.of(x)


def test_divisions_a_reshape_introduces_vanish():
    b, t, c = Var("b", _e(B)), Var("t", _e(T)), Var("c", 768)
    flat = Lin.of(b) * (_e(T) * 768) + Lin.of(t) * 768 + c
    assert flat.floordiv(_e(T) * 768) == Lin.of(b)
    assert flat.mod(768) == Lin.of(c)
    assert flat.floordiv(768).mod(_e(T)) == Lin.of(t)
    # the row-major round trip over [B, T, 768] is the identity
    parts = unflatten(flat, (_e(B), _e(T), 768))
    assert parts == [Lin.of(b), Lin.of(t), Lin.of(c)]


def test_a_division_that_only_some_sizes_allow_stays():
    t = Var("t", _e(T) + 1)  # t reaches T: (t // T) is 1 at the last step
    e = Lin.of(t).floordiv(_e(T))
    assert e != Lin(0)
    assert evaluate(e, {"t": 7}, {"s0": 7}) == 1


def test_bounds_are_expressions():
    t = Var("t", _e(T))
    e = Lin.of(t) * 3 + 2
    lo, hi = e.bounds()
    assert lo == 2 and hi == sym.size(3 * _e(T) - 1)


def test_text_of_a_symbolic_index():
    b, t = Var("b", _e(B)), Var("t", _e(T))
    e = Lin.of(b) * (_e(T) * 64) + Lin.of(t) * 64 + _e(T)
    assert render(e, lambda d: "?") == "64*s0*b + 64*t + s0"
    assert render(e.floordiv(_e(T) + 1), lambda d: "?", floordiv="//").endswith("// (s0 + 1))")


def _random_shape(rng: random.Random) -> list:
    choices = [2, 3, 4, 5, _e(T), _e(B), 2 * _e(T)]
    return [rng.choice(choices) for _ in range(rng.randint(1, 4))]


def _merge(shape: list, rng: random.Random) -> list:
    """A random grouping of adjacent dims into one (a reshape that merges)."""
    out, k = [], 0
    while k < len(shape):
        n = rng.randint(1, len(shape) - k)
        size = 1
        for s in shape[k:k + n]:
            size = sym.size(size * s)
        out.append(size)
        k += n
    return out


def _bind(shape: list, env: dict) -> list:
    return [sym.evaluate(s, env) if sym.is_symbolic(s) else s for s in shape]


@pytest.mark.parametrize("seed", range(40))
def test_view_chains_agree_with_their_concrete_versions(seed):
    rng = random.Random(seed)
    shape = _random_shape(rng)
    merged = _merge(shape, rng)
    perm = list(range(len(shape)))
    rng.shuffle(perm)

    def build(shape, merged):
        # read a permuted view of ``shape`` at the position of a loop nest over ``merged``
        vars_ = [Var(f"i{k}", n) for k, n in enumerate(merged)]
        flat = linearize([Lin.of(v) for v in vars_], contiguous_strides(tuple(merged)))
        idx = unflatten(flat, tuple(shape[p] for p in perm))
        src = [Lin(0)] * len(shape)
        for d, p in enumerate(perm):
            src[p] = idx[d]
        return vars_, linearize(src, contiguous_strides(tuple(shape)))

    vars_, symbolic = build(shape, merged)
    if perm == sorted(perm):  # a merge alone: the position is the flat loop index, with no division left
        assert all(isinstance(a, Var) for a in symbolic.atoms()), symbolic
    for _ in range(3):
        env = {"s0": rng.randint(2, 9), "s1": rng.randint(2, 9)}
        cvars, concrete = build(_bind(shape, env), _bind(merged, env))
        for _ in range(20):
            at = {v.name: rng.randrange(sym.evaluate(v.size, env) if sym.is_symbolic(v.size) else v.size)
                  for v in vars_}
            assert evaluate(symbolic, at, env) == evaluate(concrete, at), (shape, merged, perm, symbolic)


def test_a_product_divisor_is_printed_as_one_operand():
    """``i / s0*s1`` in C++ divides by ``s0`` and multiplies by ``s1``: a symbolic divisor is parenthesized, in
    index text and in size expressions alike (fuzz seed 9 through kiln's backend read a wrong element)."""
    t = Var("t", _e(T) * _e(B) + 5)
    text = render(Lin.of(t).floordiv(_e(T) * _e(B)), lambda d: "?")
    assert text.endswith("/ (s0*s1))"), text
    text = render(Lin.of(t).mod(_e(T) * _e(B)), lambda d: "?")
    assert text.endswith("% (s0*s1))"), text
    assert sym.render(sym.floordiv(_e(T) + 1, _e(T) * _e(B))).endswith("/ (s0*s1))")


def test_floats_computed_from_sizes():
    """Dynamo's SymFloat expressions (ToFloat, FloatPow, FloatTrueDiv) as sym.FloatSize: evaluated in double
    precision, printed as C++ and Python."""
    import math

    import sympy
    from torch.utils._sympy.functions import FloatPow, FloatTrueDiv, ToFloat
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    expr = FloatTrueDiv(sympy.Float(1.0), FloatPow(ToFloat(s0), sympy.Float(0.5)))
    f = sym.from_sympy(expr, {"s0": T})
    assert sym.is_symbolic(f) and sym.symbols_of(f) == {T}
    assert sym.evaluate(f, {"s0": 16}) == 0.25
    assert math.isclose(eval(sym.render(f, "py"), {"s0": 7}), 7 ** -0.5)
    assert "std::pow" in sym.render(f) and "static_cast<double>(s0)" in sym.render(f)
