"""Half-precision products with weights, computed in fp32 where that measures faster (passes/half_in_fp32.py).

ATen's bf16/fp16 GEMM and convolution accumulate in fp32 and round once; so does kiln's fp32 call on converted
operands with a rounding cast after it.  The results must be eager's up to the order of the sum (an ulp of the
half type), in every layout the activation can come in."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.passes import half_in_fp32
from kiln.tune.choices import Choices
from kiln.report import mark, reports_since

HALF = [torch.bfloat16, torch.float16]
IDS = ["bf16", "fp16"]


def _compiled(fn, *inputs, **options):
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(fn, fallback=False, **options)(*inputs)
    return got, reports_since(position)[-1]


def _ulp(dtype):
    return 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10


def _assert_eager_close(got, expected, dtype):
    """Equal to eager but for the order of the fp32 sum: at most about one half-precision ulp of the value (two
    where a rounded product feeds another)."""
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.float(), e.float(), rtol=4 * _ulp(dtype), atol=4 * _ulp(dtype))


class _Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(96, 160), nn.Linear(160, 72, bias=False)
        self.conv = nn.Conv2d(12, 24, 3, padding=1)
        self.bn = nn.BatchNorm2d(24)
        self.down = nn.Conv2d(24, 24, 1, stride=2)
        self.dw = nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.w3 = nn.Parameter(torch.randn(3, 72, 40) / 8)
        self.bias3 = nn.Parameter(torch.randn(3, 1, 40))

    def forward(self, x, img):
        h = self.fc2(F.gelu(self.fc1(x)))                                   # addmm, mm
        b = torch.baddbmm(self.bias3, h.reshape(3, -1, 72), self.w3)       # baddbmm with weights
        c = self.dw(torch.relu(self.down(torch.relu(self.bn(self.conv(img))))))  # BN folded, 1x1 stride 2, grouped
        return h, torch.bmm(h.reshape(3, -1, 72), self.w3), b, c


def _inputs(layout, dtype):
    """The linear layers' input (12, 8, 96) and the convolutions' image, in ``layout``."""
    torch.manual_seed(1)
    def randn(*shape):
        return torch.randn(*shape).to(dtype)
    x = {"transposed": lambda: randn(96, 8, 12).permute(2, 1, 0),
         "sliced": lambda: randn(12, 8, 130)[..., 7:103],
         "expanded": lambda: randn(1, 8, 96).expand(12, 8, 96)}.get(layout, lambda: randn(12, 8, 96))()
    img = randn(2, 12, 15, 17)
    return x, img.to(memory_format=torch.channels_last) if layout == "channels_last" else img


@pytest.mark.parametrize("dtype", HALF, ids=IDS)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "expanded", "channels_last"])
def test_products_in_fp32_match_eager(dtype, layout):
    torch.manual_seed(0)
    model = _Layers().eval()
    with torch.no_grad():
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2)
    model = model.to(dtype)
    inputs = _inputs(layout, dtype)
    with torch.inference_mode():
        expected = model(*inputs)
    got, report = _compiled(model, *inputs, choices="half_in_fp32=fp32")
    _assert_eager_close(got, expected, dtype)
    notes = " ".join(n for p in report.passes if p.name == "half_in_fp32" for n in p.notes)
    for op in ("mm", "bmm", "baddbmm", "convolution"):  # (a linear on a non-contiguous 3-d input is mm + add)
        assert f"{op} {str(dtype)[6:]} -> fp32" in notes, notes
    half_products = [n for n in report.optimized.nodes if n.op.value == "extern" and n.dtype == dtype]
    assert not half_products, half_products


@pytest.mark.parametrize("dtype", HALF, ids=IDS)
def test_half_call_kept_where_it_is_chosen(dtype):
    model = nn.Sequential(nn.Linear(64, 80), nn.ReLU(), nn.Linear(80, 16)).eval().to(dtype)
    x = torch.randn(32, 64).to(dtype)
    got, report = _compiled(model, x, choices="half_in_fp32=half")
    with torch.inference_mode():
        _assert_eager_close([got], [model(x)], dtype)
    assert set(report.externs) <= {"addmm"}, report.externs


def test_products_without_weights_stay_half():
    """Two activations: nothing converts at compile time (no half_in_fp32 choice), and the half bmm keeps its
    operand-layout choice (schedule/operand_layout.py)."""
    a, b = torch.randn(4, 16, 32).bfloat16(), torch.randn(4, 32, 8).bfloat16()
    got, report = _compiled(torch.bmm, a, b, choices="half_in_fp32=fp32")
    _assert_eager_close([got], [torch.bmm(a, b)], torch.bfloat16)
    assert {m.kind for m in report.choices} == {"bmm_layout"} and report.externs == ["bmm"], \
        (report.choices, report.externs)


@pytest.mark.parametrize("dtype", HALF, ids=IDS)
def test_candidates_compute_the_same_product(candidate_recorder, tmp_path, dtype):
    """Both timed candidates return the layer's half result (fp32 rounded once = the half call, to an ulp), and the
    choice is measured once per problem."""
    from kiln.ir.graph import ConstRef, GraphBuilder
    from kiln.ir.ops import Op
    b = GraphBuilder()
    x = b.add(Op.INPUT, (), shape=(24, 40), dtype=dtype)
    w = b.add(Op.CONSTANT, (), value=ConstRef(torch.randn(56, 40).to(dtype)))
    bias = b.add(Op.CONSTANT, (), value=ConstRef(torch.randn(56).to(dtype)))
    args = [bias, x, b.add(Op.PERMUTE, (w,), dims=(1, 0))]
    recorder = candidate_recorder("half")
    half_in_fp32.choose(recorder, torch.ops.aten.addmm.default, args, dtype, (24, 56))
    (calls,) = recorder.candidates.values()
    assert set(calls) == {"half", "fp32"}
    half, f32 = calls["half"](), calls["fp32"]()
    assert half.dtype == f32.dtype == dtype
    _assert_eager_close([f32], [half], dtype)

    with config.scope(cache_dir=str(tmp_path)):
        first = Choices()
        choice = half_in_fp32.choose(first, torch.ops.aten.addmm.default, args, dtype, (24, 56))
        assert choice in ("half", "fp32") and first.made[-1].how == "measured"
        later = Choices()  # (another compile: the tuning database has the answer)
        assert half_in_fp32.choose(later, torch.ops.aten.addmm.default, args, dtype, (24, 56)) == choice
        assert later.made[-1].how == "stored"


def test_past_the_budget_the_rule_predicts_by_the_cpu(tmp_path):
    """With no measuring budget left, fp32 is predicted unless the CPU has native half dot products."""
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU()).eval().bfloat16()
    with config.scope(cache_dir=str(tmp_path)):
        _, report = _compiled(model, torch.randn(64, 256).bfloat16(), choice_budget_s=0.0)
    (made,) = [m for m in report.choices if m.kind == "half_in_fp32"]
    assert made.how == "predicted" and made.choice == ("half" if half_in_fp32.native_half(torch.bfloat16) else "fp32")
