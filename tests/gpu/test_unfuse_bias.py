"""library/gpu_matmul/unfuse_bias.py: an fp32 GPU linear whose product only kiln's kernels read runs as ``mm``
with the bias added by the reading kernel; a product a library call reads, a graph output and half precision
keep ``addmm``.  Run on CPU tensors through the Triton target (``DEVICES`` widened), as on the GPU."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir.ops import Op
from kiln.library.gpu_matmul import unfuse_bias
from kiln.report import mark, reports_since
from tests.gpu.conftest import DEVICE


@pytest.fixture
def on_this_device(monkeypatch):
    monkeypatch.setattr(unfuse_bias, "DEVICES", (DEVICE,))


class Block(torch.nn.Module):
    """Attention projections (read by SDPA), an output projection into residual + LayerNorm, a GELU MLP, and a
    linear returned as it is."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.up, self.down, self.head = torch.nn.Linear(d, 3 * d), torch.nn.Linear(3 * d, d), torch.nn.Linear(d, 7)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        h = self.norm(x + self.o(a.transpose(1, 2).reshape(b, t, d)))
        h = self.norm(h + self.down(F.gelu(self.up(h))))
        return h, self.head(h)


def _targets(report):
    return [str(n.attr("target")) for n in report.optimized.nodes if n.op is Op.EXTERN]


def _compile(model, x):
    position = mark()
    with torch.inference_mode():
        expected = model(x)
        got = kiln.compile(model, target="triton", fallback=False)(x)
    [report] = reports_since(position)
    return got, expected, report


def test_linears_read_by_kernels_run_as_mm(on_this_device):
    torch.manual_seed(0)
    model, x = Block().to(DEVICE).eval(), torch.randn(2, 5, 32, device=DEVICE)
    got, expected, report = _compile(model, x)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1.3e-5, atol=1.5e-5)
    [record] = [p for p in report.passes if p.name == "unfuse_bias"]
    # o, up and down feed kernels; q/k/v feed attention and head is returned: those four keep addmm
    assert record.notes == ["fp32 bias added by the product's reader: 3"], record.notes
    targets = _targets(report)
    # (q/k/v may be one merged addmm: merge_linears runs where weights may be copied)
    assert targets.count("aten.mm.default") == 3 and targets.count("aten.addmm.default") in (2, 4), targets


def test_half_precision_and_other_devices_keep_addmm(on_this_device, monkeypatch):
    torch.manual_seed(0)
    model, x = Block().to(DEVICE).eval(), torch.randn(2, 5, 32, device=DEVICE)
    if DEVICE == "cuda":
        got, expected, report = _compile(model.to(torch.bfloat16), x.to(torch.bfloat16))
        assert "aten.mm.default" not in _targets(report)
    monkeypatch.setattr(unfuse_bias, "DEVICES", ("some-other-device",))
    got, expected, report = _compile(model.float(), x)
    [record] = [p for p in report.passes if p.name == "unfuse_bias"]
    assert record.notes == [], record.notes
