"""KILN_CHECK checks what runs, and ``kiln bisect`` names the guilty step, pass or choice.

Each test injects a wrong result into one place - a generated kernel, a native library call, a Python extern,
a pass - and asserts that the step checker names that step (with the graph nodes it computes and its inputs'
layouts) and that bisect names the culprit and writes a reproducer that fails while the fault is in place."""
import pytest
import torch

import kiln
from kiln.codegen import cpp_expr as cpp_codegen
from kiln.ir.graph import GraphBuilder
from kiln.ir.ops import Op
from kiln import config
from kiln.passes import pipeline
from kiln.runtime import module
from kiln.library.gemm import op as cpu_gemm
from kiln.ir.interp import view_function
from kiln.runtime.checking import StepCheckError
from kiln.schedule import layout as schedule_layout, program
from kiln.testing.bisect import bisect, check_saved


def _model():
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40)

    def fn(x):
        y = lin(x.transpose(0, 1))
        return torch.softmax(y * 2, -1), torch.exp(y).sum(-1)
    return fn, torch.randn(3, 7, 24)


def _compile_checked(fn, x):
    with torch.inference_mode():
        return kiln.compile(fn, check=True, fallback=False)(x)


def test_check_passes_when_nothing_is_wrong():
    fn, x = _model()
    got = _compile_checked(fn, x)
    for a, e in zip(got, fn(x)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def _scale_exp(monkeypatch, factor):
    """The C++ printer writes exp(x) as exp(x) * factor (a kernel computes a wrong value)."""
    original = cpp_codegen.op_text

    def op_text(op, args, dtype, arg_dtype):
        text = original(op, args, dtype, arg_dtype)
        return f"({text} * {factor}f)" if op is Op.EXP else text
    monkeypatch.setattr(cpp_codegen, "op_text", op_text)  # (patched: injects a bug into kiln's code generator)


@pytest.fixture
def wrong_exp(monkeypatch):
    _scale_exp(monkeypatch, 1.01)


@pytest.mark.parametrize("factor", [1.01, 1.0005])
def test_check_names_a_wrong_kernel(monkeypatch, factor):
    """1.0005: five times the checker's float32 tolerance, in a well-conditioned step - [Note: a float64 second
    opinion] excuses what rounding can explain, not a small real error."""
    _scale_exp(monkeypatch, factor)
    fn, x = _model()
    with pytest.raises(StepCheckError) as caught:
        _compile_checked(fn, x)
    info = caught.value.info
    assert info.kind == "kernel" and "exp" in info.name, info.describe()
    assert any("exp(" in line for line in info.nodes) and info.inputs, info.describe()


def test_check_names_a_wrong_kernel_of_a_symbolic_graph(wrong_exp):
    """A graph compiled for every size builds its kernels from a copy of the graph per size: the step's nodes
    are not the graph's, and the checker names them by op and id (it raised a KeyError instead)."""
    def fn(x):
        return torch.exp(x * 2).sum(-1) + 1

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="kiln", dynamic=True)
    with config.scope(check=True, fallback=False), torch.inference_mode(), pytest.raises(StepCheckError) as caught:
        compiled(torch.randn(5, 7))
    assert caught.value.info.kind == "kernel" and caught.value.info.nodes, caught.value.info.describe()


def test_check_accepts_an_ill_conditioned_step_that_rounds_differently():
    """LayerNorm over a row of equal values (fuzz seed 7272): eager's mean is exact, kiln's is one ulp off, and
    the normalized noise is 1e-4 where the float32 reference says 0 - ill-conditioned, not wrong.  The float64
    second opinion sees that rounding alone moves the result that far, and the check passes."""
    from kiln.testing.fuzz import generate
    from kiln.testing.fuzz_run import run_program
    result = run_program(generate(7272, size="full"), options={"check": True})
    assert result.status == "ok", result.detail


@pytest.fixture
def wrong_native_layout(monkeypatch):
    """Native calls address a reshape that copies as if it were a view (the bug of shared/regressions/
    linear_transposed_input.py), with kiln's GEMM chosen for every linear."""
    if not cpu_gemm.available():
        pytest.skip("kiln's GEMM does not build here")

    def layout(shape, strides, dtype, chain):
        t = torch.empty_strided(tuple(shape), tuple(strides), dtype=dtype, device="meta")
        for n in chain:
            t = view_function(n)(t)
        return tuple(t.stride()), t.storage_offset()
    monkeypatch.setattr(program, "view_layout", layout)  # (patched: injects a bug where native calls are bound)
    monkeypatch.setattr(schedule_layout, "view_layout", layout)  # (and no copy kernel is put before the call)
    with config.scope(choices="gemm=kiln"):
        yield


