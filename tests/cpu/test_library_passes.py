"""The library passes (kiln/library: choosing kiln's GEMM, convolution and attention kernels, and half precision in
fp32), each as IR text before and after (``tests/unit/test_passes.run_pass``: the pass, then DCE, and the
interpreter checks the results on fresh random inputs).  The choices are forced through the choice service
(``Config.choices`` syntax), so nothing is measured."""

import pytest
import torch

from kiln.ir.extern import build_extern
from kiln.ir.graph import GraphBuilder
from kiln.ir.ops import Op
from kiln.passes.dce import dce
from kiln.passes.rewrite import RewriteLog
from kiln.tune.choices import Choices
from tests.unit import test_passes
from tests.unit.test_passes import const, inp, randn, run_pass

aten = torch.ops.aten
F32 = torch.float32


@pytest.fixture(autouse=True)
def _seed():
    test_passes._gen.manual_seed(1234)  # the same weights and inputs whichever tests run


def _with(forced: str, pass_fn):
    """The pass with ``forced`` choices, then DCE (what it leaves dead goes in the pipeline's next clean-up)."""
    return lambda g: dce(pass_fn(g, RewriteLog(choices=Choices(forced))))


def _scalar(b, v, shape):
    return b.add(Op.EXPAND, (b.add(Op.FULL, shape=(), dtype=F32, value=v),), shape=shape)


def _linear_gelu():
    """addmm(b, x, W^T) then the exact gelu as lowering writes it on the CPU: gelu(y)."""
    b = GraphBuilder()
    x = inp(b, (8, 64))
    w, bias = const(b, randn(96, 64)), const(b, randn(96))
    y = build_extern(b, aten.addmm.default, [bias, x, b.add(Op.PERMUTE, (w,), dims=(1, 0))], {}, (8, 96), F32)
    return b.finish([b.add(Op.GELU, (y,))])


# the linear + gelu graph as built, and after select_gemm put it on kiln's GEMM (gemm_epilogue's input)
_LINEAR_GELU = """\
graph(%in0: f32[8, 64]):
  %0 = constant(value=const<(96, 64)>) : f32[96, 64]
  %1 = constant(value=const<(96,)>) : f32[96]
  %2 = permute(%0, dims=(1, 0)) : f32[64, 96]
  %3 = extern(%1, %in0, %2, target=aten.addmm.default, out_index=None) : f32[8, 96]
  %4 = gelu(%3) : f32[8, 96]
  return (%4)"""
_LINEAR_GELU_ON_KILNS_GEMM = """\
graph(%in0: f32[8, 64]):
  %0 = constant(value=const<(96,)>) : f32[96]
  %1 = extern(%in0, %0, target=kiln.linear_packed.default, out_index=None) : f32[8, 96]
  %2 = gelu(%1) : f32[8, 96]
  return (%2)"""


def _conv_add_relu():
    b = GraphBuilder()
    x, r = inp(b, (1, 16, 20, 20)), inp(b, (1, 16, 20, 20))
    w, bias = const(b, randn(16, 16, 3, 3) * 0.1), const(b, randn(16))
    c = build_extern(b, aten.convolution.default, [x, w, bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1], {},
                     (1, 16, 20, 20), F32)
    return b.finish([b.add(Op.RELU, (b.add(Op.ADD, (c, r)),))])


def _attention():
    """softmax(Q K^T * 0.25) V over [B, H, T, D] = [2, 4, 8, 16], as lowering writes it (bmm, reshape, the softmax
    primitives, bmm); Q is scaled by a weight (the pass reads the device off the constants it reaches)."""
    b = GraphBuilder()
    q_in, kt, v = inp(b, (2, 4, 8, 16)), inp(b, (2, 4, 16, 8)), inp(b, (2, 4, 8, 16))
    q = b.add(Op.MUL, (q_in, const(b, randn(2, 4, 8, 16))))
    s = build_extern(b, aten.bmm.default, [b.add(Op.RESHAPE, (q,), shape=(8, 8, 16)),
                                           b.add(Op.RESHAPE, (kt,), shape=(8, 16, 8))], {}, (8, 8, 8), F32)
    logits = b.add(Op.MUL, (b.add(Op.RESHAPE, (s,), shape=(2, 4, 8, 8)), _scalar(b, 0.25, (2, 4, 8, 8))))
    mx = b.add(Op.EXPAND, (b.add(Op.AMAX, (logits,), axes=(3,), keepdim=True),), shape=(2, 4, 8, 8))
    e = b.add(Op.EXP, (b.add(Op.SUB, (logits, mx)),))
    p = b.add(Op.DIV, (e, b.add(Op.EXPAND, (b.add(Op.SUM, (e,), axes=(3,), keepdim=True),), shape=(2, 4, 8, 8))))
    return b.finish([build_extern(b, aten.bmm.default, [b.add(Op.RESHAPE, (p,), shape=(8, 8, 8)),
                                                         b.add(Op.RESHAPE, (v,), shape=(8, 8, 16))], {},
                                  (8, 8, 16), F32)])


