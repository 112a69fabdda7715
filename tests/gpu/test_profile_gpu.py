"""kiln.profile on the Triton target: each step of the interpreted program timed (the generated wrapper and
CUDA-graph replay are bypassed while profiling), with results unchanged."""
import torch

import kiln
from kiln.runtime import peaks, profiling
from tests.gpu.conftest import DEVICE, HAS_CUDA
from tests.gpu.test_wrapper import Net


def test_profile_times_every_step(monkeypatch):
    if not HAS_CUDA:  # (the interpreter's CPU run: the probes' figures do not matter)
        monkeypatch.setattr(peaks, "cpu", lambda threads: peaks.Peaks(1e11, 2e10, "test peaks"))
    model = Net().to(DEVICE).eval()
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    for mode in ("default", "reduce-overhead") if HAS_CUDA else ("default",):
        fast = kiln.compile(model, target="triton", fallback=False, fullgraph=True, mode=mode)
        with torch.inference_mode():
            want = [fast(x) for _ in range(3)][-1]
            with kiln.Profile() as prof:
                got = fast(x)
                got2 = fast(x)
        for a, b, c in zip(got, got2, want):
            torch.testing.assert_close(a, c, rtol=0, atol=0)
            torch.testing.assert_close(b, c, rtol=0, atol=0)
        steps = sorted(prof.steps.values(), key=lambda s: s.index)
        assert [s.index for s in steps] == list(range(len(steps)))
        assert {"kernel", "extern"} <= {s.kind for s in steps}
        assert all(len(s.seconds) == 2 and min(s.seconds) > 0 for s in steps)
        assert any(s.flops > 0 for s in steps if s.kind == "extern")  # the convolution and the linear
        assert "of limit" in prof.format() and profiling.current() is None
