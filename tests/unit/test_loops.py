"""Schedule primitives on loop nests (kiln/ir/loops.py): each primitive's result, legality checks, traces that
print, parse, hash and replay, and every rule-generated pointwise schedule visiting each element once and
computing what eager computes."""
import itertools

import pytest
import torch

import kiln
from kiln.codegen import cpp_schedule
from kiln.codegen.cpp_loops import candidate_traces, default_trace
from kiln.ir.loops import LoopNest, ScheduleError, Trace, fuse, parallel, reorder, split, unroll, vectorize
from kiln.report import mark, reports_since


def visited(nest: LoopNest, ndim: int) -> list[tuple[int, ...]]:
    """The original indices the nest's iterations compute, in order (a reference executor: C's / and % on
    non-negative integers are Python's // and %)."""
    out: list[tuple[int, ...]] = []
    env: dict[str, int] = {}

    def run(k: int) -> None:
        if k == len(nest.loops):
            values = dict(env)
            for var, expr in nest.defs:
                values[var] = eval(expr.replace("/", "//"), {}, values)
            out.append(tuple(values[f"i{d}"] for d in range(ndim)))
            return
        loop = nest.loops[k]
        bound = loop.extent
        if loop.stop is not None:
            outer, factor, n = loop.stop
            bound = min(factor, n - env[outer.replace(".", "_").replace("+", "_")] * factor)
        for x in range(bound):
            env[loop.var] = x
            run(k + 1)
    run(0)
    return out


def test_split_with_a_ragged_last_block():
    nest = split(LoopNest.plain((10,)), "i0", 4)
    assert str(nest) == "for i0.o in 0..3\n  for i0.i in 0..min(4, 10 - i0.o*4)\n    i0 = i0_o * 4 + i0_i"
    assert visited(nest, 1) == [(i,) for i in range(10)]


def test_fuse_reorder_and_annotations():
    nest = LoopNest.plain((3, 5, 7))
    fused = fuse(nest, "i0", "i1")
    assert [lp.name for lp in fused.loops] == ["i0+i1", "i2"] and fused.loops[0].extent == 15
    assert visited(fused, 3) == list(itertools.product(range(3), range(5), range(7)))
    swapped = reorder(nest, "i2", "i0")
    assert [lp.name for lp in swapped.loops] == ["i2", "i1", "i0"]
    assert sorted(visited(swapped, 3)) == list(itertools.product(range(3), range(5), range(7)))
    done = unroll(vectorize(parallel(swapped, "i2", 100), "i0"), "i1", 4)
    assert [(lp.kind, lp.unroll) for lp in done.loops] == [("parallel", 0), ("serial", 4), ("vector", 0)]
    assert str(done).splitlines()[0] == "for i2 in 0..7  # parallel"


@pytest.mark.parametrize("bad", [
    lambda n: vectorize(n, "i0"),                                  # not the innermost loop
    lambda n: parallel(n, "i1"),                                   # threads inside a serial loop
    lambda n: fuse(n, "i0", "i2"),                                 # not adjacent
    lambda n: reorder(split(n, "i1", 2), "i1.i", "i1.o"),          # the ragged inner loop leaves its outer
    lambda n: parallel(parallel(split(n, "i1", 2), "i0"), "i1.i"),  # threads over a loop of varying extent
    lambda n: split(n, "i0", 0),
    lambda n: unroll(parallel(n, "i0"), "i0", 4),
    lambda n: vectorize(n, "i9"),
])
def test_illegal_primitives_are_refused(bad):
    with pytest.raises(ScheduleError):
        bad(LoopNest.plain((4, 5, 6)))


def test_threads_may_share_the_blocks_of_a_split():
    nest = parallel(parallel(split(LoopNest.plain((4, 5, 6)), "i1", 2), "i0"), "i1.o")
    assert [lp.kind for lp in nest.loops] == ["parallel", "parallel", "serial", "serial"]


def test_traces_print_parse_hash_and_replay():
    t = Trace().then("fuse", "i0", "i1").then("split", "i0+i1", 16).then("parallel", "i0+i1.o", 4096) \
        .then("unroll", "i2", 2).then("vectorize", "i2")
    text = str(t)
    assert text == "fuse(i0, i1); split(i0+i1, 16); parallel(i0+i1.o, 4096); unroll(i2, 2); vectorize(i2)"
    again = Trace.parse(text)
    assert again == t and hash(again) == hash(t) and len({t, again}) == 1
    assert str(t.apply(LoopNest.plain((6, 7, 8)))) == str(again.apply(LoopNest.plain((6, 7, 8))))
    with pytest.raises(ScheduleError):
        Trace.parse("tile(i0, 4)")


