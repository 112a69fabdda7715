"""kiln's CPU attention kernel (library/attention/source.py) against float64 attention: shapes with tails, strided
views as the model gives them, both masks, threads, the measured choice, and its error messages."""
import pytest
import torch
import torch.nn.functional as F

from kiln import config
from kiln.library.attention import fuse as attention
from kiln.tune.choices import Choices
from kiln.library.attention import op as cpu_attention

pytestmark = pytest.mark.skipif(not cpu_attention.available(), reason="no AVX2/AVX-512 compiler for kiln's kernels")


def _reference(q, k, v, scale, causal):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal, scale=scale)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("b,h,t,d", [(1, 3, 37, 20), (2, 2, 50, 64), (1, 1, 1, 8), (1, 2, 33, 40), (1, 2, 48, 64)])
def test_matches_float64(b, h, t, d, causal):
    gen = torch.Generator().manual_seed(t * d)
    q, k, v = (torch.randn(b, h, t, d, generator=gen) for _ in range(3))
    scale = d ** -0.5
    got = torch.ops.kiln.attention(q, k, v, None, scale, causal, False)
    ref = _reference(q, k, v, scale, causal)
    aten = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    assert got.shape == ref.shape
    assert (got.double() - ref).abs().max() <= 2 * (aten.double() - ref).abs().max() + 1e-6


def test_strided_views_and_layout():
    """Q, K, V as the model makes them (views of one [B, T, 3, H, D] projection), K with a non-unit D stride."""
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(2, 24, 3, 4, 16, generator=gen)
    q, k, v = (qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
    k = k.transpose(2, 3).contiguous().transpose(2, 3)  # [B, H, T, D] with D strided
    got = torch.ops.kiln.attention(q, k, v, None, 0.25, True, False)
    torch.testing.assert_close(got, _reference(q, k, v, 0.25, True).float(), rtol=1.3e-5, atol=1.5e-5)
    assert got.permute(0, 2, 1, 3).is_contiguous()  # [B, T, H, D] underneath: merging heads is a view


def test_two_threads_match_one():
    q, k, v = (torch.randn(1, 6, 40, 32) for _ in range(3))
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.kiln.attention(q, k, v, None, 0.2, True, False)
        torch.set_num_threads(2)
        two = torch.ops.kiln.attention(q, k, v, None, 0.2, True, False)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, two)


