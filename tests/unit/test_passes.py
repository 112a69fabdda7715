"""Graph passes: each test builds a small graph, compares the IR text before and after the pass with the expected
text, and checks with the reference interpreter that the pass kept the results (fresh random inputs)."""
import pytest
import torch

from kiln import config
from kiln.ir.extern import build_extern
from kiln.ir.graph import ConstRef, Graph, GraphBuilder, Node, format_graph, verify
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.passes import pipeline
from kiln.passes.check import PassCheckError
from kiln.passes.cse import cse
from kiln.passes.dce import dce
from kiln.passes.fold import fold_constants
from kiln.passes.fold_affine import fold_affine
from kiln.passes.pipeline import run_pipeline
from kiln.passes.rewrite import RewriteLog, rewrite
from kiln.passes.simplify import simplify
from kiln.report import CompileReport

aten = torch.ops.aten
F32 = torch.float32
_gen = torch.Generator()


@pytest.fixture(autouse=True)
def _seed():
    _gen.manual_seed(1234)  # the same values whichever tests run


def randn(*shape) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen)


def inp(b: GraphBuilder, shape, dtype=F32) -> Node:
    return b.add(Op.INPUT, shape=shape, dtype=dtype, index=len(b.inputs))


def const(b: GraphBuilder, t: torch.Tensor) -> Node:
    return b.add(Op.CONSTANT, value=ConstRef(t))


def full(b: GraphBuilder, value, dtype=F32) -> Node:
    return b.add(Op.FULL, shape=(), dtype=dtype, value=value)


def random_inputs(g: Graph) -> list[torch.Tensor]:
    """Fresh random inputs, never zeros: floats ~ N(0, 1) shifted away from 0."""
    out = []
    for n in g.inputs:
        t = randn(*n.shape).double()
        out.append((t + t.sign() * 0.1).to(n.dtype))
    return out


def assert_same_results(before: Graph, after: Graph, inputs=None, rtol=1e-5, atol=1e-5):
    inputs = inputs if inputs is not None else random_inputs(before)
    want = interpret(before, inputs)
    got = interpret(after, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)


def run_pass(fn, g: Graph, before: str, after: str) -> Graph:
    assert format_graph(g) == before
    verify(g)
    out = fn(g)
    verify(out)
    assert format_graph(out) == after
    assert_same_results(g, out)
    return out


# ------------------------------------------------------------------------------------------------- DCE

def test_dce_removes_unused_nodes_keeps_inputs():
    b = GraphBuilder()
    x, unused = inp(b, (4,)), inp(b, (3,))
    e = b.add(Op.EXP, (x,))
    b.add(Op.SIN, (e,))                      # dead chain
    b.add(Op.NEG, (unused,))                 # dead, reads an input nobody else reads
    y = b.add(Op.NEG, (x,))
    g = b.finish([y])
    run_pass(dce, g, """\
graph(%in0: f32[4], %in1: f32[3]):
  %0 = exp(%in0) : f32[4]
  %1 = sin(%0) : f32[4]
  %2 = neg(%in1) : f32[3]
  %3 = neg(%in0) : f32[4]
  return (%3)""", """\
graph(%in0: f32[4], %in1: f32[3]):
  %0 = neg(%in0) : f32[4]
  return (%0)""")


def test_dce_keeps_everything_that_is_used_and_output_inputs():
    b = GraphBuilder()
    x = inp(b, (4,))
    e = b.add(Op.EXP, (x,))
    s = b.add(Op.ADD, (e, x))
    g = b.finish([s, x, e])
    out = dce(g)
    assert out.nodes == g.nodes and out.inputs == g.inputs and out.outputs == g.outputs


# ------------------------------------------------------------------------------------------------- CSE

def test_cse_merges_duplicate_exp():
    b = GraphBuilder()
    x = inp(b, (4,))
    e1 = b.add(Op.EXP, (x,))
    e2 = b.add(Op.EXP, (x,))
    s = b.add(Op.ADD, (e1, e2))
    # duplicates downstream of merged duplicates merge too
    t1 = b.add(Op.MUL, (s, e1))
    t2 = b.add(Op.MUL, (s, e2))
    g = b.finish([t1, t2])
    run_pass(cse, g, """\
graph(%in0: f32[4]):
  %0 = exp(%in0) : f32[4]
  %1 = exp(%in0) : f32[4]
  %2 = add(%0, %1) : f32[4]
  %3 = mul(%2, %0) : f32[4]
  %4 = mul(%2, %1) : f32[4]
  return (%3, %4)""", """\
graph(%in0: f32[4]):
  %0 = exp(%in0) : f32[4]
  %1 = add(%0, %0) : f32[4]
  %2 = mul(%1, %0) : f32[4]
  return (%2, %2)""")


def test_cse_keeps_distinct_attrs_constants_and_inputs():
    b = GraphBuilder()
    x, y = inp(b, (2, 3)), inp(b, (2, 3))
    s0 = b.add(Op.SUM, (x,), axes=(0,), keepdim=False)
    s1 = b.add(Op.SUM, (x,), axes=(1,), keepdim=False)
    c1, c2 = const(b, randn(2, 3)), const(b, randn(2, 3))   # distinct tensors: never merged
    f1, f2 = full(b, 2.0), full(b, 2.0)                     # equal scalars: merged
    ex, ey = b.add(Op.EXP, (x,)), b.add(Op.EXP, (y,))       # different inputs
    g = b.finish([s0, s1, c1, c2, f1, f2, ex, ey])
    run_pass(cse, g, """\
graph(%in0: f32[2, 3], %in1: f32[2, 3]):
  %0 = sum(%in0, axes=(0,), keepdim=False) : f32[3]
  %1 = sum(%in0, axes=(1,), keepdim=False) : f32[2]
  %2 = constant(value=const<(2, 3)>) : f32[2, 3]
  %3 = constant(value=const<(2, 3)>) : f32[2, 3]
  %4 = full(value=2.0) : f32[]
  %5 = full(value=2.0) : f32[]
  %6 = exp(%in0) : f32[2, 3]
  %7 = exp(%in1) : f32[2, 3]
  return (%0, %1, %2, %3, %4, %5, %6, %7)""", """\
graph(%in0: f32[2, 3], %in1: f32[2, 3]):
  %0 = sum(%in0, axes=(0,), keepdim=False) : f32[3]
  %1 = sum(%in0, axes=(1,), keepdim=False) : f32[2]
  %2 = constant(value=const<(2, 3)>) : f32[2, 3]
  %3 = constant(value=const<(2, 3)>) : f32[2, 3]
  %4 = full(value=2.0) : f32[]
  %5 = exp(%in0) : f32[2, 3]
  %6 = exp(%in1) : f32[2, 3]
  return (%0, %1, %2, %3, %4, %4, %5, %6)""")


