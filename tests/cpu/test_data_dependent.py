"""Graphs with data-dependent sizes (``nonzero``, boolean masks, ``.item()`` with Dynamo's capture options on):
the nodes that decide a size from values run eagerly, the rest is compiled, the report names what ran eagerly
([Note: data-dependent sizes] in kiln/frontend/data_dependent.py).  Each case is checked against eager with
data that changes the data-dependent sizes from call to call."""
import pytest
import torch
import torch.nn as nn

from kiln.report import mark, reports_since

RTOL, ATOL = 1.3e-5, 1.5e-5


@pytest.fixture
def capture():
    """Dynamo keeps data-dependent ops in the graph (instead of breaking it there)."""
    dyn = torch._dynamo.config
    saved = dyn.capture_dynamic_output_shape_ops, dyn.capture_scalar_outputs
    dyn.capture_dynamic_output_shape_ops = dyn.capture_scalar_outputs = True
    torch._dynamo.reset()
    yield
    dyn.capture_dynamic_output_shape_ops, dyn.capture_scalar_outputs = saved
    torch._dynamo.reset()


def _run(fn, calls):
    """Compile ``fn`` with kiln, check every call of ``calls`` (argument tuples) against eager; the reports."""
    position = mark()
    compiled = torch.compile(fn, backend="kiln")
    with torch.inference_mode():
        for args in calls:
            want, got = fn(*args), compiled(*args)
            want = want if isinstance(want, (tuple, list)) else (want,)
            got = got if isinstance(got, (tuple, list)) else (got,)
            assert len(want) == len(got)
            for w, g in zip(want, got):
                if w.is_floating_point():
                    torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
                else:
                    assert torch.equal(g, w)
    return reports_since(position)


def _pieces(reports, eager: int):
    """The split graph's report (``eager`` nodes ran eagerly) and its compiled pieces' reports, none eager."""
    whole = [r for r in reports if r.target == "pieces"]
    assert len(whole) == 1, [(r.name, r.target, r.fallback) for r in reports]
    assert whole[0].fallback is None and len(whole[0].eager_nodes) == eager, whole[0].eager_nodes
    pieces = [r for r in reports if "[piece" in r.name]
    assert pieces and all(r.fallback is None for r in pieces), [(r.name, r.fallback) for r in pieces]
    return whole[0], pieces


def test_nonzero_and_boolean_mask_run_eagerly_the_rest_compiled(capture):
    def f(x, y):
        a = torch.relu(x) * 2 + 1
        idx = torch.nonzero(a > 2)
        s = a[a > 2].sum()
        return a.exp() + y, idx, s * 3

    calls = [(torch.randn(8, 16), torch.randn(8, 16)) for _ in range(3)]
    whole, pieces = _pieces(_run(f, calls), eager=2)
    assert any("nonzero" in line for line in whole.eager_nodes)
    assert "ran eagerly" in whole.format()
    # what does not read nonzero's or the mask's result joins the first piece (relu ... exp + y)
    assert len(pieces) == 2


def test_item_as_a_slice_bound(capture):
    def g(x, n):
        k = n.item()
        return (x * 3).sin()[:k] + 1, x.sum()

    calls = [(torch.randn(10, 4), torch.tensor(k)) for k in (5, 2, 9, 5)]
    whole, _ = _pieces(_run(g, calls), eager=2)  # .item() and the slice whose length it gives
    assert any("number read from a tensor" in line for line in whole.eager_nodes)


def test_indices_from_nonzero_feed_a_compiled_symbolic_piece(capture):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 8)

        def forward(self, x, keep):
            rows = torch.nonzero(keep).squeeze(1)
            picked = x.index_select(0, rows)
            return torch.tanh(self.lin(picked)) * 2 + picked.sum(1, keepdim=True)

    model = M().eval()
    calls = [(torch.randn(12, 16), torch.rand(12) > p) for p in (0.3, 0.7, 0.5, 0.1)]
    _, pieces = _pieces(_run(model, calls), eager=1)
    assert any(r.dynamic for r in pieces)  # nonzero's count is an input size of the piece after it


def test_float_item_scales_the_rest(capture):
    """(Dynamo keeps a float ``.item()`` as a tensor - no unbacked symbol: one ordinary graph.)"""
    def h(x, y):
        m = x.abs().max().item()
        return torch.tanh(y / m) + x.mean()

    calls = [(torch.randn(6, 9) * s, torch.randn(6, 9)) for s in (1.0, 4.0)]
    reports = _run(h, calls)
    assert reports and all(r.fallback is None for r in reports)


def test_without_capture_the_graph_breaks_and_both_graphs_compile():
    def f(x):
        a = torch.relu(x) + 1
        idx = torch.nonzero(a > 1.5)
        return a * 2, idx

    torch._dynamo.reset()
    reports = _run(f, [(torch.randn(5, 7),), (torch.randn(5, 7),)])
    assert reports and all(r.fallback is None for r in reports)
    assert not any(r.target == "pieces" for r in reports)


def test_a_size_check_in_a_dynamic_graph_runs_eagerly_the_graph_compiled():
    """``torch._check`` on a symbolic size (an ``_assert_scalar`` kiln's kernels cannot evaluate) made the whole
    graph run eagerly; now the check alone does."""
    def f(x):
        torch._check(x.shape[0] >= 2)
        return (x * 2).sin()[: x.shape[0] // 2] + x.sum(0)

    torch._dynamo.reset()
    position = mark()
    compiled = torch.compile(f, backend="kiln", dynamic=True)
    with torch.inference_mode():
        for n in (4, 7, 10):
            x = torch.randn(n, 5)
            torch.testing.assert_close(compiled(x), f(x), rtol=RTOL, atol=ATOL)
    whole, pieces = _pieces(reports_since(position), eager=1)
    assert "size check" in whole.eager_nodes[0]
    assert pieces[0].dynamic  # the compute: one symbolic piece
