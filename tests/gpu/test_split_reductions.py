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


def test_column_reductions_split_into_chunks_of_rows():
    """[Note: column reductions split for the GPU]: a sum over the leading axes into many columns becomes partial
    sums over chunks of rows (float32 for a half-precision sum) and their sum, in the original shape."""
    from kiln.passes.split_reductions import COLUMN_CHUNK
    b = GraphBuilder()
    x2 = b.add(Op.INPUT, (), shape=(2048, 768), dtype=torch.bfloat16, index=0)
    x3 = b.add(Op.INPUT, (), shape=(8, 256, 768), dtype=torch.float32, index=1)
    short = b.add(Op.INPUT, (), shape=(2 * COLUMN_CHUNK - 1, 768), dtype=torch.float32, index=2)
    bias = b.add(Op.SUM, (x2,), shape=(1, 768), dtype=torch.bfloat16, axes=(0,), keepdim=True)
    weight = b.add(Op.AMAX, (x3,), shape=(768,), dtype=torch.float32, axes=(0, 1), keepdim=False)
    rows = b.add(Op.SUM, (x3,), shape=(8, 256), dtype=torch.float32, axes=(2,), keepdim=False)  # (a row sum)
    left = b.add(Op.SUM, (short,), shape=(768,), dtype=torch.float32, axes=(0,), keepdim=False)
    graph = split_reductions(b.finish([bias, weight, rows, left]))
    out_bias, out_weight, out_rows, out_left = graph.outputs
    assert out_bias.op is Op.RESHAPE and out_bias.shape == (1, 768)
    total = out_bias.inputs[0]
    assert total.op is Op.SUM and total.shape == (768,) and total.attr("axes") == (0,)
    partial = total.inputs[0]
    assert partial.op is Op.SUM and partial.dtype == torch.float32 and partial.attr("axes") == (1,)
    assert partial.inputs[0].op is Op.RESHAPE and partial.inputs[0].shape == (2048 // COLUMN_CHUNK, COLUMN_CHUNK, 768)
    assert out_weight.shape == (768,) and out_weight.inputs[0].op is Op.AMAX
    assert out_weight.inputs[0].inputs[0].shape == (2048 // COLUMN_CHUNK, COLUMN_CHUNK, 768)
    assert out_rows.inputs[0] is graph.inputs[1] and out_left.inputs[0] is graph.inputs[2]  # (left as they are)


def test_layer_norm_and_bias_gradients_split_by_columns_match_eager():
    """A training step's bias and LayerNorm-weight gradients split by columns, the first stage a column
    reduction of several columns a program; gradients eager's."""
    from kiln.codegen import triton as triton_codegen
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 96), torch.nn.LayerNorm(96), torch.nn.Linear(96, 24)).to(DEVICE)
    x = torch.randn(4, 130, 40, device=DEVICE)  # (520 rows: chunks of 104)
    position = mark()
    compiled = kiln.compile(model, target="triton", fallback=False)
    compiled(x).square().mean().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().mean().backward()
    for a, p in zip(got, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-4 * max(1.0, p.grad.abs().max().item()))
    assert any("over columns" in note for p in _split_records(position) for note in p.notes)
    kernels = [k for r in reports_since(position) for k in r.kernels]
    assert any(triton_codegen.column_reduction(k) and len(k.outer) == 2 and k.schedule.xblock >= 2
               for k in kernels), [(k.name, k.schedule) for k in kernels]


def test_the_column_option_turns_the_column_split_off():
    position = mark()
    x = torch.randn(512, 40, device=DEVICE)
    compiled = kiln.compile(lambda x: x.sum(0), target="triton", gpu_split_column_reductions=False)
    torch.testing.assert_close(compiled(x), x.sum(0), rtol=1e-4, atol=1e-4)
    assert not _split_records(position)
    compiled = kiln.compile(lambda x: x.sum(0) * 2, target="triton")
    torch.testing.assert_close(compiled(x), x.sum(0) * 2, rtol=1e-4, atol=1e-4)
    assert _split_records(position)
