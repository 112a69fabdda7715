"""The same model in a new process loads its module from the disk cache: no compiler runs."""
import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, torch, kiln
    from kiln.runtime.build import build_stats
    from kiln.report import reports
    from benchmarks.models import MODELS
    model, inputs = MODELS["seed"](size=20)
    with torch.inference_mode():
        out = kiln.compile(model, fallback=False)(*inputs)
        torch.testing.assert_close(out, model(*inputs), rtol=1e-4, atol=1e-4)
    print(json.dumps({"compiles": build_stats.compiles, "from_cache": reports()[-1].from_cache}))
""")


def _run(cache_dir: str) -> dict:
    env = dict(os.environ, KILN_CACHE_DIR=cache_dir)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_compiles_nothing(tmp_path):
    first = _run(str(tmp_path))
    second = _run(str(tmp_path))
    # the first process may build both layout plans of the seed model (choose.py) to measure them, and kiln's
    # Winograd and implicit-GEMM convolution libraries (measured against oneDNN for the convolutions)
    assert first["compiles"] in (1, 2, 3, 4) and first["from_cache"] is False
    assert second == {"compiles": 0, "from_cache": True}