def test_cse_merges_identical_externs():
    b = GraphBuilder()
    x, w = inp(b, (3, 4)), inp(b, (4, 5))
    m1 = build_extern(b, aten.mm.default, [x, w], {}, (3, 5), F32)
    m2 = build_extern(b, aten.mm.default, [x, w], {}, (3, 5), F32)
    g = b.finish([b.add(Op.SUB, (m1, m2))])
    out = run_pass(cse, g, """\
graph(%in0: f32[3, 4], %in1: f32[4, 5]):
  %0 = extern(%in0, %in1, target=aten.mm.default, out_index=None) : f32[3, 5]
  %1 = extern(%in0, %in1, target=aten.mm.default, out_index=None) : f32[3, 5]
  %2 = sub(%0, %1) : f32[3, 5]
  return (%2)""", """\
graph(%in0: f32[3, 4], %in1: f32[4, 5]):
  %0 = extern(%in0, %in1, target=aten.mm.default, out_index=None) : f32[3, 5]
  %1 = sub(%0, %0) : f32[3, 5]
  return (%1)""")
    assert len(out.nodes) == 4


def test_cse_does_not_merge_random_externs():
    b = GraphBuilder()
    x = inp(b, (64,))
    r1 = build_extern(b, aten.rand_like.default, [x], {}, (64,), F32)
    r2 = build_extern(b, aten.rand_like.default, [x], {}, (64,), F32)
    g = b.finish([b.add(Op.SUB, (r1, r2))])
    out = cse(g)
    assert sum(n.op is Op.EXTERN for n in out.nodes) == 2
    assert interpret(out, random_inputs(g))[0].abs().max() > 0


def test_cse_keeps_signed_zeros_apart():
    b = GraphBuilder()
    pz, nz = full(b, 0.0), full(b, -0.0)
    g = b.finish([b.add(Op.RECIPROCAL, (pz,)), b.add(Op.RECIPROCAL, (nz,))])
    out = cse(g)
    assert [t.item() for t in interpret(out, [])] == [float("inf"), float("-inf")]


# ---------------------------------------------------------------------------------------- constant folding

def _batch_norm_graph(c=8, shape=(2, 8, 5, 5)):
    """BatchNorm inference as the lowering emits it: scale and shift computed from CONSTANT weights."""
    b = GraphBuilder()
    x = inp(b, shape)
    var, w, mean, bias = (const(b, randn(c).abs() + 0.5), const(b, randn(c)), const(b, randn(c)),
                          const(b, randn(c)))
    eps = b.add(Op.EXPAND, (full(b, 1e-5),), shape=(c,))
    scale = b.add(Op.MUL, (b.add(Op.RSQRT, (b.add(Op.ADD, (var, eps)),)), w))
    shift = b.add(Op.ADD, (b.add(Op.MUL, (b.add(Op.NEG, (mean,)), scale)), bias))
    s4 = b.add(Op.EXPAND, (b.add(Op.RESHAPE, (scale,), shape=(c, 1, 1)),), shape=shape)
    t4 = b.add(Op.EXPAND, (b.add(Op.RESHAPE, (shift,), shape=(c, 1, 1)),), shape=shape)
    y = b.add(Op.ADD, (b.add(Op.MUL, (x, s4)), t4))
    return b.finish([y]), (var, w, mean, bias)


BN_BEFORE = """\
graph(%in0: f32[2, 8, 5, 5]):
  %0 = constant(value=const<(8,)>) : f32[8]
  %1 = constant(value=const<(8,)>) : f32[8]
  %2 = constant(value=const<(8,)>) : f32[8]
  %3 = constant(value=const<(8,)>) : f32[8]
  %4 = full(value=1e-05) : f32[]
  %5 = expand(%4, shape=(8,)) : f32[8]
  %6 = add(%0, %5) : f32[8]
  %7 = rsqrt(%6) : f32[8]
  %8 = mul(%7, %1) : f32[8]
  %9 = neg(%2) : f32[8]
  %10 = mul(%9, %8) : f32[8]
  %11 = add(%10, %3) : f32[8]
  %12 = reshape(%8, shape=(8, 1, 1)) : f32[8, 1, 1]
  %13 = expand(%12, shape=(2, 8, 5, 5)) : f32[2, 8, 5, 5]
  %14 = reshape(%11, shape=(8, 1, 1)) : f32[8, 1, 1]
  %15 = expand(%14, shape=(2, 8, 5, 5)) : f32[2, 8, 5, 5]
  %16 = mul(%in0, %13) : f32[2, 8, 5, 5]
  %17 = add(%16, %15) : f32[2, 8, 5, 5]
  return (%17)"""


def test_fold_batch_norm_scale_and_shift():
    g, (var, w, mean, bias) = _batch_norm_graph()
    out = run_pass(lambda g: dce(fold_constants(g)), g, BN_BEFORE, """\
graph(%in0: f32[2, 8, 5, 5]):
  %0 = constant(value=const<(8,)>) : f32[8]
  %1 = constant(value=const<(8,)>) : f32[8]
  %2 = reshape(%0, shape=(8, 1, 1)) : f32[8, 1, 1]
  %3 = expand(%2, shape=(2, 8, 5, 5)) : f32[2, 8, 5, 5]
  %4 = reshape(%1, shape=(8, 1, 1)) : f32[8, 1, 1]
  %5 = expand(%4, shape=(2, 8, 5, 5)) : f32[2, 8, 5, 5]
  %6 = mul(%in0, %3) : f32[2, 8, 5, 5]
  %7 = add(%6, %5) : f32[2, 8, 5, 5]
  return (%7)""")
    t = lambda n: n.attr("value").tensor  # noqa: E731
    scale = t(w) / torch.sqrt(t(var) + 1e-5)
    shift = t(bias) - t(mean) * scale
    torch.testing.assert_close(t(out.nodes[1]), scale)
    torch.testing.assert_close(t(out.nodes[2]), shift)


def test_fold_without_dce_leaves_dead_sources_and_logs():
    g, _ = _batch_norm_graph()
    log = RewriteLog()
    out = fold_constants(g, log)
    assert len(out.nodes) == len(g.nodes)
    # views of weights (the reshapes to [C, 1, 1]) stay views
    assert log.counts == {"folded add": 2, "folded mul": 2, "folded neg": 1, "folded rsqrt": 1}
    assert_same_results(g, out)