def _half_linear():
    b = GraphBuilder()
    x = inp(b, (8, 64), torch.bfloat16)
    w = const(b, randn(96, 64).bfloat16())
    return b.finish([build_extern(b, aten.mm.default, [x, b.add(Op.PERMUTE, (w,), dims=(1, 0))], {}, (8, 96),
                                  torch.bfloat16)])


def test_select_gemm_puts_a_linear_on_kilns_gemm():
    """kiln GEMM (a weight packed at compile time, not shown: baked)."""
    from kiln.library.gemm.select import select_gemm
    g = _linear_gelu()
    run_pass(_with('gemm=kiln', select_gemm), g, _LINEAR_GELU, _LINEAR_GELU_ON_KILNS_GEMM)


def test_select_gemm_puts_a_linear_on_onednn():
    """oneDNN's linear, on the untransposed weight."""
    from kiln.library.gemm.select import select_gemm
    g = _linear_gelu()
    run_pass(_with('gemm=onednn', select_gemm), g, _LINEAR_GELU, """\
graph(%in0: f32[8, 64]):
  %0 = constant(value=const<(96, 64)>) : f32[96, 64]
  %1 = constant(value=const<(96,)>) : f32[96]
  %2 = extern(%in0, %0, %1, target=mkldnn._linear_pointwise.default, out_index=None) : f32[8, 96]
  %3 = gelu(%2) : f32[8, 96]
  return (%3)""")


def test_gemm_epilogue_takes_the_gelu_into_kilns_gemm():
    """the gelu node becomes the GEMM's epilogue."""
    from kiln.library.gemm.epilogue import fuse_gemm_gelu
    from kiln.library.gemm.select import select_gemm
    g = _linear_gelu()
    g = dce(select_gemm(g, RewriteLog(choices=Choices('gemm=kiln'))))
    run_pass(_with('gemm=kiln', fuse_gemm_gelu), g, _LINEAR_GELU_ON_KILNS_GEMM, """\
graph(%in0: f32[8, 64]):
  %0 = constant(value=const<(96,)>) : f32[96]
  %1 = extern(%in0, %0, target=kiln.linear_packed.default, out_index=None) : f32[8, 96]
  return (%1)""")


def test_winograd_takes_the_convolution_its_residual_add_and_relu():
    """one kiln convolution with the add and the relu in its epilogue (the transformed weight baked)."""
    from kiln.library.conv.select import winograd_conv
    g = _conv_add_relu()
    run_pass(_with('conv=winograd2', winograd_conv), g, """\
graph(%in0: f32[1, 16, 20, 20], %in1: f32[1, 16, 20, 20]):
  %0 = constant(value=const<(16, 16, 3, 3)>) : f32[16, 16, 3, 3]
  %1 = constant(value=const<(16,)>) : f32[16]
  %2 = extern(%in0, %0, %1, target=aten.convolution.default, out_index=None) : f32[1, 16, 20, 20]
  %3 = add(%2, %in1) : f32[1, 16, 20, 20]
  %4 = relu(%3) : f32[1, 16, 20, 20]
  return (%4)""", """\
graph(%in0: f32[1, 16, 20, 20], %in1: f32[1, 16, 20, 20]):
  %0 = constant(value=const<(16,)>) : f32[16]
  %1 = extern(%in0, %0, %in1, target=kiln.conv_winograd.default, out_index=None) : f32[1, 16, 20, 20]
  return (%1)""")


