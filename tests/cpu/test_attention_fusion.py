"""Hand-written attention -> one attention call (library/attention/fuse.py): ATen's SDPA, or kiln's CPU kernel.

The pass runs on CUDA and CPU graphs; here on CPU constants (the fixture pins ``devices=("cpu",)``), so CI checks
the pattern matching and the numerics: causal, unmasked, and a mask that is not causal (left alone)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from kiln.report import mark, reports_since
from kiln.library.attention import op as cpu_attention


class Attn(nn.Module):
    def __init__(self, d=64, heads=4, mask="causal", t=16):
        super().__init__()
        self.h, self.kind = heads, mask
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        m = torch.tril(torch.ones(t, t)) if mask == "causal" else (torch.rand(t, t) > 0.3).float()
        self.register_buffer("mask", m.view(1, 1, t, t))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.h))
        if self.kind != "none":
            att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


@pytest.mark.parametrize("kernel,extern", [("aten", "scaled_dot_product_attention"), ("kiln", "attention")])
@pytest.mark.parametrize("kind,fused", [("causal", True), ("none", True), ("random", False)])
def test_attention_fusion(kind, fused, kernel, extern):
    torch.manual_seed(0)
    model = Attn(mask=kind).eval()
    x = torch.randn(2, 16, 64)
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(model, fallback=False, choices=f"attention={kernel}")(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    report = reports_since(position)[-1]
    assert (extern in report.externs) == fused, report.externs
    # kiln's kernel is called from the generated C++ (runtime/native.py), ATen's through Python
    assert ("attention" in report.native_externs) == (fused and kernel == "kiln"), report.native_externs


class _Sdpa(nn.Module):
    """F.scaled_dot_product_attention (traced as ATen's CPU flash attention), then the output projection.
    ``split``: the query is heads split from a projection (a transposed view); else a contiguous [B, H, T, D]."""

    def __init__(self, split: bool, c: int = 64, h: int = 4):
        super().__init__()
        self.qkv, self.proj, self.h, self.split = nn.Linear(c, 3 * c), nn.Linear(c, c), h, split

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        if not self.split:
            q = (q * 1.5).contiguous()
        y = F.scaled_dot_product_attention(q, k, v)
        return torch.relu(self.proj(y.transpose(1, 2).reshape(b, t, c)))


@pytest.mark.parametrize("split", [True, False])
def test_cpu_flash_attention_output_layout_follows_the_query(split):
    """ATen's CPU flash attention writes its output in the query's layout: heads split from a projection give
    [B, T, H, D] memory, so merging the heads for the output projection is a view and the projection is called
    from the generated C++ (library/attention: the layout fact); a contiguous query gives a contiguous output,
    whose merge is a copy kernel.  Either way the result is eager's."""
    torch.manual_seed(0)
    model = _Sdpa(split).eval()
    x = torch.randn(2, 16, 64)
    position = mark()
    with torch.inference_mode():
        # (both linears: kiln's GEMM; the attention ATen's, whose output layout is the subject)
        compiled = kiln.compile(model, fallback=False, choices="gemm=kiln,attention=aten")
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(x + 1), model(x + 1), rtol=1e-5, atol=1e-5)
    report = reports_since(position)[-1]
    assert "_scaled_dot_product_flash_attention_for_cpu" in report.externs, report.externs
    assert report.native_externs.count("linear_packed") == 2, report.native_externs
    # the contiguous query's output is merged by a copy kernel of kiln's (schedule/layout.relayout_copies),
    # so that projection is native too; the split one's merge is a view
    copies = [k.name for k in report.kernels if k.name.endswith("_copy")]
    assert len(copies) == (0 if split else 1), [k.name for k in report.kernels]


