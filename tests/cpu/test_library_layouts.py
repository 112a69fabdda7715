"""Every library and native call of kiln, fed every layout it can receive: transposed, sliced with a step,
at a storage offset, expanded (stride 0), size-1 dims, channels-last, and reshapes of such views (which copy).

[Note: the class of bug] A library call reads its operand through strides.  Where the operand is a *reshape of a
view that reshape cannot express* (``x.transpose(0, 1)`` merged to 2-D for a linear layer), the reshape copies, and
the copy's strides say nothing about the buffer the view started from; kiln's native calls once addressed the
held buffer through them (``nn.Linear`` on a transposed input: max abs error 3.3, NaN on an expanded one).  Each
test puts all layouts into one graph (one compile) and runs it with every library choice, native calls on and off.
"""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.library.gemm import select as select_gemm
from kiln.library.attention import op as cpu_attention
from kiln.library.conv import op as cpu_conv
from kiln.library.gemm import op as cpu_gemm


def _compare(fn, *inputs, **options):
    with torch.inference_mode():
        expected = fn(*inputs)
        got = kiln.compile(fn, fallback=False, **options)(*inputs)
    for i, (a, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(a, e, rtol=1.3e-5, atol=2e-5, msg=lambda m, i=i: f"output {i}: {m}")


def _linear_layouts(lin):
    """A linear layer on eight layouts of its [.., 24] input."""
    def fn(a, b, c, d):
        return (lin(a.transpose(0, 1)),                 # [7, 3, 24] of a [3, 7, 24]: reshape copies
                lin(b.expand(4, 5, 24)),                # stride-0 batch
                lin(c[:, ::2]),                         # every other feature: inner stride 2
                lin(c[1:, 3:27]),                       # storage offset, row stride 48
                lin(d.permute(2, 0, 1)),                # inner dim strided
                lin(a[:1]),                             # size-1 leading dim
                lin(a.transpose(0, 1)[:, 1:]),          # transposed and sliced
                lin(a.reshape(21, 24)),                 # plain reshape (a view)
                )
    return fn


@pytest.mark.parametrize("native_calls", [True, False])
@pytest.mark.parametrize("library", ["kiln", "onednn", "aten"])
def test_linear_on_every_layout(library, native_calls):
    if library == "kiln" and not cpu_gemm.available():
        pytest.skip("kiln's GEMM does not build here")
    if library == "onednn" and not select_gemm.onednn_available():
        pytest.skip("no oneDNN")
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40)
    inputs = (torch.randn(3, 7, 24), torch.randn(1, 5, 24), torch.randn(6, 48), torch.randn(5, 6, 24).permute(1, 2, 0))
    _compare(_linear_layouts(lin), *inputs, native_calls=native_calls, choices=f"gemm={library}")


