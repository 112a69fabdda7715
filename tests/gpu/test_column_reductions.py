"""[Note: column reductions on the GPU] (codegen/triton.py ``column_reduction``): reductions over the outer
dimension - bias and LayerNorm-weight gradients, ``x.sum(0)`` - take up to ``COLUMN_XBLOCK`` columns a program and
loop over rows, their loads contiguous; the results eager's for every kind, with prologues and epilogues, sizes that
do not divide the blocks, short reductions (one block: persistent) and half precision.  Runs on the GPU when there
is one, else under Triton's interpreter on CPU tensors (CI)."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln.codegen.triton import COLUMN_XBLOCK, column_reduction
from kiln.report import mark, reports_since
from tests.gpu.conftest import DEVICE

CASES = {
    "sum": lambda x, y: x.sum(0),
    "mean-3d": lambda x, y: x.reshape(2, -1, x.shape[-1]).mean((0, 1)),
    "var": lambda x, y: x.var(0),
    "amax-amin": lambda x, y: (x.amax(0), x.amin(0)),
    "prologue-epilogue": lambda x, y: ((x * y).sum(0) * 2 + 1, y.sum(0)),
    "softmax-dim0": lambda x, y: torch.softmax(x, 0),
}


def _columns(position):
    return [k for r in reports_since(position) for k in r.kernels if column_reduction(k)]


@pytest.mark.parametrize("shape", [(96, 130), (20, 64), (300, 3)], ids=["looped", "persistent", "narrow"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_column_reductions_match_eager(name, dtype, shape, monkeypatch):
    from kiln.codegen import triton as triton_codegen
    monkeypatch.setattr(triton_codegen, "COLUMN_PROGRAMS", 2)  # (the small shapes here would keep one a program)
    torch.manual_seed(0)
    x = torch.randn(shape, device=DEVICE).to(dtype)
    y = torch.randn(shape, device=DEVICE).to(dtype)
    fn = CASES[name]
    position = mark()
    got = kiln.compile(fn, target="triton", fallback=False, gpu_column_reductions=True)(x, y)
    want = fn(x.float(), y.float())
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for a, e in zip(got, want):
        torch.testing.assert_close(a.float(), e, rtol=tol, atol=tol * max(1.0, e.abs().max().item()))
    if name in ("sum", "prologue-epilogue", "softmax-dim0") and shape[1] > 8:  # (softmax: an elementwise pass)
        chosen = _columns(position)
        assert chosen and all(2 <= k.schedule.xblock <= min(COLUMN_XBLOCK, shape[1] // 2) for k in chosen), \
            [(k.name, k.schedule) for r in reports_since(position) for k in r.kernels]


def test_training_bias_and_layer_norm_gradients_match_eager(monkeypatch):
    from kiln.codegen import triton as triton_codegen
    monkeypatch.setattr(triton_codegen, "COLUMN_PROGRAMS", 2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.LayerNorm(96), nn.Linear(96, 40)).to(DEVICE)
    ref = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(4, 50, 48, device=DEVICE)
    position = mark()
    out = kiln.compile(model, target="triton", fallback=False, gpu_column_reductions=True)(x)
    out.square().mean().backward()
    got = [p.grad.clone() for p in model.parameters()]
    for p, r in zip(model.parameters(), ref):
        p.grad = None
        p.data.copy_(r)
    model(x).square().mean().backward()
    for a, p in zip(got, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-4 * max(1.0, p.grad.abs().max().item()))
    assert _columns(position)  # (the bias and LayerNorm-weight gradients)


def test_a_sum_of_a_prologue_held_in_row_scratch_is_a_column_reduction():
    """A column sum whose accumulator reads row scratch (an elementwise prologue - a GELU backward before a bias
    gradient - written by the pass that loads its operands, and stored in full too) is judged by those loads:
    contiguous along the columns, strided along the rows (BERT-base's feed-forward bias gradients on the H100:
    16 rows a program, 0.43 ms a kernel)."""
    from kiln.ir.index import Lin, Var
    from kiln.ir.kernel import Acc, FullLoop, KLoad, KOp, KVar, Kernel, ReduceLoop, RowStore, Store
    from kiln.ir.ops import Op
    f32 = torch.float32
    col, row = Var("o0", 3072), Var("r", 2048)
    at = Lin(0, ((col, 1), (row, 3072)))
    prologue = KOp(Op.MUL, (KLoad("buf0", at, f32), KLoad("buf1", at, f32)), f32)
    scratch = KLoad("scr0", Lin(0, ((row, 1),)), f32)
    k = Kernel("k", (3072,), 2048, [
        ReduceLoop([Acc("acc0", Op.SUM, scratch, f32)], [Store("scr0", Lin(0, ((row, 1),)), prologue)]),
        RowStore(Store("buf2", Lin(0, ((col, 1),)), KVar("acc0", f32))),
        FullLoop([Store("buf3", at, scratch)])], [], scratch={"scr0": f32})
    assert column_reduction(k)
    by_rows = Lin(0, ((col, 2048), (row, 1)))
    k.phases[0].stores[0] = Store("scr0", Lin(0, ((row, 1),)), KLoad("buf0", by_rows, f32))
    k.phases[2] = FullLoop([Store("buf3", by_rows, scratch)])
    assert not column_reduction(k)  # (rows contiguous: one row a program reads them whole)


@pytest.mark.parametrize("shape", [(96, 130), (3, 6000)], ids=["column", "long-rows"])
def test_elementwise_stores_written_in_the_reduction_s_pass(shape, monkeypatch):
    """[Note: elementwise stores in the first pass] (codegen/triton.py): a looped reduction that also stores an
    elementwise value reading no row value - a bias gradient with the masked gradient it sums - writes it in the
    pass that accumulates (one loop over the row, its operands loaded once); one that reads its row's result (a
    softmax's output) keeps its final pass (max, sum, then the output: three); results eager's."""
    from kiln.codegen import triton as triton_codegen
    monkeypatch.setattr(triton_codegen, "COLUMN_PROGRAMS", 2)
    torch.manual_seed(0)
    x = torch.randn(shape, device=DEVICE)
    y = torch.randn(shape, device=DEVICE)
    dim = 0 if shape[1] < 1000 else 1  # (columns of 96 rows; rows past one block)

    def masked(a, b):
        g = torch.where(a > 0, b * 2, 0.0)
        return g, g.sum(dim) + 1

    def normalized(a, b):
        return torch.softmax(a * b, dim)
    for fn, passes in ((masked, 1), (normalized, 3)):
        torch._dynamo.reset()
        position = mark()
        got = kiln.compile(fn, target="triton", fallback=False, gpu_column_reductions=True)(x, y)
        want = fn(x, y)
        for a, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
        source = "".join(r.source for r in reports_since(position))
        assert source.count("for r0 in range(") == passes, source
