"""Graphs traced with dynamic shapes on the Triton target, built as a static GPU module per size tuple ([Note: a
GPU module per size] in kiln/runtime/dynamic.py: ``gpu_symbolic_kernels=False``, or a graph the kernels with size
parameters cannot express), each size checked against eager.  The default path, kernels with size parameters, is
tests/gpu/test_symbolic_kernels.py.

Runs on the GPU when there is one, else under Triton's interpreter on CPU tensors (CI); sizes are small."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.report import mark, reports_since
from tests.cpu.test_dynamic_shapes import _GPT
from tests.gpu.conftest import DEVICE, HAS_CUDA


def _symbolic_report(position):
    reports = reports_since(position)
    assert reports and all(r.fallback is None for r in reports), [r.fallback for r in reports]
    symbolic = [r for r in reports if r.dynamic]
    assert len(symbolic) == 1 and symbolic[0].target == "triton", [(r.name, r.target) for r in reports]
    return symbolic[0]


def test_a_module_per_size_each_matching_eager():
    def f(x, w):
        h = torch.relu(x @ w) + x.sum(-1, keepdim=True)
        return F.softmax(h, -1) * 2

    torch.manual_seed(0)
    w = torch.randn(16, 16, device=DEVICE)
    for build_after, builds, eager in ((1, 3, 0), (2, 1, 3)):
        position = mark()
        compiled = kiln.compile(f, target="triton", dynamic=True, gpu_dynamic_build_after=build_after,
                                gpu_symbolic_kernels=False)
        with torch.inference_mode():
            for n in (3, 5, 9, 5):  # (5 again: its module is built at its second call, or reused)
                x = torch.randn(n, 16, device=DEVICE)
                torch.testing.assert_close(compiled(x, w), f(x, w), rtol=2e-5, atol=2e-5)
        report = _symbolic_report(position)
        assert report.dynamic["builds"] == builds and len(report.dynamic["sizes"]) == builds
        assert report.dynamic["eager_calls"] == eager  # (a size's first call, before its build is due)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpt_over_sequence_lengths_on_the_triton_target(mode):
    torch.manual_seed(0)
    model = _GPT().eval().to(DEVICE)
    position = mark()
    compiled = kiln.compile(model, target="triton", mode=mode, dynamic=True, gpu_symbolic_kernels=False)
    with torch.inference_mode():
        for T in (5, 17, 9, 17):
            ids = torch.randint(0, 97, (1, T), device=DEVICE)
            # (the first call at a size runs eagerly, the second builds; reduce-overhead records at the third)
            for _ in range(3 if HAS_CUDA else 2):
                torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-4, atol=1e-4)
    report = _symbolic_report(position)
    assert report.dynamic["builds"] == 3 and report.dynamic["eager_calls"] == 3


def test_data_dependent_sizes_on_the_triton_target():
    """``nonzero``'s and a boolean mask's results run eagerly; the pieces around them are Triton, the one after
    them a module per size ([Note: data-dependent sizes])."""
    dyn = torch._dynamo.config
    saved = dyn.capture_dynamic_output_shape_ops
    dyn.capture_dynamic_output_shape_ops = True
    try:
        def f(x, y):
            a = torch.relu(x) * 2 + 1
            rows = torch.nonzero(a.sum(1) > 20).squeeze(1)
            return a.exp() + y, torch.tanh(a.index_select(0, rows)) * 3

        torch._dynamo.reset()
        position = mark()
        compiled = kiln.compile(f, target="triton")
        with torch.inference_mode():
            for _ in range(3):
                x, y = torch.randn(12, 16, device=DEVICE), torch.randn(12, 16, device=DEVICE)
                for g, w in zip(compiled(x, y), f(x, y)):
                    torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5)
        reports = reports_since(position)
        whole = [r for r in reports if r.target == "pieces"]
        assert len(whole) == 1 and len(whole[0].eager_nodes) == 1
        pieces = [r for r in reports if "[piece" in r.name]
        assert len(pieces) == 2 and all(r.fallback is None and r.target == "triton" for r in pieces)
    finally:
        dyn.capture_dynamic_output_shape_ops = saved
        torch._dynamo.reset()


@pytest.mark.parametrize("name", ["llama", "mha_cross"])
def test_zoo_models_at_other_lengths_and_batches_on_the_triton_target(name):
    """One ``dynamic=True`` compile per model, called shorter and with one more row (kiln.testing.zoo_dynamic)."""
    from kiln.testing.zoo_dynamic import check
    result = check(name, "ci", device=DEVICE, target="triton")
    assert result["ok"], result
    assert result["symbolic"] >= 1 and len(result["variants"]) >= 2, result


def test_the_report_counts_builds_and_eager_calls():
    def f(x):
        return torch.sigmoid(x) * x.sum(-1, keepdim=True)
    position = mark()
    compiled = kiln.compile(f, target="triton", dynamic=True, gpu_symbolic_kernels=False)
    with torch.inference_mode():
        for n in (3, 4, 3, 6):
            compiled(torch.randn(n, 8, device=DEVICE))
    text = _symbolic_report(position).format(source=False)
    assert "a GPU module per size: 1 built, 3 call(s) run eagerly" in text, text


def test_a_call_whose_sizes_disagree_raises_a_clear_error_before_any_eager_run():
    """The GPU's eager-until-built path checks the inputs as a compiled call does: InputMismatch, not an
    ATen error from the eager run."""
    from kiln import config
    from kiln.compiler import compile_aten_graph
    from kiln.runtime.errors import InputMismatch
    from tests.cpu.test_dynamic_shapes import aot_graph
    graph = aot_graph(lambda x, y: x + y.sum(0), torch.randn(3, 5, device=DEVICE), torch.randn(4, 5, device=DEVICE))
    run = compile_aten_graph(graph, {}, cfg=config.Config().with_options(fallback=False, target="triton",
                                                                         gpu_symbolic_kernels=False))
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    tensors = iter([torch.randn(3, 5, device=DEVICE), torch.randn(4, 6, device=DEVICE)])
    args = [next(tensors) if isinstance(p.meta["val"], torch.Tensor) else int(p.meta["val"].node.hint)
            for p in placeholders]
    with pytest.raises(InputMismatch, match="expected torch.float32 of shape"):
        run(args)


def test_a_float_attribute_dynamo_passes_as_a_cpu_tensor():
    """``dynamic=True``: TorchDynamo passes a module's float attribute it does not specialize as a 0-d float64 CPU
    tensor beside the GPU inputs (transformers' rotary ``attention_scaling``); kiln copies it to the device at
    each call, and a changed value is read, not baked in."""
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 0.5

        def forward(self, x):
            return torch.tanh(x) * self.scale + x.sum(-1, keepdim=True) * self.scale

    torch._dynamo.reset()
    model = Scaled()
    position = mark()
    compiled = torch.compile(model, backend="kiln", dynamic=True, options={"target": "triton"})
    with torch.inference_mode():
        for n, scale in ((5, 0.5), (9, 0.5), (9, 1.25)):
            model.scale = scale
            x = torch.randn(n, 16, device=DEVICE)
            torch.testing.assert_close(compiled(x), model(x), rtol=2e-5, atol=2e-5)
    reports = reports_since(position)
    assert reports and all(r.fallback is None for r in reports), [r.fallback for r in reports]
    if HAS_CUDA:
        assert any(r.host_inputs for r in reports), [r.format(source=False) for r in reports]
    torch._dynamo.reset()


def test_min_of_two_sizes_gets_a_module_per_size():
    """A diagonal over a matrix of two symbolic sizes (``Min(s0, s1)``): the kernels with size parameters do not
    take it, so the graph is built per size ([Note: a GPU module per size]) - compiled, not run eagerly."""
    def f(x):
        d = torch.diagonal(x, 0, -2, -1)
        return torch.relu(d) + x.mean()
    position = mark()
    compiled = kiln.compile(f, target="triton", dynamic=True, gpu_dynamic_build_after=1)
    with torch.inference_mode():
        for shape in ((3, 5, 7), (4, 9, 6), (2, 6, 6)):
            x = torch.randn(*shape, device=DEVICE)
            torch.testing.assert_close(compiled(x), f(x), rtol=2e-5, atol=2e-5)
    report = _symbolic_report(position)
    assert report.dynamic["builds"] >= 2
