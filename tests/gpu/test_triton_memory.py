"""GPU memory: planned buffers come from the caching allocator in plan order and are released after their last
reader; no weight is copied on a GPU in default mode (BatchNorm stays in the epilogue, a kernel of kiln's writes a
convolution's weight channels-last into a transient buffer just before it)."""
import copy

import pytest
import torch
from torch import nn

import kiln
from benchmarks.models import MODELS
from kiln.ir.ops import Op, channels_last_strides
from kiln.report import mark, reports_since
from kiln.schedule.plan import triton_graph
from tests.gpu.conftest import DEVICE, HAS_CUDA, compile_and_run


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.sigmoid(y) * y + 1.0
        return self.fc(y.flatten(1)).softmax(-1)




def test_planned_buffers_are_allocated_once_and_released(no_tf32):
    model = Block().to(DEVICE).eval()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        expected = model(x)
        got, report = compile_and_run(model, x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert "caching allocator" in report.memory["summary"]
    graph = report.optimized
    module = triton_graph(graph, report, torch.device(DEVICE))
    assert not hasattr(module, "arena")
    assert all(n.op is Op.CONSTANT for n in module.static)  # nothing per call is held between calls
    allocated = [a.node for step in module.alloc_before for a in step]
    kernel_outputs = {n for n in graph.outputs if n.op is not Op.EXTERN}
    assert len(allocated) == len(set(allocated)) == len(module.planned | kernel_outputs) > 0
    dropped = {n for step in module.drop_after for n in step}
    assert module.planned - set(graph.outputs) <= dropped
    # the first write of every planned buffer comes after its allocation and before its release
    alloc_step = {a.node: k for k, step in enumerate(module.alloc_before) for a in step}
    drop_step = {n: k for k, step in enumerate(module.drop_after) for n in step}
    assert all(alloc_step[n] <= drop_step[n] for n in drop_step if n in alloc_step)
    # the convolution's result dies in the BatchNorm/ReLU kernel, which writes over it
    assert any(a.reuse is not None and a.reuse.op is Op.EXTERN for step in module.alloc_before for a in step)
    inputs = [x]
    with torch.inference_mode():
        torch.testing.assert_close(module(inputs)[0], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HAS_CUDA, reason="weights are copied only on CUDA devices")
@pytest.mark.parametrize("options", [{}, {"gpu_weight_copies": False, "mode": "reduce-overhead"}])
def test_no_weight_copies_on_the_gpu_in_default_mode_or_when_asked(options):
    """In default mode, or with ``gpu_weight_copies=False`` in any mode, every constant the compiled graph holds
    is the model's own tensor, or small (per-channel values)."""
    model, inputs = MODELS["resnet18"](size=32, device=DEVICE, dtype=torch.bfloat16)
    own = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
    got, report = compile_and_run(model, *inputs, **options)
    for n in report.optimized.nodes:
        if n.op is Op.CONSTANT:
            t = n.attr("value").tensor
            assert t.untyped_storage().data_ptr() in own or t.numel() <= 4096, (n, tuple(t.shape))


def test_default_mode_relays_out_weights_in_a_kernel_before_each_convolution(no_tf32):
    """Default mode holds no channels-last weights: each channels-last convolution whose weight's NHWC order differs
    from its NCHW order (not a 1x1 one) reads a copy a pointwise kernel writes just before it.  Modes that hold
    weight copies convert the weights once, at load."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 16, 1), nn.ReLU()).to(DEVICE).eval()
    x = torch.randn(2, 3, 8, 8, device=DEVICE)
    # (kiln's oneDNN and Winograd convolutions would take these on the CPU interpreter's path)
    got, report = compile_and_run(model, x, disabled_passes="winograd,prepack_conv")
    with torch.inference_mode():
        expected = model(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    module = triton_graph(report.optimized, report, torch.device(DEVICE))
    plan = module.plan
    convs = [s.node for s in plan.steps if getattr(s, "node", None) is not None
             and "convolution" in str(s.node.attr("target"))]
    assert len(convs) == 3 and set(convs) <= plan.cl_convs
    for conv in convs:
        w = conv.inputs[1]
        if w.shape[2:] == (1, 1):
            assert w.op is Op.CONSTANT  # its NHWC layout is its NCHW one
            continue
        assert w.op is Op.CAST and w.inputs[0].op is Op.CONSTANT
        assert plan.strides_of[w] == channels_last_strides(w.shape)
        step = next(k for k, s in enumerate(plan.steps) if getattr(s, "node", None) is conv)
        assert plan.buffer_of[w] in plan.steps[step - 1].buffers()[1]  # written by the step before the convolution
    with torch.inference_mode():
        torch.testing.assert_close(module([x])[0], expected, rtol=1e-4, atol=1e-5)
    holding = copy.copy(report)
    holding.mode = "reduce-overhead"
    held = triton_graph(report.optimized, holding, torch.device(DEVICE))
    assert not any(n.op is Op.CAST for n in held.plan.buffer_of)
    with torch.inference_mode():
        torch.testing.assert_close(held([x])[0], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HAS_CUDA, reason="measures CUDA memory")
@pytest.mark.parametrize("name", ["resnet18", "gpt"])
def test_compiled_call_peak_memory_at_most_eager(name):
    """In default mode (no weight copies), peak allocated memory over a call (what the compiled graph holds
    included) is at most eager's."""
    small = {"resnet18": {"size": 64, "batch": 4}, "gpt": {"seq": 64}}[name]
    model, inputs = MODELS[name](**small, device=DEVICE, dtype=torch.bfloat16)

    def peak(fn):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        with torch.inference_mode():
            fn(*inputs)  # compiles, for kiln
            fn(*inputs)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            out = fn(*inputs)
            torch.cuda.synchronize()
        del out
        return torch.cuda.max_memory_allocated() - base

    with torch.inference_mode():
        model(*inputs)  # library workspaces of the current stream exist for both
    eager = peak(model)
    compiled = peak(kiln.compile(model, fallback=False, fullgraph=True))
    assert compiled <= eager, (compiled / 2**20, eager / 2**20)


class _Weighted(nn.Module):
    def __init__(self, rows, cols, body):
        super().__init__()
        self.w = nn.Parameter(torch.randn(rows, cols, device=DEVICE), requires_grad=False)
        self.body = body

    def forward(self, x):
        return self.body(x, self.w)


def _module_for(fn, *inputs):
    position = mark()
    with torch.inference_mode():
        compiled = kiln.compile(fn, target="triton", fallback=False, fullgraph=True)
        compiled(*inputs)
    [report] = reports_since(position)
    return triton_graph(report.optimized, report, torch.device(DEVICE)), report


def _reuses(module):
    return [(a.node, a.reuse) for step in module.alloc_before for a in step if a.reuse is not None]


@pytest.mark.parametrize("cols", [48, 5000])  # persistent and looped rows
def test_results_take_the_memory_of_inputs_that_die_with_them(cols):
    """A matmul result read for the last time by a softmax (with a ReLU prologue), which writes each row back
    elementwise, gives its memory to the softmax's result; the values are eager's."""
    f = _Weighted(24, cols, lambda x, w: torch.softmax(torch.relu(x @ w) * 1.5, dim=-1))
    x = torch.randn(6, 24, device=DEVICE)
    module, report = _module_for(f, x)
    [(result, taken)] = _reuses(module)
    assert result is report.optimized.outputs[0] and taken.op is Op.EXTERN and report.memory["in_place"] == 1
    with torch.inference_mode():
        got = module([x])[0]
    torch.testing.assert_close(got, f(x), rtol=1e-4, atol=1e-5)
    assert report.memory["peak_bytes"] == 6 * cols * 4  # one [6, cols] fp32 buffer, not two


def test_no_reuse_when_other_elements_are_read():
    """``y + y.flip(-1)`` reads element ``n - 1 - i`` of ``y`` while writing element ``i``: another program may
    already have overwritten it, so the result gets its own buffer."""
    f = _Weighted(16, 40, lambda x, w: (x @ w) + (x @ w).flip(-1) * 2.0)
    x = torch.randn(5, 16, device=DEVICE)
    module, _ = _module_for(f, x)
    assert _reuses(module) == []
    with torch.inference_mode():
        torch.testing.assert_close(module([x])[0], f(x), rtol=1e-4, atol=1e-5)


def test_a_buffer_takes_the_memory_of_a_dead_buffer_of_its_size():
    """[Note: buffers reused by size]: ``a`` (a kernel's buffer) dies at the first matmul; the second matmul's
    result, allocated after, takes its memory - a view in the generated call, not an allocation - and ``a`` is
    released there instead.  (The tanh kernels write over the products in place.)"""
    def body(x, w):
        a = torch.sin(x) * 2.0
        return torch.tanh(torch.tanh(a @ w) @ w)

    f = _Weighted(24, 24, body)
    x = torch.randn(6, 24, device=DEVICE)
    module, report = _module_for(f, x)
    sin = next(n for n in report.optimized.nodes if n.op is Op.MUL and n.inputs[0].op is Op.SIN)
    [taking] = [k for k, step in enumerate(module.alloc_before) if any(a.reuse is sin for a in step)]
    assert sin not in module.drop_after[taking - 1] and sin in module.drop_after[taking]
    assert sum(sin in d for d in module.drop_after) == 1
    for _ in range(2):
        with torch.inference_mode():
            torch.testing.assert_close(module([x])[0], f(x), rtol=1e-4, atol=1e-4)
    assert report.wrapper.count("torch.empty_strided(") == 2, report.wrapper  # a and the first product


def test_a_dead_buffer_of_another_element_size_is_not_taken():
    """24 bytes of fp32 [2, 3] and an int64 [3] result: the same size, but the memory's view in the other dtype
    would need an even last dimension (fuzz_symbolic --target triton, seed 153): allocated apart."""
    f = _Weighted(3, 3, lambda x, w: (torch.sin(x) * 2.0 @ w).argmax(0))
    x = torch.randn(2, 3, device=DEVICE)
    module, _ = _module_for(f, x)
    assert all(a.dtype.itemsize == t.dtype.itemsize for a, t in ((a, a.reuse) for step in module.alloc_before
                                                                 for a in step if a.reuse is not None))
    with torch.inference_mode():
        torch.testing.assert_close(module([x])[0], f(x))


class _FakeGraph:
    """Stands in for a CUDA graph (CI has no GPU): a replay writes ``fill`` into the recording's outputs."""

    def __init__(self, outputs):
        self.outputs, self.fill = outputs, 0.0

    def replay(self):
        self.fill += 1
        for o in self.outputs:
            o.fill_(self.fill)


def test_replay_outputs_are_aliases_moved_onto_copies_only_when_kept():
    """The logic of [Note: outputs of a replay], on CPU tensors: a dropped output costs nothing, a kept one is
    moved onto a copy before the next replay (its values stay), a kept view blocks the replay, outputs sharing
    storage with each other are handed out as copies, and an output viewing an input is that view of the
    caller's input ([Note: outputs that are inputs])."""
    from kiln.runtime.cuda_graphs import _Recording
    x = torch.zeros(4)
    y = torch.zeros(3, 2)
    outputs = [torch.zeros(5), y, y.t(), x[:2]]  # private; two sharing storage; a view of an input
    rec = _Recording(None, outputs, [x])
    rec.graph = _FakeGraph(outputs)
    assert rec.aliased == [True, False, False, False]

    def call():
        assert rec.release_outputs()
        rec.graph.replay()
        return rec.hand_out([caller])

    caller = torch.arange(4.0)  # (the call's input: another tensor than the one recorded, with its strides)
    first = call()
    assert first[0].untyped_storage().data_ptr() == outputs[0].untyped_storage().data_ptr()  # no copy
    assert all(o.untyped_storage().data_ptr() != s.untyped_storage().data_ptr()
               for o, s in zip(first[1:3], outputs[1:3]))
    assert first[3].data_ptr() == caller.data_ptr() and torch.equal(first[3], caller[:2])
    del first
    kept = call()[0]  # the previous output was dropped: nothing to move
    second = call()
    assert torch.equal(kept, torch.full((5,), 2.0))  # moved onto a copy before the third replay
    assert torch.equal(second[0], torch.full((5,), 3.0))
    view = second[0][1:3]
    del second
    assert not rec.release_outputs()  # a view of the buffer is still held: the caller must get fresh buffers
    del view
    assert rec.release_outputs()



def test_a_shared_pool_moves_every_recordings_kept_outputs_before_any_replay():
    """[Note: one memory pool for a symbolic graph's sizes], on CPU tensors: recording B's output lies where
    recording A (captured before it) keeps an intermediate, so A's replay writes over it.  An output of B the
    caller keeps must be moved onto a copy before A replays - not only before B's own next replay."""
    from kiln.runtime.cuda_graphs import GraphPool, _Recording
    out_b = torch.zeros(4)                 # B's static output, where A's replay also writes (an intermediate)
    rec_a = _Recording(None, [torch.zeros(2)], [])
    rec_b = _Recording(None, [out_b], [])
    rec_a.graph, rec_b.graph = _FakeGraph([rec_a.outputs[0], out_b]), _FakeGraph([out_b])

    def call(rec, pool):
        assert pool.release() if pool is not None else rec.release_outputs()
        rec.graph.replay()
        outputs = rec.hand_out([])
        if pool is not None:
            pool.note_handed(rec)
        return outputs

    pool = GraphPool()
    kept = call(rec_b, pool)[0]            # B's result, held across the next call
    assert torch.equal(kept, torch.full((4,), 1.0))
    call(rec_a, pool)                      # A's replay writes 1.0 ... over B's buffer: B's result was moved first
    call(rec_a, pool)                      # (2.0 now in the shared memory)
    assert torch.equal(kept, torch.full((4,), 1.0)) and torch.equal(out_b, torch.full((4,), 2.0))
    assert pool.handed.keys() <= {id(rec_a)}
    # without the pool's release (each recording guarding its own outputs only) the kept result is overwritten
    rec_b.graph.fill = 9.0
    kept = call(rec_b, None)[0]
    call(rec_a, None)
    assert not torch.equal(kept, torch.full((4,), 10.0))

@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs")
def test_replays_update_the_callers_inputs_once_per_call():
    """reduce-overhead on a graph that updates its inputs ([Note: replaying a graph that updates its inputs]): a
    decode loop on one cache (replays of the graph recorded on it), then on new caches each call (the graph
    recorded on copies, whose updates are copied back), with a counter whose update is not idempotent (a warm-up
    run on the caller's buffers would add twice)."""
    import kiln

    def step(x, cache, count, pos):
        cache.index_copy_(1, pos, x)
        count.add_(1)
        return cache.sum(1) * count

    compiled = kiln.compile(step, mode="reduce-overhead", target="triton", fallback=False)

    def check(mine, want, t):
        x, pos = torch.randn(1, 1, 8, device=DEVICE), torch.tensor([t % 6], device=DEVICE)
        got = compiled(x, *mine, pos)
        expected = step(x, *want, pos)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        for m, w in zip(mine, want):
            torch.testing.assert_close(m, w, rtol=0, atol=0)

    def fresh():
        cache, count = torch.randn(1, 6, 8, device=DEVICE), torch.zeros((), device=DEVICE)
        return (cache, count), (cache.clone(), count.clone())

    with torch.inference_mode():
        mine, want = fresh()
        for t in range(5):
            check(mine, want, t)
        for t in range(5):  # new buffers every call: past the graphs kept per address, the copies' graph
            mine, want = fresh()
            check(mine, want, t)


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs")
def test_inputs_at_new_addresses_each_call_record_one_graph_on_copies(monkeypatch):
    """[Note: graphs keyed by input addresses]: a caller passing fresh tensors every call (a decoding loop's
    growing cache) gets one recording, on copies, not a graph per address that no later call replays; addresses
    that come again get a graph of their own (replayed with no copy)."""
    from kiln.runtime.cuda_graphs import GraphReplay
    recorded = []
    original = GraphReplay._record

    def counting(self, inputs):
        recorded.append(1)
        return original(self, inputs)
    monkeypatch.setattr(GraphReplay, "_record", counting)

    def f(x, y):
        return torch.relu(x) * y + 1.0

    compiled = kiln.compile(f, mode="reduce-overhead", target="triton", fallback=False)
    kept = []
    with torch.inference_mode():
        for _ in range(6):
            x, y = torch.randn(64, device=DEVICE), torch.randn(64, device=DEVICE)
            kept.append((x, y))  # (kept alive: every call's inputs at new addresses)
            torch.testing.assert_close(compiled(x, y), f(x, y), rtol=1e-6, atol=1e-6)
        assert len(recorded) == 1, recorded
        x, y = kept[-1]
        for k in range(3):
            x.add_(k)  # (new values at the same addresses)
            torch.testing.assert_close(compiled(x, y), f(x, y), rtol=1e-6, atol=1e-6)
        assert len(recorded) == 2, recorded


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs")
def test_a_recording_that_fails_leaves_the_graph_running_without_cuda_graphs(monkeypatch):
    """An op that cannot be captured fails only when the graph is recorded: the call runs the plain module (the
    right results, the caller's inputs updated once), says so in a warning and in the report, and later calls
    do not try again."""
    import kiln
    from kiln.report import mark, reports_since
    from kiln.runtime.cuda_graphs import GraphReplay
    tries = []

    def failing(self, inputs):
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(GraphReplay, "_record", failing)

    def step(x, count):
        count.add_(1)
        return torch.relu(x) * count

    compiled = kiln.compile(step, mode="reduce-overhead", target="triton", fallback=False)
    count, want = torch.zeros((), device=DEVICE), torch.zeros((), device=DEVICE)
    position = mark()
    with torch.inference_mode(), pytest.warns(UserWarning, match="CUDA graph recording failed"):
        for _ in range(4):
            x = torch.randn(16, device=DEVICE)
            torch.testing.assert_close(compiled(x, count), step(x, want))
    assert count.item() == want.item() == 4 and len(tries) == 1
    [report] = reports_since(position)
    assert report.memory["cuda_graph"].startswith("not used: recording failed (RuntimeError: operation not")


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs")
def test_strided_inputs_replay_the_graph(monkeypatch):
    """Inputs in another layout than contiguous (a slice of a wider batch, a transposed tensor, as a training
    step's batch slice and a backward's channels-last activations come) replay the graph - on copies in the
    graph's own buffers - instead of running the plain module every call."""
    replayed = []
    replay = torch.cuda.CUDAGraph.replay

    def counting(graph):
        replayed.append(1)
        return replay(graph)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counting)

    def f(x, y):
        return torch.relu(x) * y + 1.0

    compiled = kiln.compile(f, mode="reduce-overhead", target="triton", fallback=False,
                            cuda_graph_inputs_in_place=True)  # (off by default until measured)
    with torch.inference_mode():
        for _ in range(6):
            x = torch.randn(32, 65, device=DEVICE)[:, :64]
            y = torch.randn(64, 32, device=DEVICE).t()
            torch.testing.assert_close(compiled(x, y), f(x, y), rtol=1e-6, atol=1e-6)
    assert len(replayed) >= 3, len(replayed)
