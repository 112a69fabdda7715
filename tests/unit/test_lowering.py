"""Per-family lowering tests: compile small functions with kiln (no eager fallback), compare with eager at
rtol 1.3e-5 / atol 1.5e-5, and check that the ops were lowered (no EXTERN node left in the optimized graph).

Several ops share one function so that the number of compiled graphs (each one a C++ build) stays small.
Inputs are fresh random values (seeded, never zeros); ops with restricted domains get shifted inputs.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir.ops import Op
from kiln.report import mark, reports_since

RTOL, ATOL = 1.3e-5, 1.5e-5


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def run(fn, *inputs, rtol=RTOL, atol=ATOL, externs_ok=()):
    """Compile ``fn`` with kiln, compare with eager, and return the optimized graphs of its reports."""
    position = mark()
    with torch.inference_mode():
        expected = fn(*[x.clone() for x in inputs])
        got = kiln.compile(fn, fallback=False)(*[x.clone() for x in inputs])
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    reports = reports_since(position)
    assert reports, "kiln compiled no graph"
    graphs = [r.optimized for r in reports]
    for g in graphs:
        externs = [str(n.attr("target")) for n in g.nodes if n.op is Op.EXTERN]
        unexpected = [e for e in externs if not any(ok in e for ok in externs_ok)]
        assert not unexpected, f"ops became EXTERN instead of being lowered: {unexpected}\n{g}"
    return graphs


def nonzero(*shape, dtype=torch.float32):
    """Standard normal values pushed away from zero (|x| >= 0.05)."""
    x = torch.randn(*shape, dtype=dtype)
    return torch.where(x.abs() < 0.05, torch.full_like(x, 0.5), x)


def positive(*shape, lo=0.1, hi=4.0):
    return torch.rand(*shape) * (hi - lo) + lo


# ------------------------------------------------------------------------------------------ elementwise

def test_unary_math():
    def f(x, p, u):
        return (x.neg(), x.abs(), x.exp(), torch.expm1(x), p.log(), torch.log1p(p), p.sqrt(), p.rsqrt(),
                x.reciprocal(), torch.erf(x), torch.erfc(x), x.tanh(), x.sigmoid(), x.relu(), x.sin(), x.cos(),
                x.floor(), x.ceil(), x.round(), x.trunc(), x.sign(), torch.log2(p), torch.log10(p), torch.exp2(x),
                torch.tan(u),
                torch.sinh(x), torch.cosh(x), torch.asinh(x), torch.acosh(p + 1.0), torch.atanh(u * 0.9),
                torch.round(x * 100, decimals=1), torch.round(x * 1000, decimals=-2), torch.square(x),
                torch.frac(x))
    run(f, nonzero(6, 7) * 3, positive(6, 7), torch.rand(6, 7) * 2 - 1)


def test_unary_special_values():
    vals = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.5, -2.5, 0.5, 1e-30, 89.0, -89.0])

    def f(x):
        return (x.sign(), torch.isnan(x), torch.isinf(x), torch.isfinite(x), torch.isposinf(x), torch.isneginf(x),
                x.relu(), torch.sinh(x), torch.cosh(x), torch.asinh(x), x.round(), torch.nan_to_num(x),
                torch.fmax(x, x.flip(0)), torch.fmin(x, x.flip(0)), torch.maximum(x, x.flip(0)))
    run(f, vals)


def test_activations():
    def f(x):
        return (F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x), F.hardtanh(x, -0.5, 1.5),
                F.leaky_relu(x, 0.1), F.elu(x), F.elu(x, alpha=0.7), F.selu(x), F.celu(x, 1.3), F.hardsigmoid(x),
                F.hardswish(x), F.softplus(x), F.softplus(x, beta=2.0, threshold=3.0), F.relu6(x * 4), F.mish(x),
                F.logsigmoid(x), F.softsign(x), F.hardshrink(x, 0.3), F.softshrink(x, 0.3), F.tanhshrink(x),
                F.threshold(x, 0.2, -1.0), F.glu(x, -1))
    run(f, nonzero(5, 8) * 3)


def test_binary_float_and_broadcasting():
    def f(a, b, c):
        return (a + b, torch.add(a, b, alpha=0.5), a - c, torch.sub(a, b, alpha=2), 1.5 - a, a * c, a / b,
                torch.div(a, b, rounding_mode="trunc"), torch.div(a, b, rounding_mode="floor"), a // b,
                torch.remainder(a, b), torch.fmod(a, b), a.abs() ** b, a ** 2, a ** 3, a.abs() ** 0.5,
                2.0 ** c, torch.maximum(a, c), torch.minimum(a, b), torch.fmax(a, b), torch.fmin(a, c),
                torch.clamp(a, -0.5, 0.5), torch.clamp(a, min=b), torch.clamp(a, max=0.25), a.clamp_min(0.1),
                torch.lerp(a, b, 0.3), torch.lerp(a, b, c.sigmoid()), torch.addcmul(a, b, c, value=0.5),
                torch.addcdiv(a, b, c, value=2.0), torch.logaddexp(a, b), torch.xlogy(a, b.abs()),
                torch.where(a > b, a, c), torch.where(a > 0, a, 0.0), a.masked_fill(b > 0, -1.0))
    run(f, nonzero(4, 5), nonzero(4, 5), nonzero(5))


def test_float_floor_division_matches_aten():
    # values where floor(a / b) and ATen's fmod-based floor division disagree
    a = torch.tensor([1.0, -1.0, 0.3, 7.0, -7.5, 5.0, 1e-3, 4.0])
    b = torch.tensor([0.1, 0.1, 0.1, -2.0, 2.0, 0.0, -1e-4, 0.0])

    def f(a, b):
        return torch.div(a, b, rounding_mode="floor"), torch.floor_divide(a, b), torch.remainder(a, b)
    run(f, a, b)


def test_comparison_and_logical():
    def f(a, b, m):
        return (a == b, a != b, a < b, a <= 0.3, a > b, a >= b, torch.logical_and(a > 0, m),
                torch.logical_or(a > 0, m), torch.logical_xor(a > 0, m), torch.logical_not(m), ~m, m & (b > 0),
                m | (b > 0), m ^ (b > 0), torch.isclose(a, b, rtol=0.5))
    run(f, nonzero(3, 6), nonzero(3, 6), torch.rand(3, 6) > 0.5)


def test_integer_arithmetic_and_type_promotion():
    def f(i, j, x):
        return (i + j, i - j, i * j, i // j, torch.remainder(i, j), torch.fmod(i, j), i.abs(), -i, i & j, i | j,
                i ^ j, ~i, torch.div(i, j, rounding_mode="trunc"), i / j, i + x, i * 2.5, i.float().sqrt(),
                torch.maximum(i, j), torch.clamp(i, -3, 3), i.sign(), i ** 2, (i > 0).sum(), i.sum(1),
                i.to(torch.int32) + 1, x.to(torch.int64), x.to(torch.float64) * 2, (x > 0).to(torch.float32),
                i.to(torch.uint8) + 200)
    i = torch.randint(-20, 20, (4, 5))
    j = torch.randint(1, 7, (4, 5)) * torch.where(torch.rand(4, 5) > 0.5, 1, -1)
    run(f, i, j, nonzero(4, 5) * 5)


# ------------------------------------------------------------------------------------------ reductions

def test_reductions():
    def f(x, m):
        return (x.sum(), x.sum(1), x.sum((0, 2), keepdim=True), x.mean(-1), x.mean((1, 2)), x.prod(1), x.amax(1),
                x.amin((0, 1)), x.argmax(), x.argmax(2, keepdim=True), x.argmin(0), x.max(), x.min(), *x.max(1),
                *x.min(2, keepdim=True), m.any(), m.any(1), m.all(2), x.var(1), x.var(2, unbiased=False),
                x.std((0, 2)), *torch.var_mean(x, 1), *torch.std_mean(x, 2, correction=0),
                torch.logsumexp(x, 1), torch.linalg.vector_norm(x, dim=2), torch.linalg.vector_norm(x, 1, dim=1),
                torch.linalg.vector_norm(x, float("inf"), dim=0), torch.linalg.vector_norm(x, 3.0),
                torch.linalg.vector_norm(x, 0, dim=1), torch.norm(x, dim=1), torch.count_nonzero(m, 1),
                torch.nansum(x, 1), torch.nanmean(x, 2))
    run(f, nonzero(3, 4, 5), torch.rand(3, 4, 5) > 0.3)


def test_reductions_of_empty_and_0d():
    def f(e, s):
        return e.sum(), e.sum(0), e.prod(1), e.mean(0), s.sum(0), s.mean(), s.amax(), s.sum(-1, keepdim=True)
    run(f, torch.randn(0, 3), torch.randn(()))


def test_normalization():
    ln = torch.nn.LayerNorm(16).eval()
    gn = torch.nn.GroupNorm(4, 8).eval()
    bn = torch.nn.BatchNorm2d(8).eval()
    with torch.no_grad():
        for m in (ln, gn, bn):
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)

    def f(x, y, rm, rv):
        return (torch.softmax(x, -1), torch.log_softmax(x, 1), F.softmin(x, -1), ln(x), F.layer_norm(x, (16,)),
                gn(y), F.group_norm(y, 2), bn(y), F.normalize(x, dim=-1), F.rms_norm(x, (16,)),
                F.instance_norm(y), F.batch_norm(y, None, None, training=True),
                torch.ops.aten._native_batch_norm_legit_functional(y, bn.weight, bn.bias, rm, rv, True, 0.2, 1e-5))
    run(f, nonzero(2, 3, 16), nonzero(2, 8, 3, 5), nonzero(8), positive(8))


# ------------------------------------------------------------------------------------------ movement

def test_views_and_movement():
    def f(x, y):
        parts = torch.split(x, [1, 2], dim=1)
        chunks = torch.chunk(x, 2, dim=2)
        return (x.view(6, 4), x.reshape(2, -1), x.permute(2, 0, 1), x.transpose(0, 2), y.t(), x.unsqueeze(1),
                x[:, :1].squeeze(1), x.flatten(1), x.expand(4, 2, 3, 4), y.expand(3, 2, 5), x[:, 1:3, ::2],
                x[1], x[:, -1], x.narrow(2, -3, 2), x.select(1, 1), *parts, *chunks, *x.unbind(1),
                torch.cat([x, x * 2], 1), torch.stack([y, -y], 0), torch.flip(x, (0, 2)), x.fliplr(), torch.rot90(y),
                x.repeat(2, 1, 3), x.repeat(2, 1, 1, 1), y.tile(2), torch.diagonal(y), torch.diagonal(x, 1, 1, 2),
                torch.diagonal(x, -1, 2, 0), torch.diag(y), torch.trace(y), y.unfold(1, 2, 2), x.unfold(2, 3, 1),
                torch.tril(y), torch.triu(y, 1), torch.tril(x, -1), torch.roll(x, 1, 2), torch.roll(y, (1, -2), (0, 1)),
                x.movedim(0, -1), x.unflatten(2, (2, 2)), torch.atleast_3d(y), torch.broadcast_to(y[0], (4, 5)))
    run(f, nonzero(2, 3, 4), nonzero(2, 5))


def test_padding():
    def f(x):
        return (F.pad(x, (1, 2)), F.pad(x, (1, 1, 2, 0), value=-3.5), F.pad(x, (-1, 2, 0, -1)), F.pad(x, (-2, -1)),
                F.pad(x, (2, 1, 1, 2), mode="reflect"), F.pad(x, (2, 1, 1, 2), mode="replicate"),
                F.pad(x, (1, 1, 1, 1), mode="circular"))
    run(f, nonzero(2, 3, 5, 6))


def test_scatter_into_slices():
    def f(x, src, row):
        y = x.clone()
        y[:, 1:3] = src
        z = x.clone()
        z[:, ::2] = src[:, :1].expand(4, 3) * 2
        w = x.clone()
        w[2] = row
        v = x.clone()
        v.diagonal()[:] = 0.5
        return y, z, w, torch.slice_scatter(x, src, 1, 2, 4), torch.select_scatter(x, row, 0, 1), v
    run(f, nonzero(4, 6), nonzero(4, 2), nonzero(6))


def test_indexing():
    def f(x, w, idx, rows, cols):
        return (F.embedding(idx, w), x.index_select(1, idx.flatten()), x.index_select(0, idx[0, :1]),
                torch.gather(x, 1, idx[:1].expand(4, 3) % 4), torch.take_along_dim(x, idx[1:].expand(4, 3) % 4, 1),
                x[rows], x[:, cols], x[rows, cols], x[rows.unsqueeze(1), cols], x[..., -1], x[rows.abs() - 4],
                x[:, [0, -1]], x.unsqueeze(1)[rows, :, cols])
    x = nonzero(4, 4)
    w = nonzero(10, 3)
    idx = torch.randint(0, 4, (2, 3))
    rows = torch.randint(-4, 4, (3,))
    cols = torch.randint(0, 4, (3,))
    run(f, x, w, idx, rows, cols)


def test_upsampling_and_pooling():
    def f(x):
        return (F.interpolate(x, scale_factor=2, mode="nearest"), F.interpolate(x, size=(5, 7), mode="nearest"),
                F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
                F.interpolate(x, size=(5, 3), mode="bilinear", align_corners=True), F.adaptive_avg_pool2d(x, 1),
                F.adaptive_avg_pool2d(x, (2, 3)), F.pixel_shuffle(x[:, :4], 2), F.pixel_unshuffle(x, 2))
    run(f, nonzero(2, 4, 4, 6))


def test_creation():
    def f(x):
        n = x.shape[-1]
        return (x + torch.arange(n), x * torch.arange(1, 2 * n + 1, 2, dtype=torch.float32),
                torch.arange(0.5, n, 1.0) + x, torch.full((3, n), 2.5) + x, torch.zeros_like(x) + 1, torch.ones_like(x),
                torch.full_like(x, -1.25), x.new_ones(2, n) * 3, x.new_zeros(n), torch.scalar_tensor(4.0) * x,
                torch.eye(n) + x[0], torch.zeros(2, n, dtype=torch.int64) + 3, torch.empty_like(x).fill_(0.75))
    run(f, nonzero(3, 5))


def test_zero_size_tensors():
    def f(e, x):
        return e + 1, e.sum(1), e.view(3, 0, 2), F.pixel_shuffle(e.reshape(1, 0, 2, 2), 1), torch.cat([e, e]), x[:, 2:2]
    run(f, torch.randn(3, 0), nonzero(2, 3))


def test_single_op_graph_is_lowered():
    """Small graphs of one op each: the report's last graph holds no EXTERN."""
    for fn in (lambda x: torch.flip(x, (1,)), lambda x: x.repeat(1, 2), lambda x: torch.exp2(x)):
        graphs = run(fn, nonzero(3, 4))
        assert not [n for n in graphs[-1].nodes if n.op is Op.EXTERN]