def test_fold_scalar_full_arithmetic():
    b = GraphBuilder()
    x = inp(b, (3, 4))
    six = b.add(Op.MUL, (full(b, 2.0), full(b, 3.0)))
    three = b.add(Op.SQRT, (b.add(Op.ADD, (six, full(b, 3.0))),))
    y = b.add(Op.MUL, (x, b.add(Op.EXPAND, (three,), shape=(3, 4))))
    g = b.finish([y])
    run_pass(lambda g: dce(fold_constants(g)), g, """\
graph(%in0: f32[3, 4]):
  %0 = full(value=2.0) : f32[]
  %1 = full(value=3.0) : f32[]
  %2 = mul(%0, %1) : f32[]
  %3 = full(value=3.0) : f32[]
  %4 = add(%2, %3) : f32[]
  %5 = sqrt(%4) : f32[]
  %6 = expand(%5, shape=(3, 4)) : f32[3, 4]
  %7 = mul(%in0, %6) : f32[3, 4]
  return (%7)""", """\
graph(%in0: f32[3, 4]):
  %0 = full(value=3.0) : f32[]
  %1 = expand(%0, shape=(3, 4)) : f32[3, 4]
  %2 = mul(%in0, %1) : f32[3, 4]
  return (%2)""")


def test_fold_scalar_integer_and_comparison():
    b = GraphBuilder()
    x = inp(b, (5,), torch.int64)
    seven, two = full(b, 7, torch.int64), full(b, 2, torch.int64)
    q = b.add(Op.FLOORDIV, (b.add(Op.NEG, (seven,)), two))        # -7 // 2 == -4 (python semantics)
    lt = b.add(Op.LT, (q, two))
    y = b.add(Op.ADD, (x, b.add(Op.EXPAND, (q,), shape=(5,))))
    g = b.finish([y, lt])
    out = dce(fold_constants(g))
    assert format_graph(out) == """\
graph(%in0: i64[5]):
  %0 = full(value=-4) : i64[]
  %1 = full(value=True) : b8[]
  %2 = expand(%0, shape=(5,)) : i64[5]
  %3 = add(%in0, %2) : i64[5]
  return (%3, %1)"""
    xi = torch.randint(1, 100, (5,), generator=_gen)
    assert_same_results(g, out, [xi])


def test_fold_does_not_materialise_expand_of_constant():
    b = GraphBuilder()
    x = inp(b, (3, 8))
    e = b.add(Op.EXPAND, (const(b, randn(8)),), shape=(3, 8))
    y = b.add(Op.ADD, (x, b.add(Op.NEG, (e,))))
    # a scalar broadcast stays symbolic too
    z = b.add(Op.MUL, (y, b.add(Op.EXPAND, (full(b, 2.0),), shape=(3, 8))))
    g = b.finish([z])
    text = """\
graph(%in0: f32[3, 8]):
  %0 = constant(value=const<(8,)>) : f32[8]
  %1 = expand(%0, shape=(3, 8)) : f32[3, 8]
  %2 = neg(%1) : f32[3, 8]
  %3 = add(%in0, %2) : f32[3, 8]
  %4 = full(value=2.0) : f32[]
  %5 = expand(%4, shape=(3, 8)) : f32[3, 8]
  %6 = mul(%3, %5) : f32[3, 8]
  return (%6)"""
    out = run_pass(fold_constants, g, text, text)
    assert out.nodes == g.nodes


def test_fold_keeps_views_of_weights_and_respects_max_numel():
    b = GraphBuilder()
    w = const(b, randn(6, 4))
    wt = b.add(Op.PERMUTE, (w,), dims=(1, 0))      # a transposed weight stays a view (GEMM layout)
    neg = b.add(Op.NEG, (w,))
    g = b.finish([wt, neg])
    assert fold_constants(g, max_numel=8).nodes == g.nodes
    out = fold_constants(g)
    assert format_graph(out) == """\
graph():
  %0 = constant(value=const<(6, 4)>) : f32[6, 4]
  %1 = permute(%0, dims=(1, 0)) : f32[4, 6]
  %2 = constant(value=const<(6, 4)>) : f32[6, 4]
  return (%1, %2)"""
    folded = out.outputs[1].attr("value").tensor
    torch.testing.assert_close(folded, -w.attr("value").tensor)
    assert_same_results(g, out)


def test_fold_does_not_fold_random_extern():
    b = GraphBuilder()
    w = const(b, randn(16))
    r = build_extern(b, aten.randn_like.default, [w], {}, (16,), F32)
    g = b.finish([r])
    assert fold_constants(g).outputs[0].op is Op.EXTERN


# --------------------------------------------------------------------------------------------- fold_affine

def _conv_affine_graph(with_bias=True, c=5):
    b = GraphBuilder()
    x = inp(b, (2, 3, 6, 6))
    w = const(b, randn(c, 3, 3, 3))
    bias = const(b, randn(c)) if with_bias else None
    conv = build_extern(b, aten.convolution.default, [x, w, bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1], {},
                        (2, c, 6, 6), F32)
    s = b.add(Op.EXPAND, (const(b, randn(c, 1, 1)),), shape=(2, c, 6, 6))
    t = b.add(Op.EXPAND, (const(b, randn(c, 1, 1)),), shape=(2, c, 6, 6))
    y = b.add(Op.ADD, (b.add(Op.MUL, (conv, s)), t))
    return b.finish([y])


def test_fold_affine_conv_scale_shift_into_weights():
    g = _conv_affine_graph()
    log = RewriteLog()
    out = run_pass(lambda g: dce(fold_affine(g, log)), g, """\
graph(%in0: f32[2, 3, 6, 6]):
  %0 = constant(value=const<(5, 3, 3, 3)>) : f32[5, 3, 3, 3]
  %1 = constant(value=const<(5,)>) : f32[5]
  %2 = extern(%in0, %0, %1, target=aten.convolution.default, out_index=None) : f32[2, 5, 6, 6]
  %3 = constant(value=const<(5, 1, 1)>) : f32[5, 1, 1]
  %4 = expand(%3, shape=(2, 5, 6, 6)) : f32[2, 5, 6, 6]
  %5 = constant(value=const<(5, 1, 1)>) : f32[5, 1, 1]
  %6 = expand(%5, shape=(2, 5, 6, 6)) : f32[2, 5, 6, 6]
  %7 = mul(%2, %4) : f32[2, 5, 6, 6]
  %8 = add(%7, %6) : f32[2, 5, 6, 6]
  return (%8)""", """\
graph(%in0: f32[2, 3, 6, 6]):
  %0 = constant(value=const<(5, 3, 3, 3)>) : f32[5, 3, 3, 3]
  %1 = constant(value=const<(5,)>) : f32[5]
  %2 = extern(%in0, %0, %1, target=aten.convolution.default, out_index=None) : f32[2, 5, 6, 6]
  return (%2)""")
    assert log.counts == {"scale folded into convolution": 1, "shift folded into convolution": 1}
    # the new weights are new constants, the old ones are untouched
    assert out.nodes[0].attr("value") is not g.nodes[1].attr("value")


