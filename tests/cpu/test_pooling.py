"""Pooling lowered to kernels (frontend/aten_pool.py): every configuration against eager, NaN propagation,
max-pooling indices computed by kiln exactly as ATen's (ties, NaN, -inf, padding), and the interior loop of a
strided window vectorizes."""
import pytest
import torch
import torch.nn.functional as F

from tests.cpu.test_codegen_cpp import _compile, _is_vectorized, _vectorized_lines
from tests.unit.test_lowering import run

MAX_CASES = [  # kernel, stride, padding, dilation, ceil_mode
    (3, 2, 1, 1, False), (2, 2, 0, 1, False), (3, 1, 1, 1, False), (3, 2, 1, 1, True), (3, 2, 0, 2, False),
    ((2, 3), (1, 2), (1, 0), 1, True), (5, 3, 2, 1, True),
]
AVG_CASES = [  # kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    (3, 2, 1, False, True, None), (3, 2, 1, False, False, None), (2, 2, 0, True, True, None),
    (3, 2, 1, True, False, None), (3, 1, 1, False, True, 2), ((2, 3), (2, 1), (1, 1), True, True, None),
]
SHAPES = [(2, 5, 13, 11), (3, 9, 10)]


@pytest.mark.parametrize("case", MAX_CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_max_pool2d(case, shape):
    k, s, p, d, c = case
    run(lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=c) * 1.5, torch.randn(shape))


@pytest.mark.parametrize("case", AVG_CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_avg_pool2d(case, shape):
    k, s, p, c, cip, dv = case
    run(lambda x: F.avg_pool2d(x, k, s, p, ceil_mode=c, count_include_pad=cip, divisor_override=dv) + 1,
        torch.randn(shape))


def test_max_pool_propagates_nan():
    x = torch.randn(1, 2, 9, 9)
    x[0, 0, 2, 3] = float("nan")
    x[0, 1, 0, 0] = float("nan")  # in a border window (the general, checked loop)
    run(lambda x: F.max_pool2d(x, 3, 2, 1), x)


@pytest.mark.parametrize("case", MAX_CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_max_pool_indices_are_atens(case, shape):
    """[Note: max-pooling indices]: values in a few levels (ties within windows: the first maximum), NaNs (the
    last one), whole windows of -inf (the first in-bounds position), in every configuration; no ATen call."""
    k, s, p, d, c = case
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randint(-2, 3, shape, generator=gen).float()
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=gen)
    flat[picks[:3]] = float("nan")
    flat[picks[3:3 + flat.numel() // 4]] = float("-inf")
    x[..., :3, :3] = float("-inf")  # a corner window of -inf alone
    run(lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=c, return_indices=True), x)
    run(lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=c, return_indices=True), torch.randn(shape))


@pytest.mark.parametrize("case", MAX_CASES[:4])
def test_max_pool_indices_and_gradient_of_a_channels_last_input(case):
    """The same indices (ties, NaN) read from an NHWC input, and the gradient routed through them."""
    import kiln
    k, s, p, d, c = case
    gen = torch.Generator().manual_seed(k * 7 + s)
    x = torch.randint(-2, 3, (2, 8, 13, 11), generator=gen).float().to(memory_format=torch.channels_last)
    x[0, 1, 2, 3] = float("nan")
    run(lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=c, return_indices=True), x)
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    weights = torch.randn(2, 8, 13, 11, generator=gen)

    def loss(t):
        out = F.max_pool2d(t, k, s, p, d, ceil_mode=c)
        return (out * weights[..., :out.shape[2], :out.shape[3]]).sum()
    torch._dynamo.reset()
    kiln.compile(loss, fallback=False)(mine).backward()
    loss(ref).backward()
    torch.testing.assert_close(mine.grad, ref.grad, equal_nan=True)


def test_strided_window_interior_vectorizes(tmp_path):
    """The bounds checks of the padded window are split off (ir/index_split.py): the interior loop has plain
    stride-2 loads, which GCC vectorizes (a masked strided load it does not)."""
    r = _compile(lambda x: F.max_pool2d(torch.relu(x), 3, 2, 1), torch.randn(1, 8, 40, 40))
    vectorized, log = _vectorized_lines(r.source, tmp_path)
    lines = r.source.splitlines()
    interior = [i + 1 for i, line in enumerate(lines) if line.lstrip().startswith("for (int64_t i") and "= 1;" in line]
    assert interior and all(_is_vectorized(ln, vectorized) for ln in interior), log
