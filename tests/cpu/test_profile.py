"""kiln.profile: every step of a compiled graph is timed - the generated kernels and the library calls made from
C++ one by one - with its work (FLOPs, bytes) and the machine's limit for it."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln.runtime import peaks, profiling
from kiln.library.gemm import op as cpu_gemm


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 256), nn.Linear(256, 32)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.relu(self.fc1(x)) * 2.0), dim=-1)


@pytest.fixture(autouse=True)
def _cheap_peaks(monkeypatch):
    # the probes take a second; their figures do not matter here
    monkeypatch.setattr(peaks, "cpu", lambda threads: peaks.Peaks(1e11, 2e10, "test peaks"))


def test_every_step_is_timed_with_its_work(capsys):
    model = _Net().eval()
    x = torch.randn(16, 64)
    prof = kiln.profile(model, x, calls=4, fallback=False, choices="gemm=kiln" if cpu_gemm.available() else "")
    assert "kiln profile" in capsys.readouterr().out
    steps = sorted(prof.steps.values(), key=lambda s: s.index)
    assert steps and all(len(s.seconds) == 4 and all(t >= 0 for t in s.seconds) for s in steps)
    assert [s.index for s in steps] == list(range(len(steps)))
    kinds = {s.kind for s in steps}
    assert "kernel" in kinds
    matmuls = [s for s in steps if "linear" in s.name or "addmm" in s.name or "mm" in s.name]
    assert sorted(s.flops for s in matmuls) == [2 * 16 * 256 * 32, 2 * 16 * 64 * 256]
    if cpu_gemm.available():  # called from the generated C++, yet timed on its own
        assert {s.kind for s in matmuls} == {"native"}
    # the steps' times add up to (at most) the call's
    (call_times,) = prof.calls.values()
    assert sum(s.median_s for s in steps) <= 1.5 * max(call_times)
    table = prof.format()
    assert "of limit" in table and "test peaks" in table and steps[0].name[:20] in table


def test_a_profile_outside_calls_changes_nothing():
    model = _Net().eval()
    x = torch.randn(4, 64)
    fast = kiln.compile(model)
    with torch.inference_mode():
        want = fast(x)
        with kiln.Profile() as prof:
            got = fast(x)
        after = fast(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(after, want, rtol=0, atol=0)
    assert prof.steps and profiling.current() is None
    assert "no compiled graph ran" in kiln.Profile().format()


def test_library_flops():
    f = profiling.library_flops
    assert f("mm", {"self": torch.empty(8, 5), "mat2": torch.empty(5, 3)}, (8, 3)) == 2 * 8 * 5 * 3
    assert f("addmm", {"self": torch.empty(3), "mat1": torch.empty(8, 5), "mat2": torch.empty(5, 3)},
             (8, 3)) == 2 * 8 * 5 * 3
    assert f("convolution", {"input": torch.empty(1, 4, 9, 9), "weight": torch.empty(6, 2, 3, 3)},
             (1, 6, 7, 7)) == 2 * 6 * 49 * 2 * 9
    assert f("convolution", {"input": torch.empty(1, 80, 30), "weight": torch.empty(16, 80, 3)},
             (1, 16, 28)) == 2 * 16 * 28 * 80 * 3  # (1-D: Whisper's stem; it read 0 FLOPs before)
    assert f("convolution", {"input": torch.empty(1, 2, 5, 5, 5), "weight": torch.empty(4, 2, 3, 3, 3)},
             (1, 4, 3, 3, 3)) == 2 * 4 * 27 * 2 * 27
    assert f("conv_gemm", {"x": torch.empty(1, 4, 9, 9), "kernel": [3, 3]}, (1, 6, 7, 7)) == 2 * 6 * 49 * 4 * 9
    assert f("attention", {"q": torch.empty(1, 2, 8, 4), "k": torch.empty(1, 2, 8, 4), "causal": True},
             (1, 2, 8, 4)) == 4 * 2 * 8 * 8 * 4 / 2
    assert f("relu", {"self": torch.empty(3)}, (3,)) == 0


def test_peaks_bound_the_time():
    p = peaks.Peaks(flops_per_s=1e9, bytes_per_s=1e9, what="")
    assert p.limit_s(2e9, 1e9) == 2.0 and p.limit_s(1e9, 3e9) == 3.0