def test_fold_affine_conv_without_bias():
    g = _conv_affine_graph(with_bias=False)
    out = dce(fold_affine(g))
    verify(out)
    assert [n.op for n in out.nodes] == [Op.INPUT, Op.CONSTANT, Op.CONSTANT, Op.EXTERN]
    assert_same_results(g, out, rtol=1e-4)


def test_fold_affine_mm_plus_shift_becomes_addmm():
    b = GraphBuilder()
    x = inp(b, (5, 6))
    mm = build_extern(b, aten.mm.default, [x, const(b, randn(6, 7))], {}, (5, 7), F32)
    y = b.add(Op.ADD, (b.add(Op.EXPAND, (const(b, randn(7)),), shape=(5, 7)), mm))  # shift on the left
    g = b.finish([y])
    run_pass(lambda g: dce(fold_affine(g)), g, """\
graph(%in0: f32[5, 6]):
  %0 = constant(value=const<(6, 7)>) : f32[6, 7]
  %1 = extern(%in0, %0, target=aten.mm.default, out_index=None) : f32[5, 7]
  %2 = constant(value=const<(7,)>) : f32[7]
  %3 = expand(%2, shape=(5, 7)) : f32[5, 7]
  %4 = add(%3, %1) : f32[5, 7]
  return (%4)""", """\
graph(%in0: f32[5, 6]):
  %0 = constant(value=const<(7,)>) : f32[7]
  %1 = constant(value=const<(6, 7)>) : f32[6, 7]
  %2 = extern(%0, %in0, %1, target=aten.addmm.default, out_index=None) : f32[5, 7]
  return (%2)""")


def test_fold_affine_addmm_scale_then_shift():
    b = GraphBuilder()
    x = inp(b, (5, 6))
    mm = build_extern(b, aten.addmm.default, [const(b, randn(7)), x, const(b, randn(6, 7))], {}, (5, 7), F32)
    y = b.add(Op.MUL, (mm, b.add(Op.EXPAND, (const(b, randn(1, 7)),), shape=(5, 7))))
    y = b.add(Op.ADD, (y, b.add(Op.EXPAND, (full(b, 0.75),), shape=(5, 7))))
    g = b.finish([y])
    out = dce(fold_affine(g))
    verify(out)
    assert format_graph(out) == """\
graph(%in0: f32[5, 6]):
  %0 = constant(value=const<(7,)>) : f32[7]
  %1 = constant(value=const<(6, 7)>) : f32[6, 7]
  %2 = extern(%0, %in0, %1, target=aten.addmm.default, out_index=None) : f32[5, 7]
  return (%2)"""
    assert_same_results(g, out)


def test_fold_affine_leaves_non_channel_constants_alone():
    b = GraphBuilder()
    x = inp(b, (5, 6))
    mm = build_extern(b, aten.mm.default, [x, const(b, randn(6, 5))], {}, (5, 5), F32)
    # varies along rows, not along the output channel: must not be folded
    rows = b.add(Op.MUL, (mm, b.add(Op.EXPAND, (const(b, randn(5, 1)),), shape=(5, 5))))
    # a non-affine consumer
    sq = b.add(Op.MUL, (rows, rows))
    g = b.finish([sq])
    out = fold_affine(g)
    assert format_graph(out) == format_graph(g) == """\
graph(%in0: f32[5, 6]):
  %0 = constant(value=const<(6, 5)>) : f32[6, 5]
  %1 = extern(%in0, %0, target=aten.mm.default, out_index=None) : f32[5, 5]
  %2 = constant(value=const<(5, 1)>) : f32[5, 1]
  %3 = expand(%2, shape=(5, 5)) : f32[5, 5]
  %4 = mul(%1, %3) : f32[5, 5]
  %5 = mul(%4, %4) : f32[5, 5]
  return (%5)"""
    assert_same_results(g, out)


def test_fold_affine_leaves_extern_with_two_users_alone():
    b = GraphBuilder()
    x = inp(b, (5, 6))
    mm = build_extern(b, aten.mm.default, [x, const(b, randn(6, 7))], {}, (5, 7), F32)
    shifted = b.add(Op.ADD, (mm, b.add(Op.EXPAND, (const(b, randn(7)),), shape=(5, 7))))
    g = b.finish([shifted, b.add(Op.EXP, (mm,))])
    out = fold_affine(g)
    assert format_graph(out) == format_graph(g)


def test_fold_affine_leaves_extern_that_is_an_output_alone():
    b = GraphBuilder()
    x = inp(b, (5, 6))
    mm = build_extern(b, aten.mm.default, [x, const(b, randn(6, 7))], {}, (5, 7), F32)
    shifted = b.add(Op.ADD, (mm, b.add(Op.EXPAND, (const(b, randn(7)),), shape=(5, 7))))
    g = b.finish([shifted, mm])
    out = dce(fold_affine(g))
    assert_same_results(g, out)
    assert sum(n.op is Op.EXTERN for n in out.nodes) == 1


def _scaled_heads_graph(second_reader=False):
    """A linear, split into heads (reshape, permute) and scaled by a scalar: attention's query."""
    b = GraphBuilder()
    x = inp(b, (6, 8))
    mm = build_extern(b, aten.addmm.default, [const(b, randn(8)), x, const(b, randn(8, 8))], {}, (6, 8), F32)
    split = b.add(Op.RESHAPE, (mm,), shape=(6, 2, 4))
    heads = b.add(Op.PERMUTE, (split,), dims=(1, 0, 2))
    y = b.add(Op.MUL, (heads, b.add(Op.EXPAND, (full(b, 0.3),), shape=(2, 6, 4))))
    return b.finish([y, b.add(Op.EXP, (split,))] if second_reader else [y])


def test_fold_affine_scalar_scale_through_views():
    g = _scaled_heads_graph()
    log = RewriteLog()
    run_pass(lambda g: dce(fold_affine(g, log)), g, """\
graph(%in0: f32[6, 8]):
  %0 = constant(value=const<(8,)>) : f32[8]
  %1 = constant(value=const<(8, 8)>) : f32[8, 8]
  %2 = extern(%0, %in0, %1, target=aten.addmm.default, out_index=None) : f32[6, 8]
  %3 = reshape(%2, shape=(6, 2, 4)) : f32[6, 2, 4]
  %4 = permute(%3, dims=(1, 0, 2)) : f32[2, 6, 4]
  %5 = full(value=0.3) : f32[]
  %6 = expand(%5, shape=(2, 6, 4)) : f32[2, 6, 4]
  %7 = mul(%4, %6) : f32[2, 6, 4]
  return (%7)""", """\
graph(%in0: f32[6, 8]):
  %0 = constant(value=const<(8,)>) : f32[8]
  %1 = constant(value=const<(8, 8)>) : f32[8, 8]
  %2 = extern(%0, %in0, %1, target=aten.addmm.default, out_index=None) : f32[6, 8]
  %3 = reshape(%2, shape=(6, 2, 4)) : f32[6, 2, 4]
  %4 = permute(%3, dims=(1, 0, 2)) : f32[2, 6, 4]
  return (%4)""")
    assert log.counts == {"scalar scale folded into addmm through views": 1}


