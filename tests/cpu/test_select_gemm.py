"""GEMM library selection: either library gives eager's results; the measured choice is stored."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln.library.gemm import select as select_gemm
from kiln import config
from kiln.report import mark, reports_since
from kiln.tune.choices import Choices

pytestmark = pytest.mark.skipif(not select_gemm.onednn_available(), reason="oneDNN not built into torch")


@pytest.mark.parametrize("choice,extern", [("onednn", {"onednn_linear"}), ("aten", {"addmm", "mm"}),
                                           ("kiln", {"linear_packed"})])
def test_linear_runs_with_either_library(choice, extern):
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128, bias=False)).eval()
    x = torch.randn(64, 256)
    position = mark()
    with torch.inference_mode():
        compiled = kiln.compile(model, fallback=False, choices=f"gemm={choice}")
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    report = reports_since(position)[-1]
    assert len(report.externs) == 2 and set(report.externs) <= extern, report.externs
    assert [(m.kind, m.choice, m.how) for m in report.choices] == [("gemm", choice, "forced")] * 2


def test_choice_is_measured_once_per_shape(tmp_path):
    with config.scope(cache_dir=str(tmp_path)):
        first = Choices()
        choice = select_gemm.choose(first, 32, 64, 48)
        assert choice in ("onednn", "aten", "kiln") and first.made[-1].how == "measured"
        later = Choices()  # (another compile: the tuning database has the answer)
        assert select_gemm.choose(later, 32, 64, 48) == choice and later.made[-1].how == "stored"


@pytest.mark.parametrize("gelu", [False, True])
def test_candidates_compute_the_epilogue_they_would_run(candidate_recorder, gelu):
    """A product that feeds a gelu is timed with it: every candidate returns gelu(x @ W^T + b) (kiln and oneDNN in
    their epilogue, ATen in a pass of its own), and the pass hands the gelu to the choice."""
    recorder = candidate_recorder("aten")
    select_gemm.choose(recorder, 24, 40, 56, gelu)
    (calls,) = recorder.candidates.values()
    results = {name: fn().clone() for name, fn in calls.items()}
    assert "aten" in results and len(results) > 1, list(results)
    expected = results["aten"]
    assert (expected.min() >= -0.2) == gelu  # gelu's minimum is about -0.17
    for name, y in results.items():
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4, msg=name)

    model = nn.Sequential(nn.Linear(40, 56), nn.GELU() if gelu else nn.ReLU(), nn.Linear(56, 8)).eval()
    position = mark()
    with torch.inference_mode():
        kiln.compile(model, fallback=False, choices="gemm=aten")(torch.randn(24, 40))
    asked = [m.what for m in reports_since(position)[-1].choices]
    assert asked == ["linear 24x40x56" + (" + gelu" if gelu else ""), "linear 24x56x8"], asked


class _SlicedWeights(nn.Module):
    """Two products with slices of one fused weight (``nn.MultiheadAttention``'s cross-attention projects query and
    key/value with rows of its ``in_proj_weight``), one of them a strided slice."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(96, 32) / 6)
        self.b = nn.Parameter(torch.randn(96))

    def forward(self, q, kv):
        return (nn.functional.linear(q, self.w[:32], self.b[:32]),
                nn.functional.linear(kv, self.w[32:96:2], self.b[32:96:2]))


@pytest.mark.parametrize("choice,extern", [("kiln", "linear_packed"), ("onednn", "onednn_linear")])
def test_a_slice_of_a_constant_weight_is_a_library_weight(choice, extern):
    model = _SlicedWeights().eval()
    q, kv = torch.randn(20, 32), torch.randn(24, 32)
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(model, fallback=False, choices=f"gemm={choice}")(q, kv)
        for a, e in zip(got, model(q, kv)):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    report = reports_since(position)[-1]
    assert report.externs == [extern, extern], report.externs


class _Conv1D(nn.Module):
    """GPT-2's ``Conv1D``: a [K, N] weight used as it is, ``addmm(b, x, W)`` (and ``mm`` without a bias), and a
    transposed slice of one."""

    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(48, 80)), nn.Parameter(torch.randn(80))

    def forward(self, x):
        y = torch.addmm(self.b, x.view(-1, 48), self.w)
        return y, x.view(-1, 48) @ self.w[:, 8:40], y @ self.w.t()


@pytest.mark.parametrize("choice,extern", [("kiln", "linear_packed"), ("onednn", "onednn_linear")])
def test_a_weight_used_untransposed_is_a_library_weight(choice, extern):
    model = _Conv1D().eval()
    x = torch.randn(2, 12, 48)
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(model, fallback=False, choices=f"gemm={choice}")(x)
        for a, e in zip(got, model(x)):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    report = reports_since(position)[-1]
    assert report.externs == [extern] * 3, report.externs
