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
