"""[Note: cuDNN attention's backward reads its operands in the forward's layouts] (ir/extern.py): the cuDNN
attention backward infers its output's and incoming gradient's layout from the query's, so kiln's call hands it
``out`` and ``grad_out`` laid out as the query is (and the statistics contiguous), copying only what does not
match.  The op itself needs a GPU; here it is replaced by a recorder of what it was given."""
import pytest
import torch

from kiln.ir import extern


@pytest.fixture
def received(monkeypatch):
    seen = {}

    def record(grad_out, query, key, value, out, logsumexp, *args, **kwargs):
        seen.update(grad_out=grad_out, query=query, out=out, logsumexp=logsumexp, args=args, kwargs=kwargs)
        return query, key, value
    monkeypatch.setattr(extern, "_CUDNN_BACKWARD", record)
    return seen


def _heads(b=2, t=5, h=3, d=4):
    """A [B, H, T, D] view of a [B, T, H, D] projection, as attention's query is."""
    return torch.randn(b, t, h, d).transpose(1, 2)


def test_contiguous_out_and_gradient_are_laid_out_as_the_query(received):
    q, k, v = _heads(), _heads(), _heads()
    out, grad = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)  # (contiguous: kiln's own layout)
    lse = torch.randn(2, 3, 5, 1).transpose(2, 3).transpose(2, 3)[..., 0]
    call = extern.fast_callable(torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default)
    call(grad, q, k, v, out, lse, None, None, None, None, None, 5, 5, 0.0, False, scale=0.5)
    got = received
    assert got["out"].stride() == q.stride() and got["grad_out"].stride() == q.stride()
    torch.testing.assert_close(got["out"], out, rtol=0, atol=0)
    torch.testing.assert_close(got["grad_out"], grad, rtol=0, atol=0)
    assert got["logsumexp"].is_contiguous() and got["query"] is q
    assert got["args"][-2:] == (0.0, False) and got["kwargs"] == {"scale": 0.5}


def test_matching_operands_pass_without_a_copy(received):
    q = _heads()
    out, grad = _heads(), _heads()
    lse = torch.randn(2, 3, 5)
    extern.cudnn_attention_backward(grad, q, q, q, out, lse, None, None, None, None, None, 5, 5, 0.0, False)
    assert received["out"] is out and received["grad_out"] is grad and received["logsumexp"] is lse


def test_matching_layout_orders_dimensions_like_the_reference():
    like = torch.randn(2, 7, 3, 4).permute(0, 2, 1, 3)  # [2, 3, 7, 4], memory order (0, 2, 1, 3)
    t = torch.randn(2, 3, 7, 4)
    moved = extern.matching_layout(t, like)
    assert moved.stride() == like.stride()
    torch.testing.assert_close(moved, t, rtol=0, atol=0)
    assert extern.matching_layout(moved, like) is moved
    # a size-1 dimension's stride does not matter
    one = torch.randn(2, 1, 7, 4)
    assert extern.matching_layout(one, torch.randn(2, 7, 1, 4).transpose(1, 2)) is one
