"""kiln's batched CPU GEMM over run-time operands (``kiln::bmm``, library/gemm/bmm.py): the op against float64 on
fresh random data in every layout a graph hands it, and the pass that puts it in place of ATen's bmm/baddbmm."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.library.gemm import op as cpu_gemm
from kiln.report import mark, reports_since

pytestmark = pytest.mark.skipif(not cpu_gemm.available(), reason="kiln's GEMM does not build here")


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _layouts(batch, m, k, n):
    """(name, a, b) in the layouts a graph gives: contiguous; keys transposed (``[S, B, D]`` read as ``[B, D, S]``,
    nn.MultiheadAttention's); sliced with an offset; a broadcast (stride-0) batch; A transposed; K past the 512
    block and N, M past whole tiles."""
    a, b = _rand(batch, m, k, seed=1), _rand(batch, k, n, seed=2)
    keys = _rand(n, batch, k, seed=3).permute(1, 2, 0)
    sliced_a = _rand(batch, m + 3, k + 5, seed=4)[:, 2:2 + m, 5:]
    sliced_b = _rand(batch + 1, k, n + 7, seed=5)[1:, :, 3:3 + n]
    shared = _rand(1, k, n, seed=6).expand(batch, k, n)
    a_t = _rand(batch, k, m, seed=7).transpose(1, 2)
    return [("contiguous", a, b), ("keys transposed", a, keys), ("sliced, offset", sliced_a, sliced_b),
            ("expanded batch", a, shared), ("a transposed", a_t, b)]


# (B, M, K, N).  AVX-512 (32-column panels): a last panel of at most 16 columns runs along M (``bmm_columns``): 45
# (13 left), 69 (5), 40 (8), 37 over three 64-row blocks, 1; 96 has none.  AVX2 (16-column panels): 69, 37 and 40
# leave 5, 5 and 8 columns, 45 leaves 13 (a full panel's path).
SHAPES = [(3, 17, 33, 45), (2, 64, 64, 69), (1, 9, 600, 40), (2, 130, 20, 37), (2, 24, 40, 96), (4, 1, 8, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_in_every_layout(shape):
    batch, m, k, n = shape
    atol = 1.5e-5 * max(1.0, (k / 64) ** 0.5)  # a K-long fp32 sum's rounding grows like sqrt(K)
    for name, a, b in _layouts(batch, m, k, n):
        got = torch.ops.kiln.bmm(a, b, None)
        torch.testing.assert_close(got.double(), torch.bmm(a.double(), b.double()), rtol=1.3e-5, atol=atol,
                                   msg=lambda msg, name=name: f"{name}: {msg}")


@pytest.mark.parametrize("d_shape", [(64, 69), (1, 64, 69), (2, 1, 69), (2, 64, 69), (69,)])
def test_added_term_broadcasts_like_baddbmm(d_shape):
    a, b = _rand(2, 64, 40, seed=1), _rand(69, 2, 40, seed=2).permute(1, 2, 0)
    d = _rand(*d_shape, seed=3)
    got = torch.ops.kiln.bmm(a, b, d)
    ref = torch.baddbmm(d.double().expand(2, 64, 69), a.double(), b.double())
    torch.testing.assert_close(got.double(), ref, rtol=1.3e-5, atol=1.5e-5)


def test_added_term_in_a_transposed_layout():
    """A mask whose rows are not contiguous (the element loop, not the vector one)."""
    a, b = _rand(2, 64, 40, seed=1), _rand(69, 2, 40, seed=2).permute(1, 2, 0)
    d = _rand(69, 64, seed=3).t()
    got = torch.ops.kiln.bmm(a, b, d)
    ref = torch.baddbmm(d.double().expand(2, 64, 69), a.double(), b.double())
    torch.testing.assert_close(got.double(), ref, rtol=1.3e-5, atol=1.5e-5)


def test_the_avx2_build_matches(tmp_path):
    """kiln_bmm as an AVX2 machine compiles it (16-column panels, 6-row tiles): built here with AVX-512 off and
    called with the arguments the binder gives the native build, in each layout and with a broadcast bias."""
    import ctypes
    from kiln import config
    from kiln.library.gemm.source import GemmSchedule, gemm_source
    from kiln.runtime import native
    from kiln.runtime.build import load_module
    with config.scope(cache_dir=str(tmp_path)):
        avx2 = load_module(gemm_source(GemmSchedule()), name="kiln_gemm_avx2", extra_flags=("-mno-avx512f",)).lib
    assert avx2.kiln_gemm_nr() == 16
    op = torch.ops.kiln.bmm.default
    for batch, m, k, n in SHAPES:
        d = _rand(m, n, seed=9)
        for name, a, b in _layouts(batch, m, k, n):
            out = torch.empty(batch, m, n)
            fn, values = native._prepare(op, native.op_args(op, a, b, d), out)
            ctypes.CFUNCTYPE(None, *fn._argtypes_)(ctypes.cast(avx2.kiln_bmm, ctypes.c_void_p).value)(*values)
            ref = torch.baddbmm(d.double(), a.double(), b.double())
            torch.testing.assert_close(out.double(), ref, rtol=1.3e-5, atol=1.5e-5 * max(1.0, (k / 64) ** 0.5),
                                       msg=lambda msg, name=name: f"{name}: {msg}")


def test_interleaved_result_is_a_view_of_rows_by_batch():
    a, b = _rand(3, 5, 7), _rand(3, 7, 6, seed=1)
    got = torch.ops.kiln.bmm(a, b, None, True)
    assert got.stride() == (6, 18, 1)
    merged = got.transpose(0, 1).reshape(5, 18)  # nn.MultiheadAttention's merge of the heads: a view here
    assert merged.data_ptr() == got.data_ptr() and merged.is_contiguous()
    torch.testing.assert_close(got.double(), torch.bmm(a.double(), b.double()), rtol=1.3e-5, atol=1.5e-5)


def test_out_variant_writes_a_strided_buffer_and_empty_products():
    a, b = _rand(3, 5, 7), _rand(3, 7, 6, seed=1)
    out = torch.empty(5, 3, 6).transpose(0, 1)  # rows strided past the other batches: unit column stride only
    torch.ops.kiln.bmm.out(a, b, None, out=out)
    torch.testing.assert_close(out.double(), torch.bmm(a.double(), b.double()), rtol=1.3e-5, atol=1.5e-5)
    d = _rand(5, 6, seed=2)
    torch.testing.assert_close(torch.ops.kiln.bmm(a[:, :, :0], b[:, :0], d), d.expand(3, 5, 6))
    assert torch.ops.kiln.bmm(a[:, :, :0], b[:, :0], None).abs().max() == 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"b \[2, 4, 5\] must be \[B, K, N\] = \[2, 3, N\]"):
        torch.ops.kiln.bmm(torch.randn(2, 6, 3), torch.randn(2, 4, 5), None)
    with pytest.raises(ValueError, match="3-D fp32 CPU"):
        torch.ops.kiln.bmm(torch.randn(2, 6, 3).double(), torch.randn(2, 3, 5), None)
    with pytest.raises(ValueError, match="does not broadcast"):
        torch.ops.kiln.bmm(torch.randn(2, 6, 3), torch.randn(2, 3, 5), torch.randn(4, 5))


class _CrossAttention(nn.Module):
    """nn.MultiheadAttention's slow path: a float mask (baddbmm), bias_k/bias_v, averaged weights returned."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, kdim=24, vdim=20, add_bias_kv=True)

    def forward(self, q, k, v, mask):
        return self.attn(q, k, v, attn_mask=mask, need_weights=True)


@pytest.mark.parametrize("native", [True, False])
def test_pass_puts_kiln_bmm_in_a_graph_and_calls_it_from_cpp(native):
    """Both products (the masked scores: baddbmm with keys transposed; the weighted values: bmm) run as kiln's,
    called from the generated C++ (or through Python with native calls off), matching eager; the weighted values
    are written with the heads merged, so the output projection reads them through a view, not a copy."""
    model = _CrossAttention().eval()
    q, k, v = _rand(10, 2, 32, seed=1), _rand(12, 2, 24, seed=2), _rand(12, 2, 20, seed=3)
    mask = torch.triu(torch.full((10, 12), float("-inf")), diagonal=4)  # (bias_k appends a column to it)
    position = mark()
    with torch.inference_mode(), kiln.config.scope(native_calls=native):
        got = kiln.compile(model, fallback=False, choices="bmm=kiln")(q, k, v, mask)
        want = model(q, k, v, mask)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    report = reports_since(position)[-1]
    assert report.externs.count("bmm") == 2 and "baddbmm" not in report.externs, report.externs
    notes = " ".join(note for p in report.passes if p.name == "select_bmm" for note in p.notes)
    assert "baddbmm -> kiln bmm: 1" in notes and "bmm -> kiln bmm: 1" in notes, notes
    assert "kiln bmm writes heads merged: 1" in notes, notes
    assert not any(k.name.endswith("_copy") for k in report.kernels), [k.name for k in report.kernels]
    assert ("kiln_bmm" in report.source) == native


def test_choice_measures_kiln_against_aten(candidate_recorder):
    from kiln.library.bmm import select as bmm
    recorder = candidate_recorder("kiln")
    bmm.choose(recorder, 2, 16, 24, 8, transposed=True, bias=True)
    (calls,) = recorder.candidates.values()
    assert set(calls) == {"kiln", "aten"}, list(calls)
    results = {name: fn() for name, fn in calls.items()}
    torch.testing.assert_close(results["kiln"], results["aten"], rtol=1e-5, atol=1e-5)


def test_a_weightless_function_gets_kiln_bmm():
    """A user's function of its inputs reaches no weight to tell its device: the compile's device (its inputs')
    decides (``ir/graph.data_device``), so its batched products run as kiln's on the CPU too."""
    def scores(q, k, v, bias):
        return torch.bmm(torch.softmax(torch.baddbmm(bias, q, k.transpose(1, 2)), -1), v)

    q, k, v, bias = _rand(4, 24, 16, seed=1), _rand(4, 30, 16, seed=2), _rand(4, 30, 8, seed=3), _rand(24, 30, seed=4)
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(scores, fallback=False, choices="bmm=kiln")(q, k, v, bias)
    torch.testing.assert_close(got, scores(q, k, v, bias), rtol=1e-4, atol=1e-5)
    report = reports_since(position)[-1]
    notes = " ".join(note for p in report.passes if p.name == "select_bmm" for note in p.notes)
    assert "baddbmm -> kiln bmm: 1" in notes and "bmm -> kiln bmm: 1" in notes, notes


def test_a_graph_without_batched_products_does_not_build_the_library(monkeypatch):
    """Asking for the GEMM library builds it (seconds of g++ with a cold cache): select_bmm asks only where a
    graph has a CPU batched product (a GPU compile had built kiln's CPU GEMM for nothing)."""
    from kiln.library.bmm import select as bmm

    def built() -> bool:
        raise AssertionError("select_bmm asked for the GEMM library on a graph without a batched product")
    monkeypatch.setattr(bmm.cpu_gemm, "available", built)
    x = _rand(3, 5, 7, seed=1)
    with torch.inference_mode(), kiln.config.scope(disabled_passes="select_gemm"):
        got = kiln.compile(lambda t: torch.tanh(t) * 2 + t.sum(-1, keepdim=True), fallback=False)(x)
    torch.testing.assert_close(got, torch.tanh(x) * 2 + x.sum(-1, keepdim=True), rtol=1.3e-5, atol=1.5e-5)


def _flat_layouts(m, k, n):
    """(name, a, b, bias) of 2-D products of run-time operands in the layouts a training graph gives: a linear's
    ``x @ W^T`` with a bias row, the backward's ``dY @ W`` and ``dY^T @ X``, sliced with offsets, a 2-D bias."""
    x, w = _rand(m, k, seed=1), _rand(n, k, seed=2)
    dy_t = _rand(k, m, seed=3).t()
    sliced_a = _rand(m + 2, k + 3, seed=4)[1:1 + m, 3:]
    sliced_b = _rand(k, n + 5, seed=5)[:, 2:2 + n]
    return [("x @ W^T + bias", x, w.t(), _rand(n, seed=6)), ("dY @ W", x, _rand(k, n, seed=7), None),
            ("dY^T @ X", dy_t, _rand(k, n, seed=8), None), ("sliced, offset", sliced_a, sliced_b, None),
            ("2-D bias", x, w.t(), _rand(m, n, seed=9))]


@pytest.mark.parametrize("shape", [(33, 70, 45), (128, 96, 64), (7, 600, 37), (1, 16, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_products_of_run_time_operands_run_as_kiln_bmm(shape):
    """[Note: products of run-time operands]: ``mm``/``addmm`` whose right operand is an input (a training
    graph's weight, a gradient) run as kiln's one-batch product in every layout, matching eager; one whose right
    operand is a weight stays with the GEMM selection."""
    m, k, n = shape
    atol = 1.5e-5 * max(1.0, (k / 64) ** 0.5)
    for name, a, b, bias in _flat_layouts(m, k, n):
        fn = (lambda p, q, r: torch.addmm(r, p, q)) if bias is not None else (lambda p, q, r: torch.mm(p, q))
        position = mark()
        with torch.inference_mode():
            got = kiln.compile(fn, fallback=False, dynamic=False, choices="bmm=kiln")(a, b, bias)
        torch.testing.assert_close(got.double(), fn(a.double(), b.double(), None if bias is None else bias.double()),
                                   rtol=1.3e-5, atol=atol, msg=lambda msg, name=name: f"{name}: {msg}")
        report = reports_since(position)[-1]
        notes = " ".join(note for p in report.passes if p.name == "select_bmm" for note in p.notes)
        assert "mm -> kiln bmm: 1" in notes, (name, notes)

    linear = nn.Linear(40, 24).eval()
    position = mark()
    with torch.inference_mode():
        kiln.compile(linear, fallback=False, choices="bmm=kiln")(_rand(5, 40, seed=1))
    notes = " ".join(note for p in reports_since(position)[-1].passes if p.name == "select_bmm" for note in p.notes)
    assert "kiln bmm" not in notes, notes


def test_a_training_step_runs_its_products_as_kiln_bmm():
    """A training step's forward and backward products (weights read as inputs, gradients ``dY @ W`` and
    ``dY^T @ X``) as kiln's; gradients match eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 64), nn.GELU(), nn.Linear(64, 40))
    ref = [p.detach().clone().requires_grad_() for p in model.parameters()]
    x = _rand(20, 48, seed=3)
    position = mark()
    out = kiln.compile(model, fallback=False, choices="bmm=kiln")(x)
    out.square().sum().backward()
    h = torch.nn.functional.gelu(x @ ref[0].t() + ref[1])
    (h @ ref[2].t() + ref[3]).square().sum().backward()
    for p, q in zip(model.parameters(), ref):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    notes = " ".join(note for r in reports_since(position) for p in r.passes if p.name == "select_bmm"
                     for note in p.notes)
    import re
    assert sum(int(c) for c in re.findall(r"-> kiln bmm: (\d+)", notes)) >= 5, notes  # 2 forward, 3 backward
