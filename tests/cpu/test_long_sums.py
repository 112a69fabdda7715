"""[Note: sums folded in blocks] (codegen/cpp.py): a sum over a long row - a BatchNorm's N*H*W, a row of
millions - keeps ATen's accuracy instead of losing it in one float chain per lane."""
import torch
import torch.nn.functional as F

import kiln  # noqa: F401  (registers the backend)


def _relative(got, exact):
    return ((got.double() - exact).abs().max() / exact.abs().max()).item()


def test_a_row_of_millions_sums_as_accurately_as_eager():
    torch._dynamo.reset()
    x = torch.rand(2, 4_000_000, generator=torch.Generator().manual_seed(0)) + 1  # (positive: no cancellation)
    exact = x.double().sum(-1)
    got = torch.compile(lambda t: t.sum(-1), backend="kiln")(x)
    assert _relative(got, exact) <= max(3e-7, _relative(x.sum(-1), exact))  # (one chain per lane: 1.5e-6)


def test_batch_norm_statistics_and_gradients_over_a_large_batch():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 2, 128, 128, generator=gen) * 0.1 + 3
    exact = x.double().mean((0, 2, 3))
    got = torch.compile(lambda t: t.mean((0, 2, 3)), backend="kiln")(x)
    assert _relative(got, exact) <= 2e-7  # (one chain per lane: 5.1e-7)

    w, b = torch.randn(2, generator=gen), torch.randn(2, generator=gen)
    g = torch.randn(x.shape, generator=gen)

    def grads(fn, dtype):
        xs = [t.to(dtype).clone().requires_grad_() for t in (x, w, b)]
        fn(*xs).backward(g.to(dtype))
        return [t.grad.double() for t in xs]

    def bn(xx, ww, bb):
        return F.batch_norm(xx, None, None, ww, bb, training=True)

    exact_grads = grads(bn, torch.float64)
    got_grads = grads(torch.compile(bn, backend="kiln"), torch.float32)
    eager_grads = grads(bn, torch.float32)
    for name, got_g, eager_g, exact_g in zip(("input", "weight", "bias"), got_grads, eager_grads, exact_grads):
        # eager accumulates BatchNorm's sums in double; kiln within 10x of its distance (one chain per lane: 25x)
        assert _relative(got_g, exact_g) <= max(10 * _relative(eager_g, exact_g), 2e-6), name


def test_a_sum_over_many_rows_column_by_column():
    """[Note: column sums folded in blocks]: a bias gradient over 400,000 tokens (one chain per column: 2.3e-5)."""
    torch._dynamo.reset()
    x = torch.rand(400_000, 64, generator=torch.Generator().manual_seed(2)) + 1
    exact = x.double().sum(0)
    got = torch.compile(lambda t: t.sum(0), backend="kiln")(x)
    assert _relative(got, exact) <= max(2e-6, 3 * _relative(x.sum(0), exact))
