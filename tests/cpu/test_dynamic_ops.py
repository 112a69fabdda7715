"""Ops whose sizes, scales or positions come from symbolic sizes, compiled once with ``dynamic=True`` and checked
against eager at three shapes, forward and backward: means and variances over symbolic extents (``1 / N`` as a
float of sizes), norms, scaled attention, interpolation, pooling, positions from ``arange``, losses, padding,
fold/unfold.  Written after two wrong results this suite now catches: a float of sizes divided by a product
printed without parentheses (an instance norm's backward), and ``arange(1, n + 1)`` starting at 0."""
import math

import pytest
import torch
import torch.nn.functional as F

from kiln.report import mark, reports_since

CASES = {
    "mean_all": lambda x: x.mean() + x.mean((0, 1)).sum(),
    "var_std": lambda x: x.var(-1).sum() + x.std((0, 2), correction=0).sum(),
    "group_norm": lambda x: F.group_norm(x.reshape(x.shape[0], x.shape[1], -1), 1).sum(-1),
    "instance_norm": lambda x: F.instance_norm(x),
    "batch_norm_train": lambda x: F.batch_norm(x, None, None, training=True),
    "scaled_softmax": lambda x: torch.softmax(x @ x.transpose(-1, -2) / math.sqrt(x.shape[-1]), -1),
    "sdpa": lambda x: F.scaled_dot_product_attention(x, x, x),
    "interp_nearest": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "interp_bilinear": lambda x: F.interpolate(x, size=(x.shape[-2] * 2, 5), mode="bilinear", align_corners=False),
    "interp_bilinear_1_5": lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True),
    "avg_pool": lambda x: F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False),
    "adaptive_avg": lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
    "by_numel": lambda x: x / x.numel() + x.sum() / (x.shape[0] * x.shape[-1]),
    "arange_scaled": lambda x: x * torch.arange(x.shape[-1], dtype=x.dtype) / (x.shape[-1] - 1),
    "running_mean": lambda x: x.cumsum(-1) / torch.arange(1, x.shape[-1] + 1),
    "pow_of_size": lambda x: x * (x.shape[0] ** 0.5) + x / (x.shape[1] ** 2),
    "cross_entropy": lambda x: F.cross_entropy(x.reshape(-1, x.shape[-1]),
                                               torch.arange(x.numel() // x.shape[-1]) % x.shape[-1]).reshape(1),
    "log_softmax_mean": lambda x: F.log_softmax(x, -1).mean(0),
    "pad_reflect": lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"),
    "unfold_fold": lambda x: F.fold(F.unfold(x, 2, stride=2), x.shape[-2:], 2, stride=2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_over_symbolic_sizes_matches_eager_forward_and_backward(name):
    fn = CASES[name]
    torch._dynamo.reset()
    position = mark()
    compiled = torch.compile(fn, backend="kiln", dynamic=True)
    for k, shape in enumerate(((2, 3, 4, 6), (3, 5, 6, 8), (4, 2, 8, 10))):
        gen = torch.Generator().manual_seed(k)
        x = torch.randn(shape, generator=gen, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        got, want = compiled(x), fn(x2)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * max(1.0, want.abs().max().item()))
        grad = torch.randn(want.shape, generator=gen)
        got.backward(grad)
        want.backward(grad)
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5 * max(1.0, x2.grad.abs().max().item()))
    assert all(r.fallback is None for r in reports_since(position)), [r.fallback for r in reports_since(position)]
