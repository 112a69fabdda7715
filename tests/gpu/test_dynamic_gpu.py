"""Graphs traced with dynamic shapes on the Triton target: a static GPU module per size tuple ([Note: a GPU module
per size] in kiln/runtime/dynamic.py), each size checked against eager; nothing runs eagerly.

Runs on the GPU when there is one, else under Triton's interpreter on CPU tensors (CI); sizes are small."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.report import mark, reports_since
from tests.cpu.test_dynamic_shapes import _GPT
from tests.gpu.conftest import DEVICE, HAS_CUDA


def _symbolic_report(position):
    reports = reports_since(position)
    assert reports and all(r.fallback is None for r in reports), [r.fallback for r in reports]
    symbolic = [r for r in reports if r.dynamic]
    assert len(symbolic) == 1 and symbolic[0].target == "triton", [(r.name, r.target) for r in reports]
    return symbolic[0]


def test_a_module_per_size_each_matching_eager():
    def f(x, w):
        h = torch.relu(x @ w) + x.sum(-1, keepdim=True)
        return F.softmax(h, -1) * 2

    torch.manual_seed(0)
    position = mark()
    compiled = kiln.compile(f, target="triton", dynamic=True)
    w = torch.randn(16, 16, device=DEVICE)
    with torch.inference_mode():
        for n in (3, 5, 9, 5):  # (5 again: its module is reused)
            x = torch.randn(n, 16, device=DEVICE)
            torch.testing.assert_close(compiled(x, w), f(x, w), rtol=2e-5, atol=2e-5)
    report = _symbolic_report(position)
    assert report.dynamic["builds"] == 3 and len(report.dynamic["sizes"]) == 3


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpt_over_sequence_lengths_on_the_triton_target(mode):
    torch.manual_seed(0)
    model = _GPT().eval().to(DEVICE)
    position = mark()
    compiled = kiln.compile(model, target="triton", mode=mode, dynamic=True)
    with torch.inference_mode():
        for T in (5, 17, 9, 17):
            ids = torch.randint(0, 97, (1, T), device=DEVICE)
            for _ in range(2 if HAS_CUDA else 1):  # (reduce-overhead records at a size's second call)
                torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-4, atol=1e-4)
    report = _symbolic_report(position)
    assert report.dynamic["builds"] == 3
