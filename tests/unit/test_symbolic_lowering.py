"""Graphs traced with dynamic shapes, lowered with size expressions (frontend/lower.py ``symbolic=True``, the
second layer of docs/dynamic_shapes.md) and run by the reference interpreter at sizes other than the traced
one: the graph IR keeps every size as an expression of Dynamo's symbols, and the interpreter's results match
eager at each size.  Compiling such graphs still falls back to eager (no code generator takes sizes yet)."""
import pytest
import torch
import torch.nn.functional as F

from kiln.frontend.lower import LoweringError, lower_fx
from kiln.ir.interp import interpret
from kiln.ir.sym import is_symbolic


def _trace(fn, *inputs):
    """The AOT graph Dynamo hands a backend for ``fn`` under dynamic=True, traced and called at ``inputs``, and
    the tensors of that call in graph-input order (lifted weights among them), each either a position in
    ``inputs`` or the tensor itself."""
    from torch._functorch.aot_autograd import aot_module_simplified
    graphs, calls = [], []

    def backend(gm, example_inputs):
        def inner(g, fake_inputs):
            graphs.append(g)

            def run(*args):
                calls.append(args)
                return g.forward(*args)
            return run
        return aot_module_simplified(gm, example_inputs, fw_compiler=inner)

    torch._dynamo.reset()
    with torch.inference_mode():
        torch.compile(fn, backend=backend, dynamic=True, fullgraph=True)(*inputs)
    assert len(graphs) == 1
    slots = [next((k for k, x in enumerate(inputs) if x is a), a) for a in calls[0] if isinstance(a, torch.Tensor)]
    _trace.placeholders = list(calls[0])  # (every placeholder's value, the size symbols' ints among them)
    return graphs[0], slots


def _check_at_sizes(fn, make_inputs, sizes):
    """Trace at the first size, lower symbolically, interpret at every size against eager."""
    g, slots = _trace(fn, *make_inputs(*sizes[0]))
    graph, externs = lower_fx(g, {}, symbolic=True)
    assert any(is_symbolic(s) for n in graph.inputs for s in n.shape), str(graph)
    for size in sizes:
        inputs = make_inputs(*size)
        with torch.inference_mode():
            want = fn(*inputs)
            got = interpret(graph, [inputs[s] if isinstance(s, int) else s for s in slots])
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want)
        for w, o in zip(want, got):
            # (atol at the output's scale: an element that sums terms of ~200 to ~0.3 - the transformer layer's
            # residual - carries their rounding, 2e-5 in eager as in kiln against float64)
            scale = max(1.0, w.abs().max().item()) if w.is_floating_point() and w.numel() else 1.0
            torch.testing.assert_close(o, w, rtol=1.3e-5, atol=1.5e-5 * scale)
    return graph, externs


def test_pointwise_reductions_and_views():
    def fn(x, y):
        z = torch.softmax(x * 2 + 1, -1).reshape(-1, 8)
        w = torch.cat([z, y], 0)
        return w.sum(0), w[: x.shape[0] * 2].mean(1), (x - x.amax(1, keepdim=True)).exp()

    def inputs(b, t, n):
        return torch.randn(b, t, 16), torch.randn(n, 8)
    graph, externs = _check_at_sizes(fn, inputs, [(3, 5, 7), (2, 9, 4), (6, 2, 11)])
    assert "s" in str(graph) and externs == []  # sizes printed as expressions; every op lowered to kiln's


def test_transformer_layer_ops():
    """LayerNorm, linear, attention over a symbolic sequence length, GELU, an embedding lookup."""
    torch.manual_seed(0)
    emb, w1, w2 = torch.randn(50, 32), torch.randn(64, 32), torch.randn(32, 64)
    ln_w, ln_b = torch.randn(32), torch.randn(32)

    def fn(ids, pos):
        h = emb[ids] + pos
        a = F.layer_norm(h, (32,), ln_w, ln_b)
        q = a.view(a.shape[0], a.shape[1], 4, 8).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(h.shape)
        return h + F.linear(F.gelu(F.linear(att, w1)), w2)

    def inputs(b, t):
        return torch.randint(0, 50, (b, t)), torch.randn(t, 32)
    graph, externs = _check_at_sizes(fn, inputs, [(2, 7), (1, 12), (3, 5)])
    # lowered to kiln's ops as a static graph is: only the attention and the two products stay ATen calls
    assert all("scaled_dot_product" in e or e == "aten.mm.default" for e in externs), externs
    assert sum(n.op.value == "reshape" for n in graph.nodes) >= 4