def test_fold_affine_leaves_a_scale_whose_views_have_other_readers_alone():
    g = _scaled_heads_graph(second_reader=True)
    out = dce(fold_affine(g))
    assert sum(n.op is Op.MUL for n in out.nodes) == 1
    assert_same_results(g, out)


def test_fold_affine_accepts_reshaped_channel_constants():
    b = GraphBuilder()
    x = inp(b, (2, 3, 6, 6))
    conv = build_extern(b, aten.convolution.default,
                        [x, const(b, randn(5, 3, 3, 3)), const(b, randn(5)), [1, 1], [1, 1], [1, 1], False, [0, 0], 1],
                        {}, (2, 5, 6, 6), F32)
    s = b.add(Op.EXPAND, (b.add(Op.RESHAPE, (const(b, randn(5)),), shape=(5, 1, 1)),), shape=(2, 5, 6, 6))
    g = b.finish([b.add(Op.MUL, (conv, s))])
    out = dce(fold_affine(g))
    assert_same_results(g, out, rtol=1e-4)
    assert [n.op for n in out.nodes] == [Op.INPUT, Op.CONSTANT, Op.CONSTANT, Op.EXTERN]


def test_fold_affine_addmm_with_2d_bias():
    b = GraphBuilder()
    x = inp(b, (5, 6))
    mm = build_extern(b, aten.addmm.default, [const(b, randn(1, 7)), x, const(b, randn(6, 7))], {}, (5, 7), F32)
    y = b.add(Op.MUL, (mm, b.add(Op.EXPAND, (const(b, randn(7)),), shape=(5, 7))))
    g = b.finish([y])
    out = dce(fold_affine(g))
    verify(out)
    assert_same_results(g, out)


# ------------------------------------------------------------------------------------------------- simplify

def test_simplify_identities_and_view_chains():
    b = GraphBuilder()
    x, y = inp(b, (8, 4)), inp(b, (4, 8))
    r = b.add(Op.RESHAPE, (b.add(Op.RESHAPE, (b.add(Op.RESHAPE, (x,), shape=(4, 2, 4)),), shape=(32,)),),
              shape=(2, 16))
    p2 = b.add(Op.PERMUTE, (b.add(Op.PERMUTE, (y,), dims=(1, 0)),), dims=(1, 0))
    one = b.add(Op.EXPAND, (full(b, 1.0),), shape=(2, 16))
    zero = b.add(Op.EXPAND, (full(b, 0.0),), shape=(2, 16))
    m = b.add(Op.MUL, (r, one))                              # x * 1
    a = b.add(Op.ADD, (zero, m))                             # 0 + x
    s = b.add(Op.SUB, (a, zero))                             # x - 0
    d = b.add(Op.DIV, (s, one))                              # x / 1
    n = b.add(Op.NEG, (b.add(Op.NEG, (d,)),))                # -(-x)
    c = b.add(Op.CAST, (n,), dtype=F32)                      # cast to the same dtype
    z = b.add(Op.ADD, (c, b.add(Op.RESHAPE, (p2,), shape=(2, 16))))
    g = b.finish([z])
    run_pass(lambda g: dce(simplify(g)), g, """\
graph(%in0: f32[8, 4], %in1: f32[4, 8]):
  %0 = reshape(%in0, shape=(4, 2, 4)) : f32[4, 2, 4]
  %1 = reshape(%0, shape=(32,)) : f32[32]
  %2 = reshape(%1, shape=(2, 16)) : f32[2, 16]
  %3 = permute(%in1, dims=(1, 0)) : f32[8, 4]
  %4 = permute(%3, dims=(1, 0)) : f32[4, 8]
  %5 = full(value=1.0) : f32[]
  %6 = expand(%5, shape=(2, 16)) : f32[2, 16]
  %7 = full(value=0.0) : f32[]
  %8 = expand(%7, shape=(2, 16)) : f32[2, 16]
  %9 = mul(%2, %6) : f32[2, 16]
  %10 = add(%8, %9) : f32[2, 16]
  %11 = sub(%10, %8) : f32[2, 16]
  %12 = div(%11, %6) : f32[2, 16]
  %13 = neg(%12) : f32[2, 16]
  %14 = neg(%13) : f32[2, 16]
  %15 = cast(%14) : f32[2, 16]
  %16 = reshape(%4, shape=(2, 16)) : f32[2, 16]
  %17 = add(%15, %16) : f32[2, 16]
  return (%17)""", """\
graph(%in0: f32[8, 4], %in1: f32[4, 8]):
  %0 = reshape(%in0, shape=(2, 16)) : f32[2, 16]
  %1 = reshape(%in1, shape=(2, 16)) : f32[2, 16]
  %2 = add(%0, %1) : f32[2, 16]
  return (%2)""")


def test_simplify_boolean_mask_round_trips():
    """A boolean mask made additive (where(m, -inf, 0)) and compared back is the mask; ``not not m`` is ``m``;
    ``where(not m, x, y)`` swaps its branches; a comparison both branches answer alike is a constant, with each
    scalar rounded to its node's dtype (bf16's 0.1 is not f32's 0.1)."""
    b = GraphBuilder()
    m = inp(b, (2, 6), torch.bool)
    ninf, zero = (b.add(Op.EXPAND, (full(b, v),), shape=(2, 6)) for v in (float("-inf"), 0.0))
    additive = b.add(Op.WHERE, (m, ninf, zero))
    back = b.add(Op.LOGICAL_NOT, (b.add(Op.NE, (additive, zero)),))
    again = b.add(Op.WHERE, (back, zero, ninf))                       # == additive
    twice = b.add(Op.LOGICAL_NOT, (b.add(Op.LOGICAL_NOT, (m,)),))     # == m
    tenth = b.add(Op.EXPAND, (full(b, 0.1, torch.bfloat16),), shape=(2, 6))
    nought = b.add(Op.EXPAND, (full(b, 0.0, torch.bfloat16),), shape=(2, 6))
    never = b.add(Op.EQ, (b.add(Op.WHERE, (m, tenth, nought)), b.add(Op.EXPAND, (full(b, 0.1),), shape=(2, 6))))
    g = b.finish([again, twice, never])
    out = cse(dce(simplify(g)))
    assert format_graph(out) == """\
graph(%in0: b8[2, 6]):
  %0 = full(value=-inf) : f32[]
  %1 = expand(%0, shape=(2, 6)) : f32[2, 6]
  %2 = full(value=0.0) : f32[]
  %3 = expand(%2, shape=(2, 6)) : f32[2, 6]
  %4 = where(%in0, %1, %3) : f32[2, 6]
  %5 = full(value=False) : b8[]
  %6 = expand(%5, shape=(2, 6)) : b8[2, 6]
  return (%4, %in0, %6)"""
    mask = torch.rand(2, 6, generator=_gen) < 0.5
    assert_same_results(g, out, [mask])


