"""Size expressions (ir/sym.py): canonical forms, exact and inexact division, ranges, evaluation, text, and the
conversion of Dynamo's own expressions - the first layer of dynamic shapes (docs/dynamic_shapes.md)."""
import math
import random

import pytest
import torch

from kiln.ir.sym import (SizeExpr, Symbol, SymFloorDiv, UnsupportedSize, bounds, evaluate, floordiv, from_sympy,
                         mod, provably_eq, provably_le, provably_lt, render, size, symbols_of,
                         symbols_of_shape_env)

T, B = Symbol("s27", 2), Symbol("s77", 2)


def test_canonical_form_and_plain_ints():
    n = 32 * B * T
    assert n == T * 32 * B and hash(n) == hash(T * B * 32)
    assert (n + 5) - n == 5 and isinstance((n + 5) - n, int)
    assert size(SizeExpr.of(7)) == 7 and T * 0 == 0
    assert render(n - 3 * T, "py") == "(32*s27*s77 - 3*s27)"
    assert symbols_of(n + B) == {T, B}
    assert Symbol("s27", 5) == T  # equal by name


def test_division_exact_where_coefficients_allow_else_an_atom():
    assert floordiv(32 * B * T, 8) == 4 * B * T
    assert floordiv(6 * B * T, 3 * T) == 2 * B
    assert floordiv(B * T, B * T) == 1
    q = floordiv(B * T + 3, T)
    assert isinstance(SizeExpr.of(q).terms[0][0][0][0], SymFloorDiv)
    assert mod(4 * T, 2) == 0 and mod(T * B, T) == 0 and mod(T + 1, 1) == 0
    assert floordiv(1, T) == 0 and mod(1, T) == 1  # (1 < T for T >= 2)
    assert floordiv(-T, 2) != 0 and evaluate(floordiv(-T, 2), {"s27": 3}) == -2  # (not "below 2, so 0")
    with pytest.raises(ValueError):
        floordiv(T, 0)


def test_ranges_decide_comparisons():
    assert bounds(T - 1) == (1.0, float("inf"))
    assert provably_lt(T - 1, T) and provably_le(2, T) and not provably_lt(T, B)
    assert not provably_lt(T, 2 * T - 2)  # T = 2 makes them equal
    assert provably_le(T, 2 * T - 2) and provably_eq(T * B, B * T)
    bounded = Symbol("s1", 1, 64)
    assert provably_lt(bounded, 65) and not provably_lt(bounded, 64)
    assert bounds(floordiv(B * T + 3, T)) == (0.0, float("inf"))  # (intervals: B is not found)


def _random_expr(rng, depth):
    """(expression, function of the symbols' values computing the same thing with Python ints)."""
    if depth == 0 or rng.random() < 0.3:
        if rng.random() < 0.5:
            c = rng.randint(0, 9)
            return c, lambda env, c=c: c
        s = rng.choice([T, B])
        return SizeExpr.of(s), lambda env, s=s: env[s.name]
    a, fa = _random_expr(rng, depth - 1)
    b, fb = _random_expr(rng, depth - 1)
    op = rng.choice("+*-/%")
    if op == "+":
        return size(SizeExpr.of(a) + b), lambda env: fa(env) + fb(env)
    if op == "*":
        return size(SizeExpr.of(a) * b), lambda env: fa(env) * fb(env)
    if op == "-":  # differences go negative (Dynamo's (-s) // 2 + 3): division and remainder floor them
        return size(SizeExpr.of(a) - b), lambda env: fa(env) - fb(env)
    d, fd = (size(SizeExpr.of(b) * b + 1), lambda env: fb(env) * fb(env) + 1)  # a positive divisor
    if op == "/":
        return floordiv(a, d), lambda env: fa(env) // fd(env)
    return mod(a, d), lambda env: fa(env) % fd(env)


def test_arithmetic_agrees_with_integers_under_every_binding():
    rng = random.Random(0)
    for _ in range(400):
        expr, reference = _random_expr(rng, 4)
        for _ in range(5):
            env = {"s27": rng.randint(2, 40), "s77": rng.randint(2, 40)}
            want = reference(env)
            assert evaluate(expr, env) == want, (expr, env)
            assert eval(render(expr, "py"), {}, dict(env)) == want, render(expr, "py")
            lo, hi = bounds(expr)
            assert lo <= want <= hi, (expr, env, lo, hi)


