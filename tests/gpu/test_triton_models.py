"""The suite's models (small shapes) through the Triton generator: whole graph, matching eager.

On the GPU in fp32 and bf16 (bf16 against an fp32 reference); under the interpreter in fp32 only (it is slow).
"""
import pytest
import torch

import kiln
from benchmarks.models import MODELS
from kiln.report import mark, reports_since
from tests.gpu.conftest import DEVICE, HAS_CUDA
from tests.models.test_suite_models import ALLOWED_EXTERNS

SMALL = {"seed": {"size": 20}, "mlp": {"batch": 4},
         "resnet18": {"size": 32}, "gpt": {"seq": 8}, "chain": {"size": 48}}
DTYPES = [torch.float32, torch.bfloat16] if HAS_CUDA else [torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_suite_model_on_triton(name, dtype):
    model, inputs = MODELS[name](**SMALL[name], device=DEVICE, dtype=dtype)
    ref_model, ref_inputs = MODELS[name](**SMALL[name], device=DEVICE, dtype=torch.float32)
    position = mark()
    # fp32 is judged without TF32 (the bar: 1e-3 with tf32 off); eager's reference likewise
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        _check(name, dtype, model, inputs, ref_model, ref_inputs, position)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _check(name, dtype, model, inputs, ref_model, ref_inputs, position):
    with torch.inference_mode():
        expected = ref_model(*ref_inputs)
        compiled = kiln.compile(model, target="triton", fallback=False, fullgraph=True)
        got = compiled(*inputs)
        again = compiled(*inputs)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for out in (got, again):
        err = (out.float() - expected).norm() / expected.norm()
        assert err < tol, f"relative error {err:.2e}"
    reports = reports_since(position)
    assert len(reports) == 1 and reports[0].fallback is None and reports[0].target == "triton"
    assert set(reports[0].externs) <= ALLOWED_EXTERNS, reports[0].externs