def test_simplify_permute_chain_composes():
    b = GraphBuilder()
    x = inp(b, (2, 3, 4))
    p = b.add(Op.PERMUTE, (b.add(Op.PERMUTE, (x,), dims=(1, 2, 0)),), dims=(2, 1, 0))
    e = b.add(Op.EXPAND, (b.add(Op.EXPAND, (b.add(Op.RESHAPE, (x,), shape=(1, 2, 3, 4)),), shape=(1, 2, 3, 4)),),
              shape=(5, 2, 3, 4))
    g = b.finish([p, e])
    run_pass(lambda g: dce(simplify(g)), g, """\
graph(%in0: f32[2, 3, 4]):
  %0 = permute(%in0, dims=(1, 2, 0)) : f32[3, 4, 2]
  %1 = permute(%0, dims=(2, 1, 0)) : f32[2, 4, 3]
  %2 = reshape(%in0, shape=(1, 2, 3, 4)) : f32[1, 2, 3, 4]
  %3 = expand(%2, shape=(1, 2, 3, 4)) : f32[1, 2, 3, 4]
  %4 = expand(%3, shape=(5, 2, 3, 4)) : f32[5, 2, 3, 4]
  return (%1, %4)""", """\
graph(%in0: f32[2, 3, 4]):
  %0 = permute(%in0, dims=(0, 2, 1)) : f32[2, 4, 3]
  %1 = reshape(%in0, shape=(1, 2, 3, 4)) : f32[1, 2, 3, 4]
  %2 = expand(%1, shape=(5, 2, 3, 4)) : f32[5, 2, 3, 4]
  return (%0, %2)""")


def test_simplify_keeps_non_identities():
    b = GraphBuilder()
    x, i = inp(b, (4,)), inp(b, (4,), torch.int64)
    zero = b.add(Op.EXPAND, (full(b, 0.0),), shape=(4,))
    two = b.add(Op.EXPAND, (full(b, 2.0),), shape=(4,))
    izero = b.add(Op.EXPAND, (full(b, 0, torch.int64),), shape=(4,))
    ys = [b.add(Op.SUB, (zero, x)),                 # 0 - x is not x
          b.add(Op.MUL, (x, two)),                  # x * 2
          b.add(Op.DIV, (two, x)),                  # 2 / x
          b.add(Op.MUL, (x, zero))]                 # x * 0 is not folded (NaN/inf inputs)
    g = b.finish(ys + [b.add(Op.ADD, (i, izero))])
    out = simplify(g)
    assert format_graph(out) == format_graph(g)
    assert_same_results(g, out, [randn(4) + 3.0, torch.randint(1, 9, (4,), generator=_gen)])


def test_simplify_canonicalises_scalar_broadcasts():
    b = GraphBuilder()
    x = inp(b, (2, 3))
    f = b.add(Op.RESHAPE, (b.add(Op.EXPAND, (full(b, 2.5),), shape=(6,)),), shape=(2, 3))
    g = b.finish([b.add(Op.MUL, (x, f))])
    run_pass(lambda g: dce(simplify(g)), g, """\
graph(%in0: f32[2, 3]):
  %0 = full(value=2.5) : f32[]
  %1 = expand(%0, shape=(6,)) : f32[6]
  %2 = reshape(%1, shape=(2, 3)) : f32[2, 3]
  %3 = mul(%in0, %2) : f32[2, 3]
  return (%3)""", """\
graph(%in0: f32[2, 3]):
  %0 = full(value=2.5) : f32[]
  %1 = expand(%0, shape=(2, 3)) : f32[2, 3]
  %2 = mul(%in0, %1) : f32[2, 3]
  return (%2)""")


def test_simplify_reshape_round_trip_disappears_in_one_run():
    b = GraphBuilder()
    x = inp(b, (8, 4))
    r = b.add(Op.RESHAPE, (b.add(Op.RESHAPE, (x,), shape=(32,)),), shape=(8, 4))
    g = b.finish([b.add(Op.EXP, (r,))])
    out = dce(simplify(g))
    assert [n.op for n in out.nodes] == [Op.INPUT, Op.EXP]


# ------------------------------------------------------------------------------------------------- pipeline

def _conv_bn_graph():
    """conv -> BatchNorm (as lowered) -> relu, with a duplicated exp branch and a dead node."""
    b = GraphBuilder()
    x = inp(b, (2, 3, 6, 6))
    c = 5
    conv = build_extern(b, aten.convolution.default,
                        [x, const(b, randn(c, 3, 3, 3)), const(b, randn(c)), [1, 1], [1, 1], [1, 1], False, [0, 0], 1],
                        {}, (2, c, 6, 6), F32)
    var, w, mean, bias = (const(b, randn(c).abs() + 0.5), const(b, randn(c)), const(b, randn(c)),
                          const(b, randn(c)))
    eps = b.add(Op.EXPAND, (full(b, 1e-5),), shape=(c,))
    scale = b.add(Op.MUL, (b.add(Op.RSQRT, (b.add(Op.ADD, (var, eps)),)), w))
    shift = b.add(Op.ADD, (b.add(Op.MUL, (b.add(Op.NEG, (mean,)), scale)), bias))
    shape = (2, c, 6, 6)
    s4 = b.add(Op.EXPAND, (b.add(Op.RESHAPE, (scale,), shape=(c, 1, 1)),), shape=shape)
    t4 = b.add(Op.EXPAND, (b.add(Op.RESHAPE, (shift,), shape=(c, 1, 1)),), shape=shape)
    y = b.add(Op.RELU, (b.add(Op.ADD, (b.add(Op.MUL, (conv, s4)), t4)),))
    e1, e2 = b.add(Op.EXP, (x,)), b.add(Op.EXP, (x,))
    b.add(Op.SIN, (x,))
    return b.finish([y, b.add(Op.ADD, (e1, e2))])