def test_check_names_a_wrong_native_call(wrong_native_layout):
    fn, x = _model()
    with pytest.raises(StepCheckError) as caught:
        _compile_checked(fn, x)
    info = caught.value.info
    assert info.kind == "native" and "kiln_gemm" in info.name, info.describe()
    assert "linear_packed" in info.nodes[0] and "strides" in info.inputs[0], info.describe()


def test_check_names_a_wrong_extern(monkeypatch):
    """A Python extern (ATen's mm, library selection off) whose result is corrupted after the call."""
    original = module.CompiledGraph.extern_call

    def extern_call(self, n):
        call = original(self, n)

        def wrong(out, *values):
            result = call(out, *values)
            (out if result is None else result).mul_(1.5)
            return result
        return wrong
    monkeypatch.setattr(module.CompiledGraph, "extern_call", extern_call)  # (patched: injects a bug at run time)
    fn, x = _model()
    with pytest.raises(StepCheckError) as caught:
        with torch.inference_mode():
            kiln.compile(fn, check=True, fallback=False, library_selection=False)(x)
    assert caught.value.info.kind == "extern" and "mm" in caught.value.info.name, caught.value.info.describe()


def _double_exp(g, log):
    """A broken pass: exp(x) becomes exp(x) * 2."""
    b = GraphBuilder()
    new = {}
    for n in g.nodes:
        node = b.add_node(type(n)(n.op, tuple(new[i] for i in n.inputs), n.attrs, n.shape, n.dtype))
        if n.op is Op.EXP:
            two = b.add(Op.EXPAND, [b.add(Op.FULL, [], shape=(), dtype=n.dtype, value=2.0)], shape=n.shape)
            node = b.add(Op.MUL, [node, two])
        new[n] = node
    return b.finish([new[o] for o in g.outputs])


def test_check_and_bisect_name_a_wrong_pass(monkeypatch, tmp_path):
    # (patched: injects a broken pass into every compile, which kiln.bisect makes in its own way)
    monkeypatch.setattr(pipeline, "PIPELINE", pipeline.PIPELINE[:3] + [("double_exp", _double_exp)]
                        + pipeline.PIPELINE[3:])
    fn, x = _model()
    with pytest.raises(Exception, match="double_exp"):  # (Dynamo wraps the PassCheckError)
        _compile_checked(fn, x)
    result = bisect(fn, x, out_dir=tmp_path, verbose=False)
    assert result.differs and result.culprit_kind == "pass" and result.culprit == "double_exp", str(result)
    assert "pass double_exp" in result.fixes
    assert result.reproducer is not None and not check_saved(result.reproducer.with_suffix(".pkl"))


def test_bisect_names_a_wrong_kernel(wrong_exp, tmp_path):
    fn, x = _model()
    result = bisect(fn, x, out_dir=tmp_path, verbose=False)
    assert result.culprit_kind == "kernel" and "exp" in result.culprit, str(result)
    assert not check_saved(result.reproducer.with_suffix(".pkl"))


def test_bisect_names_a_wrong_native_call(wrong_native_layout, tmp_path):
    fn, x = _model()
    result = bisect(fn, x, out_dir=tmp_path, verbose=False)
    assert result.culprit_kind == "native" and "kiln_gemm" in result.culprit, str(result)
    assert "native_calls=False" in result.fixes and "library_selection=False" in result.fixes
    assert not check_saved(result.reproducer.with_suffix(".pkl"))
    # the reproducer is a script beside the pickle
    assert "check_saved" in result.reproducer.read_text()


def test_bisect_reports_nothing_when_right(tmp_path):
    fn, x = _model()
    result = bisect(fn, x, out_dir=tmp_path, verbose=False)
    assert not result.differs and result.reproducer is None


def test_pass_checks_of_a_graph_random_inputs_cannot_run_are_skipped_and_reported():
    """An index computed from an integer input (``i - 3``) is out of range for any small random integers the
    checker makes: KILN_CHECK says the graph's passes went unchecked instead of failing the compile."""
    def fn(x, i):
        return torch.gather(x, 0, i - 3) * 2

    x, i = torch.randn(2, 3), torch.tensor([[3, 4, 3], [4, 3, 4]])
    from kiln.report import mark, reports_since
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(fn, fallback=False, check=True)(x, i)
    [report] = reports_since(position)
    torch.testing.assert_close(got, fn(x, i))
    [record] = [p for p in report.passes if p.name == "check"]
    assert record.notes[0].startswith("pass checks skipped: the graph does not run on random inputs (RuntimeError")
