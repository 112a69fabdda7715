"""kiln's errors for bad input: option values and KILN_* variables checked against each knob's type and values,
targets that cannot run here, and calls with inputs the model cannot take (the model's own error, not
TorchDynamo's tracing report; kiln's error naming the argument where kiln itself finds the mismatch)."""
import warnings

import pytest
import torch
import torch.nn as nn

import kiln
from kiln import compiler
from kiln.config import Config
from kiln.frontend.dynamo import kiln_backend
from kiln.report import mark, reports_since


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()


def _eager_error(fn, *args) -> str:
    with pytest.raises(Exception) as info:
        fn(*args)
    return str(info.value)


# ------------------------------------------------------------------------------------------ option values

@pytest.mark.parametrize("option, value, expects", [
    ("check", "yes", "a bool"),
    ("fusion", 1, "a bool"),
    ("compile_workers", True, "an int"),
    ("compile_workers", 2.5, "an int"),
    ("max_folded_numel", "1000", "an int"),
    ("tune_budget_s", "5", "a number"),
    ("cache_dir", 3, "a str"),
    ("cxx_flags", "-O2", "a tuple of str"),
])
def test_option_of_the_wrong_type_names_option_type_and_value(option, value, expects):
    with pytest.raises(TypeError) as info:
        kiln.compile(_mlp(), **{option: value})
    msg = str(info.value)
    assert f"option {option!r}" in msg and expects in msg and repr(value) in msg, msg
    with pytest.raises(TypeError, match=f"option {option!r} expects"):
        Config().with_options(**{option: value})


@pytest.mark.parametrize("option, value, expects", [
    ("target", "tpu", r"one of \['auto', 'cpu', 'cuda', 'triton'\], got 'tpu'"),
    ("winograd_tiles", "2;4", r"comma-separated tile sizes .*, got '2;4'"),
    ("compile_workers", -1, r"a value >= 0, got -1"),
    ("tune_budget_s", -0.5, r"a value >= 0, got -0.5"),
])
def test_option_outside_its_accepted_values_is_rejected(option, value, expects):
    with pytest.raises(ValueError, match=rf"option {option!r} expects {expects}"):
        Config().with_options(**{option: value})


def test_accepted_values_are_normalised():
    cfg = Config().with_options(tune_budget_s=5, cxx_flags=["-O2", "-fopenmp"], winograd_tiles="2, 4",
                                target="cpu", check=False)
    assert cfg.tune_budget_s == 5.0 and isinstance(cfg.tune_budget_s, float)
    assert cfg.cxx_flags == ("-O2", "-fopenmp")
    assert callable(kiln.compile(_mlp(), check=True, compile_workers=2, tune_budget_s=1))


def test_torch_compile_options_are_checked_at_the_first_call():
    compiled = torch.compile(_mlp(), backend=kiln_backend, options={"check": "yes"})
    with pytest.raises(Exception, match=r"option 'check' expects a bool \(True or False\), got 'yes' \(str\)"):
        with torch.inference_mode():
            compiled(torch.randn(3, 8))


@pytest.mark.parametrize("env, text, expects", [
    ("KILN_COMPILE_WORKERS", "abc", "an int, got 'abc'"),
    ("KILN_TUNE_BUDGET_S", "fast", "a number"),
    ("KILN_CHECK", "maybe", "a bool (1/0, true/false, yes/no or on/off), got 'maybe'"),
    ("KILN_TARGET", "tpu", "one of ['auto', 'cpu', 'cuda', 'triton'], got 'tpu'"),
    ("KILN_WINOGRAD_TILES", "two", "comma-separated tile sizes"),
])
def test_malformed_environment_value_names_the_variable(monkeypatch, env, text, expects):
    monkeypatch.setenv(env, text)
    with pytest.raises(ValueError) as info:
        Config.from_env()
    assert f"environment variable {env} expects {expects}" in str(info.value), str(info.value)


def test_environment_booleans_parse_strictly(monkeypatch):
    for text, value in [("1", True), ("Yes", True), ("on", True), ("0", False), ("off", False), ("", False)]:
        monkeypatch.setenv("KILN_CHECK", text)
        assert Config.from_env().check is value
    monkeypatch.setenv("KILN_CHECK", "enabled")  # (read as True before: anything but a false word was)
    with pytest.raises(ValueError, match="environment variable KILN_CHECK expects a bool"):
        Config.from_env()


# ---------------------------------------------------------------------------------------------- targets

@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_target_without_a_gpu_says_so_at_compile():
    with pytest.raises(RuntimeError, match=r"target 'cuda' needs an NVIDIA GPU, but .*use target='auto' or 'cpu'"):
        kiln.compile(_mlp(), target="cuda")


def test_triton_target_on_cpu_tensors_without_the_interpreter_says_so(monkeypatch):
    pytest.importorskip("triton")
    # (patched: whether Triton interprets is fixed when triton is imported; this process may have it on)
    monkeypatch.setattr(compiler, "_triton_interprets", lambda: False)
    compiled = kiln.compile(_mlp(), target="triton")  # (fallback is on: a target that cannot run is raised anyway)
    with pytest.raises(RuntimeError, match=r"target 'triton' runs Triton kernels on cpu tensors only in Triton's "
                                           r"interpreter, which needs TRITON_INTERPRET=1"):
        with torch.inference_mode():
            compiled(torch.randn(3, 8))


