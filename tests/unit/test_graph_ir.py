"""The graph IR: builder typing rules, the stable printer, verify(), and the reference interpreter vs torch."""
import pytest
import torch

from kiln.ir.graph import ConstRef, Graph, GraphBuilder, Node, format_graph, verify
from kiln.ir.interp import interpret
from kiln.ir.ops import Op

F32 = torch.float32


def inp(b: GraphBuilder, shape, dtype=F32) -> Node:
    return b.add(Op.INPUT, shape=shape, dtype=dtype, index=len(b.inputs))


def softmax_graph() -> Graph:
    b = GraphBuilder()
    x = inp(b, (4, 8))
    m = b.add(Op.AMAX, (x,), axes=(1,), keepdim=True)
    e = b.add(Op.EXP, (b.add(Op.SUB, (x, b.add(Op.EXPAND, (m,), shape=(4, 8)))),))
    s = b.add(Op.SUM, (e,), axes=(1,), keepdim=True)
    y = b.add(Op.DIV, (e, b.add(Op.EXPAND, (s,), shape=(4, 8))))
    return b.finish([y])


SOFTMAX_TEXT = """\
graph(%in0: f32[4, 8]):
  %0 = amax(%in0, axes=(1,), keepdim=True) : f32[4, 1]
  %1 = expand(%0, shape=(4, 8)) : f32[4, 8]
  %2 = sub(%in0, %1) : f32[4, 8]
  %3 = exp(%2) : f32[4, 8]
  %4 = sum(%3, axes=(1,), keepdim=True) : f32[4, 1]
  %5 = expand(%4, shape=(4, 8)) : f32[4, 8]
  %6 = div(%3, %5) : f32[4, 8]
  return (%6)"""


def test_printer_is_stable():
    g = softmax_graph()
    assert format_graph(g) == SOFTMAX_TEXT
    assert str(g) == SOFTMAX_TEXT
    # node ids are global counters, the text does not depend on them
    assert format_graph(softmax_graph()) == SOFTMAX_TEXT


def test_printer_attrs_types_and_multiple_inputs_outputs():
    b = GraphBuilder()
    x = inp(b, (2, 3))
    i = inp(b, (5,), torch.int64)
    w = b.add(Op.CONSTANT, value=ConstRef(torch.arange(6.0).reshape(3, 2)))
    k = b.add(Op.CONSTANT, value=ConstRef(torch.tensor([1.5, -2.0])))
    half = b.add(Op.FULL, shape=(), dtype=F32, value=0.5)
    c = b.add(Op.CAST, (i,), dtype=torch.float64)
    p = b.add(Op.PERMUTE, (x,), dims=(1, 0))
    r = b.add(Op.RESHAPE, (p,), shape=(6,))
    lt = b.add(Op.LT, (x, b.add(Op.EXPAND, (half,), shape=(2, 3))))
    sl = b.add(Op.SLICE, (r,), shape=(3,), dim=0, start=1, step=2)
    io = b.add(Op.IOTA, shape=(5,), dtype=torch.int64, start=2, step=3)
    g = b.finish([c, lt, sl, w, k, io])
    assert format_graph(g) == """\
graph(%in0: f32[2, 3], %in1: i64[5]):
  %0 = constant(value=const<(3, 2)>) : f32[3, 2]
  %1 = constant(value=const([1.5, -2.0])) : f32[2]
  %2 = full(value=0.5) : f32[]
  %3 = cast(%in1) : f64[5]
  %4 = permute(%in0, dims=(1, 0)) : f32[3, 2]
  %5 = reshape(%4, shape=(6,)) : f32[6]
  %6 = expand(%2, shape=(2, 3)) : f32[2, 3]
  %7 = lt(%in0, %6) : b8[2, 3]
  %8 = slice(%5, dim=0, start=1, step=2) : f32[3]
  %9 = iota(start=2, step=3) : i64[5]
  return (%3, %7, %8, %0, %1, %9)"""
    verify(g)


