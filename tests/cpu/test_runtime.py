"""Runtime: output recycling never overwrites what the caller holds; the arena reuses memory; input checks."""
import pytest
import torch

import kiln
from kiln.ir.graph import GraphBuilder
from kiln.ir.ops import Op
from kiln.report import CompileReport, mark, reports_since
from kiln.runtime.memory import Interval, plan
from kiln.schedule.plan import build_cpu


def _f(x):
    return torch.exp(x) * 2 + 1


def test_outputs_held_by_the_caller_are_never_overwritten():
    fn = kiln.compile(_f)
    xs = [torch.randn(128, 256) for _ in range(4)]
    with torch.inference_mode():
        outs = [fn(x) for x in xs]
        views = [fn(x)[3] for x in xs]
        for x, out, view in zip(xs, outs, views):
            torch.testing.assert_close(out, _f(x))
            torch.testing.assert_close(view, _f(x)[3])


def test_dropped_outputs_are_recycled():
    fn = kiln.compile(_f)
    x, y = torch.randn(128, 256), torch.randn(128, 256)
    with torch.inference_mode():
        fn(x)  # the compiling call: Dynamo may keep its result alive
        first = fn(x)
        address = first.data_ptr()
        del first
        second = fn(y)
    assert second.data_ptr() == address
    torch.testing.assert_close(second, _f(y))


def test_arena_reuses_dead_buffers():
    iv = [Interval("a", 4096, 0, 1), Interval("b", 4096, 1, 2), Interval("c", 4096, 2, 3)]
    p = plan(iv)
    assert p.offsets["a"] == p.offsets["c"] != p.offsets["b"]
    assert p.arena_bytes == 8192 and p.naive_bytes == 12288


def test_model_arena_smaller_than_buffers():
    def deep(x, w):
        for _ in range(4):
            x = torch.relu(x @ w) + 1
        return x
    position = mark()
    with torch.inference_mode():
        kiln.compile(deep)(torch.randn(64, 64), torch.randn(64, 64))
    memory = reports_since(position)[-1].memory
    assert memory["arena_bytes"] < memory["naive_bytes"]


def test_wrong_input_names_the_expected_type():
    b = GraphBuilder()
    x = b.add(Op.INPUT, (), shape=(4,), dtype=torch.float32, index=0)
    graph = b.finish([b.add(Op.EXP, (x,))])
    module = build_cpu(graph, CompileReport("t"))
    with pytest.raises(ValueError, match=r"expected torch.float32 of shape \[4\]"):
        module([torch.randn(5)])
    torch.testing.assert_close(module([torch.ones(4)])[0], torch.ones(4).exp())


def test_in_place_update_of_a_non_contiguous_input_reaches_the_caller():
    def f(x):
        x.mul_(2)
        return x.sum(0)
    x = torch.randn(6, 4).t()  # non-contiguous: the kernels run on a contiguous copy
    expected_x = x.clone()
    expected = f(expected_x)
    with torch.no_grad():
        out = kiln.compile(f, fallback=False)(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, expected_x)


