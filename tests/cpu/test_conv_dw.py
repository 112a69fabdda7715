"""kiln's depthwise CPU convolution (library/conv/source_dw.py): the op against float64 convolution on fresh random
data, and the pass that puts it into graphs with its epilogues."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.library.conv import select as winograd
from kiln.report import mark, reports_since
from kiln.library.conv import op_dw as cpu_conv_dw

pytestmark = pytest.mark.skipif(not cpu_conv_dw.available(), reason="kiln's depthwise kernel does not build here")

# (N, C, H, W, kh, kw, stride, padding)
SHAPES = [
    (1, 32, 14, 14, 3, 3, (1, 1), (1, 1)),     # MobileNet's 3x3
    (2, 40, 15, 13, 3, 3, (2, 2), (1, 1)),     # strided; 40 channels: a partial vector on AVX-512
    (1, 20, 17, 19, 5, 5, (1, 1), (2, 2)),     # 5x5; 20 channels: partial vectors on AVX2 and AVX-512
    (1, 12, 9, 11, 5, 3, (2, 1), (0, 1)),      # rectangular filter, stride and padding
    (1, 7, 6, 5, 3, 3, (1, 1), (0, 0)),        # fewer channels than a vector; output narrower than a pixel block
    (1, 48, 14, 14, 7, 7, (1, 1), (3, 3)),     # ConvNeXt's 7x7: every block of a 14-wide row at an edge
    (2, 24, 19, 23, 7, 7, (2, 2), (3, 3)),     # 7x7 stride 2; 24 channels: a whole and a partial vector
    (1, 40, 9, 29, 3, 3, (1, 1), (0, 0)),      # unpadded: a short last block whose windows lie in the input
    (1, 16, 12, 30, 5, 5, (2, 1), (2, 2)),     # 5x5, different strides along y and x
]


def _case(shape, seed):
    n, c, h, w, kh, kw, stride, padding = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=gen)
    weight = torch.randn(c, 1, kh, kw, generator=gen) / (kh * kw) ** 0.5
    bias = torch.randn(c, generator=gen)
    return x, weight, bias, list(stride), list(padding)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])) + f"-s{s[6][0]}{s[6][1]}")
@pytest.mark.parametrize("channels_last", [True, False])
def test_matches_float64_convolution(shape, channels_last):
    x, weight, bias, stride, padding = _case(shape, 0)
    c, kh, kw = weight.shape[0], weight.shape[2], weight.shape[3]
    layout = torch.channels_last if channels_last else torch.contiguous_format
    ref = F.conv2d(x.double(), weight.double(), bias.double(), stride, padding, groups=c)
    packed = cpu_conv_dw.pack_weight(weight)
    got = torch.ops.kiln.conv_dw(x.contiguous(memory_format=layout), packed, bias, None, c, [kh, kw], stride,
                                 padding, False, channels_last)
    assert got.is_contiguous(memory_format=layout)
    torch.testing.assert_close(got.double(), ref, rtol=1.3e-5, atol=1.5e-5)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_epilogues_and_input_relu_keep_nan(layout):
    """relu(conv(relu(x)) + r) in one call, NaN kept as torch.relu keeps it; channels-last takes the interior
    blocks' fast loop, NCHW the general one."""
    x, weight, bias, stride, padding = _case(SHAPES[0], 1)
    c = weight.shape[0]
    x[0, 3, 5, 5] = float("nan")
    x = x.contiguous(memory_format=layout)
    r = torch.randn(1, c, 14, 14)
    packed = cpu_conv_dw.pack_weight(weight)
    got = torch.ops.kiln.conv_dw(x, packed, bias, r, c, [3, 3], stride, padding, True, True, True)
    ref = torch.relu(F.conv2d(torch.relu(x).double(), weight.double(), bias.double(), stride, padding, groups=c)
                     + r.double())
    torch.testing.assert_close(got.double(), ref, rtol=1.3e-5, atol=1.5e-5, equal_nan=True)
    assert torch.isnan(got[0, 3, 4:7, 4:7]).all() and not torch.isnan(got[0, 4]).any()


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[6], SHAPES[8]], ids=["3x3", "7x7", "3x3-unpadded"])
def test_input_relu6_clamps_both_ends(layout, shape):
    """The producer's ReLU6 applied on the input (``relu_input_max``): values above 6 and below 0 clamped, NaN kept."""
    x, weight, bias, stride, padding = _case(shape, 2)
    c, kh, kw = weight.shape[0], weight.shape[2], weight.shape[3]
    x = (x * 8).contiguous(memory_format=layout)
    x[0, 2, 6, 6] = float("nan")
    packed = cpu_conv_dw.pack_weight(weight)
    got = cpu_conv_dw.conv_dw(x, packed, bias, None, c, [kh, kw], stride, padding, False, True, True,
                              relu_input_max=6.0)
    clamped = torch.where(torch.isnan(x), x, x.clamp(0, 6))
    ref = F.conv2d(clamped.double(), weight.double(), bias.double(), stride, padding, groups=c)
    torch.testing.assert_close(got.double(), ref, rtol=1.3e-5, atol=1.5e-5, equal_nan=True)