def test_builder_infers_types():
    b = GraphBuilder()
    x = inp(b, (2, 3, 4))
    assert b.add(Op.SUM, (x,), axes=(0, 2), keepdim=False).shape == (3,)
    assert b.add(Op.SUM, (x,), axes=(1,), keepdim=True).shape == (2, 1, 4)
    am = b.add(Op.ARGMAX, (x,), axes=(2,), keepdim=False)
    assert (am.shape, am.dtype) == ((2, 3), torch.int64)
    assert b.add(Op.PERMUTE, (x,), dims=(2, 0, 1)).shape == (4, 2, 3)
    assert b.add(Op.EXPAND, (x,), shape=(5, 2, 3, 4)).shape == (5, 2, 3, 4)
    assert b.add(Op.GT, (x, x)).dtype == torch.bool
    assert b.add(Op.CAT, (x, x), dim=1).shape == (2, 6, 4)
    with pytest.raises(ValueError, match="broadcast"):
        b.add(Op.EXPAND, (x,), shape=(2, 5, 4))


def test_elementwise_operands_of_different_shape_are_rejected():
    b = GraphBuilder()
    x, y = inp(b, (4, 8)), inp(b, (4, 1))
    with pytest.raises(ValueError, match="one shape"):
        b.add(Op.ADD, (x, y))
    with pytest.raises(ValueError, match="one shape"):
        b.add(Op.WHERE, (b.add(Op.GT, (x, x)), x, y))


def test_elementwise_operands_of_different_dtype_are_rejected():
    b = GraphBuilder()
    x, y = inp(b, (4,)), inp(b, (4,), torch.float64)
    with pytest.raises(ValueError, match="one dtype"):
        b.add(Op.MUL, (x, y))


def test_verify_accepts_valid_graph():
    verify(softmax_graph())


def test_verify_rejects_use_before_definition():
    g = softmax_graph()
    # swap the expand and the sub that uses it
    nodes = list(g.nodes)
    nodes[2], nodes[3] = nodes[3], nodes[2]
    with pytest.raises(AssertionError, match="before it is defined"):
        verify(Graph(nodes, g.inputs, g.outputs))


def test_verify_rejects_node_from_another_graph_and_missing_output():
    g = softmax_graph()
    other = softmax_graph()
    with pytest.raises(AssertionError, match="before it is defined"):
        verify(Graph(g.nodes + [other.nodes[-1]], g.inputs, g.outputs))
    with pytest.raises(AssertionError, match="not in the graph"):
        verify(Graph(g.nodes, g.inputs, other.outputs))


def test_verify_rejects_hand_built_elementwise_with_mismatched_shapes():
    b = GraphBuilder()
    x, y = inp(b, (4, 8)), inp(b, (4, 1))
    bad = Node(Op.ADD, (x, y), {}, (4, 8), F32)  # bypasses GraphBuilder.add, which would refuse it
    with pytest.raises(ValueError, match="one shape"):
        verify(Graph(b.nodes + [bad], b.inputs, [bad]))


def test_verify_rejects_wrong_recorded_type():
    b = GraphBuilder()
    x = inp(b, (4, 8))
    y = b.add(Op.EXP, (x,))
    bad = Node(Op.NEG, (y,), {}, (8, 4), F32)  # built by hand, bypassing the builder's inference
    with pytest.raises(AssertionError, match="rules give"):
        verify(Graph(b.nodes + [bad], b.inputs, [bad]))


# ------------------------------------------------------------------------------------------- interpreter

def _run(build, *inputs):
    b = GraphBuilder()
    nodes = [inp(b, tuple(t.shape), t.dtype) for t in inputs]
    out = build(b, *nodes)
    g = b.finish(out if isinstance(out, list) else [out])
    verify(g)
    return interpret(g, list(inputs))