def test_without_an_arena_buffers_are_allocated_per_step():
    """A program without an arena (what the GPU runs: each buffer allocated before its first writer and freed
    after its last reader) on the CPU: the generated C++ finds each buffer in its pointer table (it used to read
    unset entries and crash)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4),
                                torch.nn.Softmax(-1)).eval()
    position = mark()
    with torch.inference_mode():
        kiln.compile(model, fallback=False)(torch.randn(3, 8))
        graph = reports_since(position)[-1].optimized
        report = CompileReport("no arena")
        module = build_cpu(graph, report, arena=False)
        assert "arena_bytes" in report.memory and not module.arena_mode and any(module.alloc_before)
        for _ in range(2):
            x = torch.randn(3, 8)
            torch.testing.assert_close(module([x])[0], model(x), rtol=1.3e-5, atol=1.5e-5)


def test_base_of_an_output_view_is_not_arena_memory():
    """An output that is a view (here ``stack``'s result returned as is, while a later matmul reads it) keeps its
    base alive after the call: the base may share no arena bytes with later intermediates of this call (the
    linear's result overwrote it, fuzz seed 2960), nor be overwritten by the next call (the caller still holds
    the first result)."""
    def fn(x0, x2, x3, x5):
        v1 = torch.stack([x0, x0, x0], dim=-3)
        v2 = torch.bmm(v1, x2.expand(3, -1, -1))
        v3 = torch.nn.functional.linear(x0, x3)
        v8 = x5 / (v3.abs() + 0.5)
        return v2, v8, v1

    def inputs():
        return [torch.randn(1, 2), torch.randn(2, 1), torch.randn(5, 2), torch.randn(5)]

    compiled = kiln.compile(fn, fallback=False)
    a, b = inputs(), inputs()
    got_a = compiled(*a)
    got_b = compiled(*b)
    for got, args in ((got_a, a), (got_b, b)):
        for g, e in zip(got, fn(*args)):
            torch.testing.assert_close(g, e, rtol=1.3e-5, atol=1.5e-5)


def test_output_that_is_an_input_after_simplification_is_a_new_tensor():
    """``x.clone()``, ``x * 1`` and ``copy(a, y)`` are the input itself in kiln's graph; eager returns a tensor of
    its own, which must neither alias the caller's input nor show an in-place update of it made later in the
    function (``y.masked_fill_`` after ``v[0:1] = y``, fuzz seed 4591)."""
    def clone(x):
        return x.clone(), x * 1, x.clone().t()

    def update_after(x, y, mask):
        v = x.amax(dim=-1, keepdim=True)
        v[0:1] = y
        y.masked_fill_(mask, 0.25)
        return v

    x = torch.randn(4, 3)
    got = kiln.compile(clone, fallback=False)(x)
    for g, e in zip(got, clone(x)):
        assert g.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    y, mask = torch.randn(1, 1), torch.tensor([[True]])
    expected = update_after(x, y.clone(), mask)
    y_compiled = y.clone()
    got = kiln.compile(update_after, fallback=False)(x, y_compiled, mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert y_compiled.item() == 0.25


def test_lean_call_matches_the_interpreter():
    """[Note: lean call] A program of C++ segments alone runs without the interpreter: the same outputs (a
    permuted and a reshaped view of output buffers here) as ``interpret``; a strided input or a wrong shape goes
    through the interpreter (a contiguous copy; the error naming what was expected)."""
    def f(x, y):
        z = torch.exp(x) * 2 + y
        return z.t(), (z - 1).reshape(4, 2, 16), z.sum(1)

    position = mark()
    compiled = kiln.compile(f, fallback=False)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    with torch.inference_mode():
        compiled(x, y)
        graph = reports_since(position)[-1].optimized
        module = build_cpu(graph, CompileReport("lean"))
        assert module._lean is not None
        for args in ((x, y), (torch.randn(16, 8).t(), torch.randn(8, 16)), (torch.randn(8, 16), torch.randn(8, 16))):
            got, reference = module(list(args)), module.interpret(list(args))
            for g, r, e in zip(got, reference, f(*args)):
                assert g.shape == e.shape
                torch.testing.assert_close(g, e, rtol=1.3e-5, atol=1.5e-5)
                torch.testing.assert_close(g, r, rtol=0, atol=0)
        with pytest.raises(ValueError, match=r"expected torch.float32 of shape \[8, 16\]"):
            module([torch.randn(8, 15), y])


def test_lean_call_is_not_used_where_an_output_is_an_input():
    def f(x):
        return x.clone(), x + 1
    position = mark()
    with torch.inference_mode():
        kiln.compile(f, fallback=False)(torch.randn(4))
        module = build_cpu(reports_since(position)[-1].optimized, CompileReport("interpreted"))
    assert module._lean is None


@pytest.mark.parametrize("dynamic", [False, True])
def test_outputs_that_view_another_output_alias_it_as_in_eager(dynamic):
    """[Note: outputs that view outputs]: ``y, y.view(-1), y[1:], y.t()[1]`` come back sharing y's storage with
    eager's strides and offsets, so an in-place update of one shows through the others."""
    def f(x):
        y = x * 2
        return y, y.view(-1), y[1:], y.t()[1], (y + 1)[:, :2]

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="kiln", dynamic=dynamic)
    for rows in (3, 5):
        x = torch.randn(rows, 4)
        got, want = compiled(x), f(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        for g, w in zip(got[:4], want[:4]):  # (the last views an intermediate no output holds: a tensor of its own)
            assert (g.stride(), g.storage_offset()) == (w.stride(), w.storage_offset())
        assert all(g.untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr() for g in got[:4])
        got[0].add_(100)
        want[0].add_(100)
        torch.testing.assert_close(got[2], want[2])
        torch.testing.assert_close(got[3], want[3])


def _one_value_twice(x0, mask, x4, x5):
    """Outputs 0 and 2 are one zero-size value in kiln's graph; output 2 (an integer round trip) has no gradient."""
    return torch.where(mask, x0, x5), x4.softmax(0), (x0 * 1.0).to(torch.int64).to(x0.dtype)


def check_outputs_kiln_merges_are_distinct_tensors(device: str = "cpu", **options) -> None:
    """[Note: one value at two outputs], for the tests of each target."""
    torch._dynamo.reset()
    x0 = torch.randn(0, 1, device=device, requires_grad=True)
    x5 = torch.randn(0, 1, device=device, requires_grad=True)
    x4 = torch.randn(3, device=device, requires_grad=True)
    mask = torch.tensor([True], device=device)
    outs = torch.compile(_one_value_twice, backend="kiln", options=options)(x0, mask, x4, x5)
    assert outs[0] is not outs[2] and [o.requires_grad for o in outs] == [True, True, False]
    weight = torch.randn(3, device=device)
    (outs[0].sum() + (outs[1] * weight).sum()).backward()  # (crashed: no tangent for output 0)
    x = x4.detach().requires_grad_()
    torch.testing.assert_close(x4.grad, torch.autograd.grad((x.softmax(0) * weight).sum(), x)[0])
    assert x0.grad is not None and x0.grad.shape == (0, 1)

    def twice(x):  # (CSE makes one node of the two products)
        return x * 2, x * 2

    torch._dynamo.reset()
    a, b = torch.compile(twice, backend="kiln", options=options)(torch.randn(4, 3, device=device))
    assert a is not b
    a.add_(1)
    torch.testing.assert_close(b + 1, a)


def test_outputs_kiln_merges_are_distinct_tensors():
    """[Note: one value at two outputs]: the caller gets a tensor per output, and a training step its gradients."""
    check_outputs_kiln_merges_are_distinct_tensors()
