"""kiln's part of the training partition ([Note: recompute what the backward can rebuild], frontend/partition.py):
saved activations that are short elementwise chains over what the backward holds anyway - GELU's output next to
its input, a LayerNorm's output next to its input and statistics, BatchNorm + ReLU in training mode - are rebuilt
in the backward instead of saved.  Each model is compiled with the pass on and off: the gradients (and BatchNorm's
running statistics) match eager's either way, and the report shows fewer saved bytes with it on."""
import copy
import re

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.report import mark, reports_since


def _step(model, inputs, recompute, budget=1.0):
    """One forward and backward of a compiled copy (the pass on or off, a memory budget): (the copy, its output,
    the forward's partition summary)."""
    torch._dynamo.reset()
    copied = copy.deepcopy(model)
    position = mark()
    with kiln.config.scope(training_recompute=recompute, training_memory_budget=budget):
        out = torch.compile(copied, backend="kiln")(*inputs)
        out.float().square().mean().backward()
    reports = reports_since(position)
    assert reports and all(r.fallback is None for r in reports), [r.fallback for r in reports]
    return copied, out, reports[0].training


def _saved_mib(summary):
    return float(re.search(r"saved \d+ activations, ([\d.]+) MiB", summary).group(1))


def _check(model, inputs, rtol=1.3e-5, atol=1.5e-5, moved=True, budget=1.0):
    ref = copy.deepcopy(model)
    ref_out = ref(*inputs)
    ref_out.float().square().mean().backward()
    summaries = {}
    for recompute in (False, True):
        got, out, summaries[recompute] = _step(model, inputs, recompute, budget if recompute else 1.0)
        torch.testing.assert_close(out, ref_out, rtol=rtol, atol=atol)
        for (name, p), q in zip(got.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
        for (name, b), c in zip(got.named_buffers(), ref.buffers()):
            torch.testing.assert_close(b, c, rtol=rtol, atol=atol, msg=lambda m: f"buffer {name}: {m}")
    assert "kiln recomputes" not in summaries[False]
    if moved:
        assert "kiln recomputes" in summaries[True], summaries[True]
        assert _saved_mib(summaries[True]) < _saved_mib(summaries[False]), summaries
    return summaries[True]


def test_gelu_output_for_the_next_weight_gradient():
    """Linear -> GELU -> Linear: the second Linear's weight gradient reads GELU's output, GELU's backward its
    input; only the input is saved, the output rebuilt (and its bias gradient's column sums stay one kernel)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    _check(model, (torch.randn(128, 64),))


def test_layer_norm_output_from_its_statistics():
    """LayerNorm -> Linear, with a residual: the LayerNorm's output is rebuilt from its input, mean and rstd."""
    torch.manual_seed(1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = nn.LayerNorm(128), nn.Linear(128, 128)

        def forward(self, x):
            return x + self.fc(self.norm(x))
    _check(Block(), (torch.randn(2, 160, 128) * 3 + 1,))


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_relu_in_training_mode(affine):
    """Conv -> BatchNorm (training mode: the batch's statistics, running statistics updated) -> ReLU -> Conv:
    the ReLU's output the second convolution's weight gradient reads is rebuilt from the first's output."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16, affine=affine), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1)).train()
    _check(model, (torch.randn(4, 8, 32, 32),), rtol=1e-4, atol=1e-5)


def test_batch_norm_in_evaluation_mode_is_left_saved():
    """In evaluation mode a BatchNorm normalizes by its running statistics: not rebuilt from batch statistics
    (there are none); the gradients still match."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1)).eval()
    summary = _check(model, (torch.randn(4, 8, 32, 32),), rtol=1e-4, atol=1e-5, moved=False)
    assert "kiln recomputes" not in summary, summary


def test_bf16_layer_norm_and_gelu():
    """A bf16 model: the LayerNorm's output rebuilt in float32 from bf16 input and float32 statistics, rounded to
    bf16 as the forward's was (checked against an fp32 run at bf16 tolerance)."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.LayerNorm(128), nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128)).to(torch.bfloat16)
    x = torch.randn(256, 128, dtype=torch.bfloat16)
    got, out, summary = _step(model, (x,), recompute=True)
    assert "kiln recomputes" in summary, summary
    ref = copy.deepcopy(model).float()
    ref_out = ref(x.float())
    ref_out.square().mean().backward()
    torch.testing.assert_close(out.float(), ref_out, rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(got.named_parameters(), ref.parameters()):
        err = ((p.grad.float() - q.grad).norm() / q.grad.norm()).item()
        assert err < 2e-2, f"{name}: relative error {err:.2e}"


def test_backward_twice_with_retain_graph():
    """The rebuilt values are the backward's own: a second backward over the same saved values gives the same
    gradients again."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    ref = copy.deepcopy(model)
    x = torch.randn(128, 64)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kiln")
    for m in (compiled, ref):
        loss = m(x).square().mean()
        loss.backward(retain_graph=True)
        loss.backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1.3e-5, atol=1.5e-5)


def _budget(summary):
    found = re.search(r"memory budget ([\d.]+): saved activations ([\d.]+) -> ([\d.]+) MiB \((met|not met)", summary)
    assert found, summary
    return float(found.group(1)), float(found.group(2)), float(found.group(3)), found.group(4) == "met"


def test_memory_budget_recomputes_products():
    """[Note: a memory budget]: at 0.3 of the saved bytes, the hidden layers' products are repeated in the
    backward too (the cheapest per byte first); the gradients still match eager's."""
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 64))
    summary = _check(model, (torch.randn(128, 64),), budget=0.3)
    budget, before, after, met = _budget(summary)
    assert budget == 0.3 and met and after <= 0.3 * before + 0.01, summary
    assert "products or convolutions" in summary, summary