def test_cpp_text():
    assert render(floordiv(B * T + 3, T)) == "((s27*s77 + 3) / s27)"
    assert render(2**40 + 0 * T) == "INT64_C(1099511627776)"
    assert render(floordiv(-T, 2)) == "kiln_floordivi<int64_t>(-s27, 2)"  # (C's / truncates a negative)
    assert render(B, name=lambda s: f"kiln_sizes[{s.name[1:]}]") == "kiln_sizes[77]"


def test_python_and_triton_text_floor_a_negative_numerator():
    """Kernel text for Triton (``lang="py"``): Triton's ``//`` and ``%`` truncate as C's do, so a numerator that
    may be negative (``-s27 // 2``, what a convolution's output size ``(2*s77 - s27) // 2 + 1`` simplifies to)
    is written so that truncating and flooring division both give the floor.  Checked by evaluating the text
    under both semantics."""
    def trunc_div(a, b):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q

    class Trunc(int):  # an int whose // and % truncate, as Triton's
        def _wrap(self, v):
            return Trunc(v)

        def __floordiv__(self, o):
            return Trunc(trunc_div(int(self), int(o)))

        def __mod__(self, o):
            return Trunc(int(self) - trunc_div(int(self), int(o)) * int(o))

        def __neg__(self):
            return Trunc(-int(self))

        def __add__(self, o):
            return Trunc(int(self) + int(o))

        __radd__ = __add__

        def __sub__(self, o):
            return Trunc(int(self) - int(o))

        def __rsub__(self, o):
            return Trunc(int(o) - int(self))

        def __mul__(self, o):
            return Trunc(int(self) * int(o))

        __rmul__ = __mul__

    for expr in (floordiv(-T, 2), mod(-T, 3), floordiv(2 * B - T, 2) + 1, floordiv(B - 3 * T, T) * 2):
        text = render(expr, "py")
        for t in range(2, 9):
            for b in range(2, 9):
                want = evaluate(expr, {"s27": t, "s77": b})
                assert eval(text, {"s27": t, "s77": b}) == want, (text, t, b)
                assert int(eval(text, {"s27": Trunc(t), "s77": Trunc(b)})) == want, (text, t, b)
    assert render(floordiv(B + T, 2), "py") == "((s27 + s77) // 2)"  # (a non-negative numerator: plain)


