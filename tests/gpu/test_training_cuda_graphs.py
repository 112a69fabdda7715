"""Training graphs under reduce-overhead ([Note: training graphs], [Note: a graph on copies reads settled inputs
in place]): forward and backward replayed as CUDA graphs, parameters and saved activations read in place, the
batch copied; loss and parameters match eager's over the steps; gradient accumulation (two forwards before the
backwards) keeps the first forward's activations.  Needs CUDA (CUDA graphs); skipped under the interpreter."""
import copy

import pytest
import torch
import torch.nn as nn

import kiln
from tests.gpu.conftest import HAS_CUDA

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs")
ON = {"training_cuda_graphs": True, "cuda_graph_inputs_in_place": True}  # (off by default until measured on a GPU)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 32)).cuda()


def _replays(monkeypatch):
    """Count the CUDA graph recordings and the replays of each GraphReplay."""
    from kiln.runtime import triton_module
    recorded, replayed = [], []
    record, call = triton_module.GraphReplay._record, torch.cuda.CUDAGraph.replay

    def counting_record(self, inputs):
        recorded.append(id(self))
        return record(self, inputs)

    def counting_replay(graph):
        replayed.append(1)
        return call(graph)
    monkeypatch.setattr(triton_module.GraphReplay, "_record", counting_record)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counting_replay)
    return recorded, replayed


def test_training_steps_replay_cuda_graphs_and_match_eager(monkeypatch):
    recorded, replayed = _replays(monkeypatch)
    model, ref = _model(), None
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    torch._dynamo.reset()
    compiled = kiln.compile(model, mode="reduce-overhead", fallback=False, **ON)
    for step in range(8):
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
    # forward: one recording (parameters in place, the batch copied); backward: one on copies, then one with
    # the saved activations in place once the forward replays; the later steps replay
    assert len(set(recorded)) == 2 and len(recorded) <= 4, recorded
    assert len(replayed) >= 8, len(replayed)


def test_gradient_accumulation_keeps_the_first_forwards_activations(monkeypatch):
    recorded, _ = _replays(monkeypatch)
    model = _model()
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = kiln.compile(model, mode="reduce-overhead", fallback=False, **ON)
    for step in range(5):
        xs = [torch.randn(32, 64, generator=torch.Generator().manual_seed(10 * step + k)).cuda() for k in range(2)]
        for fn, m in ((compiled, model), (ref, ref)):
            m.zero_grad(set_to_none=True)
            losses = [fn(x).square().mean() for x in xs]  # two forwards, then both backwards
            for loss in reversed(losses):
                loss.backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    assert recorded  # (the graphs were recorded: the check above ran on replays)
