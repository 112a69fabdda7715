"""Random programs through the Triton code generator, with their gradients ([Note: fuzzing gradients]).

The fuzzer's programs make CPU tensors, so its runs on the device machine reach the C++ target only; here the
Triton target runs them under Triton's interpreter (CI).  Its first runs found a wrong result (an input updated
in place written over), NaN gradients (half-precision comparisons), and constants Triton could not parse."""
import importlib.util
import os

import pytest
import torch

import kiln
from kiln.testing import fuzz
from tests.gpu.conftest import HAS_CUDA


@pytest.mark.skipif(HAS_CUDA, reason="CPU tensors through the Triton target: Triton's interpreter (CI)")
def test_programs_and_their_gradients_through_the_triton_target():
    """80 programs (float32 and half), each compiled for inference and for training: outputs and inputs'
    gradients against eager's.  ~20 s on the 2-core dev box."""
    summary = fuzz.run_seeds(list(range(8000, 8080)), size="ci", dtype="all", jobs=2, group=5, log=None,
                             options={"target": "triton"}, grad=True)
    assert not summary.failing(), summary.format()
    assert summary.counts()["ok"] >= 72, summary.format()


def test_outputs_kiln_merges_are_distinct_tensors_on_the_triton_target():
    """[Note: one value at two outputs] through the Triton target (gradient fuzz seed 4192 crashed there too)."""
    from tests.cpu.test_runtime import check_outputs_kiln_merges_are_distinct_tensors
    from tests.gpu.conftest import DEVICE
    check_outputs_kiln_merges_are_distinct_tensors(DEVICE, target="triton")


def test_variance_of_equal_values_on_the_triton_target():
    """[Note: the variance of equal values] through the Triton target (gradient fuzz seed 9304 failed on both)."""
    from tests.cpu.test_variance import check_variance_of_equal_values
    from tests.gpu.conftest import DEVICE
    check_variance_of_equal_values(DEVICE, target="triton")


_FOUND = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fuzz", "found")


@pytest.mark.skipif(HAS_CUDA, reason="the reproducers make CPU tensors: Triton's interpreter (CI)")
@pytest.mark.parametrize("name", sorted(f for f in os.listdir(_FOUND) if f.endswith(".py")
                                        and "def check_gradients" in open(os.path.join(_FOUND, f)).read()))
def test_found_gradient_reproducers_through_the_triton_target(name):
    """Every shrunk reproducer of a gradient failure (tests/fuzz/found/, run there on the C++ target) through the
    Triton target too: two of them failed on it alone (a half value stored and used unrounded; the
    interpreter's bf16 truncation)."""
    spec = importlib.util.spec_from_file_location(f"found_{name[:-3]}", os.path.join(_FOUND, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch._dynamo.reset()
    with kiln.config.scope(target="triton"):
        module.check_gradients("kiln")


def test_bf16_casts_round_to_nearest_even():
    """A kernel's fp32 -> bf16 conversion rounds as ATen's does (ties to even; [Note: the interpreter's bf16
    rounding] - Triton's interpreter truncated), subnormals kept."""
    from tests.gpu.conftest import DEVICE
    x = torch.randn(4096, device=DEVICE) * 3
    x[:6] = torch.tensor([1.00390625, 1.01171875, -1.00390625, 1e-40, float("nan"), float("inf")])
    torch._dynamo.reset()
    got = kiln.compile(lambda t: (t * 1.0).to(torch.bfloat16), target="triton", fallback=False)(x)
    want = x.to(torch.bfloat16)
    assert torch.equal(got.view(torch.int16)[5:], want.view(torch.int16)[5:]) and got[4].isnan()


def test_values_read_before_an_update_keep_the_old_values_on_the_triton_target():
    """[Note: reads before an in-place update] through the Triton target (fuzz seed 11444 failed on both)."""
    from tests.cpu.test_inplace_updates import check_values_read_before_an_update_keep_the_old_values
    from tests.gpu.conftest import DEVICE
    check_values_read_before_an_update_keep_the_old_values(DEVICE, target="triton")


def test_dynamic_training_outputs_that_view_an_intermediate_on_the_triton_target():
    """fuzz_symbolic --grad seed 84 through the Triton target (it failed on both)."""
    from tests.cpu.test_training import check_dynamic_training_outputs_that_view_an_intermediate
    from tests.gpu.conftest import DEVICE
    check_dynamic_training_outputs_that_view_an_intermediate(DEVICE, target="triton")
