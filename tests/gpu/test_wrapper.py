"""The generated straight-line call (kiln.runtime.wrapper) against the interpreted program and eager."""
import pytest
import torch
from torch import nn

from kiln.runtime.triton_module import TritonGraph
from kiln.schedule.plan import triton_graph
from tests.gpu.conftest import DEVICE, compile_and_run
from tests.gpu.test_triton_memory import Block


class Net(Block):
    """A library call with an epilogue kernel over its result, a residual read twice, views handed to a
    library (flatten, transposed weight), and two outputs, one a view."""

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        z = y * torch.sigmoid(y) + y
        logits = self.fc(z.flatten(1))
        return logits.softmax(-1), z[:, :2].permute(0, 2, 3, 1)


def _module(report) -> TritonGraph:
    return triton_graph(report.optimized, report, torch.device(DEVICE))


@pytest.fixture
def net():
    model = Net().to(DEVICE).eval()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    return model


def test_wrapper_matches_the_interpreted_call_and_eager(net):
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        expected = net(x)
        got, report = compile_and_run(net, x)
        module = _module(report)
        wrapped = module([x])
        interpreted = module.interpret([x])
    assert report.wrapper.startswith("def call(inputs):") and "del v" in report.wrapper
    for g, w, i, e in zip(got, wrapped, interpreted, expected):
        torch.testing.assert_close(w, i, rtol=0, atol=0)
        assert w.stride() == i.stride()
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(w, e, rtol=1e-4, atol=1e-5)


def test_wrapper_checks_inputs_and_copies_strided_ones(net):
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        _, report = compile_and_run(net, x)
        module = _module(report)
        with pytest.raises(ValueError, match=r"input 0 expected torch.float32 of shape \[2, 4, 6, 6\]"):
            module([torch.randn(2, 4, 6, 7, device=DEVICE)])
        with pytest.raises(ValueError, match="expected torch.float32"):
            module([x.double()])
        strided = torch.randn(2, 4, 6, 12, device=DEVICE)[..., ::2]
        torch.testing.assert_close(module([strided])[0], net(strided)[0], rtol=1e-4, atol=1e-5)


def test_wrapper_reuses_the_memory_of_values_that_die():
    """The ``del`` lines free what the interpreted program frees: a long chain of library calls and kernels
    holds at most a few buffers at once (on the CPU the caching allocator is absent, so the check is that
    every intermediate is deleted before the call returns)."""
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(6)]).to(DEVICE).eval()
    x = torch.randn(4, 16, device=DEVICE)
    with torch.inference_mode():
        got, report = compile_and_run(layers, x)
        torch.testing.assert_close(got, layers(x), rtol=1e-4, atol=1e-5)
    lines = report.wrapper.splitlines()
    assigned = {ln.split(" = ")[0].strip() for ln in lines if ln.startswith("    v") and " = " in ln}
    inputs = {ln.split(" = ")[0].strip() for ln in lines if " = inputs[" in ln}
    deleted = {ln.split()[1] for ln in lines if ln.strip().startswith("del ")}
    returned = set(lines[-1].removeprefix("    return [").removesuffix("]").split(", "))
    assert len(deleted) >= 10
    assert assigned - deleted <= returned | inputs


@pytest.mark.parametrize("view", [False, True])
def test_wrapper_hands_out_library_results_in_eagers_layout(view):
    """A convolution whose library writes channels-last (on the CPU: oneDNN with a prepacked weight), returned
    as is or as a view: the caller gets eager's strides, as from the interpreted call."""
    conv = nn.Conv2d(4, 8, 3).to(DEVICE).eval()
    model = (lambda x: conv(x).flatten(1)) if view else conv
    x = torch.randn(2, 4, 9, 9, device=DEVICE)
    with torch.inference_mode():
        expected = model(x)
        got, report = compile_and_run(model, x)
        module = _module(report)
        wrapped = module([x])[0]
        interpreted = module.interpret([x])[0]
    assert ("OUTPUT_" in report.wrapper) == bool(module.plan.strides_of)
    for t in (got, wrapped, interpreted):
        torch.testing.assert_close(t, expected, rtol=1e-4, atol=1e-5)
        assert t.stride() == expected.stride()


def test_wrapper_can_be_turned_off(net):
    """``gpu_call_wrapper=False`` (Config): the plan is interpreted step by step, with the same results."""
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        expected = net(x)
        got, report = compile_and_run(net, x, gpu_call_wrapper=False)
    assert report.wrapper == ""
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