class _MaskedSdpa(nn.Module):
    """An encoder layer's attention as Hugging Face models call it: SDPA with an additive padding mask."""

    def __init__(self, c: int = 64, h: int = 4, causal: bool = False):
        super().__init__()
        self.qkv, self.proj, self.h, self.causal = nn.Linear(c, 3 * c), nn.Linear(c, c), h, causal

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=None if self.causal else mask,
                                           is_causal=self.causal)
        return self.proj(o.transpose(1, 2).reshape(b, t, c))


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_on_the_cpu_becomes_kiln_attention(causal):
    """fuse_attention's second rule: ATen's CPU flash attention (with its additive mask, or causal) runs as kiln's
    kernel, called from the generated code; a padded key masked for every query of one sequence gives eager's
    zeros, not softmax's NaN."""
    if not cpu_attention.available():
        pytest.skip("kiln's attention does not build here")
    torch.manual_seed(0)
    model = _MaskedSdpa(causal=causal).eval()
    x = torch.randn(2, 24, 64)
    mask = torch.zeros(2, 1, 24, 24)
    mask[0, :, :, 20:] = float("-inf")   # padding: keys 20.. of sequence 0
    mask[1, :, 5, :] = float("-inf")     # a query that sees no key
    position = mark()
    with torch.inference_mode():
        compiled = kiln.compile(model, fallback=False, choices="attention=kiln")
        torch.testing.assert_close(compiled(x, mask), model(x, mask), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(x + 1, mask), model(x + 1, mask), rtol=1e-5, atol=1e-5)
    report = reports_since(position)[-1]
    assert "attention" in report.native_externs and "_scaled_dot_product_flash_attention_for_cpu" \
        not in report.externs, report.externs


class _HalfSoftmax(Attn):
    """Attention in bf16 whose softmax runs in fp32 between two casts: written so (transformers' ``softmax(...,
    dtype=torch.float32).to(q.dtype)``), or ATen's own half softmax as the decomposition lowers it."""

    def __init__(self, upcast: bool):
        super().__init__(mask="causal")
        self.upcast = upcast

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.h))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        p = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype) if self.upcast else F.softmax(att, dim=-1)
        return self.proj((p @ v).transpose(1, 2).contiguous().view(b, t, c))


@pytest.mark.parametrize("upcast", [True, False])
def test_half_attention_with_its_softmax_in_fp32_is_one_call(upcast):
    """The casts around a half model's softmax do not hide the pattern: one SDPA call, as close to the fp32 model
    as eager's bf16 result is (SDPA too keeps the softmax in fp32)."""
    torch.manual_seed(0)
    model = _HalfSoftmax(upcast).eval()
    x = torch.randn(2, 16, 64)
    half = _HalfSoftmax(upcast).eval()
    half.load_state_dict(model.state_dict())
    half = half.to(torch.bfloat16)
    position = mark()
    with torch.inference_mode():
        want = model(x)
        got = kiln.compile(half, fallback=False)(x.bfloat16()).float()
        eager_error = (half(x.bfloat16()).float() - want).abs().max().item()
    assert (got - want).abs().max().item() <= 2 * eager_error + 1e-2
    report = reports_since(position)[-1]
    assert "scaled_dot_product_attention" in report.externs and "bmm" not in report.externs, report.externs


class _Cross(nn.Module):
    """Cross attention: 6 queries over 9 keys and values of another sequence (value head size ``dv``)."""

    def __init__(self, d=32, heads=4, dv=8):
        super().__init__()
        self.h, self.dv = heads, dv
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, heads * dv)

    def forward(self, x, mem):
        b, t, c = x.shape
        s = mem.shape[1]
        q = self.q(x).view(b, t, self.h, c // self.h).transpose(1, 2)
        k = self.k(mem).view(b, s, self.h, c // self.h).transpose(1, 2)
        v = self.v(mem).view(b, s, self.h, self.dv).transpose(1, 2)
        att = F.softmax((q @ k.transpose(-2, -1)) * 0.35, dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, t, self.h * self.dv)


@pytest.mark.parametrize("kernel", ["aten", "kiln"])
@pytest.mark.parametrize("dv", [8, 5])
def test_cross_attention_with_other_key_count_is_one_call(kernel, dv):
    """Queries and keys of different lengths (no causal mask then): one attention call; kiln's kernel where the
    value head size is the query's, ATen's SDPA otherwise."""
    torch.manual_seed(0)
    model = _Cross(dv=dv).eval()
    x, mem = torch.randn(2, 6, 32), torch.randn(2, 9, 32)
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(model, fallback=False, choices=f"attention={kernel}")(x, mem)
        torch.testing.assert_close(got, model(x, mem), rtol=1e-5, atol=1e-5)
    report = reports_since(position)[-1]
    want = "attention" if kernel == "kiln" and dv == 8 else "scaled_dot_product_attention"
    assert want in report.externs and "bmm" not in report.externs, report.externs