def test_scores_far_below_the_row_max():
    """Scores 90 to 2000 below their row's max: the softmax's exponential flushes e^x below e^-87 to 0 (the
    probabilities it drops are under 1.6e-38); rows whose scores spread little keep every key."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen) for _ in range(3))
    q[:, :, :20] *= 60.0  # half the rows: scores spread by hundreds
    got = torch.ops.kiln.attention(q, k, v, None, 0.25, False, False)
    torch.testing.assert_close(got, _reference(q, k, v, 0.25, False).float(), rtol=1.3e-5, atol=1.5e-5)


def test_nan_scores_give_nan_rows_as_torch():
    q, k, v = (torch.randn(1, 1, 8, 8) for _ in range(3))
    q[0, 0, 5, 2] = float("nan")
    got = torch.ops.kiln.attention(q, k, v, None, 0.5, False, False)
    assert torch.isnan(got[0, 0, 5]).all() and not torch.isnan(got[0, 0, :5]).any()


def test_bad_input_is_named():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="4-D fp32 CPU tensors"):
        torch.ops.kiln.attention(q.double(), q, q, None, 1.0, False, False)
    with pytest.raises(ValueError, match="must be"):
        torch.ops.kiln.attention(q, torch.randn(1, 2, 8, 8), q, None, 1.0, False, False)
    with pytest.raises(ValueError, match="causal mask needs as many keys"):
        torch.ops.kiln.attention(q, torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16), None, 1.0, True, False)


def test_choice_is_measured_once(tmp_path):
    with config.scope(cache_dir=str(tmp_path)):
        first = Choices()
        choice = attention.choose(first, 1, 2, 64, 64, 32, True)
        assert first.made[-1].how == "measured"
        later = Choices()  # (another compile: the tuning database has the answer)
        assert attention.choose(later, 1, 2, 64, 64, 32, True) == choice and later.made[-1].how == "stored"


def _masked_reference(q, k, v, mask, scale, causal=False):
    scores = q.double() @ k.double().transpose(-1, -2) * scale + mask.double()
    if causal:
        t, s = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ v.double()


@pytest.mark.parametrize("mask_shape", ["b1ts", "1hts", "ts", "bhts-transposed"])
@pytest.mark.parametrize("b,h,t,s,d", [(2, 3, 37, 45, 32), (1, 2, 70, 70, 16), (1, 1, 5, 9, 24)])
def test_additive_mask_broadcast_and_strided(b, h, t, s, d, mask_shape):
    """The additive mask as models pass it (padding [B, 1, T, S], position bias [1, H, T, S], [T, S]) and as a
    transposed view (its key stride not 1: the scalar path); queries past a 16-row tile, keys past a 16-column one,
    cross attention (S != T)."""
    gen = torch.Generator().manual_seed(t + s + d)
    q = torch.randn(b, h, t, d, generator=gen)
    k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(2))
    shape = {"b1ts": (b, 1, t, s), "1hts": (1, h, t, s), "ts": (t, s), "bhts-transposed": (b, h, s, t)}[mask_shape]
    mask = torch.randn(*shape, generator=gen) * 3
    if mask_shape == "bhts-transposed":
        mask = mask.transpose(-1, -2)
    got = torch.ops.kiln.attention(q, k, v, mask, d ** -0.5, False, True)
    torch.testing.assert_close(got, _masked_reference(q, k, v, mask, d ** -0.5).float(), rtol=1.3e-5, atol=1.5e-5)


def test_fully_masked_rows_give_zeros_or_nan():
    """A query whose keys are all masked (-inf): ATen's flash kernels give zeros (``zero_empty``), softmax NaN."""
    q, k, v = (torch.randn(1, 2, 20, 16) for _ in range(3))
    mask = torch.zeros(1, 1, 20, 20)
    mask[..., 3, :] = float("-inf")
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask)[0]
    zeros = torch.ops.kiln.attention(q, k, v, mask, 0.25, False, True)
    nans = torch.ops.kiln.attention(q, k, v, mask, 0.25, False, False)
    assert (zeros[:, :, 3] == 0).all() and torch.isnan(nans[:, :, 3]).all()
    torch.testing.assert_close(zeros, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, attn_mask=mask, scale=0.25)[0], rtol=1.3e-5, atol=1.5e-5)
    assert not torch.isnan(flash).any()


def test_the_avx2_build_matches(tmp_path):
    """The kernel as an AVX2 machine compiles it (16-query blocks, 6-row tiles): built here with AVX-512 off and
    called with the arguments the binder gives the native build."""
    import ctypes
    from kiln.runtime import native
    from kiln.runtime.build import load_module
    from kiln.library.attention.source import attention_source
    with config.scope(cache_dir=str(tmp_path)):
        avx2 = load_module(attention_source(), name="kiln_attention_avx2", extra_flags=("-mno-avx512f",)).lib
    assert avx2.kiln_gemm_nr() == 16
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 41, 32, generator=gen) for _ in range(3))
    mask = torch.randn(2, 1, 41, 41, generator=gen)
    for causal in (False, True):
        out = torch.empty(2, 41, 3, 32).permute(0, 2, 1, 3)
        op = torch.ops.kiln.attention.default
        fn, values = native._prepare(op, native.op_args(op, q, k, v, mask, 0.3, causal, True), out)
        ctypes.CFUNCTYPE(None, *fn._argtypes_)(ctypes.cast(avx2.kiln_attention, ctypes.c_void_p).value)(*values)
        torch.testing.assert_close(out, _masked_reference(q, k, v, mask, 0.3, causal).float(), rtol=1.3e-5,
                                   atol=1.5e-5)