def test_fuse_attention_makes_one_attention_call():
    """one kiln::attention call on Q, K (a view) and V; the merged heads a reshape."""
    from kiln.library.attention.fuse import fuse_attention
    g = _attention()
    run_pass(_with('attention=kiln', fuse_attention), g, """\
graph(%in0: f32[2, 4, 8, 16], %in1: f32[2, 4, 16, 8], %in2: f32[2, 4, 8, 16]):
  %0 = constant(value=const<(2, 4, 8, 16)>) : f32[2, 4, 8, 16]
  %1 = mul(%in0, %0) : f32[2, 4, 8, 16]
  %2 = reshape(%1, shape=(8, 8, 16)) : f32[8, 8, 16]
  %3 = reshape(%in1, shape=(8, 16, 8)) : f32[8, 16, 8]
  %4 = extern(%2, %3, target=aten.bmm.default, out_index=None) : f32[8, 8, 8]
  %5 = reshape(%4, shape=(2, 4, 8, 8)) : f32[2, 4, 8, 8]
  %6 = full(value=0.25) : f32[]
  %7 = expand(%6, shape=(2, 4, 8, 8)) : f32[2, 4, 8, 8]
  %8 = mul(%5, %7) : f32[2, 4, 8, 8]
  %9 = amax(%8, axes=(3,), keepdim=True) : f32[2, 4, 8, 1]
  %10 = expand(%9, shape=(2, 4, 8, 8)) : f32[2, 4, 8, 8]
  %11 = sub(%8, %10) : f32[2, 4, 8, 8]
  %12 = exp(%11) : f32[2, 4, 8, 8]
  %13 = sum(%12, axes=(3,), keepdim=True) : f32[2, 4, 8, 1]
  %14 = expand(%13, shape=(2, 4, 8, 8)) : f32[2, 4, 8, 8]
  %15 = div(%12, %14) : f32[2, 4, 8, 8]
  %16 = reshape(%15, shape=(8, 8, 8)) : f32[8, 8, 8]
  %17 = reshape(%in2, shape=(8, 8, 16)) : f32[8, 8, 16]
  %18 = extern(%16, %17, target=aten.bmm.default, out_index=None) : f32[8, 8, 16]
  return (%18)""", """\
graph(%in0: f32[2, 4, 8, 16], %in1: f32[2, 4, 16, 8], %in2: f32[2, 4, 8, 16]):
  %0 = constant(value=const<(2, 4, 8, 16)>) : f32[2, 4, 8, 16]
  %1 = mul(%in0, %0) : f32[2, 4, 8, 16]
  %2 = permute(%in1, dims=(0, 1, 3, 2)) : f32[2, 4, 8, 16]
  %3 = extern(%1, %2, %in2, target=kiln.attention.default, out_index=None) : f32[2, 4, 8, 16]
  %4 = reshape(%3, shape=(8, 8, 16)) : f32[8, 8, 16]
  return (%4)""")


def test_half_in_fp32_runs_a_bf16_product_in_fp32():
    """the activation cast up, the weight folded to fp32, the result cast back."""
    from kiln.passes.half_in_fp32 import half_in_fp32
    g = _half_linear()
    run_pass(_with('half_in_fp32=fp32', half_in_fp32), g, """\
graph(%in0: bf16[8, 64]):
  %0 = constant(value=const<(96, 64)>) : bf16[96, 64]
  %1 = permute(%0, dims=(1, 0)) : bf16[64, 96]
  %2 = extern(%in0, %1, target=aten.mm.default, out_index=None) : bf16[8, 96]
  return (%2)""", """\
graph(%in0: bf16[8, 64]):
  %0 = cast(%in0) : f32[8, 64]
  %1 = constant(value=const<(96, 64)>) : f32[96, 64]
  %2 = permute(%1, dims=(1, 0)) : f32[64, 96]
  %3 = extern(%0, %2, target=aten.mm.default, out_index=None) : f32[8, 96]
  %4 = cast(%3) : bf16[8, 96]
  return (%4)""")


def _conv(k: int, stride: int, c: int = 16):
    b = GraphBuilder()
    x = inp(b, (1, c, 128, 128))
    w, bias = const(b, randn(32, c, k, k) * 0.1), const(b, randn(32))
    out = (128 - k) // stride + 1
    return b.finish([build_extern(b, aten.convolution.default, [x, w, bias, [stride, stride], [0, 0], [1, 1], False,
                                                                 [0, 0], 1], {}, (1, 32, out, out), F32)])


def test_conv_libraries_built_for_a_graph_are_the_ones_it_can_use():
    """The compile starts kiln's convolution libraries in the background; Winograd's only where a 3x3 stride-1
    convolution could run on them (a patch embedding, 16x16 stride 16, needs the implicit GEMM's alone)."""
    from kiln import config
    from kiln.library.conv.select import libraries
    with config.scope(winograd_tiles="2,4"):
        patch = libraries(_conv(16, 16))
        three = libraries(_conv(3, 1))
    assert set(patch) == {"kiln_conv_gemm"}, patch
    assert set(three) == {"kiln_conv_gemm", "kiln_winograd2", "kiln_winograd4"}, three
