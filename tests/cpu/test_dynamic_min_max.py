"""Graphs traced with dynamic shapes whose sizes are the least or greatest of two unrelated sizes (Dynamo's
``Min``/``Max``: a diagonal over a matrix of two symbolic sizes, a buffer as long as the longer of two inputs):
compiled whole on the CPU (no eager fallback), one symbolic graph for every size, each checked against eager."""
import torch

from kiln.report import mark, reports_since


def _check(fn, shapes):
    torch._dynamo.reset()
    position = mark()
    compiled = torch.compile(fn, backend="kiln", dynamic=True)
    gen = torch.Generator().manual_seed(0)
    for shape_set in shapes:
        inputs = [torch.randn(*s, generator=gen) for s in shape_set]
        torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=1.3e-5, atol=1.5e-5)
    reports = reports_since(position)
    assert reports and all(r.fallback is None for r in reports), [r.fallback for r in reports]
    assert any(r.dynamic for r in reports)
    return reports


def test_diagonal_of_two_symbolic_sizes():
    def f(x):
        d = torch.diagonal(x, 0, -2, -1)          # [B, Min(R, C)]
        return d.sum(-1) + x.mean() * d.shape[-1]
    reports = _check(f, [[(3, 5, 7)], [(4, 9, 6)], [(2, 6, 6)], [(3, 11, 4)]])
    assert any("((" in r.source and "?" in r.source for r in reports if r.dynamic)  # (Min in the C++ sizes)


def test_offset_diagonal_then_elementwise():
    def f(x, y):
        d = torch.diagonal(x, 1, 0, 1)           # Min(R, C - 1)
        return torch.relu(d) * 2 + y[: d.shape[0]].sum()
    _check(f, [[(5, 7), (9,)], [(8, 6), (12,)], [(4, 4), (7,)]])


def test_longer_of_two_inputs():
    def f(x, y):
        n = max(x.shape[0], y.shape[0])         # Max(s0, s1)
        out = x.new_zeros(n)
        return out + torch.nn.functional.pad(x, (0, n - x.shape[0])) + torch.nn.functional.pad(y, (0, n - y.shape[0]))
    _check(f, [[(5,), (7,)], [(9,), (4,)], [(6,), (6,)], [(3,), (8,)]])

