"""Updates of a caller's buffer made in place (kiln/passes/inplace_updates.py): a static KV cache's decode step."""
import pytest
import torch

import kiln
from kiln.report import mark, reports_since


def _compile_and_run(fn, *inputs):
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(fn, fallback=False, fullgraph=True)(*inputs)
    [report] = reports_since(position)
    return got, report


def _notes(report):
    return [note for p in report.passes if p.name == "inplace_updates" for note in p.notes]


def _cache(strided: bool) -> torch.Tensor:
    cache = torch.randn(2, 8, 16)
    return cache.transpose(1, 2).contiguous().transpose(1, 2) if strided else cache


@pytest.mark.parametrize("strided", [False, True])
def test_a_cache_update_is_made_in_the_callers_tensor(strided):
    def step(x, cache, pos):
        cache.index_copy_(1, pos, x)
        return torch.softmax(cache.sum(-1), -1), cache.amax(1) * 2

    x, pos = torch.randn(2, 1, 16), torch.tensor([5])
    want_cache = _cache(strided)
    mine = want_cache.clone(memory_format=torch.preserve_format)
    assert mine.stride() == want_cache.stride()
    with torch.inference_mode():
        expected = step(x, want_cache, pos)
    got, report = _compile_and_run(step, x, mine, pos)
    assert _notes(report) == ["input updated in place: 1"]
    externs = [n.attr("target") for n in report.optimized.nodes if n.attr("target") is not None]
    assert torch.ops.aten.index_put_.default in externs and torch.ops.aten.copy_.default not in externs
    torch.testing.assert_close(mine, want_cache, rtol=0, atol=0)
    assert mine.stride() == want_cache.stride()
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_an_input_read_besides_its_update_keeps_the_copy():
    """The old cache is read too (its sum before the update): an update in place would change what that read
    sees in some program order, so the functional update and its copy back stay."""
    def step(x, cache, pos):
        before = cache.sum(1)
        cache.index_copy_(1, pos, x)
        return before, cache.sum(1)

    x, pos = torch.randn(2, 1, 16), torch.tensor([3])
    want_cache = _cache(False)
    mine = want_cache.clone()
    with torch.inference_mode():
        expected = step(x, want_cache, pos)
    got, report = _compile_and_run(step, x, mine, pos)
    assert _notes(report) == []
    torch.testing.assert_close(mine, want_cache, rtol=0, atol=0)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_repeated_calls_accumulate_in_the_callers_cache():
    """A decode loop: each call writes one more row of the same cache, as eager's steps do."""
    def step(x, cache, pos):
        cache.index_copy_(1, pos, x)
        return cache.mean(1)

    compiled = kiln.compile(step, fallback=False)
    want_cache, mine = torch.zeros(1, 6, 4), torch.zeros(1, 6, 4)
    with torch.inference_mode():
        for t in range(6):
            x, pos = torch.randn(1, 1, 4), torch.tensor([t])
            torch.testing.assert_close(compiled(x, mine, pos), step(x, want_cache, pos), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine, want_cache, rtol=0, atol=0)


def test_pass_checks_run_every_graph_on_fresh_inputs_and_compare_the_updates():
    """KILN_CHECK's per-pass check (passes/check.py): a graph that updates an input ran on the same random
    inputs at every check, so the second run saw the first run's update (a false "pass 'dce' changed output 0"
    on the step below); and an update made wrongly in place must be caught like a wrong output."""
    from kiln.ir.graph import GraphBuilder
    from kiln.passes.check import Checker, PassCheckError

    def step(x, cache, pos):
        before = cache.sum(1)
        cache.index_copy_(1, pos, x)
        return before, cache.sum(1)

    x, pos = torch.randn(2, 1, 16), torch.tensor([3])
    _, report = _compile_and_run(step, x, torch.randn(2, 8, 16), pos)
    graph = report.captured
    checker = Checker(graph)
    checker.check("again", graph)  # (twice on one graph: the same results, its update included)
    # the same outputs, but the cache left as it came: the update is part of what the graph does
    b = GraphBuilder()
    for n in graph.nodes:
        if not (n.op.name == "EXTERN" and n.attr("target") is torch.ops.aten.copy_.default):
            b.add_node(n)
    dropped = b.finish(graph.outputs)
    with pytest.raises(PassCheckError, match=r"changed input \d+ \(as the graph leaves it\)"):
        checker.check("drop the update", dropped)



@pytest.mark.parametrize("copy", ["clone", "times_one"])
def test_an_output_of_the_input_before_its_update_keeps_the_old_values(copy):
    """The graph returns the cache as it came (``clone()``, or ``* 1`` that kiln folds to the input itself) and
    updates it: the update is made in place (the input has no reader in kiln's graph), and the returned value is
    a copy of the input taken before the call (``compiler._AliasFix``), not the updated cache."""
    def step(cache, pos, x):
        old = cache.clone() if copy == "clone" else cache * 1
        cache.index_copy_(0, pos, x)
        return old, cache.sum(0)

    cache, pos, x = torch.randn(5, 3), torch.tensor([1, 4]), torch.randn(2, 3)
    want_cache = cache.clone()
    with torch.inference_mode():
        expected = step(want_cache, pos, x)
    got, report = _compile_and_run(step, cache, pos, x)
    assert _notes(report) == ["input updated in place: 1"]
    torch.testing.assert_close(cache, want_cache, rtol=0, atol=0)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


def check_values_read_before_an_update_keep_the_old_values(device: str = "cpu", **options) -> None:
    """[Note: reads before an in-place update] (schedule/fuse.py), for each target's tests."""
    def fn(mask, x, index, value, scale):
        y = torch.where(mask, 0.25, x)  # (reads x before its update; reaches the output through inlined nodes)
        first, _, last = torch.tensor_split(y, 3, dim=0)
        x.index_put_((index,), value, accumulate=True)
        last.mul_(scale)
        return first, last * 2

    torch.manual_seed(0)
    mask = torch.rand(11, 1, device=device) < 0.3
    x, value, scale = (torch.randn(1, device=device) for _ in range(3))
    index = torch.zeros(1, dtype=torch.int64, device=device)
    want_x = x.clone()
    want = fn(mask, want_x, index, value, scale)
    torch._dynamo.reset()
    got = torch.compile(fn, backend="kiln", options=options)(mask, x, index, value, scale)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(x, want_x)


def test_values_read_before_an_update_keep_the_old_values():
    """A value computed from an input before the graph updates that input in place, inlined into a kernel after
    the update, read the new values (fuzz seed 11444, both targets): it is computed before the update."""
    check_values_read_before_an_update_keep_the_old_values()