def test_bad_arguments_are_named():
    x = torch.randn(1, 8, 6, 6)
    with pytest.raises(ValueError, match="takes 8 input channels and 72 packed weights"):
        torch.ops.kiln.conv_dw(x, torch.zeros(70), None, None, 8, [3, 3], [1, 1], [1, 1], False)
    with pytest.raises(ValueError, match="fp32"):
        torch.ops.kiln.conv_dw(x.double(), torch.zeros(72), None, None, 8, [3, 3], [1, 1], [1, 1], False)


class _Inverted(nn.Module):
    """A MobileNetV2 block: expand 1x1, depthwise 3x3, project 1x1, residual."""

    def __init__(self, c: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
                                nn.BatchNorm2d(hidden), nn.ReLU())
        self.project = nn.Sequential(nn.Conv2d(hidden, c, 1, bias=False), nn.BatchNorm2d(c))
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.dw(self.expand(x)))


def test_pass_runs_a_depthwise_layer_with_its_epilogue():
    model = _Inverted().eval()
    x = torch.randn(2, 16, 56, 56)
    position = mark()
    with torch.inference_mode():  # (the other convolutions cannot run depthwise: chosen as usual)
        out = kiln.compile(model, fallback=False, choices="conv=dw")(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    report = reports_since(position)[-1]
    forced = [m.what for m in report.choices if m.how == "forced"]
    assert len(forced) == 1 and forced[0].endswith("groups 64 + relu"), report.choices
    assert "conv_dw" in report.externs, report.externs
    notes = " ".join(note for p in report.passes if p.name == "winograd" for note in p.notes)
    assert "convolution -> kiln depthwise: 1" in notes and "relu -> depthwise epilogue: 1" in notes, notes


def test_choice_measures_onednn_against_the_depthwise_kernel(candidate_recorder):
    recorder = candidate_recorder("onednn")
    winograd.choose(recorder, (1, 24, 20, 20), (24, 1, 3, 3), [2, 2], [1, 1], "relu", 24)
    (calls,) = recorder.candidates.values()
    assert set(calls) == {"onednn", "dw"}, list(calls)
    results = {name: fn() for name, fn in calls.items()}
    torch.testing.assert_close(results["dw"], results["onednn"], rtol=1e-4, atol=1e-4)
    assert results["dw"].min() >= 0


class _Relu6Block(nn.Module):
    """MobileNet-V2's layers: convolutions each followed by BatchNorm and ReLU6 (hardtanh(0, 6))."""

    def __init__(self, c: int = 16, groups: int = 1, k: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(c, c, k, padding=k // 2, groups=groups)
        self.bn, self.act = nn.BatchNorm2d(c), nn.ReLU6()
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.act(self.bn(self.conv(x))) * 1.5


def _compiled_with_a_nan(model: nn.Module, choice: str) -> tuple[torch.Tensor, object, str]:
    """Compile ``model`` with the convolution choice forced, check it on an input with values past 6 and a NaN;
    return eager's result, the report and the notes of the convolution pass."""
    x = torch.randn(1, 16, 20, 20) * 4
    x[0, 3, 5, 5] = float("nan")
    position = mark()
    with torch.inference_mode():
        out = kiln.compile(model, fallback=False, choices=f"conv={choice}")(x)
        expected = model(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
    report = reports_since(position)[-1]
    return expected, report, " ".join(note for p in report.passes if p.name == "winograd" for note in p.notes)


@pytest.mark.parametrize("choice,groups,k,label", [("dw", 16, 3, "depthwise"), ("gemm", 1, 1, "implicit-GEMM"),
                                                    ("winograd2", 1, 3, "Winograd")])
def test_relu6_is_a_convolution_epilogue(choice, groups, k, label):
    """ReLU6 lowers to minimum(maximum(conv, 0), 6): both fold into kiln's convolution (a ReLU clamped at 6), no
    kernel of its own; values above 6, below 0 and NaN come out as eager's."""
    torch.manual_seed(0)
    expected, report, notes = _compiled_with_a_nan(_Relu6Block(groups=groups, k=k).eval(), choice)
    assert (expected == 9.0).any() and (expected == 0).any() and expected.isnan().any()
    assert f"relu -> {label} epilogue: 1" in notes and f"relu6 clamp -> {label} epilogue: 1" in notes, notes
    assert not any("minimum" in k.name or "maximum" in k.name for k in report.kernels), \
        [k.name for k in report.kernels]


class _OneDnnThenRelu6(nn.Module):
    """A dilated depthwise layer (no kiln kernel takes dilation: ATen's or oneDNN's convolution) with its ReLU6,
    then a 1x1 projection."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, padding=2, dilation=2, groups=c)
        self.act, self.project = nn.ReLU6(), nn.Conv2d(c, 24, 1)

    def forward(self, x):
        return self.project(self.act(self.dw(x)))


@pytest.mark.parametrize("choice,label", [("gemm", "implicit-GEMM"), ("winograd2", "Winograd")])
def test_relu6_before_a_convolution_is_applied_as_it_reads(choice, label):
    """A ReLU6 that no epilogue took (its producer is oneDNN's) is applied by the kiln convolution reading it."""
    torch.manual_seed(0)
    model = _OneDnnThenRelu6().eval()
    if choice.startswith("winograd"):
        model.project = nn.Conv2d(16, 24, 3, padding=1).eval()
    _, report, notes = _compiled_with_a_nan(model, choice)
    assert f"relu6 -> {label} input: 1" in notes, notes
    assert not any("minimum" in k.name for k in report.kernels), [k.name for k in report.kernels]


@pytest.mark.parametrize("op", ["dw", "gemm", "direct"])
@pytest.mark.parametrize("padding", [[0, 0, 1, 1], [1, 0, 2, 1], [0, 2, 0, 1]])
def test_four_sided_padding_matches_a_padded_convolution(op, padding):
    """[top, left, bottom, right] padding (TensorFlow's stride-2 "same": more after than before) against ATen's
    convolution of the explicitly padded input, stride 2 and 1, input channels-last and NCHW."""
    from kiln.library.conv import op as cpu_conv
    if op != "dw" and not cpu_conv.gemm_available():
        pytest.skip("kiln's implicit GEMM does not build here")
    gen = torch.Generator().manual_seed(3)
    c = 12 if op == "dw" else 5
    x = torch.randn(2, c, 11, 10, generator=gen)
    top, left, bottom, right = padding
    for stride in ([2, 2], [1, 2]):
        for layout in (torch.channels_last, torch.contiguous_format):
            xl = x.contiguous(memory_format=layout)
            if op == "dw":
                w = torch.randn(c, 1, 3, 3, generator=gen)
                got = torch.ops.kiln.conv_dw(xl, cpu_conv_dw.pack_weight(w), None, None, c, [3, 3], stride, padding,
                                             False, True)
                ref = F.conv2d(F.pad(x, (left, right, top, bottom)).double(), w.double(), None, stride, groups=c)
            else:
                w = torch.randn(8, c, 3, 3, generator=gen)
                got = torch.ops.kiln.conv_gemm(xl, cpu_conv.pack_conv_weight(w), None, None, 8, [3, 3], stride,
                                               padding, False, True, direct=op == "direct")
                ref = F.conv2d(F.pad(x, (left, right, top, bottom)).double(), w.double(), None, stride)
            torch.testing.assert_close(got.double(), ref, rtol=1.3e-5, atol=2e-5)


class _TfSameBlock(nn.Module):
    """transformers' MobileNet-V2 way: F.pad "same" (more after than before for stride 2), then the convolution
    with padding 0, ReLU6 before it."""

    def __init__(self, c: int = 16, groups: int = 16):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, groups=groups)

    def forward(self, x):
        return self.conv(F.pad(F.relu6(x), (0, 1, 0, 1))) * 1.5


@pytest.mark.parametrize("choice,groups,label", [("dw", 16, "depthwise"), ("gemm", 1, "implicit-GEMM")])
def test_tensorflow_same_pad_folds_into_the_convolution(choice, groups, label):
    torch.manual_seed(0)
    model = _TfSameBlock(groups=groups).eval()
    x = torch.randn(1, 16, 20, 20) * 4
    position = mark()
    with torch.inference_mode():
        out = kiln.compile(model, fallback=False, choices=f"conv={choice}")(x)
        expected = model(x)
    torch.testing.assert_close(out, expected, rtol=1.3e-5, atol=2e-5)
    report = reports_since(position)[-1]
    notes = " ".join(note for p in report.passes if p.name == "winograd" for note in p.notes)
    assert f"zero pad -> {label} padding: 1" in notes and f"relu6 -> {label} input: 1" in notes, notes
    assert not any("pad" in k.name for k in report.kernels), [k.name for k in report.kernels]


def test_the_avx2_build_matches(tmp_path):
    """The library as an AVX2 machine compiles it (8-lane vectors, 4-pixel blocks): the sliding-window rows of the
    3x3 and 7x7 filters, edge blocks and the input ReLU6, called with the arguments the binder gives the native
    build."""
    import ctypes
    from kiln import config
    from kiln.runtime import native
    from kiln.runtime.build import load_module
    from kiln.library.conv.source_dw import conv_dw_source
    with config.scope(cache_dir=str(tmp_path)):
        avx2 = load_module(conv_dw_source(), name="kiln_conv_dw_avx2", extra_flags=("-mno-avx512f",)).lib
    op = torch.ops.kiln.conv_dw.default
    for shape in (SHAPES[1], SHAPES[6], SHAPES[7]):
        x, weight, bias, stride, padding = _case(shape, 4)
        c, kh, kw = weight.shape[0], weight.shape[2], weight.shape[3]
        x = (x * 4).contiguous(memory_format=torch.channels_last)
        x[0, 1, 3, 3] = float("nan")
        ho = (x.shape[2] + 2 * padding[0] - kh) // stride[0] + 1
        wo = (x.shape[3] + 2 * padding[1] - kw) // stride[1] + 1
        out = torch.empty(x.shape[0], c, ho, wo).contiguous(memory_format=torch.channels_last)
        args = native.op_args(op, x, cpu_conv_dw.pack_weight(weight), bias, None, c, kernel=[kh, kw], stride=stride,
                              padding=padding, relu=False, channels_last=True, relu_input=True, relu_input_max=6.0)
        fn, values = native._prepare(op, args, out)
        ctypes.CFUNCTYPE(None, *fn._argtypes_)(ctypes.cast(avx2.kiln_conv_dw, ctypes.c_void_p).value)(*values)
        ref = F.conv2d(torch.clamp(x.double(), 0, 6), weight.double(), bias.double(), stride, padding, groups=c)
        torch.testing.assert_close(out.double(), ref, rtol=1.3e-5, atol=1.5e-5, equal_nan=True)


def test_past_the_budget_the_rule_predicts_kilns_kernel_for_its_sliding_windows(tmp_path):
    """Nothing measured (budget 0): a depthwise convolution of 3, 5 or 7 taps per row at stride 1 or 2 and at
    least 16 channels is predicted kiln's kernel (ConvNeXt in the model: faster than oneDNN's calls); a 4-wide
    filter, or 8 channels, oneDNN."""
    from kiln import config
    # (each above the MIN_FLOPS below which no choice is made)
    cases = [(nn.Conv2d(32, 32, 7, padding=3, groups=32), torch.randn(1, 32, 40, 40), "dw"),
             (nn.Conv2d(96, 96, 3, stride=2, padding=1, groups=96), torch.randn(1, 96, 112, 112), "dw"),
             (nn.Conv2d(64, 64, 4, padding=2, groups=64), torch.randn(1, 64, 60, 60), "onednn"),
             (nn.Conv2d(8, 8, 5, padding=2, groups=8), torch.randn(1, 8, 120, 120), "onednn")]
    position = mark()
    with config.scope(cache_dir=str(tmp_path)), torch.inference_mode():
        for conv, x, _ in cases:
            out = kiln.compile(conv.eval(), fallback=False, choice_budget_s=0.0)(x)
            torch.testing.assert_close(out, conv(x), rtol=1e-4, atol=1e-5)
    made = [(m.choice, m.how) for r in reports_since(position) for m in r.choices if m.kind == "conv"]
    assert made == [(want, "predicted") for *_, want in cases], made
