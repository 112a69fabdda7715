"""[Note: saved activations channels-last] (frontend/training.py, ``Config.training_channels_last``): a training
forward lays out its saved convolution inputs channels-last and tells AOTAutograd their strides, the backward is
compiled for inputs in that layout and runs ``convolution_backward`` channels-last.  Under Triton's interpreter
(CI) on small convolutional nets, every step's outputs and gradients against eager's, and the layouts chosen;
on a GPU the same with BatchNorm under bf16 autocast."""
import copy

import pytest
import torch
import torch.nn as nn

import kiln
import kiln.schedule.plan as plan_module
from kiln.ir.ops import channels_last_strides
from tests.gpu.conftest import DEVICE, HAS_CUDA


class _Residual(nn.Module):
    def __init__(self, c: int, bn: bool):
        super().__init__()
        norm = (lambda: nn.BatchNorm2d(c)) if bn else nn.Identity
        # (no bias before a BatchNorm, as in ResNets: its exact gradient is zero, and bf16 rounding noise is all
        # that is left to compare)
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=not bn), norm(), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, padding=1, bias=not bn), norm())

    def forward(self, x):
        return torch.relu(self.body(x) + x)


def _net(bn: bool) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), _Residual(8, bn),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


@pytest.fixture
def plans(monkeypatch):
    """Every plan a compile makes, with the output positions it was free to lay out."""
    made = []
    original = plan_module.make_plan

    def recording(graph, saved=frozenset()):
        plan = original(graph, saved)
        made.append((graph, saved, plan))
        return plan
    monkeypatch.setattr(plan_module, "make_plan", recording)
    return made


def _train(model, ref, x, steps, device, autocast=False, tol=(1e-4, 1e-5)):
    compiled = kiln.compile(model, fallback=False, target="triton", training_channels_last=True)
    for _ in range(steps):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            out = compiled(x)
            ref_out = ref(x)
        out.float().square().mean().backward()
        ref_out.float().square().mean().backward()
        torch.testing.assert_close(out.float(), ref_out.float(), rtol=tol[0], atol=tol[1])
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            err = ((p.grad.float() - q.grad.float()).norm() / q.grad.float().norm().clamp_min(1e-12)).item()
            assert err < tol[0] * 10, f"{name}: relative gradient error {err:.2e}"


def test_saved_convolution_inputs_channels_last_and_the_backward_reads_them_so(plans, no_tf32):
    torch._dynamo.reset()
    model = _net(bn=False).to(DEVICE)
    ref = copy.deepcopy(model)
    _train(model, ref, torch.randn(2, 3, 16, 16, device=DEVICE), 2, DEVICE)
    forward = [(g, s, p) for g, s, p in plans if s]
    backward = [(g, p) for g, s, p in plans if not s and any(n.attr("strides") for n in g.inputs)]
    assert forward and backward, plans
    graph, saved, plan = forward[-1]
    laid_out = {o for o in plan.laid_out}
    assert laid_out and all(plan.laid_out[o] == channels_last_strides(o.shape) for o in laid_out)
    user_outputs = {o for k, o in enumerate(graph.outputs) if k not in saved}
    assert not laid_out & user_outputs  # (the user's outputs keep eager's layout)
    graph, plan = backward[-1]
    cl = [n for n in graph.inputs if len(n.shape) == 4 and n.attr("strides") == channels_last_strides(n.shape)]
    assert cl and all(plan.strides_of[n] == n.attr("strides") for n in cl)
    # the backward's convolutions read a channels-last gradient
    grads = [n.inputs[0] for n in graph.nodes if getattr(n.attr("target"), "overloadpacket", None)
             is torch.ops.aten.convolution_backward]
    assert any(plan.strides_of.get(g) == channels_last_strides(g.shape) for g in grads)


