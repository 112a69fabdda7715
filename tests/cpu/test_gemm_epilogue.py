"""A linear layer's gelu in the GEMM call (library/gemm/epilogue.py), against eager on fresh random inputs."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.library.gemm import select as select_gemm
from kiln.report import mark, reports_since
from kiln.library.gemm import op as cpu_gemm


def _compile_and_check(fn, x, choice):
    position = mark()
    with torch.inference_mode():
        out = kiln.compile(fn, fallback=False, choices=f"gemm={choice}")(x)
        torch.testing.assert_close(out, fn(x), rtol=1.3e-5, atol=1.5e-5)
    report = reports_since(position)[-1]
    notes = " ".join(note for p in report.passes if p.name == "gemm_epilogue" for note in p.notes)
    return report, notes


@pytest.mark.parametrize("choice", ["kiln", "onednn"])
def test_gelu_after_linear_runs_in_the_gemm(choice):
    if choice == "kiln" and not cpu_gemm.available() or choice == "onednn" and not select_gemm.onednn_available():
        pytest.skip(f"{choice} GEMM not available here")
    mlp = nn.Sequential(nn.Linear(256, 520), nn.GELU(), nn.Linear(520, 64)).eval()  # above select_gemm's MIN_FLOPS
    report, notes = _compile_and_check(mlp, torch.randn(40, 256) * 2, choice)
    assert f"gelu -> {choice} GEMM epilogue: 1" in notes, notes
    assert not report.kernels, [k.name for k in report.kernels]  # nothing left for a generated kernel


@pytest.mark.parametrize("choice", ["kiln", "onednn"])
def test_gelu_after_a_linear_on_3d_activations(choice):
    """A transformer's MLP: the linear runs on [B*T, C] and its result is viewed as [B, T, N] before the gelu."""
    if choice == "kiln" and not cpu_gemm.available() or choice == "onednn" and not select_gemm.onednn_available():
        pytest.skip(f"{choice} GEMM not available here")
    mlp = nn.Sequential(nn.Linear(96, 520), nn.GELU(), nn.Linear(520, 96)).eval()
    report, notes = _compile_and_check(mlp, torch.randn(2, 40, 96) * 2, choice)
    assert f"gelu -> {choice} GEMM epilogue: 1" in notes, notes
    assert not any(n.op.name == "GELU" for k in report.kernels for n in k.nodes), [k.name for k in report.kernels]


@pytest.mark.skipif(not cpu_gemm.available(), reason="kiln's CPU GEMM does not build here")
def test_epilogue_matches_the_generated_gelu_kernel():
    """kiln's epilogue evaluates the generated kernel's expression: both agree to rounding, NaN kept."""
    gen = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(70, 130, generator=gen) * 3, torch.randn(90, 130, generator=gen), torch.randn(90)
    x[3, 7] = float("nan")
    packed = cpu_gemm.pack_weight(w)
    fused = torch.ops.kiln.linear_packed(x, packed, b, 90, 0, 0, 0, True)
    plain = torch.ops.kiln.linear_packed(x, packed, b, 90)
    with torch.inference_mode():
        expected = kiln.compile(lambda t: F.gelu(t), fallback=False)(plain)
    torch.testing.assert_close(fused, expected, rtol=2.4e-7, atol=1e-30, equal_nan=True)
    assert torch.isnan(fused[3]).all() and not torch.isnan(fused[4]).any()


@pytest.mark.skipif(not cpu_gemm.available(), reason="kiln's CPU GEMM does not build here")
def test_not_fused_when_the_linear_result_is_used_again_or_the_gelu_is_tanh():
    lin = nn.Linear(256, 512)

    def both(x):
        y = lin(x)
        return F.gelu(y), y.sum(0)

    report, notes = _compile_and_check(both, torch.randn(32, 256), "kiln")
    assert "gelu ->" not in notes and report.externs == ["linear_packed"], report.externs
    report, notes = _compile_and_check(lambda x: F.gelu(lin(x), approximate="tanh"), torch.randn(32, 256), "kiln")
    assert "gelu ->" not in notes


def test_gelu_vanishes_for_very_negative_inputs():
    """Phi(x) is taken as exactly 0 below -4 sqrt 2, so x * Phi(x) leaves no -x * eps behind for huge negative x
    (an approximation's residue of 1e-8 would be 1e30 at x = -1e38), and NaN and infinities come out as ATen's."""
    x = torch.tensor([-1e38, -1e30, -1e6, -40.0, -13.5, -6.0, -5.66, -5.0, -0.5, -0.0, 0.0, 0.5, 3.0, 5.66, 6.0,
                      1e30, float("nan"), float("-inf")])
    with torch.inference_mode():
        got = kiln.compile(lambda t: F.gelu(t), fallback=False)(x)
    assert (got[:6] == 0).all() and got[:6].signbit().all(), got
    assert got[9].signbit() and not got[10].signbit()
    torch.testing.assert_close(got, F.gelu(x.double()).float(), rtol=1.3e-5, atol=1.5e-5, equal_nan=True)


@pytest.mark.skipif(not cpu_gemm.available(), reason="kiln's CPU GEMM does not build here")
def test_gemm_results_live_in_the_arena():
    """kiln::linear_packed.out writes into the planned buffer, so intermediate GEMM results are not new tensors
    each call (as aten.mm's are not); the graph's output is still its own tensor."""
    mlp = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 64)).eval()
    x = torch.randn(32, 256)
    position = mark()
    with torch.inference_mode():
        compiled = kiln.compile(mlp, fallback=False, choices="gemm=kiln")
        first = compiled(x)
        torch.testing.assert_close(first, mlp(x), rtol=1.3e-5, atol=1.5e-5)
        second = compiled(x * 2)
        torch.testing.assert_close(second, mlp(x * 2), rtol=1.3e-5, atol=1.5e-5)
        torch.testing.assert_close(first, mlp(x), rtol=1.3e-5, atol=1.5e-5)  # not overwritten by the second call
    gemms = [line for line in reports_since(position)[-1].plan.splitlines() if "linear_packed" in line]
    # the two inner GEMMs write the arena; the last one writes the graph's output
    assert ["arena @" in line for line in gemms] == [True, True, False], gemms
    assert "graph output" in gemms[-1], gemms
    with pytest.raises(ValueError, match="unit column stride"):
        torch.ops.kiln.linear_packed.out(x, cpu_gemm.pack_weight(torch.randn(8, 256)), None, 8,
                                         out=torch.empty(8, 32).t())
