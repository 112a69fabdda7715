"""reduce-overhead's replay logic without a GPU ([Note: CUDA graphs emulated on the CPU]): which calls replay, record
or run plainly, and whether the results stay right - for training steps ([Note: a training step replays one
recording per graph]), gradient accumulation, held outputs, outputs that are inputs, graphs that update their
inputs, and callers that alternate buffers or pass fresh ones.  Every result is checked against eager."""
import copy

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.runtime import cuda_graphs

RO = {"mode": "reduce-overhead", "fallback": False, "emulate_cuda_graphs": True}
TRAINING = {**RO, "training_cuda_graphs": True, "cuda_graph_inputs_in_place": True}


@pytest.fixture
def counted(monkeypatch):
    """Recordings (by GraphReplay) and replays of emulated graphs, and every GraphReplay made."""
    recorded, replayed, made = [], [], []
    record, replay, init = (cuda_graphs.GraphReplay._record, cuda_graphs._EmulatedGraph.replay,
                            cuda_graphs.GraphReplay.__init__)

    def counting_record(self, inputs):
        recorded.append(id(self))
        return record(self, inputs)

    def counting_replay(self, inputs):
        replayed.append(id(self))
        return replay(self, inputs)

    def noting_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(cuda_graphs.GraphReplay, "_record", counting_record)
    monkeypatch.setattr(cuda_graphs._EmulatedGraph, "replay", counting_replay)
    monkeypatch.setattr(cuda_graphs.GraphReplay, "__init__", noting_init)
    torch._dynamo.reset()
    return recorded, replayed, made


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 32))


def _trained_pair(optimizer, lr):
    """The MLP, eager's copy, an optimizer for each, and the model compiled for training under emulated graphs."""
    model = _mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = (optimizer(m.parameters(), lr=lr) for m in (model, ref))
    return model, ref, opt, ref_opt, kiln.compile(model, **TRAINING)


def _step_both(compiled, opt, ref, ref_opt, step):
    """One training step of the compiled model and of eager's copy on the same batch; their losses agree."""
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(32, 64, generator=g), torch.randn(32, 32, generator=g)
    losses = []
    for fn, o in ((compiled, opt), (ref, ref_opt)):
        o.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(fn(x), y)
        loss.backward()
        o.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-6), step


def test_training_steps_replay_one_recording_per_graph_and_match_eager(counted):
    recorded, replayed, made = counted
    model, ref, opt, ref_opt, compiled = _trained_pair(torch.optim.AdamW, 1e-3)
    settled = None
    for step in range(12):
        if step == 8:
            settled = (len(recorded), len(replayed))
        _step_both(compiled, opt, ref, ref_opt, step)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert len(made) == 2 and len(set(recorded)) == 2, (made, recorded)
    # the parameters read in place in both graphs, the saved activations in place in the backward; a batch the
    # allocator happened to place at one address in the first calls may be copied after one more recording
    assert len(recorded) <= 4, recorded
    assert len(recorded) == settled[0] and len(replayed) - settled[1] == 2 * 4, (recorded, settled, replayed)
    forward, backward = made
    assert forward.unprotected_runs == backward.unprotected_runs == 0
    params = len(list(model.parameters()))
    assert len(forward.in_place) >= params and len(backward.in_place) >= len(backward.expected) - 2


def accumulate_two_forwards(compiled, model, ref, steps, device="cpu"):
    """Gradient accumulation: two forwards, then both backwards, each step; gradients checked against eager's
    (the GPU's test of real CUDA graphs runs this too)."""
    for step in range(steps):
        xs = [torch.randn(32, 64, generator=torch.Generator().manual_seed(10 * step + k)).to(device) for k in range(2)]
        for fn, m in ((compiled, model), (ref, ref)):
            m.zero_grad(set_to_none=True)
            losses = [fn(x).square().mean() for x in xs]  # two forwards, then both backwards
            for loss in reversed(losses):
                loss.backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


def test_the_steady_call_hands_over_to_the_general_one_when_a_parameter_moves(counted, monkeypatch):
    """[Note: the steady call of a graph on copies]: once settled, each training call takes the steady path; a
    parameter given new storage (``p.data = ...``: the graph reads the old address) is caught there, the general
    call records the graph again on the new address, and every step stays eager's."""
    recorded, _, made = counted
    steady = []
    original = cuda_graphs.GraphReplay._steady_call

    def counting_steady(self, inputs):
        outputs = original(self, inputs)
        steady.append(outputs is not None)
        return outputs
    monkeypatch.setattr(cuda_graphs.GraphReplay, "_steady_call", counting_steady)
    model, ref, opt, ref_opt, compiled = _trained_pair(torch.optim.SGD, 1e-2)
    moved_at = None
    for step in range(14):
        if step == 7:
            moved_at = (len(recorded), len(steady))
            g = torch.Generator().manual_seed(99)
            fresh = torch.randn(model[0].weight.shape, generator=g)
            model[0].weight.data, ref[0].weight.data = fresh.clone(), fresh.clone()
        _step_both(compiled, opt, ref, ref_opt, step)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert any(steady[:moved_at[1]]) and all(steady[-4:]), steady  # (steady before the move and after it)
    assert False in steady[moved_at[1]:], steady  # the move went to the general call
    assert len(recorded) > moved_at[0], recorded  # ... which recorded the forward again
    assert all(r.unprotected_runs == 0 for r in made)


