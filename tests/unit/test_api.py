"""The public API: kiln.compile's argument checking, the torch.compile entry point, gradients, output
structure, kiln.explain and recompilation on new shapes."""
import importlib.metadata
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten

import kiln
from kiln.config import Config
from kiln.frontend import dynamo as kiln_dynamo
from kiln.report import mark, reports_since


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


# --------------------------------------------------------------------------------------- argument checking

def test_unknown_option_lists_accepted_ones():
    with pytest.raises(ValueError) as info:
        kiln.compile(_model(), chek=True)
    msg = str(info.value)
    assert "chek" in msg
    for name in Config.option_names():
        assert name in msg
    assert "check" in Config.option_names() and "fusion" in Config.option_names()


def test_known_options_are_accepted_without_compiling():
    position = mark()
    fn = kiln.compile(_model(), check=True, fusion=False, verbose=False)
    assert callable(fn)
    assert reports_since(position) == []  # compilation happens at the first call


def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match=r"unknown mode 'fastest'.*accepted modes are .*'default'.*'max-autotune'"):
        kiln.compile(_model(), mode="fastest")
    for mode in ("default", "reduce-overhead", "max-autotune"):
        assert callable(kiln.compile(_model(), mode=mode))


def test_bad_target_is_rejected():
    accepted = r"accepted targets are \['auto', 'cpu', 'cuda', 'triton'\]"
    with pytest.raises(ValueError, match=r"unknown target 'tpu'.*" + accepted):
        kiln.compile(_model(), target="tpu")
    assert callable(kiln.compile(_model(), target="cpu"))


@pytest.mark.parametrize("bad", [42, "model", None, [nn.Linear(2, 2)]])
def test_non_callable_is_rejected(bad):
    with pytest.raises(TypeError, match="expects an nn.Module or a function"):
        kiln.compile(bad)


def test_backend_rejects_bad_mode_and_options_directly():
    with pytest.raises(ValueError, match="unknown mode"):
        kiln_dynamo.check_mode("turbo")
    assert kiln_dynamo.check_mode(None) == "default"


# ------------------------------------------------------------------------------------ torch.compile entry

_ENTRY_POINT_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    assert "kiln" not in sys.modules, "kiln imported by torch itself"
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    f = torch.compile(m, backend="kiln", options={"check": True, "fallback": False})

    # kiln was loaded through the entry point; spy on the pass checker to see the option arrive
    import kiln.passes.check as chk
    seen = []
    original = chk.Checker.check
    def spy(self, name, graph):
        seen.append(name)
        return original(self, name, graph)
    chk.Checker.check = spy
    from kiln.report import mark, reports_since
    position = mark()
    with torch.inference_mode():
        got, want = f(x), m(x)
    torch.testing.assert_close(got, want)
    reports = reports_since(position)
    assert len(reports) == 1 and reports[0].fallback is None, [r.fallback for r in reports]
    assert seen and seen[0] == "dce", seen

    # unknown options given to torch.compile reach kiln's validation
    torch._dynamo.reset()
    bad = torch.compile(m, backend="kiln", options={"no_such_option": 1})
    try:
        with torch.inference_mode():
            bad(x)
    except Exception as exc:
        assert "no_such_option" in str(exc) and "accepted options" in str(exc), str(exc)
    else:
        raise AssertionError("unknown option accepted")
    print("ENTRY-POINT-OK", len(seen))
""")


def test_torch_compile_backend_entry_point_without_importing_kiln():
    names = {e.name for e in importlib.metadata.entry_points(group="torch_dynamo_backends")}
    if "kiln" not in names:
        pytest.skip("kiln is not installed (pip install -e . --no-deps registers the torch_dynamo_backends entry)")
    env = dict(os.environ)
    env.pop("KILN_CHECK", None)
    proc = subprocess.run([sys.executable, "-c", _ENTRY_POINT_SCRIPT], capture_output=True, text=True, env=env,
                          cwd="/", timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ENTRY-POINT-OK" in proc.stdout


# ----------------------------------------------------------------------------------------------- gradients

def test_a_call_that_needs_gradients_compiles_its_forward_and_backward():
    """[Note: training graphs]: no warning, no eager fallback; outputs and gradients as eager's."""
    model = _model()
    assert all(p.requires_grad for p in model.parameters())
    x = torch.randn(5, 8)
    compiled = kiln.compile(model)
    position = mark()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.is_grad_enabled()
        got = compiled(x)
        got2 = compiled(x * 2)
        got3 = compiled(torch.randn(7, 8))   # a new shape recompiles
        got.sum().backward()
    assert not [w for w in caught if "kiln" in str(w.message)], [str(w.message) for w in caught]
    want = model(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got2, model(x * 2))
    assert got3.shape == (7, 4)
    assert got.requires_grad
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want.sum().backward()
    for g, w in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(g, w)
    reports = reports_since(position)
    assert all(r.fallback is None for r in reports), [r.fallback for r in reports]
    assert {"forward", "backward"} <= {r.training.split(";")[0] for r in reports}


# -------------------------------------------------------------------------------------- output structures

