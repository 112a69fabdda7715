"""A reduction over size-1 axes (ResNet's global pooling of a 1x1 feature map) is its input (passes/simplify.py).

Found on the H200: kept as a reduction of rows of one element, a bf16 ResNet at 32x32 generated a Triton kernel
that stored a row value through a [rows, RBLOCK] mask, which Triton refuses to compile."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.report import mark, reports_since
from tests.gpu.conftest import DEVICE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_reduction_over_size_one_axes_is_its_input(dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 1, 1, device=DEVICE).to(dtype)

    def fn(x):
        return (F.adaptive_avg_pool2d(F.relu(x) + 1, 1).flatten(1), x.sum((2, 3)), x.amax(-1), (x > 0).sum(-1),
                x.argmax(-1))
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(fn, fallback=False, target="triton")(x)
    for g, e in zip(got, fn(x)):
        torch.testing.assert_close(g, e)
    notes = [note for p in reports_since(position)[-1].passes for note in p.notes]
    assert any("reduction over size-1 axes" in note for note in notes), notes


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_an_element_stored_beside_a_reduction_of_extent_one(dynamic):
    """A gathered value reduced over a size-1 axis (argmin) and also returned: one kernel stores the element
    inside the reduction's loop at an index without the reduction position (fuzz_symbolic --target triton,
    seed 149: the store's pointer was a [rows, 1] block for a [rows, RBLOCK] value, which tl.store refuses)."""
    torch.manual_seed(0)
    x = (torch.rand(1, 3, 1, device=DEVICE) + 0.5).to(torch.bfloat16).expand(5, 3, 8)
    idx = torch.randint(0, 5, (1, 7, 1, 6), device=DEVICE)

    def fn(x, idx):
        g = torch.gather(x.expand(2, 5, 3, -1), -3, idx)
        return g.argmin(dim=2), g.squeeze(-3) * 2

    torch._dynamo.reset()
    position = mark()
    with torch.inference_mode():
        got = torch.compile(fn, backend="kiln", dynamic=dynamic,
                            options={"target": "triton", "fallback": False})(x, idx)
    for g, e in zip(got, fn(x, idx)):
        torch.testing.assert_close(g, e)
    assert all(r.fallback is None for r in reports_since(position))
    torch._dynamo.reset()