def test_slices_and_sizes_as_values():
    """``x[:5]`` of a dimension traced at 7 has Dynamo's traced length 5 (Dynamo guards the size at 5 or more, so
    no call of this graph clamps it); ``x[1:] + x[:-1]`` has length ``s - 1``; ``x.shape[0]`` as a value is a size
    expression the interpreter evaluates per call."""
    def fn(x):
        return x[:5] * 2, x * x.shape[0], x[1:] + x[:-1]

    graph, externs = _check_at_sizes(fn, lambda t: (torch.randn(t, 3),), [(7,), (5,), (12,)])
    assert externs == [] and "full(value=s" in str(graph)


def test_a_lowering_that_would_specialize_fails_the_graph(monkeypatch):
    """A lowering that turns a symbolic size into an int makes Dynamo guard on it: the graph is refused (it
    would be wrong at every other size), not lowered with the size baked in."""
    from kiln.frontend import aten
    g, _ = _trace(lambda x: torch.relu(x) + 1, torch.randn(3, 5))

    def specializing(L, fx_node, *args, **kwargs):
        int(fx_node.meta["val"].shape[0])  # (what a careless lowering would do)
        raise aten.Unsupported("no")
    monkeypatch.setitem(aten.LOWERINGS, torch.ops.aten.relu, specializing)
    with pytest.raises(LoweringError, match="specialized"):
        lower_fx(g, {}, symbolic=True)


def test_static_lowering_still_refuses_symbolic_graphs():
    g, _ = _trace(lambda x: x * 2, torch.randn(3, 5))
    with pytest.raises(LoweringError, match="symbolic sizes"):
        lower_fx(g, {})


class _Block(torch.nn.Module):
    """A pre-norm transformer block with an embedding, as a module (its weights are frozen into the graph)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, ids):
        h = self.emb(ids)
        q, k, v = self.qkv(self.ln(h)).view(ids.shape[0], ids.shape[1], 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(h.shape)
        h = h + self.out(a)
        return h + self.fc2(F.gelu(self.fc1(self.ln(h))))


@pytest.mark.parametrize("gemm", ["aten", "kiln"])
def test_the_pass_pipeline_on_a_symbolic_graph(gemm):
    """Weights frozen into constants as kiln's frontend does, then every pass of the pipeline: the optimized graph
    still matches eager at each size.  The products' rows are a size expression: kiln's GEMM (forced here) takes
    them per call with the rule's schedule; the attention library, which binds its sizes when compiled, leaves
    SDPA to ATen."""
    from kiln import config
    from kiln.passes.pipeline import run_pipeline
    torch.manual_seed(0)
    model = _Block().eval()
    g, slots = _trace(model, torch.randint(0, 50, (2, 7)))
    params = {id(p) for p in model.parameters()}
    frozen = {k: a for k, a in enumerate(_trace.placeholders) if id(a) in params}  # (by placeholder position)
    graph, _ = lower_fx(g, frozen, symbolic=True)
    with config.scope(choices=f"gemm={gemm}"):
        graph = run_pipeline(graph)  # (each pass's result verified: shape rules over size expressions)
    assert (sum("linear_packed" in str(n.attr("target")) for n in graph.nodes) == 4) == (gemm == "kiln")
    for b, t in [(2, 7), (1, 13), (3, 4)]:
        ids = torch.randint(0, 50, (b, t))
        with torch.inference_mode():
            got, = interpret(graph, [ids])
            torch.testing.assert_close(got, model(ids), rtol=1.3e-5, atol=1.5e-5)


def test_fuzz_programs_through_the_symbolic_pipeline():
    """kiln/testing/fuzz_symbolic.py on the fuzzer's first programs (all dtypes): lowered symbolically, optimized
    and interpreted, each matches eager or is refused as a whole (never a wrong result or a crash).  Seeds 270
    (a negative size divided: a convolution's output height) and 288 (a split of symbolic parts returned as a view
    of the input) were wrong results; seed 10 still crashes (docs/dynamic_shapes.md)."""
    from kiln.testing.fuzz_symbolic import check
    statuses = {seed: check(seed, "all", "full") for seed in (*range(10), 270, 288)}
    assert all(status in ("ok", "refused", "eager_error") for status, _ in statuses.values()), statuses
    assert sum(status == "ok" for status, _ in statuses.values()) >= 8 and statuses[270][0] == statuses[288][0] == "ok"
