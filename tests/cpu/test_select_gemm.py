"""GEMM library selection: either library gives eager's results; the measured choice is memoised."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln.passes import select_gemm
from kiln.report import mark, reports_since

pytestmark = pytest.mark.skipif(not select_gemm.onednn_available(), reason="oneDNN not built into torch")


@pytest.mark.parametrize("choice,extern", [("onednn", {"onednn_linear"}), ("aten", {"addmm", "mm"}),
                                           ("kiln", {"linear_packed"})])
def test_linear_runs_with_either_library(monkeypatch, choice, extern):
    monkeypatch.setattr(select_gemm, "choose", lambda m, k, n, gelu=False: choice)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128, bias=False)).eval()
    x = torch.randn(64, 256)
    position = mark()
    with torch.inference_mode():
        torch.testing.assert_close(kiln.compile(model, fallback=False)(x), model(x), rtol=1e-4, atol=1e-5)
    externs = reports_since(position)[-1].externs
    assert len(externs) == 2 and set(externs) <= extern, externs


def test_choice_is_measured_once_per_shape(monkeypatch):
    select_gemm._choices.clear()
    first = select_gemm.choose(32, 64, 48)
    assert first in ("onednn", "aten", "kiln")
    monkeypatch.setattr(select_gemm.decisions, "fastest", lambda *a, **k: pytest.fail("measured twice"))
    assert select_gemm.choose(32, 64, 48) == first


@pytest.mark.parametrize("gelu", [False, True])
def test_candidates_compute_the_epilogue_they_would_run(monkeypatch, gelu):
    """A product that feeds a gelu is timed with it: every candidate returns gelu(x @ W^T + b) (kiln and oneDNN in
    their epilogue, ATen in a pass of its own), and the pass hands the gelu to the choice."""
    calls = {}
    monkeypatch.setattr(select_gemm._choices, "decide", lambda key, make, **kw: calls.update(make()) or "aten")
    select_gemm.choose(24, 40, 56, gelu)
    results = {name: fn().clone() for name, fn in calls.items()}
    assert "aten" in results and len(results) > 1, list(results)
    expected = results["aten"]
    assert (expected.min() >= -0.2) == gelu  # gelu's minimum is about -0.17
    for name, y in results.items():
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4, msg=name)

    seen = []
    monkeypatch.setattr(select_gemm, "choose", lambda m, k, n, gelu=False: seen.append(gelu) or "aten")
    monkeypatch.setattr(select_gemm, "MIN_FLOPS", 0)
    model = nn.Sequential(nn.Linear(40, 56), nn.GELU() if gelu else nn.ReLU(), nn.Linear(56, 8)).eval()
    with torch.inference_mode():
        kiln.compile(model, fallback=False)(torch.randn(24, 40))
    assert seen == [gelu, False], seen