def test_to_copy_onto_its_own_device_is_a_cast_and_a_move_between_devices_is_not():
    """``x.to(device=x.device, dtype=...)`` (transformers' casts, on a GPU ``device='cuda:0'``) lowers to a
    cast; only a move between devices stays an ATen call.  The rule reads the devices of the ATen values, so it
    is tested on stand-in fx nodes (no GPU here to give a cuda:0 value)."""
    from types import SimpleNamespace

    from kiln.frontend import aten as lowerings
    from kiln.frontend.lowering_base import Unsupported

    class _Lowerer:
        def cast(self, x, dtype):
            return ("cast", x, dtype)

    def node(device, dtype=torch.float16):
        return SimpleNamespace(meta={"val": torch.empty(2, device=device, dtype=dtype)})

    # "meta" stands for a device other than the CPU (as cuda:0 is)
    on_meta = SimpleNamespace(meta=node("meta").meta, args=(node("meta", torch.float32),))
    assert lowerings._to_copy(_Lowerer(), on_meta, "x", device=torch.device("meta"),
                              dtype=torch.float16) == ("cast", "x", torch.float16)
    moved = SimpleNamespace(meta=node("meta").meta, args=(node("cpu", torch.float32),))
    with pytest.raises(Unsupported, match="device transfer"):
        lowerings._to_copy(_Lowerer(), moved, "x", device=torch.device("meta"))
    back = SimpleNamespace(meta=node("cpu").meta, args=(node("meta", torch.float32),))
    with pytest.raises(Unsupported, match="device transfer"):
        lowerings._to_copy(_Lowerer(), back, "x", device=torch.device("cpu"))
    run(lambda x: x.to(device=x.device, dtype=torch.float64) * 2, torch.randn(5, 3))


