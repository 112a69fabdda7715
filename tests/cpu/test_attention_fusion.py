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