def test_output_structure_matches_eager():
    def fn(x, y):
        s = torch.sin(x) * y
        return (s + 1, [x.exp(), {"max": s.amax(-1), "t": (y.t(), x - y)}], {"sum": s.sum(), "neg": -y})

    x, y = torch.randn(4, 6), torch.randn(4, 6)
    position = mark()
    with torch.inference_mode():
        want = fn(x, y)
        got = kiln.compile(fn, fallback=False)(x, y)
    assert len(reports_since(position)) == 1
    got_leaves, got_spec = tree_flatten(got)
    want_leaves, want_spec = tree_flatten(want)
    assert got_spec == want_spec
    assert type(got) is tuple and type(got[1]) is list and type(got[2]) is dict
    for g, w in zip(got_leaves, want_leaves):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w)


# ---------------------------------------------------------------------------------------------- explain

def test_explain_reports_ir_kernels_and_cpp(capsys):
    model = _model().eval()
    x = torch.randn(3, 8)
    text = kiln.explain(model, x)
    assert "graph IR after capture" in text
    assert "generated kernels" in text
    assert "generated C++" in text
    assert "graph IR after the passes" in text
    assert "fell back to eager" not in text
    assert text in capsys.readouterr().out


def test_explain_prints_the_program_step_by_step():
    """Every step of the Program in order: kernels with the buffers they read and write, library calls with their
    operands (a view named by the buffer it views), and where each buffer a step writes lives (arena offset or a
    per-call tensor) with its size."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    text = kiln.explain(model, torch.randn(3, 8))
    plan = text.split("--- program: ")[1].split("\n\n")[0].splitlines()
    assert plan[0].startswith(f"{len(plan) - 1} steps in order")
    steps = [line.split()[1] for line in plan[1:]]
    assert steps.count("kernel") >= 1 and steps.count("extern") == 2, plan
    assert all(line.split()[0] == str(k) for k, line in enumerate(plan[1:])), plan
    assert "view(buf" in text and "writes buf" in text
    assert "arena @0, " in text and "per call (graph output), 48 B" in plan[-1], plan


# ----------------------------------------------------------------------------------------- recompilation

def test_new_input_shape_gives_correct_results():
    model = _model().eval()
    compiled = kiln.compile(model, fallback=False)
    with torch.inference_mode():
        for batch in (3, 5):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        x = torch.randn(2, 3, 8)   # a different rank
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_in_place_update_of_an_input_is_kept():
    import torch

    import kiln

    def f(x, buf):
        buf.add_(1)
        return x * 2

    x, buf = torch.randn(4), torch.zeros(3) + 5
    with torch.inference_mode():
        out = kiln.compile(f)(x, buf)
    torch.testing.assert_close(out, x * 2)
    torch.testing.assert_close(buf, torch.full((3,), 6.0))


# ----------------------------------------------------------------------------------------------- naming, CLI

def test_graphs_are_named_after_the_model_or_function():
    """Reports name the compiled model's class or function; a graph torch.compile hands over is named after the
    traced function and where it is."""
    from kiln.report import mark, reports_since

    def scale_sin(x):
        return x.sin() * 2

    position = mark()
    with torch.inference_mode():
        kiln.compile(_model().eval())(torch.randn(3, 8))
        kiln.compile(scale_sin)(torch.randn(3, 8))
        torch._dynamo.reset()
        torch.compile(scale_sin, backend="kiln")(torch.randn(4, 5))
    names = [r.name for r in reports_since(position)]
    assert names[0] == type(_model()).__name__ and names[1].endswith("scale_sin"), names
    assert names[2].startswith("scale_sin (test_api.py:"), names


def test_cli_version_and_factories_beside_the_caller(tmp_path, monkeypatch, capsys):
    """``kiln --version``; ``kiln bisect module:fn`` finds a module in the current directory (as ``python -m``
    does) and ``path/script.py:fn`` a script anywhere."""
    from kiln import cli
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"kiln {kiln.__version__}"
    (tmp_path / "beside_me.py").write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.nn.Linear(4, 3).eval(), torch.randn(2, 4)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    model, inputs = cli._factory("beside_me:make")
    assert isinstance(model, torch.nn.Linear) and len(inputs) == 1
    model, inputs = cli._factory(str(tmp_path / "beside_me.py") + ":make")
    assert isinstance(model, torch.nn.Linear)
    with pytest.raises(SystemExit, match="no file"):
        cli._factory(str(tmp_path / "missing.py") + ":make")


def test_max_autotune_shows_its_progress_from_the_start(capsys):
    """max-autotune says at once what it is doing (capture and the passes take seconds before any kernel is
    tuned) and when it is done; ``tune_progress=False`` keeps stderr quiet.  (Budget 0: nothing is measured.)"""
    from kiln.tune import progress
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    with torch.inference_mode():
        kiln.compile(model, mode="max-autotune", tune_budget_s=0)(torch.randn(2, 8))
    err = capsys.readouterr().err
    assert "kiln max-autotune: graph 'Sequential': capturing and optimizing" in err, err
    assert "done in" in err
    with kiln.config.scope(tune_progress=False):
        progress.begin("graph 'quiet'")
        progress.update(1, 2, None, 0.0)
        progress.end()
    assert "kiln max-autotune" not in capsys.readouterr().err
