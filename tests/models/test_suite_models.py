"""End-to-end: the benchmark suite's models (small shapes) compile whole and match eager."""
import pytest
import torch

import kiln
from benchmarks.models import MODELS
from kiln.report import mark, reports_since

SMALL = {
    "seed": {"size": 32},
    "mlp": {"batch": 4},
    "resnet18": {"size": 64},
    "gpt": {"seq": 16},
    "chain": {"size": 64},
}
# matmul (ATen/MKL or oneDNN, whichever measured faster), convolution and pooling
ALLOWED_EXTERNS = {"convolution", "onednn_convolution", "conv_winograd", "conv_gemm", "attention", "mm", "addmm",
                   "bmm", "onednn_linear", "linear_packed", "scaled_dot_product_attention", "max_pool2d_with_indices",
                   "avg_pool2d"}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_suite_model_matches_eager(name):
    model, inputs = MODELS[name](**SMALL[name])
    position = mark()
    with torch.inference_mode():
        expected = model(*inputs)
        compiled = kiln.compile(model, fallback=False, fullgraph=True)
        got = compiled(*inputs)
        again = compiled(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(again, expected, rtol=1e-4, atol=1e-4)
    reports = reports_since(position)
    assert len(reports) == 1 and reports[0].fallback is None
    assert set(reports[0].externs) <= ALLOWED_EXTERNS, reports[0].externs


def test_fresh_inputs_each_call():
    model, (x,) = MODELS["seed"](size=24)
    with torch.inference_mode():
        compiled = kiln.compile(model)
        for _ in range(3):
            x = torch.randn_like(x)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
