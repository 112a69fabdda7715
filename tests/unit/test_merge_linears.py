"""passes/merge_linears.py: linears reading one input become one wider product and column slices of it."""
import torch

import kiln
from kiln.ir.extern import build_extern
from kiln.ir.graph import ConstRef, GraphBuilder, format_graph
from kiln.ir.ops import Op
from kiln.passes.merge_linears import merge_linears
from kiln.passes.rewrite import RewriteLog
from kiln.report import mark, reports_since
from tests.unit.test_passes import assert_same_results, inp, randn

aten = torch.ops.aten
F32 = torch.float32


def _const(b, t):
    return b.add(Op.CONSTANT, (), value=ConstRef(t))


def test_qkv_projections_merge_into_one_product():
    b = GraphBuilder()
    x = inp(b, (6, 8))
    outs = []
    for n in (8, 8, 4):  # a grouped-query V is narrower
        w = b.add(Op.PERMUTE, (_const(b, randn(n, 8)),), dims=(1, 0))
        outs.append(build_extern(b, aten.addmm.default, [_const(b, randn(n)), x, w], {}, (6, n), F32))
    g = b.finish([b.add(Op.ADD, (outs[0], outs[1])), outs[2]])
    log = RewriteLog()
    out = merge_linears(g, log)
    text = format_graph(out)
    assert text.count("aten.addmm") == 1 and "f32[6, 20]" in text, text
    assert text.count("slice(") == 3 and "start=8" in text and "start=16" in text, text
    assert log.notes() == ["3 linears on one input merged: 1"]
    assert_same_results(g, out)


def test_mm_and_addmm_and_other_inputs_stay_apart():
    b = GraphBuilder()
    x, y = inp(b, (5, 8)), inp(b, (5, 8))
    w1, w2, w3 = (_const(b, randn(8, 3)) for _ in range(3))
    a = build_extern(b, aten.mm.default, [x, w1], {}, (5, 3), F32)
    c = build_extern(b, aten.addmm.default, [_const(b, randn(3)), x, w2], {}, (5, 3), F32)
    d = build_extern(b, aten.mm.default, [y, w3], {}, (5, 3), F32)
    e = build_extern(b, aten.mm.default, [x, b.add(Op.PERMUTE, (y,), dims=(1, 0))], {}, (5, 5), F32)  # not constant
    g = b.finish([a, c, d, e])
    assert merge_linears(g, RewriteLog()) is g


def test_merged_gated_mlp_end_to_end_on_strided_inputs():
    """A SwiGLU MLP (gate and up merged, [K, N] weights as stored by GPT-2's Conv1D for one of them) on a
    transposed input, compiled against eager."""
    torch.manual_seed(0)
    gate, up, down = torch.nn.Linear(24, 40, bias=False), torch.nn.Linear(24, 40, bias=False), torch.nn.Linear(40, 24)
    wq = torch.randn(24, 16)

    def fn(h, x):
        z = h.transpose(0, 1)
        a = torch.nn.functional.silu(gate(z)) * up(z)
        return down(a), z @ wq, torch.addmm(torch.randn(0).new_ones(16), x, wq)

    h, x = torch.randn(7, 3, 24), torch.randn(5, 24)
    position = mark()
    with torch.inference_mode():
        expected = fn(h, x)
        got = kiln.compile(fn, fallback=False)(h, x)
    [report] = reports_since(position)
    [record] = [p for p in report.passes if p.name == "merge_linears"]
    assert record.notes == ["2 linears on one input merged: 1"], record.notes
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1.3e-5, atol=2e-5)
