"""Kernels between layouts: loop collapsing (ir/loop_collapse.py) and transposed tiles
(codegen/cpp_tile.py), each checked against eager on shapes with partial tiles."""
import pytest
import torch

from kiln import config
from kiln.ir.index_split import inner_segments, specialize
from kiln.ir.kernel import KConst, KIndex, KLoad, KOp
from kiln.ir.index import Lin, Var
from kiln.ir.ops import Op
from tests.cpu.test_codegen_cpp import _compile


@pytest.mark.parametrize("shape", [(1, 7, 9, 20), (2, 16, 16, 32), (1, 33, 5, 48), (3, 4, 4, 3)])
def test_transposed_operand_matches_eager(shape):
    """out[n, c, h, w] = f(x[n, h, w, c]): the loads of x are transposed relative to the stores."""
    x = torch.randn(shape)
    y = torch.randn(shape[0], shape[3], 1, 1)
    r = _compile(lambda x, y: torch.relu(x.permute(0, 3, 1, 2) * 2.0 + y), x, y)
    tiled = min(shape[3], shape[1] * shape[2]) >= 16
    assert ("kiln_rt::transpose16" in r.source) == tiled


def test_channels_last_conv_writes_nchw_output_through_tiles():
    conv = torch.nn.Conv2d(8, 24, 3).eval()
    with config.scope(layout_optimization=True):
        r = _compile(lambda x: torch.relu(conv(torch.relu(conv_in(x)))), torch.randn(1, 3, 21, 19))
    assert "kiln_rt::transpose16" in r.source


conv_in = torch.nn.Conv2d(3, 8, 3).eval()


def test_broadcast_kernel_loops_are_collapsed():
    x, b = torch.randn(1, 6, 10, 12), torch.randn(1, 6, 1, 1)
    r = _compile(lambda x, b: torch.sigmoid(x + b), x, b)
    assert r.kernels[0].outer == (6, 120)


def _cond(op, lin, k):
    return KOp(op, (KIndex(lin, torch.int64), KConst(k, torch.int64)), torch.bool)


def test_inner_segments_of_a_padded_window():
    i1, i2 = Var("i1", 10), Var("i2", 56)
    lo = _cond(Op.GE, Lin.of(i2) * 2, 1)             # 2*i2 >= 1    false only at i2 = 0
    hi = _cond(Op.LT, Lin.of(i2) * 2 + 2, 113)       # 2*i2 + 2 < 113  always true
    row = _cond(Op.GE, Lin.of(i1) + Lin.of(i2) * 0, 1)
    segs = inner_segments([lo, hi, row], i2)
    assert [(s.lo, s.hi) for s in segs] == [(0, 1), (1, 56)]
    assert segs[0].facts == {}  # shorter than MIN_SEGMENT: the general body
    assert segs[-1].hi == 56 and segs[-1].facts.get(lo) is True and segs[-1].facts.get(hi) is True
    assert row not in segs[-1].facts  # a condition on another loop is not decided by i2


def test_inner_segments_of_a_concatenation():
    i = Var("i0", 100)
    first = _cond(Op.LT, Lin.of(i), 40)
    segs = inner_segments([first], i)
    assert [(s.lo, s.hi, s.facts.get(first)) for s in segs] == [(0, 40, True), (40, 100, False)]


def test_specialize_folds_selects():
    i = Var("i0", 100)
    c = _cond(Op.LT, Lin.of(i), 40)
    a, b = KLoad("buf0", Lin.of(i), torch.float32), KLoad("buf1", Lin.of(i) - 40, torch.float32)
    e = KOp(Op.WHERE, (KOp(Op.LOGICAL_AND, (c, KConst(True, torch.bool)), torch.bool), a, b), torch.float32)
    assert specialize(e, {c: True}) == a
    assert specialize(e, {c: False}) == b
    assert specialize(e, {}) == KOp(Op.WHERE, (c, a, b), torch.float32)  # and(c, true) -> c


def test_a_padded_transposed_operand_is_not_read_through_tiles():
    """A pad of a channels-last value written NCHW (MobileNet-V2's TF-style padding before a stride-2 layer,
    out[c, y, x] = y < 112 and x < 112 ? in[x * 96 + y * 10752 + c] : 0): where the condition is false the load's
    index is past the input, so the input is read by the element loop under the condition, never through 16 x 16
    tiles (a tile reads all its elements: past the buffer's end, a crash one run in two).  An unguarded
    transposed load of the same kernel is still tiled."""
    from kiln.ir.kernel import FullLoop, Kernel, Store
    from kiln.ir.tiling import plan_tiles
    c, y, x = Var("i0", 96), Var("i1", 113), Var("i2", 113)
    inside = KOp(Op.LOGICAL_AND, (_cond(Op.LT, Lin.of(y), 112), _cond(Op.LT, Lin.of(x), 112)), torch.bool)
    index = Lin.of(c) + Lin.of(y) * 10752 + Lin.of(x) * 96
    padded = KOp(Op.WHERE, (inside, KLoad("buf0", index, torch.float32), KConst(0.0, torch.float32)), torch.float32)
    out = Lin.of(c) * 12769 + Lin.of(y) * 113 + Lin.of(x)

    def kernel(value):
        return Kernel("kernel_0_pad", (96, 113, 113), 0, [FullLoop([Store("buf1", out, value)])], [])

    assert plan_tiles(kernel(padded)) is None
    plain = KOp(Op.ADD, (padded, KLoad("buf2", index, torch.float32)), torch.float32)
    plan = plan_tiles(kernel(plain))
    assert plan is not None and [ld.buf for ld in plan.loads] == ["buf2"]