def test_run_pipeline_with_check_on_valid_graph():
    g = _conv_bn_graph()
    report = CompileReport(name="t")
    with config.scope(constant_folding=True):
        out = run_pipeline(g, report, check=True)
    verify(out)
    assert [p.name for p in report.passes] == [name for name, _ in pipeline.PIPELINE]
    text = format_graph(out)
    assert "sin" not in text                               # dead code gone
    assert text.count("exp(") == 1                         # duplicate exp merged
    assert "rsqrt" not in text and "neg" not in text       # BN scale/shift folded to constants
    assert_same_results(g, out, rtol=1e-4, atol=1e-4)


def test_run_pipeline_folds_batch_norm_into_conv():
    g = _conv_bn_graph()
    with config.scope(constant_folding=True, library_selection=False):
        out = run_pipeline(g, check=True)
    assert format_graph(out) == """\
graph(%in0: f32[2, 3, 6, 6]):
  %0 = constant(value=const<(5, 3, 3, 3)>) : f32[5, 3, 3, 3]
  %1 = constant(value=const<(5,)>) : f32[5]
  %2 = extern(%in0, %0, %1, target=aten.convolution.default, out_index=None) : f32[2, 5, 6, 6]
  %3 = relu(%2) : f32[2, 5, 6, 6]
  %4 = exp(%in0) : f32[2, 3, 6, 6]
  %5 = add(%4, %4) : f32[2, 3, 6, 6]
  return (%3, %5)"""
    assert_same_results(g, out, rtol=1e-4, atol=1e-4)


def _negate_first_exp(g: Graph, log: RewriteLog) -> Graph:
    done = []

    def rule(n, inputs, b):
        if n.op is Op.EXP and not done:
            done.append(n)
            return b.add(Op.NEG, inputs)
        return None
    return rewrite(g, rule)


def test_checker_names_the_pass_that_breaks_numerics():
    broken = list(pipeline.PIPELINE)
    broken.insert(3, ("deliberately_wrong", _negate_first_exp))
    g = _conv_bn_graph()
    with pytest.raises(PassCheckError, match="deliberately_wrong"):
        run_pipeline(g, check=True, passes=broken)
    # without the check the wrong pass goes unnoticed
    run_pipeline(g, check=False, passes=broken)


def test_checker_message_names_pass_and_output():
    def drop_relu(g, log):
        return rewrite(g, lambda n, inputs, b: inputs[0] if n.op is Op.RELU else None)
    with pytest.raises(PassCheckError, match="'drop_relu' changed output 0"):
        run_pipeline(_conv_bn_graph(), check=True, passes=[("dce", lambda g, log: dce(g)), ("drop_relu", drop_relu)])


def test_prepack_conv_bakes_the_weight_and_keeps_results():
    from kiln.library.conv.prepack import available, prepack_conv
    if not available():
        pytest.skip("oneDNN not available in this torch build")
    g = _conv_bn_graph()
    log = RewriteLog()
    out = prepack_conv(g, log)
    assert log.counts == {"convolution -> oneDNN with prepacked weight": 1}
    text = format_graph(out)
    assert "mkldnn._convolution_pointwise" in text and "aten.convolution" not in text
    assert_same_results(g, out, rtol=1e-4, atol=1e-4)