def test_interp_matches_torch():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, generator=gen)
    y = torch.randn(3, 5, generator=gen)

    def build(b, x, y):
        sig = b.add(Op.SIGMOID, (x,))
        mx = b.add(Op.MAXIMUM, (x, y))
        tot = b.add(Op.SUM, (b.add(Op.MUL, (sig, mx)),), axes=(1,), keepdim=False)
        perm = b.add(Op.PERMUTE, (x,), dims=(1, 0))
        sl = b.add(Op.SLICE, (perm,), shape=(2, 3), dim=0, start=1, step=2)
        pad = b.add(Op.PAD, (x,), shape=(3, 8), pads=((0, 0), (1, 2)), value=-1.5)
        cat = b.add(Op.CAT, (x, y), dim=0)
        fd = b.add(Op.FLOORDIV, (x, y))
        rem = b.add(Op.REM, (x, y))
        wh = b.add(Op.WHERE, (b.add(Op.GT, (x, y)), x, y))
        am = b.add(Op.ARGMAX, (x,), axes=(1,), keepdim=True)
        return [tot, sl, pad, cat, fd, rem, wh, am]

    got = _run(build, x, y)
    want = [(torch.sigmoid(x) * torch.maximum(x, y)).sum(1), x.t()[1::2],
            torch.nn.functional.pad(x, (1, 2), value=-1.5), torch.cat([x, y]),
            torch.div(x, y, rounding_mode="floor"), torch.remainder(x, y), torch.where(x > y, x, y),
            x.argmax(1, keepdim=True)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)


def test_interp_integer_ops_and_indirect():
    gen = torch.Generator().manual_seed(2)
    a = torch.randint(-20, 20, (4, 6), generator=gen)
    d = torch.randint(1, 7, (4, 6), generator=gen) * torch.where(torch.rand(4, 6, generator=gen) > 0.5, 1, -1)
    idx = torch.randint(0, 4, (2, 3), generator=gen)
    gidx = torch.randint(0, 6, (4, 2), generator=gen)

    def build(b, a, d, idx, gidx):
        return [b.add(Op.DIV, (a, d)), b.add(Op.FLOORDIV, (a, d)), b.add(Op.REM, (a, d)), b.add(Op.FMOD, (a, d)),
                b.add(Op.TAKE, (a, idx), dim=0), b.add(Op.GATHER, (a, gidx), dim=1),
                b.add(Op.PROD, (d,), axes=(0, 1), keepdim=False),
                b.add(Op.IOTA, shape=(5,), dtype=torch.int64, start=3, step=-2)]

    got = _run(build, a, d, idx, gidx)
    want = [torch.div(a, d, rounding_mode="trunc"), torch.div(a, d, rounding_mode="floor"), torch.remainder(a, d),
            torch.fmod(a, d), a[idx], torch.gather(a, 1, gidx), d.prod(), torch.arange(5) * -2 + 3]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_interp_rejects_wrong_input_count():
    with pytest.raises(ValueError, match="takes 1 inputs"):
        interpret(softmax_graph(), [])


def test_interp_softmax():
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(interpret(softmax_graph(), [x])[0], torch.softmax(x, dim=1))


def test_fast_callables_compute_what_their_overloads_do():
    """The C bindings a generated call uses instead of an OpOverload (ir/extern._BOUND) pick that overload from
    the call's arguments: equal results, in the out tensor where given one; other ops are called as they are."""
    from kiln.ir.extern import fast_callable
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    x, w, b = r(2, 4, 7, 7).contiguous(memory_format=torch.channels_last), r(6, 4, 3, 3), r(6)
    a, m, c = r(5, 3), r(3, 4), r(4)
    p, q = r(2, 5, 3), r(2, 3, 4)
    calls = [(aten.convolution.default, (x, w, b, [2, 1], [1, 0], [1, 1], False, [0, 0], 1), {}),
             (aten.convolution.default, (x, r(4, 1, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 4), {}),
             (aten.addmm.default, (c, a, m), {"beta": 0.5, "alpha": 2.0}),
             (aten.mm.default, (a, m), {}), (aten.bmm.default, (p, q), {}),
             (aten.baddbmm.default, (r(2, 5, 4), p, q), {"alpha": 0.25})]
    for op, args, kwargs in calls:
        fn = fast_callable(op)
        assert fn is not op and fn.__name__ == op._opname
        expected = op(*args, **kwargs)
        assert torch.equal(fn(*args, **kwargs), expected), op
        if op is not aten.convolution.default:
            out = torch.empty_like(expected)
            fast_callable(op, out=True)(*args, **kwargs, out=out)
            assert torch.equal(out, expected), op
    assert fast_callable(aten.add.Tensor) is aten.add.Tensor
    assert fast_callable(aten.add.Tensor, out=True) is aten.add.out