def test_linalg_ops_with_effect_tokens_compile_and_raise_as_eager():
    """torch 2.13 captures linalg.inv/solve with an effect token (higher_order.with_effects around
    aten._linalg_check_errors, kiln/frontend/effects.py): the graph compiles whole, matches eager, and a singular
    input raises eager's error (the check is kept, after the factorization it reads)."""
    import kiln
    from kiln.report import mark, reports_since

    def f(a, b):
        return torch.linalg.inv(a) @ b + torch.linalg.solve(a, b)
    torch._dynamo.reset()
    compiled = kiln.compile(f, fallback=False)
    position = mark()
    with torch.inference_mode():
        a, b = torch.randn(5, 5) + 5 * torch.eye(5), torch.randn(5, 3)
        torch.testing.assert_close(compiled(a, b), f(a, b), rtol=1e-4, atol=1e-5)
        assert all(r.fallback is None for r in reports_since(position))
        with pytest.raises(torch.linalg.LinAlgError, match="singular"):
            compiled(torch.zeros(5, 5), b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "bf16 input, fp32 weight"])
@pytest.mark.parametrize("shape, groups, affine", [((2, 6, 3, 4), 3, True), ((3, 4, 1, 1), 4, False),
                                                   ((3, 4, 1, 1), 4, True), ((2, 8, 5), 2, True)])