def test_linear_on_transposed_input_regression():
    """../shared/regressions/linear_transposed_input.py, with kiln's default choices."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 768)
    _compare(lambda x: (lin(x.transpose(0, 1)),), torch.randn(2, 17, 256))


def _conv_layouts(conv):
    def fn(x, y):
        return (conv(x),                                              # contiguous
                conv(x.contiguous(memory_format=torch.channels_last)),  # channels-last
                conv(y[:, 3:9, 1:-1, 2:]),                            # sliced C, H and W (offset, row stride)
                conv(y.transpose(2, 3)[:, 6:, :9, :11]),              # transposed H/W
                conv(x[:1].expand(2, -1, -1, -1)),                    # stride-0 batch
                conv(y[:, ::2]),                                      # every other channel
                )
    return fn


@pytest.mark.parametrize("native_calls", [True, False])
@pytest.mark.parametrize("algorithm", ["onednn", "winograd2", "gemm", "direct"])
def test_convolution_on_every_layout(algorithm, native_calls):
    if algorithm != "onednn" and not (cpu_conv.gemm_available() and cpu_gemm.available()):
        pytest.skip("kiln's convolutions do not build here")
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(6, 8, 3, padding=1)
    _compare(_conv_layouts(conv), torch.randn(2, 6, 9, 11), torch.randn(2, 12, 13, 12), native_calls=native_calls,
             choices=f"conv={algorithm}")


def test_depthwise_convolution_on_every_layout():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(6, 6, 3, padding=1, groups=6)
    _compare(_conv_layouts(conv), torch.randn(2, 6, 9, 11), torch.randn(2, 12, 13, 12), choices="conv=dw")


def _attention_layouts(q, k, v, mask):
    """Hand-written and SDPA attention on head-split views, as transformers' models make them."""
    b, t, hd = q.shape
    heads = 4

    def split(x):  # [B, T, H*D] -> [B, H, T, D] (a transposed view)
        return x.view(b, t, heads, hd // heads).transpose(1, 2)
    qs, ks, vs = split(q), split(k), split(v)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    scores = (qs @ ks.transpose(-1, -2)) * (hd // heads) ** -0.5
    hand = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ vs
    kv1 = ks[:, :1].expand(b, heads, t, hd // heads)   # grouped-query style: one head expanded
    return (hand,
            F.scaled_dot_product_attention(qs, ks, vs, is_causal=True),
            F.scaled_dot_product_attention(qs, kv1, vs, attn_mask=mask),
            F.scaled_dot_product_attention(qs[:, :, 1:], ks[:, :, 1:], vs[:, :, 1:]))


@pytest.mark.parametrize("kiln_attention", [True, False])
def test_attention_on_every_layout(kiln_attention):
    if kiln_attention and not cpu_attention.available():
        pytest.skip("kiln's attention does not build here")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 10, 32) for _ in range(3))
    mask = torch.randn(2, 1, 10, 10)
    _compare(_attention_layouts, q, k, v, mask, choices=f"attention={'kiln' if kiln_attention else 'aten'}")


@pytest.mark.parametrize("name", ["_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                                  "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"])
@pytest.mark.parametrize("heads_split", [True, False])
def test_attention_result_layout_agrees_with_aten(name, heads_split):
    """The layout kiln's plan gives an ATen attention op's result (``library.fixed_strides``: kernels index the
    result by it, so merging the heads is a view) is the one the op writes, by torch's meta kernels, for a query
    split from a projection ([B, T, H, D] memory) and a contiguous one; where kiln knows no layout it says None."""
    from kiln import library
    from kiln.ir.extern import build_extern
    from kiln.ir.graph import GraphBuilder
    from kiln.ir.ops import Op
    b_, h, t, d = 2, 4, 16, 8
    op = getattr(torch.ops.aten, name).default
    gb = GraphBuilder()
    if heads_split:
        x = gb.add(Op.INPUT, shape=(b_, t, h * d), dtype=torch.bfloat16, index=0)
        q = gb.add(Op.PERMUTE, (gb.add(Op.RESHAPE, (x,), shape=(b_, t, h, d)),), dims=(0, 2, 1, 3))
        meta_q = torch.empty(b_, t, h, d, dtype=torch.bfloat16, device="meta").transpose(1, 2)
    else:
        q = gb.add(Op.INPUT, shape=(b_, h, t, d), dtype=torch.bfloat16, index=0)
        meta_q = torch.empty(b_, h, t, d, dtype=torch.bfloat16, device="meta")
    extra = (None, False) if "efficient" in name or "cudnn" in name else ()
    node = build_extern(gb, op, [q, q, q, *extra], {}, (b_, h, t, d), torch.bfloat16, out_index=0)
    gb.finish([node])
    expected = op(meta_q, meta_q, meta_q, *extra)[0].stride()
    got = library.fixed_strides(node)
    assert got is None or got == expected, (got, expected)
    if heads_split:  # the case the rule is for: a view when the heads merge
        assert got == expected