def test_memory_budget_with_convolutions_and_batch_norm():
    """Convolutions repeated under a budget, BatchNorm in training mode between them: gradients and running
    statistics match eager's (the statistics are updated once, by the forward)."""
    torch.manual_seed(7)
    model = nn.Sequential(nn.Conv2d(4, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 8, 3, padding=1)).train()
    summary = _check(model, (torch.randn(4, 4, 24, 24),), rtol=1e-4, atol=1e-5, budget=0.4)
    assert _budget(summary)[3] and "products or convolutions" in summary, summary


def test_memory_budget_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"training_memory_budget.*\(0, 1\]"):
        kiln.compile(nn.Linear(4, 4), training_memory_budget=0)
    with pytest.raises(ValueError, match=r"training_memory_budget.*\(0, 1\]"):
        kiln.compile(nn.Linear(4, 4), training_memory_budget=1.5)


def test_symbolic_batch():
    """``dynamic=True``: the rebuilt values' sizes are symbols the backward has (saved sizes); one symbolic
    forward and backward serve every batch, gradients as eager's at each."""
    torch.manual_seed(8)
    model = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 1024), nn.GELU(), nn.Linear(1024, 8))
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    position = mark()
    compiled = torch.compile(model, backend="kiln", dynamic=True)
    for batch in (64, 97, 130):
        x = torch.randn(batch, 32)
        for m in (compiled, ref):
            m.zero_grad()
            m(x).square().mean().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    reports = reports_since(position)
    assert all(r.fallback is None and r.dynamic for r in reports)
    assert any("kiln recomputes" in (r.training or "") for r in reports), [r.training for r in reports]


def test_memory_budget_through_chunked_products():
    """A fused gate/up product chunked in two (SwiGLU): the chunks are views (items of a split), rebuilt with the
    product under a budget; at 0.3 the budget is met and the gradients match eager's."""
    torch.manual_seed(9)

    class SwiGLU(nn.Module):
        def __init__(self, d=64, hidden=256):
            super().__init__()
            self.gate_up, self.down = nn.Linear(d, 2 * hidden), nn.Linear(hidden, d)

        def forward(self, x):
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return x + self.down(nn.functional.silu(gate) * up)
    summary = _check(SwiGLU(), (torch.randn(256, 64),), rtol=1e-4, atol=1e-5, budget=0.3)
    assert _budget(summary)[3], summary


def test_memory_budget_through_split_heads_and_position_indices():
    """Attention with a fused query/key/value product split three ways and positions made by ``arange``: the
    rebuilds go through the split's items (views) and make the positions again; at 0.2 the budget is met and
    the gradients match eager's."""
    torch.manual_seed(10)

    class Attention(nn.Module):
        def __init__(self, d=64, heads=4):
            super().__init__()
            self.qkv, self.out, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
            self.pos = nn.Embedding(128, d)

        def forward(self, x):
            b, t, d = x.shape
            x = x + self.pos(torch.arange(t))
            q, k, v = self.qkv(x).split(d, dim=-1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            scores = torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1)
            return self.out((scores @ v).transpose(1, 2).reshape(b, t, d))
    summary = _check(Attention(), (torch.randn(4, 96, 64),), rtol=1e-4, atol=1e-5, budget=0.2)
    assert _budget(summary)[3], summary


class _Attention(nn.Module):
    """Self-attention written out: the backward needs transposed activations (``q^T``-like views of products)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1) * (c // self.heads) ** -0.5).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


def _attention_step_matches_eager():
    """A compiled forward and backward of ``_Attention``: its gradients eager's; returns the partition summary."""
    torch.manual_seed(0)
    model = _Attention()
    x = torch.randn(2, 16, 32)
    copied, out, summary = _step(model, (x,), True)
    ref = copy.deepcopy(model)
    ref(x).square().mean().backward()
    for p, q in zip(copied.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    return summary


def test_saved_strided_views_reach_the_backward_as_their_contiguous_bases(monkeypatch):
    """[Note: saved views travel as their bases]: no saved activation reaches the compiled backward as a strided
    view (which it would copy every step); the gradients match eager's."""
    from kiln import compiler
    strided = []
    compile_graph = compiler.compile_aten_graph

    def spy(fx_gm, frozen, *args, **kwargs):
        if "backward" in kwargs.get("name", ""):
            strided.extend(n.name for n in fx_gm.graph.nodes if n.op == "placeholder" and not n.name.startswith(
                ("primals", "tangents")) and isinstance(n.meta.get("val"), torch.Tensor)
                and not n.meta["val"].is_contiguous())
        return compile_graph(fx_gm, frozen, *args, **kwargs)
    monkeypatch.setattr(compiler, "compile_aten_graph", spy)
    summary = _attention_step_matches_eager()
    assert not strided, strided
    assert "strided saved views handed over as their bases" in summary, summary


def test_the_backward_reads_every_saved_activation_in_place(monkeypatch):
    """[Note: a training graph's outputs in eager's layout]: kiln drops attention's ``clone`` of the query, key
    and value (its kernels read the strided slices of the fused projection), yet the forward hands them to the
    backward dense, as eager's values were - so no compiled graph copies an input at the start of its call."""
    from kiln.runtime.module import CompiledGraph
    copied_inputs = []
    start = CompiledGraph.start

    def spy(self, inputs):
        copied_inputs.extend(tuple(t.shape) for t in inputs if not t.is_contiguous())
        return start(self, inputs)
    monkeypatch.setattr(CompiledGraph, "start", spy)
    _attention_step_matches_eager()
    assert not copied_inputs, copied_inputs
