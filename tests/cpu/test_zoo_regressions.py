"""Regressions found by the model zoo (tests/models/test_zoo.py), each as the smallest function that showed it.

Every test calls the compiled function twice on different inputs and checks the results of both calls, the
first one after the second call ran: the bugs here gave right answers on the first call only, or let the
second call overwrite what the first returned.
"""
import torch
import torch.nn.functional as F

import kiln
from kiln.report import mark, reports_since


def _two_calls(fn, make_input):
    """Compile ``fn``, call it on two fresh inputs, holding both results; returns [(got, expected), ...]."""
    a, b = make_input(), make_input()
    with torch.inference_mode():
        compiled = kiln.compile(fn, fallback=False, fullgraph=True)
        got_a = compiled(a)
        got_b = compiled(b)
        return [(got_a, fn(a)), (got_b, fn(b))]


def test_extern_reading_a_copying_reshape_sees_each_calls_input():
    """BERT/ViT/Swin with eager attention: ``q @ k^T`` on heads split from a linear's result.  The bmm reads
    ``reshape(transpose(view(addmm)))``, a reshape that copies; the runtime cached that copy as if it were a
    view of the (arena-resident) addmm result, so every later call reused the first call's scores."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64)

    def heads_scores(x):
        q = lin(x).view(2, 16, 4, 16).transpose(1, 2)
        return torch.matmul(q, q.transpose(2, 3))

    for got, expected in _two_calls(heads_scores, lambda: torch.randn(2, 16, 64)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_as_strided_from_adaptive_pooling_is_lowered():
    """Swin's pooler: adaptive_avg_pool1d of a transposed LayerNorm output decomposes to a mean and an
    ``aten.as_strided`` restriding it.  As an extern the as_strided result was a view of kiln's arena, returned
    to the caller and overwritten by the next call.  Lowered, it is a reshape (no extern at all)."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(32)

    def pooled(x):
        h = norm(x)
        return h, torch.flatten(F.adaptive_avg_pool1d(h.transpose(1, 2), 1), 1)

    position = mark()
    for got, expected in _two_calls(pooled, lambda: torch.randn(2, 64, 32)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert reports_since(position)[0].externs == []


def test_as_strided_general_layouts():
    """as_strided of a computed value: a permuted layout (a view), overlapping windows, an offset, stride 0."""
    cases = [((2, 3), (1, 2), 0), ((3, 3), (1, 1), 0), ((2, 2), (3, 1), 1), ((4,), (0,), 2), ((4, 4), (4, 1), 0)]
    for size, stride, offset in cases:
        def restride(x, size=size, stride=stride, offset=offset):
            return torch.as_strided(torch.exp(x), size, stride, offset) + 1
        torch._dynamo.reset()
        for got, expected in _two_calls(restride, lambda: torch.randn(16)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_view_op_extern_does_not_alias_kiln_memory():
    """A view op kiln does not lower (a bit-cast ``view(dtype)``) runs as its ``*_copy`` twin: as the view
    itself, its result aliased kiln's output buffer, which the second call overwrote under the caller."""
    def bitcast(x):
        y = torch.exp(x) * 2
        return y.view(torch.int32), y.sum()

    position = mark()
    for (got_bits, got_sum), (bits, total) in _two_calls(bitcast, lambda: torch.randn(4, 8)):
        torch.testing.assert_close(got_bits.view(torch.float32), bits.view(torch.float32), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_sum, total, rtol=1e-5, atol=1e-5)
    assert reports_since(position)[0].externs == ["view_copy"]


def test_user_sdpa_stays_one_library_call():
    """``F.scaled_dot_product_attention`` in a model (transformers' sdpa attention) runs as one library call, ATen's
    CPU flash attention or kiln's (library/attention): its decomposition (scores materialized between two bmm
    calls) ran Whisper-tiny's 1500-frame encoder at 0.97x eager, the library call at 1.25x."""
    def attend(q, mask):
        k, v = torch.tanh(q), torch.sigmoid(q)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, mask = torch.randn(2, 4, 33, 16), torch.randn(2, 1, 33, 33)
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(attend, fallback=False, fullgraph=True)(q, mask)
    torch.testing.assert_close(got, attend(q, mask), rtol=1e-5, atol=1e-5)
    assert reports_since(position)[0].externs in (["_scaled_dot_product_flash_attention_for_cpu"], ["attention"])