def test_split_conv_bias_moves_the_bias_into_an_add():
    from kiln.library.conv.split_bias import split_conv_bias
    g = _conv_bn_graph()
    log = RewriteLog()
    out = split_conv_bias(g, log, devices=("cpu",))  # the pass is for CUDA weights; the IR is the same
    assert log.counts == {"convolution bias moved to the next kernel": 1}
    conv = next(n for n in out.nodes if n.op is Op.EXTERN)
    assert len(conv.inputs) == 2  # x and the weight: no bias operand
    assert_same_results(g, out, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------- order

def _downsample_block(ds_channels=8):
    """x = relu(in); main = relu(conv2(relu(conv1(x)))); out = main + conv_ds(x), in capture's order (the 1x1
    downsample convolution after the main branch)."""
    b = GraphBuilder()
    x = b.add(Op.RELU, (inp(b, (1, 4, 8, 8)),))

    def conv(src, cin, cout, k, stride):
        w = const(b, randn(cout, cin, k, k))
        return build_extern(b, aten.convolution.default, [src, w, None, [stride, stride], [k // 2, k // 2],
                                                          [1, 1], False, [0, 0], 1], {},
                            (1, cout, 4, 4), F32)

    h = b.add(Op.RELU, (conv(x, 4, 8, 3, 2),))
    main = b.add(Op.RELU, (conv(h, 8, 8, 3, 1),))
    ds = conv(x, 4, ds_channels, 1, 2)
    if ds_channels != 8:
        ds = b.add(Op.SLICE, (ds,), shape=(1, 8, 4, 4), dim=1, start=0, step=1)
    return b.finish([b.add(Op.ADD, (main, ds))])


def test_order_runs_the_last_reader_of_a_large_value_before_the_next_library_call():
    from kiln.passes.order import hoist_last_readers
    g = _downsample_block()
    log = RewriteLog()
    out = hoist_last_readers(g, log)
    verify(out)
    conv1, conv2, ds = [n for n in g.nodes if n.op is Op.EXTERN]
    # conv1(x), then the downsample (x's last reader) before conv2: x dies before conv2 runs
    assert [n for n in out.nodes if n.op is Op.EXTERN] == [conv1, ds, conv2]
    assert log.counts == {"aten.convolution.default moved up: its input dies earlier": 1}
    assert_same_results(g, out)
    assert format_graph(hoist_last_readers(out)) == format_graph(out)  # nothing left to move


def test_order_keeps_a_call_whose_result_is_larger_than_what_it_frees():
    from kiln.passes.order import hoist_last_readers
    g = _downsample_block(ds_channels=32)  # the downsample's result (512 values) outweighs x (256)
    assert format_graph(hoist_last_readers(g)) == format_graph(g)


def test_fusion_recomputes_values_computed_from_weights_alone():
    """Unfolded BatchNorm (GPU default mode holds no folded constants): the scale ``w * rsqrt(var + eps)``
    inlined into a producer that a max-pool reads 4 times must not make that producer a stored kernel."""
    from kiln.schedule.fuse import decide_realized
    b = GraphBuilder()
    x = inp(b, (1, 4, 8, 8))
    mean, var, w, bias = (const(b, randn(4)) for _ in range(4))
    eps = b.add(Op.EXPAND, (full(b, 1e-5),), shape=(4,))
    scale = b.add(Op.MUL, (b.add(Op.RSQRT, (b.add(Op.ADD, (b.add(Op.ABS, (var,)), eps)),)), w))
    shift = b.add(Op.ADD, (b.add(Op.MUL, (b.add(Op.NEG, (mean,)), scale)), bias))

    def per_channel(v):
        return b.add(Op.EXPAND, (b.add(Op.RESHAPE, (v,), shape=(4, 1, 1)),), shape=(1, 4, 8, 8))

    y = b.add(Op.RELU, (b.add(Op.ADD, (b.add(Op.MUL, (x, per_channel(scale))), per_channel(shift))),))
    rows = [b.add(Op.SLICE, (y,), shape=(1, 4, 4, 8), dim=2, start=i, step=2) for i in (0, 1)]
    corners = [b.add(Op.SLICE, (r,), shape=(1, 4, 4, 4), dim=3, start=j, step=2) for r in rows for j in (0, 1)]
    m = b.add(Op.MAXIMUM, (b.add(Op.MAXIMUM, corners[:2]), b.add(Op.MAXIMUM, corners[2:])))
    g = b.finish([m])
    realized, _ = decide_realized(g)
    assert y not in realized and scale not in realized


def test_fusion_stores_a_residual_stream_that_consumers_would_reread():
    """x_k = x_(k-1) + branch_k, each x_k read by a row reduction (a LayerNorm's mean) and the next add.  Inlined,
    the last mean would load every branch; the stream is stored once recomputing it loads more than storing it
    ((u - 1)(L - 1) > 2: two consumers, four full-size loads), and a stored x_k starts the count again."""
    from kiln.schedule.fuse import decide_realized
    b = GraphBuilder()
    xs = [inp(b, (8, 64))]
    branches = [inp(b, (8, 64)) for _ in range(6)]
    means = []
    for br in branches:
        xs.append(b.add(Op.ADD, (xs[-1], br)))
        means.append(b.add(Op.SUM, (xs[-1],), axes=(1,), keepdim=True))
    g = b.finish(means + [xs[-1]])
    realized, _ = decide_realized(g)
    # x1 loads 2 inputs, x2 3 (recomputed twice: 6 loads against 3 + 1 + 2), x3 4: stored; x4, x5 load 2 and 3
    assert [x in realized for x in xs[1:]] == [False, False, True, False, False, True], \
        [x in realized for x in xs[1:]]
    b2 = GraphBuilder()  # a per-row value read by every element is not a load that counts
    x = inp(b2, (8, 64))
    row = inp(b2, (8, 1))
    y = b2.add(Op.ADD, (b2.add(Op.ADD, (x, b2.add(Op.EXPAND, (row,), shape=(8, 64)))), b2.add(Op.EXPAND, (row,),
                                                                                               shape=(8, 64))))
    g2 = b2.finish([b2.add(Op.SUM, (y,), axes=(1,), keepdim=True), b2.add(Op.MUL, (y, y))])
    assert y not in decide_realized(g2)[0]


def test_fusion_counts_readers_through_views():
    """OPT's residual is ``(x + branch).view(shape)``: the add's one user is a view, read by the next add and a
    LayerNorm's mean.  Counted through the view, the stream is stored as in the test above; counted by direct
    users it was recomputed everywhere (layer 12's LayerNorm read all 24 earlier branch outputs)."""
    from kiln.schedule.fuse import decide_realized
    b = GraphBuilder()
    xs = [inp(b, (8, 64))]
    branches = [inp(b, (8, 64)) for _ in range(6)]
    means = []
    for br in branches:
        flat = b.add(Op.ADD, (xs[-1], br))
        xs.append(b.add(Op.RESHAPE, (flat,), shape=(8, 64)))
        means.append(b.add(Op.SUM, (xs[-1],), axes=(1,), keepdim=True))
    g = b.finish(means + [xs[-1]])
    realized, _ = decide_realized(g)
    adds = [x.inputs[0] for x in xs[1:]]
    # (the last add's view is the graph output, stored as such)
    assert [a in realized for a in adds[:5]] == [False, False, True, False, False], [a in realized for a in adds]


# ------------------------------------------------------------------------------------------------ fold_pad

def _padded_conv(pads, value=0.0, padding=(1, 0)):
    b = GraphBuilder()
    x = inp(b, (2, 3, 6, 7))
    shape = tuple(s + a + c for s, (a, c) in zip((2, 3, 6, 7), pads))
    n = shape[0]
    p = b.add(Op.PAD, (x,), shape=shape, pads=tuple(pads), value=value)
    w = const(b, randn(4, 3, 3, 3))
    ho, wo = (shape[2] + 2 * padding[0] - 3) // 2 + 1, shape[3] + 2 * padding[1] - 2
    conv = build_extern(b, aten.convolution.default, [p, w, None, [2, 1], list(padding), [1, 1], False, [0, 0], 1],
                        {}, (n, 4, ho, wo), F32)
    return b.finish([conv])


def test_fold_pad_symmetric_zero_pad_becomes_convolution_padding():
    from kiln.passes.fold_pad import fold_pad
    log = RewriteLog()
    out = run_pass(lambda g: dce(fold_pad(g, log)), _padded_conv(((0, 0), (0, 0), (1, 1), (2, 2))), """\
graph(%in0: f32[2, 3, 6, 7]):
  %0 = pad(%in0, pads=((0, 0), (0, 0), (1, 1), (2, 2)), value=0.0) : f32[2, 3, 8, 11]
  %1 = constant(value=const<(4, 3, 3, 3)>) : f32[4, 3, 3, 3]
  %2 = extern(%0, %1, target=aten.convolution.default, out_index=None) : f32[2, 4, 4, 9]
  return (%2)""", """\
graph(%in0: f32[2, 3, 6, 7]):
  %0 = constant(value=const<(4, 3, 3, 3)>) : f32[4, 3, 3, 3]
  %1 = extern(%in0, %0, target=aten.convolution.default, out_index=None) : f32[2, 4, 4, 9]
  return (%1)""")
    from kiln.ir.extern import extern_args
    assert extern_args(out.outputs[0])[0][4] == [2, 2]  # padding (1, 0) + the pad's (1, 2)
    assert log.counts == {"zero pad -> convolution padding": 1}


@pytest.mark.parametrize("pads,value", [
    (((0, 0), (0, 0), (0, 1), (0, 1)), 0.0),   # TensorFlow's stride-2 "same": more after than before
    (((0, 0), (0, 0), (1, 1), (1, 1)), 1.0),   # not zeros
    (((1, 1), (0, 0), (1, 1), (1, 1)), 0.0),   # pads the batch too
    (((0, 0), (0, 0), (-1, -1), (0, 0)), 0.0),  # a crop
])
def test_fold_pad_keeps_pads_convolution_padding_cannot_say(pads, value):
    from kiln.passes.fold_pad import fold_pad
    if any(a < 0 for a, _ in pads):
        g = _padded_conv(pads, value, padding=(1, 1))
    else:
        g = _padded_conv(pads, value)
    log = RewriteLog()
    out = fold_pad(g, log)
    assert format_graph(out) == format_graph(g) and not log.counts
