"""[Note: reductions split for the GPU] (passes/split_reductions.py): long reductions into few rows - a
BatchNorm's channel statistics and gradients over ``(N, H, W)`` - run as two reductions on the Triton target, with
the results eager's.  Runs on the GPU when there is one, else under Triton's interpreter on CPU tensors (CI)."""
import torch
import torch.nn.functional as F

import kiln
from kiln.ir.ops import Op
from kiln.passes.split_reductions import split_reductions
from kiln.ir.graph import GraphBuilder
from kiln.report import mark, reports_since
from tests.gpu.conftest import DEVICE


def _split_records(position):
    return [p for r in reports_since(position) for p in r.passes if p.name == "split_reductions" and p.notes]


def test_channel_statistics_and_their_gradients_split_and_match_eager():
    def bn(x, w, b):
        return F.batch_norm(x, None, None, w, b, training=True)

    torch.manual_seed(0)
    x = torch.randn(4, 3, 96, 96, device=DEVICE) * 0.5 + 2
    w, b = torch.randn(3, device=DEVICE), torch.randn(3, device=DEVICE)
    g = torch.randn(x.shape, device=DEVICE)
    position = mark()
    compiled = kiln.compile(bn, target="triton")
    got_in = [t.clone().requires_grad_() for t in (x, w, b)]
    want_in = [t.clone().requires_grad_() for t in (x, w, b)]
    got, want = compiled(*got_in), bn(*want_in)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, e in zip(got_in, want_in):
        torch.testing.assert_close(a.grad, e.grad, rtol=1e-4, atol=1e-3 * e.grad.abs().max().item())
    assert _split_records(position), [p for r in reports_since(position) for p in r.passes if "split" in p.name]


def test_the_rewrite_keeps_shapes_and_leaves_short_or_wide_reductions():
    b = GraphBuilder()
    x = b.add(Op.INPUT, (), shape=(16, 64, 112, 112), dtype=torch.bfloat16, index=0)
    long_sum = b.add(Op.SUM, (x,), shape=(64,), dtype=torch.bfloat16, axes=(0, 2, 3), keepdim=False)
    peak = b.add(Op.AMAX, (x,), shape=(1, 64, 1, 1), dtype=torch.bfloat16, axes=(0, 2, 3), keepdim=True)
    rows = b.add(Op.SUM, (x,), shape=(16, 64), dtype=torch.bfloat16, axes=(2, 3), keepdim=False)  # (1024 rows)
    graph = split_reductions(b.finish([long_sum, peak, rows]))
    out_sum, out_peak, out_rows = graph.outputs
    assert out_sum.shape == (64,) and out_sum.inputs[0].op is Op.SUM and out_sum.inputs[0].dtype == torch.float32
    assert out_sum.inputs[0].shape == (16, 64, 1, 1)
    assert out_peak.shape == (1, 64, 1, 1) and out_peak.inputs[0].op is Op.AMAX
    assert out_rows.inputs[0] is graph.inputs[0]  # (already 1024 rows: left as it is)


def test_the_option_turns_it_off():
    position = mark()
    compiled = kiln.compile(lambda x: x.sum((0, 2, 3)), target="triton", gpu_split_reductions=False)
    x = torch.randn(4, 3, 96, 96, device=DEVICE)
    torch.testing.assert_close(compiled(x), x.sum((0, 2, 3)), rtol=1e-4, atol=1e-3)
    assert not _split_records(position)