def test_explicit_target_on_the_wrong_device_is_named():
    with pytest.raises(ValueError, match=r"target 'cpu' generates C\+\+ for CPU tensors, but the inputs are on cuda"):
        compiler.check_target("cpu", torch.device("cuda"))
    if not torch.cuda.is_available():  # (with a GPU: "cuda" on CPU tensors is the wrong device instead)
        with pytest.raises(RuntimeError, match="target 'cuda' needs an NVIDIA GPU"):
            compiler.check_target("cuda", torch.device("cpu"))
    compiler.check_target("auto", torch.device("cuda"))  # auto follows the tensors


def test_meta_tensors_fall_back_to_eager_instead_of_failing_in_the_compiled_graph():
    emb = nn.Embedding(10, 4).eval()
    compiled = kiln.compile(emb)
    ids = torch.randint(0, 10, (2, 5))
    with torch.inference_mode():
        compiled(ids)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = compiled(ids.to("meta"))  # eager takes meta indices beside CPU weights
    assert got.shape == emb(ids.to("meta")).shape
    # (torch 2.13's fake tensors take meta indices beside CPU weights, and kiln's compile falls back; 2.11's refuse
    # them while tracing, and kiln.compile runs the call eagerly)
    messages = [str(w.message) for w in caught]
    assert any("the graph has meta tensors" in m or "could not trace this call" in m for m in messages), messages


# ------------------------------------------------------------------------------- inputs the model rejects

def test_shape_mismatch_in_a_matmul_raises_eagers_error_and_new_shapes_still_compile():
    model = _mlp()
    compiled = kiln.compile(model, fallback=False)
    bad = torch.randn(3, 7)
    with torch.inference_mode():
        compiled(torch.randn(3, 8))
        with pytest.raises(RuntimeError) as info:
            compiled(bad)
        assert str(info.value) == _eager_error(model, bad) == "mat1 and mat2 shapes cannot be multiplied (3x7 and 8x16)"
        assert type(info.value) is RuntimeError and info.value.__context__ is None  # no TorchDynamo report
        assert any("ran the model eagerly" in note for note in info.value.__notes__)
        position = mark()
        x = torch.randn(5, 8)  # a shape the model takes: Dynamo recompiles and kiln compiles it
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        assert [r.fallback for r in reports_since(position)] == [None]


@pytest.mark.parametrize("case", ["conv_int64", "conv_float64", "embedding_float", "meta_beside_cpu_weights"])
def test_input_the_model_rejects_raises_eagers_error(case):
    torch.manual_seed(0)
    if case.startswith("conv"):
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).eval()
        good = torch.randn(1, 3, 16, 16)
        bad = good.long() if case == "conv_int64" else good.double()
    elif case == "embedding_float":
        model, good = nn.Embedding(10, 4).eval(), torch.randint(0, 10, (2, 5))
        bad = good.float()
    else:
        model, good = _mlp(), torch.randn(3, 8)
        bad = good.to("meta")
    compiled = kiln.compile(model)
    with torch.inference_mode():
        compiled(good)
        with pytest.raises(Exception) as info:
            compiled(bad)
        assert str(info.value) == _eager_error(model, bad)
        assert type(info.value).__module__ == "builtins", type(info.value)


def test_op_that_fake_tensors_reject_but_eager_runs_returns_eagers_result_with_one_warning():
    w = torch.randn(8, 4)

    def fn(x):
        return torch.relu(x @ w)
    compiled = kiln.compile(fn)
    x = torch.randn(3, 8, device="meta")  # eager multiplies a meta tensor by a CPU one; fake tensors refuse
    with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = compiled(x), compiled(x)
    assert first.shape == second.shape == (3, 4) and first.device.type == "meta"
    traced = [str(w.message) for w in caught if "could not trace this call" in str(w.message)]
    assert len(traced) == 1 and "ran eagerly" in traced[0], [str(w.message) for w in caught]


def test_failure_after_a_graph_break_is_not_re_run_and_names_inputs_and_line():
    w = torch.randn(8, 4)

    def inner(x):
        return torch.relu(x @ w)

    def fn(x, buf):
        buf.add_(1)
        print("graph break")
        return inner(x)
    compiled = kiln.compile(fn)
    buf = torch.zeros(2)
    with torch.inference_mode():
        compiled(torch.randn(3, 8), buf)
        with pytest.raises(RuntimeError) as info:
            compiled(torch.randn(3, 7), buf)
    msg = str(info.value)
    assert msg.startswith("kiln: the model fails on this call's inputs (x: torch.float32[3, 7] on cpu, "
                          "buf: torch.float32[2] on cpu): RuntimeError: a and b must have same reduction dim"), msg
    assert "test_errors.py" in msg and "in inner: return torch.relu(x @ w)" in msg and "graph break" in msg, msg
    assert info.value.__cause__ is None and info.value.__suppress_context__
    torch.testing.assert_close(buf, torch.full((2,), 2.0))  # the second call's update ran once, not again