def test_dynamo_expressions_convert_and_evaluate():
    """Every placeholder size and view size of a graph traced with dynamic=True, converted and evaluated against
    the sizes of the call that traced it."""
    from torch._functorch.aot_autograd import aot_module_simplified
    seen = []

    def backend(gm, example_inputs):
        def inner(g, fake_inputs):
            def run(*args):
                seen.append((g, args))  # the call's real inputs: tensors and the symbols' values
                return g.forward(*args)
            return run
        return aot_module_simplified(gm, example_inputs, fw_compiler=inner)

    def f(x, y):
        z = torch.cat([x.reshape(-1, 8), y], 0)
        return z[: x.shape[0] * 2].sum(0), z.reshape(2, -1) * x.shape[1]

    x, y = torch.randn(3, 5, 16), torch.randn(7, 8)
    with torch.inference_mode():
        torch.compile(f, backend=backend, dynamic=True)(x, y)
    (g, inputs), = seen
    shape_env = next(v.shape[0].node.shape_env for v in (n.meta.get("val") for n in g.graph.nodes)
                     if isinstance(v, torch.Tensor) and v.dim() and isinstance(v.shape[0], torch.SymInt))
    symbols = symbols_of_shape_env(shape_env)
    assert all(s.lo == 2 and s.hi is None for name, s in symbols.items() if name in ("s27", "s77"))
    env = {}
    placeholders = [n for n in g.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, inputs):
        if isinstance(value, int):
            env[str(node.meta["val"].node.expr)] = value
    actual = {}

    class Record(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            actual[n] = out
            return out
    Record(g).run(*inputs)
    checked = 0
    for node in g.graph.nodes:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for dim, s in enumerate(val.shape):
            expr = s.node.expr if isinstance(s, torch.SymInt) else s
            assert evaluate(from_sympy(expr, symbols), env) == actual[node].shape[dim], (node, dim, expr)
            checked += 1
    assert checked > 10 and len(env) >= 2
    import sympy
    # a Max that no argument provably is: an extreme of sizes (tests/unit/test_sym_extreme.py), evaluated per call
    big = from_sympy(sympy.Max(sympy.Symbol("s27"), 3), symbols | {"s27": T})
    assert evaluate(big, {"s27": 2}) == 3 and evaluate(big, {"s27": 9}) == 9
    with pytest.raises(UnsupportedSize):  # (what kiln has no form for)
        from_sympy(sympy.Abs(sympy.Symbol("s27") - 5), symbols | {"s27": T})


def test_min_and_max_of_sizes_that_differ_by_constants():
    """``Min(s0, s0 - 1)`` (sympy leaves it; a diagonal's length above the main one of a square matrix) is
    ``s0 - 1`` at every size; a ``Min`` of two unrelated sizes is an extreme (``sym.SymExtreme``)."""
    import sympy
    s = Symbol("s0", 2, None)
    t = Symbol("s1", 2, None)
    names = {"s0": s, "s1": t}
    x, y = sympy.Symbol("s0"), sympy.Symbol("s1")
    for n in (2, 5, 9):
        env = {"s0": n, "s1": 3}
        assert evaluate(from_sympy(sympy.Min(x, x - 1, evaluate=False), names), env) == n - 1
        assert evaluate(from_sympy(sympy.Max(x + 2, x - 1, evaluate=False), names), env) == n + 2
        assert evaluate(from_sympy(sympy.Min(2 * x, 2 * x + 3, evaluate=False), names), env) == 2 * n
    m = from_sympy(sympy.Min(x, y), names)  # (unrelated sizes: an extreme, tests/unit/test_sym_extreme.py)
    assert evaluate(m, {x.name: 4, y.name: 9}) == 4 and evaluate(m, {x.name: 8, y.name: 3}) == 3


@pytest.mark.parametrize("op", ["truediv", "sub", "add", "mul", "pow"])
def test_float_sizes_render_with_their_operands_grouped(op):
    """A float of sizes whose right operand is a product or a sum renders with it grouped: ``A / s0*s1`` divided by
    s0 and multiplied by s1 (an instance norm's ``1 / (N*C*H*W / (N*C))`` over a symbolic batch: its gradient was
    wrong).  The Python text is evaluated and compared with ``evaluate``; the C++ text must group the same way."""
    from kiln.ir.sym import FloatSize
    s0, s1, s2 = Symbol("s0", 2), Symbol("s1", 2), Symbol("s2", 2)
    env = {"s0": 3, "s1": 5, "s2": 7}
    products = [s0 * s1, s0 * s1 * s2 * s2, s0 + s1, s2 - s0, s0, 4]
    for left in products:
        for right in (products if op != "pow" else [s2 - s0, s0, 3]):  # (powers kept finite)
            x = FloatSize(op, (FloatSize("float", (left,)), right))
            want = evaluate(x, env)
            got = eval(render(x, "py"), {}, dict(env))
            assert got == pytest.approx(want, rel=1e-12), (render(x, "py"), got, want)
            cpp = render(x, "cpp").replace("static_cast<double>", "float").replace("std::pow", "pow")
            assert eval(cpp, {"pow": pow}, dict(env)) == pytest.approx(want, rel=1e-12), render(x, "cpp")


def test_rounded_multiples_of_sizes_convert_to_integer_division():
    """``TruncToInt(1.5*ToFloat(s0))`` - an interpolation's output size at a scale factor - is ``(3*s0) // 2``
    where the factor is a small dyadic fraction (its product in double precision is exact, so the floor agrees
    for every size); ceilings too; a factor like 0.3, whose products round, stays refused."""
    import sympy
    from torch.utils._sympy.functions import CeilToInt, FloorToInt, ToFloat, TruncToInt
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    symbols = {"s0": Symbol("s0", 2)}
    for kind, rounding in ((TruncToInt, math.trunc), (FloorToInt, math.floor), (CeilToInt, math.ceil)):
        for c in (1.5, 0.5, 0.75, 2.5, 3.0, 1.25):
            got = from_sympy(kind(sympy.Float(c) * ToFloat(s0)), symbols)
            for n in range(2, 200):
                assert evaluate(got, {"s0": n}) == rounding(c * float(n)), (kind, c, n, got)
    with pytest.raises(UnsupportedSize):
        from_sympy(TruncToInt(sympy.Float(0.3) * ToFloat(s0)), symbols)
