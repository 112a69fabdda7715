"""kiln's implicit-GEMM CPU convolution (library/conv/source_gemm.py): the op against float64 convolution on
fresh random data, and the pass that puts it into graphs with their epilogues."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.library.conv import select as winograd
from kiln.report import mark, reports_since
from kiln.library.conv import op as cpu_conv

pytestmark = pytest.mark.skipif(not cpu_conv.gemm_available(), reason="kiln's CPU GEMM does not build here")

# (N, C, H, W, K, kh, kw, stride, padding)
SHAPES = [
    (1, 16, 9, 9, 24, 1, 1, (1, 1), (0, 0)),       # 1x1: a plain GEMM of the channels-last input
    (2, 12, 11, 10, 40, 1, 1, (2, 2), (0, 0)),     # ResNet's downsampling 1x1 stride 2
    (1, 8, 15, 13, 20, 3, 3, (2, 2), (1, 1)),      # strided 3x3
    (1, 3, 30, 30, 16, 7, 7, (2, 2), (3, 3)),      # the stem: 7x7 stride 2 on 3 channels
    (2, 5, 10, 12, 7, 5, 3, (1, 2), (2, 0)),       # rectangular filter, stride and padding
    (1, 130, 6, 7, 33, 3, 3, (1, 1), (1, 1)),      # K = 1170 > one K block of 1024; 33 columns: a partial panel
    (1, 4, 40, 40, 8, 3, 3, (1, 1), (0, 0)),       # 1444 output pixels: several row blocks
    (1, 3, 14, 14, 16, 3, 3, (1, 1), (0, 0)),      # direct kernel without a padded copy (whole 6-pixel blocks)
]


def _case(shape, seed):
    n, c, h, w, k, kh, kw, stride, padding = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=gen)
    weight = torch.randn(k, c, kh, kw, generator=gen) / (c * kh * kw) ** 0.5
    bias = torch.randn(k, generator=gen)
    return x, weight, bias, list(stride), list(padding)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:7])) + f"-s{s[7][0]}{s[7][1]}")
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("direct", [False, True], ids=["packed", "direct"])
def test_matches_float64_convolution(shape, channels_last, direct):
    """Both paths of the op: im2col rows packed for the micro-kernel, and the pack-free direct kernel."""
    x, weight, bias, stride, padding = _case(shape, seed=sum(shape[:7]))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    packed = cpu_conv.pack_conv_weight(weight)
    k, _, kh, kw = weight.shape
    y = torch.ops.kiln.conv_gemm(x, packed, bias, None, k, [kh, kw], stride, padding, False, channels_last, False,
                                 direct)
    ref = F.conv2d(x.double(), weight.double(), bias.double(), stride, padding)
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    torch.testing.assert_close(y, ref.float(), rtol=1.3e-5, atol=1.5e-5)


@pytest.mark.parametrize("direct", [False, True], ids=["packed", "direct"])
def test_epilogue_residual_relu_and_input_relu_keep_nan(direct):
    x, weight, bias, stride, padding = _case((1, 24, 9, 10, 16, 3, 3, (1, 1), (1, 1)), seed=5)
    x[0, 5, 3, 3] = float("nan")
    residual = torch.randn(1, 16, 9, 10).contiguous(memory_format=torch.channels_last)
    y = torch.ops.kiln.conv_gemm(x, cpu_conv.pack_conv_weight(weight), bias, residual, 16, [3, 3], stride, padding,
                                 True, True, True, direct)
    ref = torch.relu(F.conv2d(torch.relu(x.double()), weight.double(), bias.double(), stride, padding)
                     + residual.double())
    torch.testing.assert_close(y, ref.float(), rtol=1.3e-5, atol=1.5e-5, equal_nan=True)
    assert torch.isnan(y[0, :, 2:5, 2:5]).all() and not torch.isnan(y[0, :, 6:, 6:]).any()


# 1x1 stride-1 convolutions read their input in place (no packing) when its pixels lie at one stride, and write a
# dense channels-last output directly, the epilogue tile by tile: (N, C, H, W, K, input layout, threads), each
# with the residual/ReLU6 epilogue and without
POINTWISE = [
    (1, 16, 9, 9, 96, "channels_last", 1),     # small K x N: tile by tile; 81 rows (a partial last tile)
    (2, 32, 7, 5, 16, "channels_last", 2),     # two images at one pixel stride; 16 of 32 columns; two threads
    (1, 520, 6, 6, 136, "channels_last", 1),   # the K block of all panels too big for L2: panel by panel
    (1, 1100, 3, 5, 40, "channels_last", 2),   # K = 1100 > one K block (1024)
    (1, 24, 8, 9, 33, "nchw", 1),              # NCHW input (pixels at stride 1, channels at H*W)
    (2, 24, 8, 9, 33, "nchw", 1),              # two NCHW images: not one pixel stride -> packed
    (1, 20, 9, 11, 24, "sliced", 2),           # a channels-last slice along W: not one pixel stride -> packed
]


@pytest.mark.parametrize("case", POINTWISE, ids=lambda c: "x".join(map(str, c[:5])) + f"-{c[5]}-t{c[6]}")
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "residual-relu6"])
@pytest.mark.parametrize("channels_last_out", [True, False], ids=["nhwc-out", "nchw-out"])
@pytest.mark.parametrize("relu_in", [None, 6.0, float("inf")], ids=["x", "relu6-x", "relu-x"])
def test_pointwise_convolution_paths(case, epilogue, channels_last_out, relu_in):
    n, c, h, w, k, layout, threads = case
    gen = torch.Generator().manual_seed(c + k)
    x = torch.randn(n, c, h, w + (layout == "sliced"), generator=gen)
    if layout != "nchw":
        x = x.contiguous(memory_format=torch.channels_last)
    if layout == "sliced":
        x = x[..., 1:]
    weight = torch.randn(k, c, 1, 1, generator=gen) / c ** 0.5
    bias = torch.randn(k, generator=gen)
    residual = torch.randn(n, k, w, h, generator=gen).transpose(2, 3) if epilogue else None  # (strided)
    if epilogue:
        x[0, 3, 2, 2] = float("nan")
    if relu_in is not None:
        x[0, 4, 1, 1] = float("nan")  # (an input ReLU keeps NaN)
        x[0, :, 0, 1] = 9.0  # (above ReLU6's clamp)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        y = torch.ops.kiln.conv_gemm(x, cpu_conv.pack_conv_weight(weight), bias, residual, k, [1, 1], [1, 1], [0, 0],
                                     epilogue, channels_last_out, relu_input=relu_in is not None,
                                     relu_max=6.0 if epilogue else None,
                                     relu_input_max=relu_in if relu_in != float("inf") else None)
    finally:
        torch.set_num_threads(before)
    xin = x.double() if relu_in is None else torch.clamp(x.double(), 0.0, relu_in)  # (clamp keeps NaN)
    ref = F.conv2d(xin, weight.double(), bias.double())
    if epilogue:
        ref = torch.clamp(ref + residual.double(), 0.0, 6.0)  # (clamp keeps NaN, as the kernel)
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last_out else torch.contiguous_format)
    torch.testing.assert_close(y, ref.float(), rtol=1.3e-5, atol=1.5e-5, equal_nan=True)
    if epilogue:
        assert torch.isnan(y[0, :, 2, 2]).all() and not torch.isnan(y[:, :, 3:, 3:]).any()
    if relu_in is not None:
        assert torch.isnan(y[0, :, 1, 1]).all()


def test_two_threads_share_a_block():
    """A 7x7 layer is one block of 49 rows: the threads split its packing, column panels and epilogue."""
    x, weight, bias, stride, padding = _case((1, 64, 7, 7, 96, 3, 3, (1, 1), (1, 1)), seed=7)
    packed = cpu_conv.pack_conv_weight(weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        y = torch.ops.kiln.conv_gemm(x, packed, bias, None, 96, [3, 3], stride, padding, False)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(y, F.conv2d(x.double(), weight.double(), bias.double(), stride, padding).float(),
                               rtol=1.3e-5, atol=1.5e-5)


def test_bad_input_names_what_was_expected():
    x, weight, bias, stride, padding = _case((1, 4, 6, 6, 8, 3, 3, (1, 1), (0, 0)), seed=1)
    packed = cpu_conv.pack_conv_weight(weight)
    with pytest.raises(ValueError, match="4-D fp32 CPU input"):
        cpu_conv.conv_gemm_impl(x.double(), packed, bias, None, 8, [3, 3], stride, padding, False, True)
    with pytest.raises(ValueError, match="residual"):
        cpu_conv.conv_gemm_impl(x, packed, bias, torch.zeros(1, 8, 5, 5), 8, [3, 3], stride, padding, False, True)


class _DownBlock(nn.Module):
    """ResNet's downsampling block: strided 3x3 and 1x1 convolutions, BN, residual add, ReLU."""

    def __init__(self, cin: int = 32, cout: int = 64):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, 2, bias=False), nn.BatchNorm2d(cout))
        for bn in (self.bn1, self.bn2, self.down[1]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


def test_pass_offers_the_direct_kernel_for_few_input_channels(candidate_recorder):
    """A first layer (3 channels) may run pack-free; the candidates agree, and a graph runs it with its ReLU."""
    recorder = candidate_recorder("onednn")
    winograd.choose(recorder, (1, 3, 30, 30), (16, 3, 7, 7), [2, 2], [3, 3], "relu")
    (calls,) = recorder.candidates.values()
    assert {"onednn", "gemm", "direct"} <= set(calls), list(calls)
    results = {name: fn() for name, fn in calls.items()}
    for name, y in results.items():
        torch.testing.assert_close(y, results["onednn"], rtol=1e-4, atol=1e-4, msg=name)
    recorder = candidate_recorder("onednn")
    winograd.choose(recorder, (1, 16, 30, 30), (16, 16, 3, 3), [2, 2], [1, 1], "relu")
    assert "direct" not in list(recorder.candidates.values())[0]  # (16 channels: the packed GEMM's case)

    stem = nn.Sequential(nn.Conv2d(3, 24, 7, 2, 3), nn.ReLU()).eval()
    x = torch.randn(2, 3, 64, 64)
    position = mark()
    with torch.inference_mode():
        compiled = kiln.compile(stem, fallback=False, choices="conv=direct")
        torch.testing.assert_close(compiled(x), stem(x), rtol=1e-4, atol=1e-5)
    notes = " ".join(note for p in reports_since(position)[-1].passes if p.name == "winograd" for note in p.notes)
    assert "convolution -> kiln direct (few channels): 1" in notes and "relu -> implicit-GEMM epilogue: 1" in notes, \
        notes


def test_pass_runs_a_downsampling_block_with_its_epilogues():
    model = _DownBlock().eval()
    x = torch.randn(2, 32, 48, 48)  # every convolution above the pass's MIN_FLOPS
    position = mark()
    with torch.inference_mode():
        out = kiln.compile(model, fallback=False, choices="conv=gemm")(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert out.is_contiguous()
    report = reports_since(position)[-1]
    assert report.externs == ["conv_gemm"] * 3, report.externs
    notes = " ".join(note for p in report.passes if p.name == "winograd" for note in p.notes)
    assert "relu -> implicit-GEMM epilogue: 2" in notes and "residual add -> implicit-GEMM epilogue: 1" in notes, \
        notes
    assert not report.kernels  # BN folded, the add and both ReLUs in epilogues


def test_the_avx2_build_matches(tmp_path):
    """The library as an AVX2 machine compiles it (16-column panels, 6-row tiles): the 1x1 paths (input read in
    place, with an input ReLU6; tile epilogue) and the packed 3x3, built here with AVX-512 off and called with the
    arguments the binder gives the native build."""
    import ctypes
    from kiln import config
    from kiln.runtime import native
    from kiln.runtime.build import load_module
    from kiln.library.conv.source_gemm import conv_gemm_source
    with config.scope(cache_dir=str(tmp_path)):
        avx2 = load_module(conv_gemm_source(), name="kiln_conv_gemm_avx2", extra_flags=("-mno-avx512f",)).lib
    assert avx2.kiln_gemm_nr() == 16
    gen = torch.Generator().manual_seed(11)
    op = torch.ops.kiln.conv_gemm.default
    for c, k, kernel, padding in ((24, 40, 1, 0), (12, 20, 3, 1)):
        x = torch.randn(1, c, 9, 7, generator=gen).contiguous(memory_format=torch.channels_last)
        x[0, 2, 4, 4] = float("nan")
        weight = torch.randn(k, c, kernel, kernel, generator=gen) / c ** 0.5
        bias = torch.randn(k, generator=gen)
        residual = torch.randn(1, k, 9, 7, generator=gen).contiguous(memory_format=torch.channels_last)
        # the native build's packing: 32-column panels here, so pack with the AVX2 library's own
        taps = weight.permute(0, 2, 3, 1).contiguous()
        kg = taps[0].numel()
        packed = torch.empty(-(-k // 16) * 16 * kg)
        avx2.kiln_pack_b(ctypes.c_void_p(taps.data_ptr()), ctypes.c_int64(kg), ctypes.c_int64(k), ctypes.c_int64(1),
                         ctypes.c_int64(kg), ctypes.c_void_p(packed.data_ptr()))
        out = torch.empty(1, k, 9, 7).contiguous(memory_format=torch.channels_last)
        args = native.op_args(op, x, packed, bias, residual, k, kernel=[kernel, kernel], stride=[1, 1],
                              padding=[padding, padding], relu=True, channels_last=True, relu_input=True,
                              relu_max=6.0, relu_input_max=6.0)
        fn, values = native._prepare(op, args, out)
        ctypes.CFUNCTYPE(None, *fn._argtypes_)(ctypes.cast(avx2.kiln_conv_gemm, ctypes.c_void_p).value)(*values)
        ref = torch.clamp(F.conv2d(torch.clamp(x.double(), 0, 6), weight.double(), bias.double(), 1, padding)
                          + residual.double(), 0, 6)
        torch.testing.assert_close(out, ref.float(), rtol=1.3e-5, atol=1.5e-5, equal_nan=True)