def test_off_by_default_keeps_eager_layouts(plans):
    torch._dynamo.reset()
    model = _net(bn=False).to(DEVICE)
    compiled = kiln.compile(model, fallback=False, target="triton")
    compiled(torch.randn(2, 3, 16, 16, device=DEVICE)).sum().backward()
    assert plans and all(not p.laid_out for _, s, p in plans)  # (no attention here: nothing laid out)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_batch_norm_net_under_autocast_on_the_gpu(plans):
    torch._dynamo.reset()
    model = _net(bn=True).cuda().train()
    ref = copy.deepcopy(model)
    _train(model, ref, torch.randn(8, 3, 32, 32, device="cuda"), 3, "cuda", autocast=True, tol=(2e-2, 2e-2))
    assert any(p.laid_out for _, s, p in plans if s)


class _Attention(nn.Module):
    """Heads split from one projection, SDPA, heads merged for the output projection."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (u.transpose(1, 2) for u in self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def test_attention_output_handed_to_the_backward_in_its_own_layout(plans, no_tf32):
    """[Note: attention results in ATen's layout]: with ``attention_result_layouts`` the forward hands its saved
    attention output over in the layout ATen wrote it ([B, T, H, D] memory; reported to AOTAutograd though the
    trace had it too) and the backward takes it so, without a copy; gradients are eager's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Attention().to(DEVICE)
    ref = copy.deepcopy(model)
    x = torch.randn(2, 8, 32, device=DEVICE)
    compiled = kiln.compile(model, fallback=False, target="triton", attention_result_layouts=True)
    compiled(x).square().mean().backward()
    ref(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    merged = (256, 8, 32, 1)  # ([2, 4, 8, 8] laid out [2, 8, 4, 8])
    forward = [p for _, s, p in plans if s]
    backward = [g for g, s, _ in plans if not s]
    assert forward and any(v == merged for v in forward[-1].laid_out.values())
    assert backward and any(n.attr("strides") == merged for n in backward[-1].inputs)


def test_weights_channels_last_only_beside_channels_last_activations(plans):
    """ATen runs a convolution channels-last when its input *or its weight* is: a weight cast laid out
    channels-last beside NCHW activations (a BatchNorm output that a reduction kernel writes, NCHW) had ATen copy
    the activations and the incoming gradient around each call, and re-lay out its results.  Under bf16 autocast
    (whose weight casts are kiln's kernels) every convolution's weight is channels-last only where its
    activations are; gradients against eager's."""
    torch._dynamo.reset()
    model = _net(bn=True).to(DEVICE).train()
    ref = copy.deepcopy(model)
    _train(model, ref, torch.randn(2, 3, 16, 16, device=DEVICE), 2, DEVICE, autocast=True, tol=(3e-2, 3e-2))
    aten = torch.ops.aten
    checked = 0
    for graph, _, plan in plans:
        cl = {n for n, s in plan.strides_of.items() if len(n.shape) == 4 and s == channels_last_strides(n.shape)}
        cl |= {n for n in graph.inputs if len(n.shape) == 4 and n.attr("strides") == channels_last_strides(n.shape)}
        for n in graph.nodes:
            packet = getattr(n.attr("target"), "overloadpacket", None) if n.op.name == "EXTERN" else None
            if packet is aten.convolution and n.inputs[1] in cl:
                assert n.inputs[0] in cl or n in cl, f"forward convolution {n}: weight channels-last alone"
                checked += 1
            elif packet is aten.convolution_backward and len(n.inputs) > 2 and n.inputs[2] in cl:
                assert n.inputs[0] in cl or n.inputs[1] in cl, f"{n}: weight channels-last alone"
                checked += 1
    assert checked  # (some weight is laid out channels-last: the net's first layers run so)
    # (the partition's rebuilt BatchNorm output, rounded to bf16 by ``prims.convert_element_type``: a cast in a
    # kernel, not an ATen call between two kernels)
    converts = [n for graph, _, _ in plans for n in graph.nodes if n.op.name == "EXTERN"
                and "convert_element_type" in str(n.attr("target"))]
    assert not converts, converts