def test_gradient_accumulation_keeps_the_first_forwards_activations(counted):
    recorded, replayed, _ = counted
    model = _mlp()
    ref = copy.deepcopy(model)
    accumulate_two_forwards(kiln.compile(model, **TRAINING), model, ref, 6)
    assert recorded and replayed  # (the checks above ran on replays)


def test_a_held_training_output_moved_before_a_replay_still_takes_gradients(counted):
    model = _mlp()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model, **TRAINING)
    for step in range(5):
        xs = [torch.randn(32, 64, generator=torch.Generator().manual_seed(10 * step + k)) for k in range(2)]
        grads = []
        for fn, m in ((compiled, model), (ref, ref)):
            m.zero_grad(set_to_none=True)
            first = fn(xs[0])
            second = fn(xs[1])  # (its replay moves ``first`` onto a copy of its values)
            (first * 2 + second).sum().backward()  # a new use of the moved output, after the move
            grads.append([p.grad for p in m.parameters()])
        for got, want in zip(*grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_held_outputs_keep_their_values_across_replays(counted):
    recorded, replayed, _ = counted
    model = _mlp().eval()
    compiled = kiln.compile(model, **RO)
    held = []
    with torch.no_grad():
        for step in range(8):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(step))  # fresh tensors: a graph on copies
            held.append((compiled(x), model(x)))
    for got, want in held:  # every earlier output moved onto a copy before the replay that overwrote its buffer
        torch.testing.assert_close(got, want, rtol=1.3e-5, atol=1.5e-5)
    # (the graph on copies; the allocator may hand a later input an address seen before: a keyed graph)
    assert 1 <= len(recorded) <= 1 + cuda_graphs.GraphReplay.MAX_GRAPHS and len(replayed) >= 5, (recorded, replayed)


def test_alternating_buffers_get_a_graph_each(counted):
    recorded, replayed, made = counted
    model = _mlp().eval()
    compiled = kiln.compile(model, **RO)
    buffers = [torch.empty(8, 64), torch.empty(8, 64)]
    with torch.no_grad():
        for step in range(8):
            x = buffers[step % 2]
            x.copy_(torch.randn(8, 64, generator=torch.Generator().manual_seed(step)))
            torch.testing.assert_close(compiled(x), model(x), rtol=1.3e-5, atol=1.5e-5)
    (replay,) = made
    assert len(replay.graphs) == 2 and replay.copy_graph is None and len(recorded) == 2


def test_an_output_that_views_an_input_is_a_view_of_the_callers_tensor(counted):
    class Returns(nn.Module):
        def forward(self, x):
            return x.relu() * 2, x[1:]

    compiled = kiln.compile(Returns(), **RO)
    with torch.no_grad():
        for step in range(5):
            x = torch.randn(6, 4)
            y, tail = compiled(x)
            torch.testing.assert_close(y, x.relu() * 2)
            assert tail.data_ptr() == x[1:].data_ptr() and tail.stride() == x[1:].stride()
            x[1:] += 1  # an update of the input shows through the output that views it, as in eager
            torch.testing.assert_close(tail, x[1:])


@pytest.mark.parametrize("fresh", [False, True], ids=["same-buffer", "fresh-buffers"])
def test_a_graph_that_updates_its_input_updates_it_once_per_call(counted, fresh):
    class Counter(nn.Module):
        def forward(self, count, x):
            count.add_(1)
            return x * count

    compiled = kiln.compile(Counter(), **RO)
    count = torch.zeros(4)
    with torch.no_grad():
        for step in range(1, 7):
            if fresh:
                count = count.clone()
            x = torch.randn(4)
            torch.testing.assert_close(compiled(count, x), x * step)
            torch.testing.assert_close(count, torch.full((4,), float(step)))


def test_an_expanded_output_replays(counted):
    """An output that is an expanded view (stride 0) of a buffer: the replay writes the buffer's elements once
    (fuzz seed 18 in reduce-overhead)."""
    recorded, replayed, _ = counted

    def f(x, w):
        return (x @ w).expand(3, 2), x.sum()

    compiled = kiln.compile(f, **RO)
    with torch.no_grad():
        for step in range(5):
            x, w = torch.randn(1, 4), torch.randn(4, 2)
            got, want = compiled(x, w), f(x, w)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1.3e-5, atol=1.5e-5)
    assert replayed


def test_an_emulated_replay_refuses_an_input_no_longer_at_its_address():
    double = lambda inputs: [inputs[0] * 2]  # noqa: E731
    x = torch.randn(4)
    recording = cuda_graphs._EmulatedGraph.record(double, [x], [])
    recording.replay([x])
    torch.testing.assert_close(recording.outputs[0], x * 2)
    elsewhere = torch.randn(4)
    recording.replay([elsewhere])  # (the recorded tensor is alive where it was: read there, as a graph would)
    torch.testing.assert_close(recording.outputs[0], x * 2)
    x.set_(torch.randn(4).untyped_storage())  # moved: a CUDA graph would read whatever lies at the old address
    with pytest.raises(RuntimeError, match="no longer at the address"):
        recording.replay([elsewhere])
