"""kiln's Winograd convolution: the derived matrices, the op against float64 convolution in every layout and
epilogue, the pass (choice, epilogue absorption, NCHW graph outputs), and its error messages."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.library.conv.source_winograd import winograd_matrices
from kiln.library.conv import select as winograd
from kiln.report import mark, reports_since
from kiln.library.conv import op as cpu_conv
from kiln.tune.choices import Choices

pytestmark = pytest.mark.skipif(not cpu_conv.available(), reason="no AVX2/AVX-512 compiler for kiln's kernels")
CL = torch.channels_last


@pytest.mark.parametrize("m", cpu_conv.TILE_SIZES)
def test_matrices_compute_correlation(m):
    at, g, bt = (np.array(x.tolist(), dtype=np.float64) for x in winograd_matrices(m))
    rng = np.random.default_rng(m)
    d, f = rng.standard_normal(m + 2), rng.standard_normal(3)
    np.testing.assert_allclose(at @ ((g @ f) * (bt @ d)), [d[i:i + 3] @ f for i in range(m)], atol=1e-12)


def _relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).abs() / (ref.abs() + 1)).max().item()


@pytest.mark.parametrize("m", cpu_conv.TILE_SIZES)
@pytest.mark.parametrize("n,c,h,w,k,pad", [(1, 5, 9, 11, 7, 1), (2, 17, 13, 10, 33, 0), (1, 64, 12, 12, 48, 1),
                                           (1, 3, 3, 3, 1, 0)])
def test_op_matches_float64_convolution(m, n, c, h, w, k, pad):
    gen = torch.Generator().manual_seed(n * 100 + c)
    x = torch.randn(n, c, h, w, generator=gen)
    weight = torch.randn(k, c, 3, 3, generator=gen)
    bias = torch.randn(k, generator=gen)
    ref = F.conv2d(x.double(), weight.double(), bias.double(), padding=pad)
    direct = _relative_error(F.conv2d(x, weight, bias, padding=pad), ref)  # fp32 direct convolution's own error
    y = torch.ops.kiln.conv_winograd(x, cpu_conv.transform_weight(weight, m), bias, None, k, m, [pad, pad], False)
    assert y.shape == ref.shape and y.stride(1) == 1  # channels-last
    # F(2x2) rounds like direct convolution; F(4x4)'s larger transform entries cost about a decimal digit
    assert _relative_error(y, ref) <= (3 if m == 2 else 30) * direct + 1e-6


@pytest.mark.parametrize("x_layout", [CL, torch.contiguous_format])
@pytest.mark.parametrize("r_layout", [CL, torch.contiguous_format])
@pytest.mark.parametrize("out_channels_last", [True, False])
def test_layouts_and_epilogue(x_layout, r_layout, out_channels_last):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 20, 10, 9, generator=gen).contiguous(memory_format=x_layout)
    weight = torch.randn(24, 20, 3, 3, generator=gen) / 8
    bias = torch.randn(24, generator=gen)
    residual = torch.randn(2, 24, 10, 9, generator=gen).contiguous(memory_format=r_layout)
    residual[0, 3, 4, 4] = float("nan")  # relu keeps NaN, as torch.relu
    y = torch.ops.kiln.conv_winograd(x, cpu_conv.transform_weight(weight, 2), bias, residual, 24, 2, [1, 1], True,
                                     out_channels_last)
    ref = torch.relu(F.conv2d(x, weight, bias, padding=1) + residual)
    assert y.is_contiguous(memory_format=CL if out_channels_last else torch.contiguous_format)
    torch.testing.assert_close(y, ref, rtol=1.3e-5, atol=1.5e-5, equal_nan=True)
    assert torch.isnan(y[0, 3, 4, 4])


def test_two_threads_match_one():
    x = torch.randn(1, 32, 30, 30)
    packed = cpu_conv.transform_weight(torch.randn(40, 32, 3, 3), 2)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.kiln.conv_winograd(x, packed, None, None, 40, 2, [1, 1], False)
        torch.set_num_threads(2)
        two = torch.ops.kiln.conv_winograd(x, packed, None, None, 40, 2, [1, 1], False)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, two)  # blocks of tiles are independent: the same arithmetic in any thread


def test_bad_input_is_named():
    packed = cpu_conv.transform_weight(torch.randn(8, 4, 3, 3), 2)
    with pytest.raises(ValueError, match="4-D fp32 CPU input"):
        torch.ops.kiln.conv_winograd(torch.randn(1, 4, 8, 8).double(), packed, None, None, 8, 2, [1, 1], False)
    with pytest.raises(ValueError, match="smaller than the 3x3 filter"):
        torch.ops.kiln.conv_winograd(torch.randn(1, 4, 2, 2), packed, None, None, 8, 2, [0, 0], False)
    with pytest.raises(ValueError, match="residual"):
        torch.ops.kiln.conv_winograd(torch.randn(1, 4, 8, 8), packed, None, torch.randn(1, 8, 7, 7), 8, 2, [1, 1],
                                     False)
    with pytest.raises(ValueError, match="tile must be one of"):
        torch.ops.kiln.conv_winograd(torch.randn(1, 4, 8, 8), packed, None, None, 8, 3, [1, 1], False)


class _Block(nn.Module):
    """conv-BN-ReLU, conv-BN + identity, ReLU: a ResNet basic block."""

    def __init__(self, ch: int = 32):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch)
        self.conv2, self.bn2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def test_pass_takes_block_with_epilogues():
    model = _Block().eval()
    x = torch.randn(2, 32, 16, 16)
    position = mark()
    with torch.inference_mode():
        out = kiln.compile(model, fallback=False, choices="conv=winograd2")(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert out.is_contiguous()  # the graph output is written NCHW, eager's layout
    report = reports_since(position)[-1]
    assert report.externs == ["conv_winograd", "conv_winograd"], report.externs
    notes = " ".join(note for p in report.passes if p.name == "winograd" for note in p.notes)
    assert "relu -> Winograd epilogue: 2" in notes and "residual add -> Winograd epilogue: 1" in notes, notes
    assert not report.kernels  # BN folded, add and both ReLUs in the epilogues: nothing left to generate


def test_relu_used_twice_is_not_absorbed():
    conv = nn.Conv2d(8, 8, 3, padding=1)

    def fn(x):
        y = conv(x)
        return torch.relu(y), y * 2  # the conv's result is needed without the ReLU too

    x = torch.randn(1, 8, 10, 10)
    with torch.inference_mode():
        a, b = kiln.compile(fn, fallback=False, choices="conv=winograd2")(x)
        torch.testing.assert_close(a, torch.relu(conv(x)), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(b, conv(x) * 2, rtol=1e-4, atol=1e-5)


def test_choice_is_measured_once_and_can_be_turned_off(tmp_path):
    with config.scope(cache_dir=str(tmp_path)):
        first = Choices()
        choice = winograd.choose(first, (1, 16, 12, 12), (16, 16, 3, 3), [1, 1], [1, 1])
        assert choice in ("onednn", "winograd2", "gemm") and first.made[-1].how == "measured"
        later = Choices()  # (another compile: the tuning database has the answer)
        assert winograd.choose(later, (1, 16, 12, 12), (16, 16, 3, 3), [1, 1], [1, 1]) == choice
        assert later.made[-1].how == "stored"
    # (turning Winograd off still measures the implicit GEMM against oneDNN)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()).eval()
    position = mark()
    with config.scope(winograd_tiles=""), torch.inference_mode():
        kiln.compile(model, fallback=False)(torch.randn(1, 16, 32, 32))
    assert "conv_winograd" not in reports_since(position)[-1].externs
    with config.scope(winograd_tiles="3"), pytest.raises(ValueError, match="tile sizes must be among"):
        winograd.tiles()


@pytest.mark.parametrize("epilogue", ["relu", "add_relu", "add", ""])
def test_choice_times_each_candidate_with_its_epilogue(epilogue, candidate_recorder):
    """The conv pass passes the epilogue kiln's kernels would take in to the measurement, whose candidates then
    compute it: kiln's kernels in their output transform, oneDNN's result in a separate pass (checked here on
    the values each candidate returns)."""
    conv, conv2 = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)  # above MIN_FLOPS
    bodies = {"relu": lambda x: torch.relu(conv(x)), "add_relu": lambda x: torch.relu(conv(x) + conv2(x)),
              "add": lambda x: conv(x) + conv2(x) * 2, "": lambda x: conv(x) * conv(x).sum()}
    position = mark()
    with torch.inference_mode():
        kiln.compile(bodies[epilogue], fallback=False, choices="conv=winograd2")(torch.randn(1, 16, 40, 40))
    asked = [m.what for m in reports_since(position)[-1].choices if m.what.startswith("conv [1, 16, 40, 40]")]
    assert asked and asked[0].endswith(f" + {epilogue}" if epilogue else "stride [1, 1]"), asked

    recorder = candidate_recorder("onednn")
    winograd.choose(recorder, (1, 16, 12, 12), (16, 16, 3, 3), [1, 1], [1, 1], epilogue)
    (calls,) = recorder.candidates.values()
    results = {name: fn() for name, fn in calls.items()}
    assert "onednn" in results and len(results) > 1, list(results)
    # oneDNN's timed pass after an add is the add alone (the generated kernel's ReLU costs nothing more)
    expected = results["onednn"].relu() if epilogue == "add_relu" else results["onednn"]
    assert expected.min() < 0 if epilogue in ("", "add") else expected.min() >= 0
    for name, y in results.items():  # every candidate computed the same function, epilogue included
        torch.testing.assert_close(y.relu() if name == "onednn" and epilogue == "add_relu" else y, expected,
                                   rtol=1e-4, atol=1e-4, msg=name)


def test_views_of_channels_last_results_have_eager_strides():
    """A graph output that is a view (flatten, permute) of a library's channels-last result gets the strides
    eager's contiguous result would give it."""
    conv = nn.Conv2d(16, 32, 3, padding=1)

    def fn(x):
        z = conv(torch.relu(x))
        return z.flatten(1), z.permute(0, 2, 3, 1)

    x = torch.randn(2, 16, 12, 12)
    with torch.inference_mode():
        got, expected = kiln.compile(fn, fallback=False, choices="conv=winograd2")(x), fn(x)
    for a, b in zip(got, expected):
        assert a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_channels_past_one_k_block():
    """More input channels than one K block of the GEMM (1024): the products accumulate over K blocks."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 1100, 6, 5, generator=gen)
    weight = torch.randn(20, 1100, 3, 3, generator=gen) / 30
    bias = torch.randn(20, generator=gen)
    ref = F.conv2d(x.double(), weight.double(), bias.double(), padding=1)
    y = torch.ops.kiln.conv_winograd(x, cpu_conv.transform_weight(weight, 2), bias, None, 20, 2, [1, 1], False)
    # the per-op fp32 tolerance against float64 (9900 products per output: direct convolution's own error here
    # is 1-3e-6, Winograd's 3-9e-6, at every channel count from 900 to 2048, across the K-block boundary)
    torch.testing.assert_close(y, ref.float(), rtol=1.3e-5, atol=1.5e-5)


def test_relu_of_the_input_is_applied_as_it_is_read():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 24, 9, 10, generator=gen)
    x[0, 5, 3, 3] = float("nan")
    weight = torch.randn(16, 24, 3, 3, generator=gen) / 8
    y = torch.ops.kiln.conv_winograd(x, cpu_conv.transform_weight(weight, 2), None, None, 16, 2, [1, 1], False,
                                     True, True)
    torch.testing.assert_close(y, F.conv2d(torch.relu(x), weight, padding=1), rtol=1.3e-5, atol=1.5e-5,
                               equal_nan=True)
    assert torch.isnan(y[0, :, 2:5, 2:5]).all() and not torch.isnan(y[0, :, 6:, 6:]).any()


def test_pass_moves_a_library_convolutions_relu_into_the_next_input():
    """oneDNN's strided convolution keeps its ReLU out (NaN semantics); the Winograd convolution reading it
    applies the ReLU to its input instead of a separate kernel."""
    model = nn.Sequential(nn.Conv2d(8, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1)).eval()
    x = torch.randn(2, 8, 40, 40)
    position = mark()
    with torch.inference_mode():
        torch.testing.assert_close(kiln.compile(model, fallback=False, choices="conv=winograd2")(x), model(x), rtol=1e-4, atol=1e-5)
    report = reports_since(position)[-1]
    notes = " ".join(note for p in report.passes if p.name == "winograd" for note in p.notes)
    assert "relu -> Winograd input: 1" in notes, notes
    assert not report.kernels, [k.name for k in report.kernels]


def test_the_report_shows_what_was_measured(tmp_path):
    model = nn.Sequential(nn.Conv2d(16, 24, 3, padding=1), nn.ReLU()).eval()
    position = mark()
    with config.scope(cache_dir=str(tmp_path)), torch.inference_mode():  # (an empty tuning database)
        kiln.compile(model, fallback=False, choice_budget_s=60.0)(torch.randn(1, 16, 40, 40))
    report = reports_since(position)[-1]
    (made,) = [m for m in report.choices if m.kind == "conv"]
    assert made.how == "measured" and made.note.startswith("measured conv [1, 16, 40, 40] x [24, 16, 3, 3]") \
        and " ms" in made.note, made
    assert made.format() in report.format(source=False)


def test_past_the_budget_the_rule_predicts_winograd_for_large_outputs(tmp_path):
    """Nothing measured (budget 0): the rule predicts Winograd F(2x2) for a 3x3 stride-1 convolution with a large
    output, oneDNN below ``WINOGRAD_MIN_OUTPUT`` positions; the answers are not stored (a later compile with
    budget measures them)."""
    big, small = nn.Conv2d(32, 32, 3, padding=1), nn.Conv2d(128, 128, 3, padding=1)
    position = mark()
    with config.scope(cache_dir=str(tmp_path)), torch.inference_mode():
        for conv, x in ((big, torch.randn(1, 32, 32, 32)), (small, torch.randn(1, 128, 13, 13))):
            out = kiln.compile(conv, fallback=False, choice_budget_s=0.0)(x)
            torch.testing.assert_close(out, conv(x), rtol=1e-4, atol=1e-5)
    made = [(m.choice, m.how) for r in reports_since(position) for m in r.choices if m.kind == "conv"]
    assert made == [("winograd2", "predicted"), ("onednn", "predicted")], made
