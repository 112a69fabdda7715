"""The index simplifier (kiln/ir/index.py): exact rules, bounds, and a brute-force check against torch views."""
import random

import numpy as np
import pytest
import torch

from kiln.ir.index import Dyn, FloorDiv, Lin, Mod, Var, floordiv, linearize, mod, render, unflatten
from kiln.ir.ops import contiguous_strides, numel


# ------------------------------------------------------------------------------------------------ helpers

def evaluate(e: Lin, env: dict, c_semantics: bool = False) -> np.ndarray:
    """Value of ``e`` with ``env`` mapping each Var to an int64 array (all broadcast together).

    ``c_semantics`` evaluates / and % as C does (truncation), i.e. as the rendered C++ would."""
    out = np.int64(e.const)
    for atom, c in e.terms:
        out = out + c * _atom(atom, env, c_semantics)
    return out


def _atom(a, env, c_semantics):
    if isinstance(a, Var):
        return env[a]
    if isinstance(a, (FloorDiv, Mod)):
        x = evaluate(a.arg, env, c_semantics)
        if c_semantics:
            q = np.trunc(x / a.k).astype(np.int64)
            return q if isinstance(a, FloorDiv) else x - q * a.k
        return x // a.k if isinstance(a, FloorDiv) else x % a.k
    raise TypeError(a)


def all_atoms(e: Lin):
    for a, _ in e.terms:
        yield a
        if isinstance(a, (FloorDiv, Mod)):
            yield from all_atoms(a.arg)


def grid(vars_: list[Var]) -> dict:
    """Every combination of the vars' values, as broadcastable arrays."""
    if not vars_:
        return {}
    mesh = np.meshgrid(*[np.arange(v.size, dtype=np.int64) for v in vars_], indexing="ij")
    return {v: m for v, m in zip(vars_, mesh)}


def out_vars(shape) -> list[Var]:
    return [Var(f"i{d}", s) for d, s in enumerate(shape)]


def has_divmod(e: Lin) -> bool:
    return any(isinstance(a, (FloorDiv, Mod)) for a in all_atoms(e))


# ------------------------------------------------------------------------------------------ exact rules

@pytest.mark.parametrize("shape", [(24,), (2, 3, 4), (4, 6), (1, 24), (4, 1, 6), (2, 1, 3, 1, 4), (24, 1)])
def test_unflatten_linearize_round_trip_gives_flat_var(shape):
    p = Var("p", numel(shape))
    idx = unflatten(Lin.of(p), shape)
    assert linearize(idx, contiguous_strides(shape)) == Lin.of(p)


def test_unflatten_text():
    p = Var("p", 24)
    idx = unflatten(Lin.of(p), (2, 3, 4))
    assert [str(i) for i in idx] == ["((p) / 12)", "((((p) / 4)) % 3)", "((p) % 4)"]
    # size-1 dims index 0, and the outermost dim needs no mod
    assert [str(i) for i in unflatten(Lin.of(p), (4, 1, 6))] == ["((p) / 6)", "0", "((p) % 6)"]


def test_reshape_split_then_merge_is_identity():
    # [B, H*W] -> [B, H, W] -> [B, H*W]: no div/mod survives
    b, q = Var("b", 2), Var("q", 12)
    idx = unflatten(linearize([Lin.of(b), Lin.of(q)], (12, 1)), (2, 3, 4))
    assert [str(i) for i in idx] == ["b", "((q) / 4)", "((q) % 4)"]
    back = unflatten(linearize(idx, contiguous_strides((2, 3, 4))), (2, 12))
    assert back == [Lin.of(b), Lin.of(q)]


