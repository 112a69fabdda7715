"""max-autotune on the CPU: kernel schedules measured once, stored, and reused (kiln/tune/cpu.py)."""
import torch

import kiln
from kiln.tune import cpu as tune_cpu
from kiln.tune.db import TuningDB


def _model(a, b):
    x = torch.sigmoid(a) * torch.tanh(b)
    return x - x.mean(-1, keepdim=True)


def test_max_autotune_measures_once_then_reuses():
    a, b = torch.randn(64, 512), torch.randn(64, 512)
    before = tune_cpu.stats.measured
    with torch.inference_mode():
        out = kiln.compile(_model, mode="max-autotune", fallback=False)(a, b)
    torch.testing.assert_close(out, _model(a, b), rtol=1.3e-5, atol=1.5e-5)
    measured = tune_cpu.stats.measured - before
    assert measured >= 4, "each kernel's candidates should have been measured"
    assert len(TuningDB.open().records()) >= 1
    torch._dynamo.reset()
    reused = tune_cpu.stats.from_database
    with torch.inference_mode():
        again = kiln.compile(_model, mode="max-autotune", fallback=False)(a, b)   # a second compile ...
        plain = kiln.compile(_model, fallback=False)(a, b)                        # ... and default mode
    torch.testing.assert_close(again, out)
    torch.testing.assert_close(plain, out)
    assert tune_cpu.stats.measured - before == measured   # ... measure nothing
    assert tune_cpu.stats.from_database > reused
