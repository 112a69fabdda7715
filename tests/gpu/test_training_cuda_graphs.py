"""Training graphs under reduce-overhead ([Note: training graphs], [Note: a graph on copies reads settled inputs
in place]): forward and backward replayed as CUDA graphs, parameters and saved activations read in place, the
batch copied; loss and parameters match eager's over the steps; gradient accumulation (two forwards before the
backwards) keeps the first forward's activations - these need CUDA (CUDA graphs) and skip under the interpreter;
a held output moved onto a copy keeps its version counter (any device)."""
import copy

import pytest
import torch
import torch.nn as nn

import kiln
from tests.cpu.test_cuda_graph_emulation import accumulate_two_forwards
from tests.gpu.conftest import HAS_CUDA

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs")
ON = {"training_cuda_graphs": True}  # (the default since session 42; named so that the tests keep meaning it)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 32)).cuda()


def _replays(monkeypatch):
    """Count the CUDA graph recordings and the replays of each GraphReplay."""
    from kiln.runtime import cuda_graphs
    recorded, replayed = [], []
    record, call = cuda_graphs.GraphReplay._record, torch.cuda.CUDAGraph.replay

    def counting_record(self, inputs):
        recorded.append(id(self))
        return record(self, inputs)

    def counting_replay(graph):
        replayed.append(1)
        return call(graph)
    monkeypatch.setattr(cuda_graphs.GraphReplay, "_record", counting_record)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counting_replay)
    return recorded, replayed


@needs_cuda
def test_training_steps_replay_cuda_graphs_and_match_eager(monkeypatch):
    recorded, replayed = _replays(monkeypatch)
    model, ref = _model(), None
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    torch._dynamo.reset()
    compiled = kiln.compile(model, mode="reduce-overhead", fallback=False, **ON)
    settled = None
    for step in range(12):
        if step == 8:
            settled = (len(recorded), len(replayed))
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(32, 64, generator=g).cuda(), torch.randn(32, 32, generator=g).cuda()
        for fn, o in ((compiled, opt), (ref, ref_opt)):
            o.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(fn(x), y)
            loss.backward()
            o.step()
            if fn is compiled:
                got = loss.item()
        assert abs(got - loss.item()) <= 1e-5 * abs(loss.item()) + 1e-6, step
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    # the forward's graph and the backward's (each recorded again at most a few times while addresses settle);
    # once settled, every step replays both and records nothing
    assert len(set(recorded)) == 2, recorded
    assert len(recorded) == settled[0], recorded
    assert len(replayed) - settled[1] == 2 * 4, (len(replayed), settled)


@needs_cuda
def test_gradient_accumulation_keeps_the_first_forwards_activations(monkeypatch):
    recorded, _ = _replays(monkeypatch)
    model = _model()
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = kiln.compile(model, mode="reduce-overhead", fallback=False, **ON)
    accumulate_two_forwards(compiled, model, ref, 5, "cuda")
    assert recorded  # (the graphs were recorded: the check above ran on replays)


def test_moving_a_held_output_keeps_its_version_for_autograd():
    """[Note: outputs of a replay]: a held output moved onto a copy of its values (``set_``) keeps its version
    counter, so a backward that saved it does not refuse it as modified in place (no CUDA graph needed)."""
    from kiln.runtime.cuda_graphs import _keep_version
    w = torch.randn(4, requires_grad=True)
    held = torch.randn(4).detach()
    out = held * 1.0
    y = (w * out).sum()  # saves ``out`` for w's gradient
    version = out._version
    copy = out.clone()
    out.set_(copy.untyped_storage(), copy.storage_offset(), copy.shape, copy.stride())
    _keep_version(out, version)
    y.backward()
    torch.testing.assert_close(w.grad, held)
