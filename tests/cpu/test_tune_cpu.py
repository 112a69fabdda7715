"""max-autotune on the CPU: kernel schedules measured once, stored, and reused (kiln/tune/cpu.py)."""
import torch

import kiln
from kiln.report import mark, reports_since
from kiln.tune.db import TuningDB


def _model(a, b):
    x = torch.sigmoid(a) * torch.tanh(b)
    return x - x.mean(-1, keepdim=True)


def test_max_autotune_measures_once_then_reuses():
    a, b = torch.randn(64, 512), torch.randn(64, 512)
    position = mark()
    with torch.inference_mode():
        out = kiln.compile(_model, mode="max-autotune", fallback=False)(a, b)
    torch.testing.assert_close(out, _model(a, b), rtol=1.3e-5, atol=1.5e-5)
    (report,) = reports_since(position)
    first = report.tuning
    assert first.measured >= 4, "each kernel's candidates should have been measured"
    # through the choice service, and in the report (kiln.explain's "tuned schedules")
    assert report.schedules and {m.how for m in report.schedules} == {"measured"}, report.schedules
    assert "--- tuned schedules" in report.format()
    assert len(TuningDB.open().records()) >= 1
    torch._dynamo.reset()
    position = mark()
    with torch.inference_mode():
        again = kiln.compile(_model, mode="max-autotune", fallback=False)(a, b)   # a second compile ...
        plain = kiln.compile(_model, fallback=False)(a, b)                        # ... and default mode
    torch.testing.assert_close(again, out)
    torch.testing.assert_close(plain, out)
    later = [r.tuning for r in reports_since(position)]
    assert [t.measured for t in later] == [0, 0]   # ... measure nothing
    assert all(t.from_database >= 1 for t in later)
    assert all({m.how for m in r.schedules} == {"stored"} for r in reports_since(position))


def small_model():
    """A factory for ``kiln tune`` (module:function -> (model, inputs))."""
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)).eval(), \
        (torch.randn(16, 64),)


def test_kiln_tune_command_reports_progress(tmp_path):
    import os
    import subprocess
    import sys
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-m", "kiln", "tune", "tests.cpu.test_tune_cpu:small_model", "--budget", "120"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "kernels" in first.stderr and "measured" in first.stdout
    assert "measured 0" not in first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert "measured 0 candidate(s)" in second.stdout, second.stdout   # resumed from the database