@pytest.mark.parametrize("extents", [(10000,), (3, 5, 7), (16, 16, 64), (2, 130)])
def test_generated_schedules_visit_every_element_once(extents):
    space = candidate_traces(extents, 1 << 15)
    assert space and default_trace(extents, 4096, 1 << 15) in space + [default_trace(extents, 4096, 1 << 15)]
    everything = sorted(itertools.product(*(range(e) for e in extents)))
    for t in space:
        assert sorted(visited(t.apply(LoopNest.plain(extents)), len(extents))) == everything, str(t)


def test_every_generated_schedule_compiles_and_matches_eager(monkeypatch):
    """Each rule-generated trace of a pointwise kernel, compiled by g++, computes what eager computes."""
    x, y, z = torch.randn(3, 50, 70), torch.randn(3, 50, 1), torch.randn(70)

    def fn(a, b, c):  # broadcasts keep three axes (a contiguous pointwise kernel would be one flat loop)
        return torch.sigmoid(a) * b + torch.tanh(a - c)

    def compile_with(choose):
        # (patched: puts each candidate trace in the place of the rule's, to compile and run every one of them)
        monkeypatch.setattr("kiln.tune.cpu.default_schedule", choose)
        position = mark()
        with torch.inference_mode():
            got = kiln.compile(fn, fallback=False)(x, y, z)
        torch.testing.assert_close(got, fn(x, y, z), rtol=1.3e-5, atol=1.5e-5)
        [report] = reports_since(position)
        return report.kernels[0]
    kernel = compile_with(cpp_schedule.default_schedule)
    extents = tuple(kernel.outer)
    traces = candidate_traces(extents, 1 << 15)
    assert len(extents) >= 2 and len(traces) >= 3
    for t in traces:
        k = compile_with(lambda _, t=t: cpp_schedule.CppSchedule(loops=str(t)))
        assert k.schedule.loops == str(t)


def test_a_reductions_trace_splits_into_rows_and_lanes():
    from kiln.codegen.cpp_loops import reduction_trace, split_reduction_trace
    t = reduction_trace(2, 32, 1 << 15)
    assert str(t) == "parallel(o0, 32768); parallel(o1, 32768); split(r, 32); vectorize(r.i)"
    rows, lanes = split_reduction_trace(t)
    assert str(rows) == "parallel(o0, 32768); parallel(o1, 32768)" and lanes == 32
    assert split_reduction_trace(reduction_trace(1, 0, 100)) == (Trace((("parallel", "o0", 100),)), 0)
    for bad in ("split(r, 8)", "split(r, 8); unroll(r.i, 2)", "vectorize(r)"):
        with pytest.raises(ScheduleError):
            split_reduction_trace(Trace.parse(bad))


def test_every_reduction_schedule_compiles_and_matches_eager(monkeypatch):
    """Lane counts over r (with a ragged tail) and rows fused into one parallel loop, compiled by g++."""
    x = torch.randn(4, 6, 301)[:, ::2]  # strided rows: the two row axes stay apart

    def fn(a):
        return torch.softmax(a, -1) * a.amax(-1, keepdim=True)

    def compile_with(choose):
        # (patched: puts each candidate trace in the place of the rule's, to compile and run every one of them)
        monkeypatch.setattr("kiln.tune.cpu.default_schedule", choose)
        position = mark()
        with torch.inference_mode():
            got = kiln.compile(fn, fallback=False)(x)
        torch.testing.assert_close(got, fn(x), rtol=1.3e-5, atol=1.5e-5)
        [report] = reports_since(position)
        return [k for k in report.kernels if k.is_reduction]
    [kernel] = compile_with(cpp_schedule.default_schedule)
    n = len(kernel.outer)
    traces = [str(s.loops) for s in cpp_schedule.candidates(kernel)]
    if n >= 2:
        traces.append("fuse(o0, o1); parallel(o0+o1, 1); split(r, 8); vectorize(r.i)")
    assert len(traces) >= 4
    for t in traces:
        [k] = compile_with(lambda _, t=t: cpp_schedule.CppSchedule(loops=t))
        assert k.schedule.loops == t
