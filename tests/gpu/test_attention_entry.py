"""[Note: attention's entry] (kiln/ir/extern.py): how a generated call reaches ATen's attention."""
import functools

import pytest
import torch
import torch.nn.functional as F

from kiln import config
from kiln.ir.extern import EFFICIENT_UP_TO, attention_efficient_first, fast_callable
from tests.gpu.conftest import DEVICE

SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _qkv(t: int, s: int, d: int = 64, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """Q, K, V as kiln's fused attention passes them: strided views of one projection's rows."""
    rows = torch.randn(max(t, s), 3 * 2 * d, device=DEVICE, dtype=dtype)
    q = rows[:t, :2 * d].view(t, 2, d).transpose(0, 1).unsqueeze(0)
    k = rows[:s, 2 * d:4 * d].view(s, 2, d).transpose(0, 1).unsqueeze(0)
    v = rows[:s, 4 * d:].view(s, 2, d).transpose(0, 1).unsqueeze(0)
    return q, k, v


def test_the_entry_is_chosen_per_mode_and_by_the_option():
    default = fast_callable(SDPA)
    graphs = fast_callable(SDPA, mode="reduce-overhead")
    assert isinstance(default, functools.partial) and default.func is attention_efficient_first
    assert default.keywords["efficient_up_to"] == EFFICIENT_UP_TO[0]
    assert graphs.keywords["efficient_up_to"] == EFFICIENT_UP_TO[1] < EFFICIENT_UP_TO[0]
    with config.scope(gpu_attention_entry="composite"):
        assert fast_callable(SDPA) is SDPA
    with config.scope(gpu_attention_entry="efficient"):
        assert fast_callable(SDPA).keywords["efficient_up_to"] is None
    with pytest.raises(ValueError, match="gpu_attention_entry"):
        config.get().with_options(gpu_attention_entry="flash")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t,s", [(37, 37), (300, 300), (5, 19)])
def test_the_entry_computes_what_the_composite_does(causal, t, s):
    """Small problems take the efficient op on CUDA, large ones (and CPU tensors) the composite; causal with other
    key counts than queries keeps the composite's top-left convention.  bf16 on the GPU against an fp32 reference."""
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    q, k, v = _qkv(t, s, dtype=dtype)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=0.125)
    for limit in (None, 0, EFFICIENT_UP_TO[0]):
        got = attention_efficient_first(q, k, v, is_causal=causal, scale=0.125, efficient_up_to=limit)
        assert got.shape == want.shape and got.dtype == dtype
        tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1.3e-5, atol=1.5e-5)
        torch.testing.assert_close(got.float(), want, **tol)


def test_masks_and_dropout_go_to_the_composite():
    q, k, v = _qkv(8, 8)
    mask = torch.rand(8, 8, device=DEVICE) > 0.3
    mask[:, 0] = True
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(attention_efficient_first(q, k, v, mask), want, rtol=1.3e-5, atol=1.5e-5)


CUDNN = torch.ops.aten._scaled_dot_product_cudnn_attention.default


def test_cudnn_attention_is_replaced_only_where_its_first_output_alone_is_read():
    """[Note: cuDNN attention's first call]: the generated call's entry for ATen's cuDNN op is the efficient-first
    function only where nothing but the attention output is read (a training graph's logsumexp is cuDNN's)."""
    from kiln.ir.extern import cudnn_efficient_first
    entry = fast_callable(CUDNN, first_output_only=True)
    assert isinstance(entry, functools.partial) and entry.func is cudnn_efficient_first
    assert entry.keywords["efficient_up_to"] == EFFICIENT_UP_TO[0]
    assert fast_callable(CUDNN) is CUDNN
    with config.scope(gpu_attention_entry="composite"):
        assert fast_callable(CUDNN, first_output_only=True) is CUDNN


@pytest.mark.skipif(DEVICE != "cuda", reason="cuDNN attention needs a GPU")
@pytest.mark.parametrize("mask_shape", [(1, 1, 1, 64), (2, 1, 48, 64), (2, 2, 48, 64), None])
def test_efficient_first_computes_what_cudnn_does(mask_shape):
    """The efficient op with cuDNN's additive bias broadcast to the scores: the same result as the cuDNN op, for a
    key padding row, a per-query mask, one per head, none; a query whose keys are all masked too."""
    from kiln.ir.extern import cudnn_efficient_first
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 2, 48, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    bias = None
    if mask_shape is not None:
        masked = torch.rand(mask_shape, device="cuda", generator=gen) > 0.6
        masked[..., :4] = False  # (every query keeps a key)
        bias = torch.zeros(mask_shape, device="cuda", dtype=torch.bfloat16).masked_fill(masked, float("-inf"))
    want = CUDNN(q, k, v, bias, False, 0.0, False, False, scale=0.125)[0]
    for limit in (None, EFFICIENT_UP_TO[0], 0):
        got = cudnn_efficient_first(q, k, v, bias, False, 0.0, False, False, scale=0.125, efficient_up_to=limit)[0]
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
