"""Native calls (runtime/native.py): kiln's library ops called from the generated C++ give eager's results, in every
place such a call can sit - after a kernel, on a graph input, on a view, after a Python extern, before the graph's
output - and a call the binder cannot address stays a Python extern."""
import itertools

import pytest
import torch
import torch.nn as nn

import kiln
from kiln import config
from kiln.library.conv import select as winograd
from kiln.report import mark, reports_since
from kiln.library.conv import op as cpu_conv
from kiln.library.gemm import op as cpu_gemm
from test_winograd import _Block as _WinogradBlock  # (pytest puts this folder on sys.path)

pytestmark = pytest.mark.skipif(not (cpu_gemm.available() and cpu_conv.gemm_available()),
                                reason="kiln's CPU GEMM does not build here")


@pytest.fixture(autouse=True)
def _kiln_gemm_for_every_linear():
    with config.scope(choices="gemm=kiln"):  # (forced: also the linears too small to measure)
        yield


def _compile_report(model, *inputs, **options):
    position = mark()
    with torch.inference_mode():
        out = kiln.compile(model, fallback=False, **options)(*inputs)
        torch.testing.assert_close(out, model(*inputs), rtol=1e-4, atol=1e-4)
    return reports_since(position)[-1]


class _MLP(nn.Module):
    """linear-gelu-linear on [B, T, D] activations (the linears read views), then a LayerNorm (the output)."""

    def __init__(self, d: int = 48, h: int = 96):
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(d, h), nn.Linear(h, d), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def test_linears_are_called_from_cpp():
    report = _compile_report(_MLP().eval(), torch.randn(2, 7, 48))
    assert report.externs == ["linear_packed"] * 2, [(p.name, p.notes) for p in report.passes][5:9]
    assert report.native_externs == ["linear_packed"] * 2, report.native_externs
    assert "kiln_native_fn[0]" in report.source and "kiln_native_fn[1]" in report.source
    assert "called from the generated C++" in report.format(source=False)


def test_graph_output_is_written_into_the_callers_tensor():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)).eval()
    report = _compile_report(model, torch.randn(5, 32))
    # the first linear writes the arena, the last one the tensor the caller gets (new or recycled per call)
    assert report.native_externs == ["linear_packed", "linear_packed"], report.native_externs


@pytest.mark.parametrize("library", ["kiln", "aten"])
def test_results_outlive_the_next_call(library):
    """The last linear's result reaches the caller as a view ([B*T, N] -> [B, T, N]): it must not be written into
    the arena, where the next call would overwrite it (addmm's ``.out`` into the arena once did that), and a
    recycled output tensor must be one the caller dropped."""
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)).eval()
    x1, x2 = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    with torch.inference_mode():
        compiled = kiln.compile(model, fallback=False, choices=f"gemm={library}")
        first = compiled(x1)
        for _ in range(3):  # (outputs nobody holds are recycled)
            second = compiled(x2)
        torch.testing.assert_close(first, model(x1), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(second, model(x2), rtol=1e-4, atol=1e-5)


def test_thread_count_changes_after_compile():
    model, x = _MLP(64, 160).eval(), torch.randn(3, 40, 64)
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            compiled = kiln.compile(model, fallback=False)
            for n in (1, 2, 1):
                torch.set_num_threads(n)
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(threads)


class _Block(_WinogradBlock):
    """test_winograd's ResNet block, then a pointwise op (so its second convolution is not the graph's output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 0.5


@pytest.mark.parametrize("choices", [("winograd2", "winograd4"), ("onednn", "winograd2"), ("gemm", "direct")])
def test_convolutions_after_kernels_and_python_externs(monkeypatch, choices):
    """The second convolution reads the first one's result: an arena buffer (native), or oneDNN's tensor (a
    Python extern), and the block's input as its residual."""
    picks = itertools.cycle(choices)
    # (patched: Config.choices forces one answer for every convolution, this test needs one per convolution)
    monkeypatch.setattr(winograd, "choose", lambda *a, **k: next(picks))
    channels = 6 if "direct" in choices else 16  # the direct kernel takes few input channels
    size = (80, 64) if "direct" in choices else (48, 40)  # (both convolutions big enough to be chosen for)
    report = _compile_report(_Block(channels).eval(), torch.randn(2, channels, *size))
    kiln_convs = [c for c in choices if c != "onednn"]
    assert len(report.native_externs) == len(kiln_convs), (report.externs, report.native_externs)


def test_depthwise_convolution_is_called_from_cpp():
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2,
                                                                                       padding=1, groups=8)).eval()
    report = _compile_report(nn.Sequential(model, nn.Flatten(), nn.Softplus()).eval(), torch.randn(2, 8, 9, 9),
                             choices="gemm=kiln,conv=dw")
    assert "conv_dw" in report.native_externs, (report.externs, report.native_externs)


def test_switched_off_every_call_goes_through_python():
    model, x = _MLP().eval(), torch.randn(2, 7, 48)
    position = mark()
    with torch.inference_mode():
        out = kiln.compile(model, fallback=False, native_calls=False)(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    report = reports_since(position)[-1]
    assert report.externs == ["linear_packed"] * 2 and not report.native_externs, report.native_externs
    assert "kiln_native_fn[0]" not in report.source


def test_python_path_calls_through_the_binder():
    """The ops' Python implementations call their C function through the same binder as the generated code, so
    the argument list lives in one place: a non-contiguous bias is made contiguous first (it used to be read as
    if it were), and an argument the library cannot take is a clear error, not a wrong pointer."""
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(5, 24, generator=gen), torch.randn(40, 24, generator=gen)
    bias = torch.randn(80, generator=gen)[::2]
    packed = cpu_gemm.pack_weight(w)
    out = torch.ops.kiln.linear_packed(x, packed, bias, 40)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, bias), rtol=1.3e-5, atol=1.5e-5)
    with pytest.raises(ValueError, match="linear_packed.*bias"):
        torch.ops.kiln.linear_packed(x, packed, bias.double(), 40)
    xc = torch.randn(1, 8, 10, 10, generator=gen)
    wc = torch.randn(16, 8, 3, 3, generator=gen)
    bc = torch.randn(32, generator=gen)[::2]
    y = torch.ops.kiln.conv_gemm(xc, cpu_conv.pack_conv_weight(wc), bc, None, 16, [3, 3], [2, 2], [1, 1], False)
    torch.testing.assert_close(y, torch.nn.functional.conv2d(xc, wc, bc, 2, 1), rtol=1e-4, atol=1e-4)
