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
@pytest.mark.parametrize("b,h,t,d", [(1, 3, 37, 20), (2, 2, 50, 64), (1, 1, 1, 8), (1, 2, 33, 40)])
def test_matches_float64(b, h, t, d, causal):
    gen = torch.Generator().manual_seed(t * d)
    q, k, v = (torch.randn(b, h, t, d, generator=gen) for _ in range(3))
    scale = d ** -0.5
    got = torch.ops.kiln.attention(q, k, v, scale, causal)
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
    got = torch.ops.kiln.attention(q, k, v, 0.25, True)
    torch.testing.assert_close(got, _reference(q, k, v, 0.25, True).float(), rtol=1.3e-5, atol=1.5e-5)
    assert got.permute(0, 2, 1, 3).is_contiguous()  # [B, T, H, D] underneath: merging heads is a view


def test_two_threads_match_one():
    q, k, v = (torch.randn(1, 6, 40, 32) for _ in range(3))
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.kiln.attention(q, k, v, 0.2, True)
        torch.set_num_threads(2)
        two = torch.ops.kiln.attention(q, k, v, 0.2, True)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, two)


def test_nan_scores_give_nan_rows_as_torch():
    q, k, v = (torch.randn(1, 1, 8, 8) for _ in range(3))
    q[0, 0, 5, 2] = float("nan")
    got = torch.ops.kiln.attention(q, k, v, 0.5, False)
    assert torch.isnan(got[0, 0, 5]).all() and not torch.isnan(got[0, 0, :5]).any()


def test_bad_input_is_named():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="4-D fp32 CPU tensors"):
        torch.ops.kiln.attention(q.double(), q, q, 1.0, False)
    with pytest.raises(ValueError, match="must be"):
        torch.ops.kiln.attention(q, torch.randn(1, 2, 8, 8), q, 1.0, False)
    with pytest.raises(ValueError, match="causal mask needs as many keys"):
        torch.ops.kiln.attention(q, torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16), 1.0, True)


def test_choice_is_measured_once(tmp_path):
    with config.scope(cache_dir=str(tmp_path)):
        first = Choices()
        choice = attention.choose(first, 1, 2, 64, 32, True)
        assert first.made[-1].how == "measured"
        later = Choices()  # (another compile: the tuning database has the answer)
        assert attention.choose(later, 1, 2, 64, 32, True) == choice and later.made[-1].how == "stored"