def test_reshape_merge_is_correct():
    # [2, 3, 4] viewed as [6, 4]: reading the source through the merged view
    r, c = Var("r", 6), Var("c", 4)
    src = unflatten(linearize([Lin.of(r), Lin.of(c)], (4, 1)), (2, 3, 4))
    env = grid([r, c])
    want = np.arange(24).reshape(6, 4)
    np.testing.assert_array_equal(evaluate(linearize(src, contiguous_strides((2, 3, 4))), env), want)
    np.testing.assert_array_equal(np.broadcast_to(evaluate(src[0], env), (6, 4)), want // 12)


def test_reshape_merge_of_loop_vars():
    # [2, 3, 4] viewed as [6, 4]: the source index of (r, c) is (r // 3, r % 3, c), flat = 4*r + c
    r, c = Var("r", 6), Var("c", 4)
    src = unflatten(linearize([Lin.of(r), Lin.of(c)], (4, 1)), (2, 3, 4))
    assert [str(i) for i in src] == ["((r) / 3)", "((r) % 3)", "c"]
    assert linearize(src, contiguous_strides((2, 3, 4))) == Lin.of(r) * 4 + c


def test_merge_of_split_dims():
    # loop vars (a, b, c) over [2, 3, 4] read from a [2, 12] view: (a, 4*b + c), no div/mod at all
    a, b, c = Var("a", 2), Var("b", 3), Var("c", 4)
    flat = linearize([Lin.of(a), Lin.of(b), Lin.of(c)], (12, 4, 1))
    src = unflatten(flat, (2, 12))
    assert src == [Lin.of(a), Lin.of(b) * 4 + c]


def test_rules_from_module_docstring():
    p, b = Var("p", 12), Var("b", 5)
    assert floordiv(Lin.of(p), 4) * 4 + mod(Lin.of(p), 4) == Lin.of(p)          # (p // W) * W + p % W -> p
    assert mod(Lin.of(b) * 3 + floordiv(Lin.of(p), 4), 3) == floordiv(Lin.of(p), 4)  # (b*H + p//W) % H
    assert floordiv(Lin.of(b) * 12 + p, 12) == Lin.of(b)                         # (b*HW + p) // HW -> b


def test_permute_then_reshape_keeps_div_mod():
    # x: [2, 3, 4] -> permute(0, 2, 1) -> [2, 4, 3] -> reshape [2, 12]: a transposed read needs j//3 and j%3
    b, j = Var("b", 2), Var("j", 12)
    src = unflatten(linearize([Lin.of(b), Lin.of(j)], (12, 1)), (2, 4, 3))
    x_idx = [None] * 3
    for d, p in enumerate((0, 2, 1)):
        x_idx[p] = src[d]
    flat = linearize(x_idx, contiguous_strides((2, 3, 4)))
    assert str(flat) == "((j) / 3) + 4*((j) % 3) + 12*b"
    assert FloorDiv(Lin.of(j), 3) in set(flat.atoms()) and Mod(Lin.of(j), 3) in set(flat.atoms())
    env = grid([b, j])
    want = torch.arange(24).reshape(2, 3, 4).permute(0, 2, 1).reshape(2, 12).numpy()
    np.testing.assert_array_equal(evaluate(flat, env), want)


def test_floordiv_and_mod_basic_simplifications():
    x = Var("x", 10)
    assert floordiv(Lin.of(x), 1) == Lin.of(x)
    assert mod(Lin.of(x), 1) == Lin(0)
    assert floordiv(Lin.of(x), 10) == Lin(0)           # 0 <= x < 10
    assert mod(Lin.of(x), 10) == Lin.of(x)
    assert floordiv(Lin.of(x), 16) == Lin(0)
    assert floordiv(Lin(7), 2) == Lin(3) and mod(Lin(7), 2) == Lin(1)
    assert floordiv(Lin.of(x) * 6 + 4, 3) == Lin.of(x) * 2 + 1   # (6x + 4) // 3 = 2x + 1
    assert mod(Lin.of(x) * 6 + 4, 3) == Lin(1)
    # nested division collapses: (x // 2) // 3 -> x // 6
    assert floordiv(floordiv(Lin.of(Var("y", 100)), 2), 3) == Lin.of(FloorDiv(Lin.of(Var("y", 100)), 6))


def test_bounds():
    x, y = Var("x", 10), Var("y", 4)
    assert x.bounds() == (0, 9)
    assert Var("z", 0).bounds() == (0, 0)
    assert (Lin.of(x) * 3 - y + 2).bounds() == (2 - 3, 27 + 2)
    assert FloorDiv(Lin.of(x), 4).bounds() == (0, 2)
    assert Mod(Lin.of(x), 4).bounds() == (0, 3)
    assert Mod(Lin.of(y), 8).bounds() == (0, 3)   # already in range: the argument's own bounds
    assert Dyn("idx", 7).bounds() == (0, 6)
    e = floordiv(Lin.of(x) * 5 + y, 3)
    lo, hi = e.bounds()
    vals = evaluate(e, grid([x, y]))
    assert lo <= vals.min() and vals.max() <= hi


def test_substitute():
    x, y = Var("x", 12), Var("y", 3)
    e = mod(Lin.of(x), 4) + floordiv(Lin.of(x), 4) * 4
    assert e == Lin.of(x)
    e2 = floordiv(Lin.of(x), 4)
    assert e2.substitute({x: Lin.of(y) * 4}) == Lin.of(y)


def test_render():
    x, y = Var("x", 12), Var("y", 3)
    assert render(Lin(0), str) == "0"
    assert render(Lin.of(x) * 2 + y - 1, str) == "2*x + y - 1"
    assert render(mod(Lin.of(x), 5), str) == "((x) % 5)"
    assert str(Lin.of(Dyn("k", 4)) * 3) == "3*<k>"


# --------------------------------------------------------------------------------------- brute force

def _random_factorization(n: int, rng: random.Random) -> tuple[int, ...]:
    dims = []
    rest = n
    while rest > 1 and len(dims) < 4:
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = rng.choice(divisors)
        dims.append(d)
        rest //= d
    dims.append(rest)
    if rng.random() < 0.3:
        dims.insert(rng.randrange(len(dims) + 1), 1)
    rng.shuffle(dims)
    return tuple(dims)


def _random_view_chain(rng: random.Random, base_shape):
    """A list of (kind, attrs, out_shape) views, applied to a tensor of ``base_shape`` in order."""
    shape = tuple(base_shape)
    chain = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(["reshape", "reshape", "permute", "slice", "expand"])
        if kind == "reshape":
            new = _random_factorization(numel(shape), rng)
            chain.append(("reshape", new, new))
            shape = new
        elif kind == "permute":
            dims = list(range(len(shape)))
            rng.shuffle(dims)
            shape = tuple(shape[d] for d in dims)
            chain.append(("permute", tuple(dims), shape))
        elif kind == "slice":
            cands = [d for d, s in enumerate(shape) if s > 1]
            if not cands:
                continue
            d = rng.choice(cands)
            step = rng.randint(1, 3)
            start = rng.randrange(shape[d])
            length = rng.randint(1, (shape[d] - start + step - 1) // step)
            shape = shape[:d] + (length,) + shape[d + 1:]
            chain.append(("slice", (d, start, step), shape))
        else:  # expand: a size-1 dim broadcast, or a new leading dim
            ones = [d for d, s in enumerate(shape) if s == 1]
            if ones and rng.random() < 0.6:
                d = rng.choice(ones)
                new = shape[:d] + (rng.randint(2, 3),) + shape[d + 1:]
            else:
                new = (rng.randint(2, 3),) + shape
            chain.append(("expand", new, new))
            shape = new
    return chain


def _apply_torch(t: torch.Tensor, chain) -> torch.Tensor:
    for kind, attrs, out_shape in chain:
        if kind == "reshape":
            t = t.reshape(attrs)
        elif kind == "permute":
            t = t.permute(attrs)
        elif kind == "slice":
            d, start, step = attrs
            t = t.narrow(d, start, (out_shape[d] - 1) * step + 1)[(slice(None),) * d + (slice(None, None, step),)]
        else:
            t = t.expand(attrs)
        assert tuple(t.shape) == tuple(out_shape)
    return t


def _source_index(chain, base_shape, idx: list[Lin]) -> list[Lin]:
    """Compose the chain's index maps backwards, exactly as kernel_build.define does for each view op."""
    shapes = [tuple(base_shape)] + [c[2] for c in chain]
    for (kind, attrs, out_shape), in_shape in zip(reversed(chain), reversed(shapes[:-1])):
        if kind == "reshape":
            idx = unflatten(linearize(idx, contiguous_strides(out_shape)), in_shape)
        elif kind == "permute":
            src = [Lin(0)] * len(idx)
            for d, p in enumerate(attrs):
                src[p] = idx[d]
            idx = src
        elif kind == "slice":
            d, start, step = attrs
            idx = list(idx)
            idx[d] = idx[d] * step + start
        else:
            off = len(out_shape) - len(in_shape)
            idx = [Lin(0) if in_shape[j] == 1 and out_shape[j + off] != 1 else idx[j + off]
                   for j in range(len(in_shape))]
    return idx


@pytest.mark.parametrize("seed", range(60))
def test_random_view_chains_match_torch(seed):
    rng = random.Random(seed)
    base = _random_factorization(rng.choice([12, 16, 24, 30, 36, 48, 60]), rng)
    chain = _random_view_chain(rng, base)
    base_t = torch.arange(numel(base)).reshape(base)
    want = _apply_torch(base_t, chain).numpy()
    out_shape = chain[-1][2]
    vs = out_vars(out_shape)
    idx = _source_index(chain, base, [Lin.of(v) for v in vs])
    flat = linearize(idx, contiguous_strides(base))
    env = grid(vs)
    got = np.broadcast_to(evaluate(flat, env), out_shape)
    np.testing.assert_array_equal(got, want, err_msg=f"base {base}, chain {chain}, expr {flat}")
    # the rendered C++ (truncating / and %) agrees: every div/mod argument stays non-negative
    np.testing.assert_array_equal(np.broadcast_to(evaluate(flat, env, c_semantics=True), out_shape), want)
    lo, hi = flat.bounds()
    assert lo <= want.min() and want.max() <= hi
    # each per-dim index of the source stays inside its dim
    for d, (i, s) in enumerate(zip(idx, base)):
        vals = evaluate(i, env)
        assert 0 <= np.min(vals) and np.max(vals) < s, (d, str(i))


@pytest.mark.parametrize("seed", range(20))
def test_random_contiguous_reshape_chains_simplify_to_flat_var(seed):
    # any chain of reshapes between contiguous shapes reads the source at exactly the flat output index
    rng = random.Random(1000 + seed)
    n = rng.choice([6, 12, 24, 36, 64, 120])
    base = _random_factorization(n, rng)
    shapes = [_random_factorization(n, rng) for _ in range(rng.randint(1, 4))]
    chain = [("reshape", s, s) for s in shapes]
    p = Var("p", n)
    idx = unflatten(Lin.of(p), shapes[-1])
    flat = linearize(_source_index(chain, base, idx), contiguous_strides(base))
    assert flat == Lin.of(p), f"{base} -> {shapes}: {flat}"


@pytest.mark.parametrize("seed", range(20))
def test_random_linear_expressions_divmod(seed):
    # floordiv/mod of random non-negative linear forms over small vars agree with numpy floor semantics
    rng = random.Random(2000 + seed)
    vs = [Var(f"v{k}", rng.randint(1, 7)) for k in range(rng.randint(1, 3))]
    e = Lin(rng.randint(0, 20))
    for v in vs:
        e = e + Lin.of(v) * rng.choice([1, 2, 3, 4, 6, 8, 12])
    env = grid(vs)
    base = evaluate(e, env)
    for k in (1, 2, 3, 4, 5, 8, 12):
        q, r = floordiv(e, k), mod(e, k)
        np.testing.assert_array_equal(np.broadcast_to(evaluate(q, env), base.shape), base // k, err_msg=str(q))
        np.testing.assert_array_equal(np.broadcast_to(evaluate(r, env), base.shape), base % k, err_msg=str(r))
        np.testing.assert_array_equal(np.broadcast_to(evaluate(q * k + r, env), base.shape), base)
        if e.const % k == 0:  # recombination: k * (e // k) + e % k == e, structurally
            assert q * k + r == e, f"{e}: {q} * {k} + {r}"
        # a nested split-and-merge
        q2 = floordiv(q, 2)
        np.testing.assert_array_equal(np.broadcast_to(evaluate(q2, env), base.shape), base // k // 2)


def test_reduction_over_trailing_dims_recombines_into_one_remainder():
    # BatchNorm's statistics over (N, H, W) of NCHW [4, C, 24, 24]: one index r over N*H*W, unflattened into
    # (n, h, w) and read at 24*h + w - that is r % 576, one remainder (a multiple of the vector width) for two
    r = Var("r", 4 * 24 * 24)
    n, h, w = unflatten(Lin.of(r), (4, 24, 24))
    flat = n * (64 * 576) + h * 24 + w
    assert flat == Lin.of(FloorDiv(Lin.of(r), 576)) * (64 * 576) + Lin.of(Mod(Lin.of(r), 576))
    env = grid([r])
    want = torch.arange(4 * 64 * 576).reshape(4, 64, 24, 24)[:, 0].reshape(-1).numpy()
    np.testing.assert_array_equal(evaluate(flat, env), want)


@pytest.mark.parametrize("seed", range(20))
def test_nested_remainders_recombine_and_keep_their_value(seed):
    # c*k*((x // k) % m) + c*(x % k) == c*(x % (k*m)), for nested splits of random shapes and a scale c
    rng = random.Random(3000 + seed)
    shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(2, 4)))
    x = Var("x", int(np.prod(shape)) * rng.randint(1, 3))
    c = rng.choice([1, 2, 3])
    parts = unflatten(Lin.of(x), shape)
    tail = linearize(parts[1:], contiguous_strides(shape[1:])) * c
    inner = int(np.prod(shape[1:]))
    assert tail == mod(Lin.of(x), inner) * c, f"{shape}: {tail}"
    np.testing.assert_array_equal(evaluate(tail, grid([x])), c * (np.arange(x.size) % inner))