# ----------------------------------------------------------------------- kiln's check of a compiled graph

class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x, scale):
        return torch.relu(self.linear(x)) * scale


def _compiled_graphs(fn, *args):
    """kiln's compiled graphs for ``fn`` on ``args``, callable without TorchDynamo's guards in front."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(kiln_backend(gm, example_inputs, options={"fallback": False}))
        return graphs[-1]
    with torch.inference_mode():
        torch.compile(fn, backend=backend)(*args)
    return graphs


def test_compiled_graph_names_the_users_argument():
    model = _Scaled().eval()
    [graph] = _compiled_graphs(model, torch.randn(3, 8), torch.randn(3, 4))
    params = (model.linear.weight, model.linear.bias)  # (TorchDynamo passes the module's weights first)
    expected = r"kiln: argument 'scale' expected torch.float32 of shape \[3, 4\] on cpu, got "
    with torch.inference_mode():
        with pytest.raises(ValueError, match=expected + r"torch.float64 of shape \[3, 4\] on cpu"):
            graph(*params, torch.randn(3, 8), torch.randn(3, 4).double())
        with pytest.raises(ValueError, match=expected + r"torch.float32 of shape \[3, 5\] on cpu"):
            graph(*params, torch.randn(3, 8), torch.randn(3, 5))
        with pytest.raises(ValueError, match=expected + r"torch.float32 of shape \[3, 4\] on meta"):
            graph(*params, torch.randn(3, 8), torch.randn(3, 4, device="meta"))

    def fn(a, batch):
        return torch.sin(a) * batch["k"][0]
    [graph] = _compiled_graphs(fn, torch.randn(3), {"k": [torch.randn(3)]})
    with torch.inference_mode(), pytest.raises(ValueError, match=r"argument batch\['k'\]\[0\] expected"):
        graph(torch.randn(3), torch.randn(4))


def test_symbolic_sizes_with_dynamic_shapes_off_fall_back_with_a_reason_that_says_so():
    from kiln import config
    compiled = torch.compile(_mlp(), backend=kiln_backend, dynamic=True)
    position = mark()
    with torch.inference_mode(), warnings.catch_warnings(record=True), config.scope(dynamic_shapes=False):
        warnings.simplefilter("always")
        compiled(torch.randn(3, 8))
    [report] = reports_since(position)
    assert "kiln compiles static shapes only" in report.fallback and "dynamic=True" in report.fallback


def test_symbolic_sizes_compile_for_every_size():
    model = _mlp()
    compiled = torch.compile(model, backend=kiln_backend, dynamic=True)
    position = mark()
    with torch.inference_mode():
        for rows in (3, 5, 3, 17):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=1.3e-5, atol=1.5e-5)
    [report] = reports_since(position)
    assert report.fallback is None and len(report.dynamic["sizes"]) == 3


def test_float_indices_stay_with_aten_which_raises_eagers_error():
    """Some torch versions' fake tensors let float indices into an embedding through (2.11 does); kiln must not
    cast them to int64 and read rows: the op stays an ATen call, which raises eager's error at run time."""
    from kiln.compiler import compile_aten_graph
    weight = torch.randn(10, 4)
    g = torch.fx.Graph()
    w, idx = g.placeholder("w"), g.placeholder("idx")
    w.meta["val"], idx.meta["val"] = weight, torch.zeros(2, 5)  # (float32 indices)
    out = g.call_function(torch.ops.aten.embedding.default, (w, idx))
    out.meta["val"] = torch.zeros(2, 5, 4)
    g.output((out,))
    position = mark()
    run = compile_aten_graph(torch.fx.GraphModule({}, g), {0: weight}, cfg=Config().with_options(fallback=False))
    assert reports_since(position)[-1].externs == ["embedding"]
    ids = torch.randint(0, 10, (2, 5)).float()
    with pytest.raises(RuntimeError) as info:
        run([weight, ids])
    assert str(info.value) == _eager_error(nn.functional.embedding, ids, weight)


def test_failed_capture_runs_eagerly_and_says_why(monkeypatch):
    """AOTAutograd's trace with kiln's decompositions can fail before kiln compiles anything (a decomposition
    whose strides a later view cannot take): with fallback on, the graph runs eagerly and the report says why;
    with it off, the error reaches the caller."""
    import warnings

    from kiln.frontend import decompositions
    from kiln.report import mark, reports_since

    def broken(x):
        raise ValueError("decomposition failed")

    # (patched: injects a failing decomposition)
    monkeypatch.setattr(decompositions, "decomposition_table", lambda: {torch.ops.aten.sin.default: broken})

    def fn(x):
        return torch.sin(x) * 2

    x = torch.randn(5)
    position = mark()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = kiln.compile(fn)(x)
    torch.testing.assert_close(got, fn(x))
    reports = reports_since(position)
    assert len(reports) == 1 and reports[0].fallback.startswith("capture to ATen (AOTAutograd) failed: ")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="decomposition failed"):
        kiln.compile(fn, fallback=False)(x)
