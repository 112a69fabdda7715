"""Reductions over several dims of a view, split into runs ([Note: reduction rows in runs], codegen/cpp.py) or
blocked by the vector ([Note: reduction index blocked by the vector]): per-channel statistics over NCHW planes
whose size is a multiple of the vector, is not, or is shorter than one vector; every reduction kind, an
elementwise pass over the row, BatchNorm's training forward and backward against eager, and a reduced view whose
inner run is not contiguous (no split: the plain loop)."""
import copy

import pytest
import torch

import kiln
from tests.cpu.test_reduction_remainder import _check  # (compiled against eager, NaN-aware; returns the report)


def _stats(t):
    mean = t.mean((0, 2, 3), keepdim=True)
    centered = t - mean
    var = (centered * centered).mean((0, 2, 3), keepdim=True)
    return t.sum((0, 2, 3)), t.amax((0, 2, 3)), t.amin((0, 2, 3)), centered * torch.rsqrt(var + 1e-5)


@pytest.mark.parametrize("shape", [(4, 8, 3, 3), (2, 5, 5, 7), (3, 6, 6, 6), (2, 4, 7, 7), (4, 3, 14, 14),
                                   (2, 4, 17, 3), (4, 3, 8, 8)])
def test_statistics_over_planes(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen) * 2 + 1
    x[0, 0, 0, 1] = float("nan")  # seen only by channel 0's row
    source = _check(_stats, x).source
    plane = shape[2] * shape[3]
    if plane % 16 == 0:
        assert "const int64_t rb = r0 / 16;" in source  # blocks of the vector
    else:
        assert "ro < " in source and "ri" in source  # runs of one plane, no division per lane
        assert f"% {plane})" not in source and f"/ {plane})" not in source


def test_batch_norm_training_forward_and_backward():
    gen = torch.Generator().manual_seed(7)
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(6), torch.nn.ReLU()).train()
    with torch.no_grad():
        model[0].weight.copy_(torch.rand(6, generator=gen) + 0.5)
        model[0].bias.copy_(torch.randn(6, generator=gen))
    reference = copy.deepcopy(model)
    x = torch.randn(3, 6, 7, 7, generator=gen)
    g = torch.randn(3, 6, 7, 7, generator=gen)
    compiled = kiln.compile(model, fallback=False)
    for m, fn in ((model, compiled), (reference, reference)):
        xi = x.clone().requires_grad_()
        (fn(xi) * g).sum().backward()
        m.input_grad = xi.grad
    torch.testing.assert_close(model.input_grad, reference.input_grad, rtol=1e-5, atol=1e-5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[0].running_var, reference[0].running_var)


def test_runs_not_contiguous_keep_the_plain_loop():
    x = torch.randn(5, 4, 7, 6)
    source = _check(lambda t: t[..., ::2].sum((0, 2, 3)), x).source  # every other element: no contiguous run
    assert "ro < " not in source