def test_group_norm_backward_is_as_accurate_as_atens(shape, groups, affine, dtype):
    """kiln's centered GroupNorm backward ([Note: a centered GroupNorm backward]) against ATen's kernel, both
    judged by ATen in float64: every gradient at least as close (within rounding), groups of one element exact
    where torch's own decomposition is 1e-5 off."""
    from kiln.frontend.decompositions import group_norm_backward
    torch.manual_seed(0)
    N, C = shape[:2]
    HxW = math.prod(shape[2:])
    dtype, weight_dtype = (torch.bfloat16, torch.float32) if isinstance(dtype, str) else (dtype, dtype)
    x = torch.randn(shape, dtype=dtype)
    w, b = (torch.randn(C, dtype=weight_dtype), torch.randn(C, dtype=weight_dtype)) if affine else (None, None)
    mask = [True, affine, affine]

    def backward(dt, weight_dt):
        def to(t, d):
            return None if t is None else t.to(d)
        _, mean, rstd = torch.ops.aten.native_group_norm(to(x, dt), to(w, weight_dt), to(b, weight_dt), N, C, HxW,
                                                         groups, 1e-5)
        dy = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dt)
        return dy, to(x, dt), mean, rstd, to(w, weight_dt)
    exact = torch.ops.aten.native_group_norm_backward(*backward(torch.float64, torch.float64), N, C, HxW, groups,
                                                      mask)
    args = backward(dtype, weight_dtype)
    ours = group_norm_backward(*args, N, C, HxW, groups, mask)
    atens = torch.ops.aten.native_group_norm_backward(*args, N, C, HxW, groups, mask)
    for got, aten_, e in zip(ours, atens, exact):
        if e is None:
            assert got is None
            continue
        assert got.dtype == aten_.dtype and got.shape == aten_.shape
        ulp = torch.finfo(got.dtype).eps * e.abs().max().item()
        assert (got.double() - e).abs().max() <= 2 * (aten_.double() - e).abs().max() + 4 * ulp
