"""The schedule stages, each as IR text before and after (in the style of test_passes.run_pass): the graph IR in,
the Plan's steps and the kernel IR out (partition: schedule/fuse.py; kernel IR: schedule/kernel_build.py; loop
collapsing: ir/loop_collapse.py) - and the Program built from them, compiled, computes what the reference
interpreter computes on random inputs."""
import torch

from kiln import config
from kiln.ir.extern import build_extern
from kiln.ir.graph import ConstRef, Graph, GraphBuilder, format_graph
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.passes.check import random_inputs
from kiln.report import CompileReport
from kiln.schedule.plan import build_cpu, make_plan


def run_stages(g: Graph, before: str, steps: str, kernels: str, strides: dict | None = None,
               channels_last: set | None = None) -> None:
    """``strides``: with layout optimization on, the buffers laid out other than contiguously, and
    ``channels_last`` the output buffers of the convolutions that run channels-last."""
    assert format_graph(g) == before
    with config.scope(layout_optimization=strides is not None):
        plan = make_plan(g)
        assert plan.format() == steps
        assert "\n".join(k.format() for k in plan.kernels) == kernels
        if strides is not None:
            assert {plan.buffer_of[n]: s for n, s in plan.strides_of.items()} == strides
            assert {plan.buffer_of[n] for n in plan.cl_convs} == channels_last
        inputs = random_inputs(g)
        with torch.inference_mode():
            got = build_cpu(g, CompileReport("stages"))(inputs)
    for a, e in zip(got, interpret(g, inputs)):
        torch.testing.assert_close(a, e, rtol=1.3e-5, atol=1.5e-5)


def _input(b: GraphBuilder, shape: tuple[int, ...], index: int):
    return b.add(Op.INPUT, (), shape=shape, dtype=torch.float32, index=index)


def test_a_softmax_is_one_row_kernel_with_a_scratch_row():
    """Partition: max, exp, sum and the division over the same rows form one kernel; kernel IR: two reductions,
    the exp kept in a row scratch for the division (not computed twice)."""
    b = GraphBuilder()
    x = _input(b, (4, 6), 0)
    m = b.add(Op.AMAX, (x,), axes=(1,), keepdim=True)
    e = b.add(Op.EXP, (b.add(Op.SUB, (x, b.add(Op.EXPAND, (m,), shape=(4, 6)))),))
    s = b.add(Op.SUM, (e,), axes=(1,), keepdim=True)
    g = b.finish([b.add(Op.DIV, (e, b.add(Op.EXPAND, (s,), shape=(4, 6))))])
    run_stages(g, """\
graph(%in0: f32[4, 6]):
  %0 = amax(%in0, axes=(1,), keepdim=True) : f32[4, 1]
  %1 = expand(%0, shape=(4, 6)) : f32[4, 6]
  %2 = sub(%in0, %1) : f32[4, 6]
  %3 = exp(%2) : f32[4, 6]
  %4 = sum(%3, axes=(1,), keepdim=True) : f32[4, 1]
  %5 = expand(%4, shape=(4, 6)) : f32[4, 6]
  %6 = div(%3, %5) : f32[4, 6]
  return (%6)""", """\
  0 kernel kernel_0_amax_exp_sum_div: reads buf0; writes buf1""", """\
kernel_0_amax_exp_sum_div  outer=[4] rsize=6
  reduce acc0 = amax(buf0[6*o0 + r])
  reduce acc1 = sum(exp(sub(buf0[6*o0 + r], acc0)))
  keep   scr0[r] = exp(sub(buf0[6*o0 + r], acc0))
  loop   buf1[6*o0 + r] = div(scr0[r], acc1)""")


def test_a_channels_last_read_keeps_the_channel_loop_and_merges_the_rest():
    """Kernel IR: the permute is an index map (no copy); loop collapsing: the two spatial loops, which every
    access walks as one run, become one loop of 35 (the channel loop stays: the input walks it with stride 1)."""
    b = GraphBuilder()
    x, bias = _input(b, (2, 5, 7, 8), 0), _input(b, (8, 1, 1), 1)
    xc = b.add(Op.PERMUTE, (x,), dims=(0, 3, 1, 2))
    g = b.finish([b.add(Op.RELU, (b.add(Op.ADD, (xc, b.add(Op.EXPAND, (bias,), shape=(2, 8, 5, 7)))),))])
    run_stages(g, """\
graph(%in0: f32[2, 5, 7, 8], %in1: f32[8, 1, 1]):
  %0 = permute(%in0, dims=(0, 3, 1, 2)) : f32[2, 8, 5, 7]
  %1 = expand(%in1, shape=(2, 8, 5, 7)) : f32[2, 8, 5, 7]
  %2 = add(%0, %1) : f32[2, 8, 5, 7]
  %3 = relu(%2) : f32[2, 8, 5, 7]
  return (%3)""", """\
  0 kernel kernel_0_relu: reads buf0, buf1; writes buf2""", """\
kernel_0_relu  outer=[2, 8, 35]
  loop   buf2[280*i0 + 35*i1 + i2] = relu(add(buf0[280*i0 + i1 + 8*i2], buf1[i1]))""")


def test_a_value_a_library_call_reads_is_stored_and_the_rest_fuses_around_it():
    """Partition: exp feeds a library call, so it gets a buffer of its own kernel; the row sum that also reads it
    joins that kernel across the call ([Note: horizontal fusion]: it reads a value the kernel computes - the
    kernel keeps each row's exp in scratch, stores it for the call and sums it), and the product after the call is
    a kernel after it."""
    b = GraphBuilder()
    x, w = _input(b, (6, 4), 0), _input(b, (4, 3), 1)
    e = b.add(Op.EXP, (x,))
    mm = build_extern(b, torch.ops.aten.mm.default, [e, w], {}, (6, 3), torch.float32)
    s = b.add(Op.SUM, (e,), axes=(1,), keepdim=True)
    g = b.finish([b.add(Op.MUL, (mm, b.add(Op.EXPAND, (s,), shape=(6, 3))))])
    run_stages(g, """\
graph(%in0: f32[6, 4], %in1: f32[4, 3]):
  %0 = exp(%in0) : f32[6, 4]
  %1 = extern(%0, %in1, target=aten.mm.default, out_index=None) : f32[6, 3]
  %2 = sum(%0, axes=(1,), keepdim=True) : f32[6, 1]
  %3 = expand(%2, shape=(6, 3)) : f32[6, 3]
  %4 = mul(%1, %3) : f32[6, 3]
  return (%4)""", """\
  0 kernel kernel_0_exp_sum: reads buf0; writes buf2, buf4
  1 extern aten.mm.default(buf2, buf1) -> buf3
  2 kernel kernel_1_mul: reads buf3, buf4; writes buf5""", """\
kernel_0_exp_sum  outer=[6] rsize=4
  reduce acc0 = sum(scr0[r])
  keep   scr0[r] = exp(buf0[4*o0 + r])
  rowout buf4[o0] = acc0
  loop   buf2[4*o0 + r] = scr0[r]
kernel_1_mul  outer=[6, 3]
  loop   buf5[3*i0 + i1] = mul(buf3[3*i0 + i1], buf4[i0])""")
    with config.scope(horizontal_fusion=False):
        assert [s.name for s in make_plan(g).kernels] == ["kernel_0_exp", "kernel_1_sum", "kernel_2_mul"]


def test_layouts_run_convolutions_and_the_kernels_between_them_channels_last():
    """Layout (schedule/layout.py, with layout optimization on): both convolutions write channels-last buffers,
    the ReLU between them runs flat over channels-last data, and the kernel writing the graph's output reads the
    channels-last result and writes eager's NCHW layout (a transposing kernel, no copy)."""
    b = GraphBuilder()
    x = _input(b, (1, 4, 6, 6), 0)

    def conv(inp, cin):
        weight = torch.randn(8, cin, 3, 3, generator=torch.Generator().manual_seed(cin))
        w = b.add(Op.CONSTANT, (), value=ConstRef(weight))
        return build_extern(b, torch.ops.aten.convolution.default,
                            [inp, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1], {}, (1, 8, 6, 6), torch.float32)
    g = b.finish([b.add(Op.SIGMOID, (conv(b.add(Op.RELU, (conv(x, 4),)), 8),))])
    run_stages(g, """\
graph(%in0: f32[1, 4, 6, 6]):
  %0 = constant(value=const<(8, 4, 3, 3)>) : f32[8, 4, 3, 3]
  %1 = extern(%in0, %0, target=aten.convolution.default, out_index=None) : f32[1, 8, 6, 6]
  %2 = relu(%1) : f32[1, 8, 6, 6]
  %3 = constant(value=const<(8, 8, 3, 3)>) : f32[8, 8, 3, 3]
  %4 = extern(%2, %3, target=aten.convolution.default, out_index=None) : f32[1, 8, 6, 6]
  %5 = sigmoid(%4) : f32[1, 8, 6, 6]
  return (%5)""", """\
  0 extern aten.convolution.default(buf0, buf1) -> buf2
  1 kernel kernel_0_relu: reads buf2; writes buf3
  2 extern aten.convolution.default(buf3, buf4) -> buf5
  3 kernel kernel_1_sigmoid: reads buf5; writes buf6""", """\
kernel_0_relu  outer=[288]
  loop   buf3[i0] = relu(buf2[i0])
kernel_1_sigmoid  outer=[8, 36]
  loop   buf6[36*i0 + i1] = sigmoid(buf5[i0 + 8*i1])""", strides={"buf2": (288, 1, 48, 8), "buf3": (288, 1, 48, 8),
                                                             "buf5": (288, 1, 48, 8)},
               channels_last={"buf2", "buf5"})


def test_program_building_plans_the_memory_of_each_step():
    """Program building (schedule/program.py), Plan in, Program out: with an arena (the CPU) each buffer gets an
    offset, and a buffer takes the slot of one that died before it is written (buf5 in buf3's, buf6 in buf4's);
    the matmuls write their arena slots through ``.out``; the graph's output is a per-call tensor.  Without an
    arena (the GPU) each buffer is allocated before its first writer, the exp in place of the product it reads,
    the second product in the memory of the ReLU's buffer, dead since the first product ([Note: buffers reused by
    size])."""
    from kiln.schedule.program import build_program
    b = GraphBuilder()
    x, w1, w2 = _input(b, (64, 32), 0), _input(b, (32, 32), 1), _input(b, (32, 32), 2)
    m1 = build_extern(b, torch.ops.aten.mm.default, [b.add(Op.RELU, (x,)), w1], {}, (64, 32), torch.float32)
    m2 = build_extern(b, torch.ops.aten.mm.default, [b.add(Op.EXP, (m1,)), w2], {}, (64, 32), torch.float32)
    g = b.finish([b.add(Op.SIGMOID, (m2,))])
    plan = make_plan(g)
    steps = ["  0 kernel kernel_0_relu: reads buf0; writes buf3",
             "  1 extern aten.mm.default(buf3, buf1) -> buf4",
             "  2 kernel kernel_1_exp: reads buf4; writes buf5",
             "  3 extern aten.mm.default(buf5, buf2) -> buf6",
             "  4 kernel kernel_2_sigmoid: reads buf6; writes buf7"]
    assert plan.format() == "\n".join(steps)

    def program(arena: bool, memory: list[str]) -> str:
        return "\n".join(f"{s:<72} {m}" for s, m in zip(steps, memory))

    assert build_program(g, plan, arena=True).format() == program(True, [
        "buf3: arena @0, 8 KiB", "buf4: arena @8192, 8 KiB", "buf5: arena @0, 8 KiB", "buf6: arena @8192, 8 KiB",
        "buf7: per call (graph output), 8 KiB"])
    assert build_program(g, plan, arena=False).format() == program(False, [
        "buf3: allocated, 8 KiB", "buf4: allocated, 8 KiB", "buf5: allocated in buf4's memory, 8 KiB",
        "buf6: allocated in buf3's memory, 8 KiB", "buf7: per call (graph output), 8 KiB"])
    inputs = random_inputs(g)
    with torch.inference_mode():
        for arena in (True, False):
            got = build_cpu(g, CompileReport("program"), arena=arena)(inputs)
            torch.testing.assert_close(got[0], interpret(g, inputs)[0], rtol=1.3e-5, atol=1.5e-5)


def test_relayout_copies_gives_library_operands_no_view_can_give_a_copy_kernel():
    """schedule/layout.relayout_copies, before/after: the reshape of a permuted value that mm reads is no view of
    a buffer, so a copy node (``view_copy``) is inserted before the call; it becomes a kernel that reads through
    the views (exp fuses into it: no buffer of its own); the transposed weight, which *is* a view, is passed as
    one; the plan computes what the interpreter does."""
    from kiln.schedule.layout import relayout_copies
    b = GraphBuilder()
    x, w = _input(b, (2, 3, 4), 0), _input(b, (10, 3), 1)
    p = b.add(Op.PERMUTE, (b.add(Op.EXP, (x,)),), dims=(0, 2, 1))
    r = b.add(Op.RESHAPE, (p,), shape=(8, 3))
    mm = build_extern(b, torch.ops.aten.mm.default, [r, b.add(Op.PERMUTE, (w,), dims=(1, 0))], {}, (8, 10),
                      torch.float32)
    g = b.finish([mm])
    after = relayout_copies(g, make_plan(g), weights=True)
    assert format_graph(after) == """\
graph(%in0: f32[2, 3, 4], %in1: f32[10, 3]):
  %0 = exp(%in0) : f32[2, 3, 4]
  %1 = permute(%0, dims=(0, 2, 1)) : f32[2, 4, 3]
  %2 = reshape(%1, shape=(8, 3)) : f32[8, 3]
  %3 = permute(%in1, dims=(1, 0)) : f32[3, 10]
  %4 = cast(%2, view_copy=True) : f32[8, 3]
  %5 = extern(%4, %3, target=aten.mm.default, out_index=None) : f32[8, 10]
  return (%5)"""
    plan = make_plan(after)
    assert plan.format() == """\
  0 kernel kernel_0_copy: reads buf0; writes buf2
  1 extern aten.mm.default(buf2, view(buf1)) -> buf3"""
    assert "\n".join(k.format() for k in plan.kernels) == """\
kernel_0_copy  outer=[8, 3]
  loop   buf2[3*i0 + i1] = f32(exp(buf0[12*((i0) / 4) + ((i0) % 4) + 4*i1]))"""
    inputs = random_inputs(g)
    with torch.inference_mode():
        got = build_cpu(after, CompileReport("stages"))(inputs)
    torch.testing.assert_close(got[0], interpret(g, inputs)[0], rtol=1.3e-5, atol=1.5e-5)
    assert relayout_copies(after, plan, weights=True) is after  # nothing left to copy


def test_relayout_copies_makes_one_copy_for_a_value_and_its_transpose():
    """A weight gradient reads ``t(r)`` and the input gradient ``r`` of one reshape of a permuted value (attention's
    heads merged back): the copy takes the chain up to the reshape, the transpose is a view of the copy - one copy
    kernel, not a second one writing the transpose; the plan computes what the interpreter does."""
    from kiln.schedule.layout import relayout_copies
    b = GraphBuilder()
    x, w, y = _input(b, (2, 3, 4), 0), _input(b, (3, 5), 1), _input(b, (8, 6), 2)
    r = b.add(Op.RESHAPE, (b.add(Op.PERMUTE, (b.add(Op.EXP, (x,)),), dims=(0, 2, 1)),), shape=(8, 3))
    dx = build_extern(b, torch.ops.aten.mm.default, [r, w], {}, (8, 5), torch.float32)
    dw = build_extern(b, torch.ops.aten.mm.default, [b.add(Op.PERMUTE, (r,), dims=(1, 0)), y], {}, (3, 6),
                      torch.float32)
    g = b.finish([dx, dw])
    after = relayout_copies(g, make_plan(g), weights=True)
    copies = [n for n in after.nodes if n.op is Op.CAST]
    assert len(copies) == 1 and copies[0].shape == (8, 3), format_graph(after)
    first, second = [n for n in after.nodes if n.op is Op.EXTERN]
    assert first.inputs[0] is copies[0]
    assert second.inputs[0].op is Op.PERMUTE and second.inputs[0].inputs[0] is copies[0]
    inputs = random_inputs(g)
    with torch.inference_mode():
        got = build_cpu(after, CompileReport("stages"))(inputs)
    for a, e in zip(got, interpret(g, inputs)):
        torch.testing.assert_close(a, e, rtol=1.3e-5, atol=1.5e-5)
    assert relayout_copies(after, make_plan(after), weights=True) is after


def test_relayout_copies_gives_attention_a_bias_with_a_unit_last_stride():
    """ATen's memory-efficient attention refuses a bias whose last dim is strided ("(*bias): last dimension must be
    contiguous"; Swin's relative-position bias is a permuted view): relayout_copies gives such an operand a copy
    kernel, and leaves alone the ones already unit-stride along their last dim (a transposed view of a buffer
    that reads the same memory, and the buffers themselves)."""
    from kiln.schedule.layout import relayout_copies
    b = GraphBuilder()
    q, k, v, x = (_input(b, shape, i) for i, shape in enumerate([(1, 2, 4, 8)] * 3 + [(1, 2, 4, 4)]))
    bias = b.add(Op.PERMUTE, (b.add(Op.EXP, (x,)),), dims=(0, 1, 3, 2))   # strides (32, 16, 1, 4)
    key = b.add(Op.SIGMOID, (k,))
    att = build_extern(b, torch.ops.aten._scaled_dot_product_efficient_attention.default,
                       [b.add(Op.RELU, (q,)), key, b.add(Op.TANH, (v,)), bias, False], {"scale": 0.5},
                       (1, 2, 4, 8), torch.float32, out_index=0)
    g = b.finish([att])
    after = relayout_copies(g, make_plan(g), weights=False)
    text = format_graph(after)
    assert text.count("view_copy=True") == 1, text
    copy = next(n for n in after.nodes if n.op is Op.CAST)
    assert copy.inputs[0].op is Op.PERMUTE and copy.shape == (1, 2, 4, 4)
    extern = next(n for n in after.nodes if n.op is Op.EXTERN)
    assert extern.inputs[3] is copy
    assert relayout_copies(after, make_plan(after), weights=False) is after


def test_relayout_copies_passes_offset_slices_and_expanded_views_as_views():
    """Operands a view of a buffer can give - a slice with an offset, an expand (stride 0) - need no copy kernel:
    relayout_copies leaves the graph as it is, and the plan, handing the views to the library, computes what the
    interpreter does."""
    from kiln.schedule.layout import relayout_copies
    b = GraphBuilder()
    x, w, r = _input(b, (9, 6), 0), _input(b, (6, 5), 1), _input(b, (1, 6), 2)
    sliced = b.add(Op.SLICE, (b.add(Op.EXP, (x,)),), dim=0, start=2, step=1, shape=(7, 6))   # offset 12
    expanded = b.add(Op.EXPAND, (b.add(Op.TANH, (r,)),), shape=(7, 6))                    # strides (0, 1)
    mm1 = build_extern(b, torch.ops.aten.mm.default, [sliced, w], {}, (7, 5), torch.float32)
    mm2 = build_extern(b, torch.ops.aten.mm.default, [expanded, w], {}, (7, 5), torch.float32)
    g = b.finish([b.add(Op.ADD, (mm1, mm2))])
    plan = make_plan(g)
    assert relayout_copies(g, plan, weights=True) is g
    assert plan.format().count("aten.mm.default(view(buf") == 2, plan.format()  # no copy kernel: 3 kernels
    inputs = random_inputs(g)
    with torch.inference_mode():
        got = build_cpu(g, CompileReport("stages"))(inputs)
    torch.testing.assert_close(got[0], interpret(g, inputs)[0], rtol=1.3e-5, atol=1.5e-5)


def test_a_shared_erf_is_stored_on_the_cpu_and_recomputed_on_the_gpu():
    """[Note: recomputing on a GPU]: GELU's ``1 + erf(x / sqrt(2))``, read by two kernels (a column sum, and a
    product a library call reads), costs more than the CPU's limit - one buffer, written once - and less than the
    GPU's: each kernel computes it from ``x``."""
    from kiln.schedule.fuse import decide_realized

    def scalar(b, value, shape):
        return b.add(Op.EXPAND, (b.add(Op.FULL, (), shape=(), dtype=torch.float32, value=value),), shape=shape)
    b = GraphBuilder()
    x = _input(b, (64, 32), 0)
    w = _input(b, (32, 16), 1)
    erf = b.add(Op.ERF, (b.add(Op.MUL, (x, scalar(b, 0.7071067811865476, (64, 32)))),))
    t = b.add(Op.ADD, (erf, scalar(b, 1.0, (64, 32))))
    column = b.add(Op.SUM, (b.add(Op.MUL, (t, x)),), axes=(0,), keepdim=False)
    product = build_extern(b, torch.ops.aten.mm.default, [b.add(Op.MUL, (t, x)), w], {}, (64, 16), torch.float32)
    g = b.finish([column, product])
    with config.scope(recompute_limit=8):
        assert t in decide_realized(g)[0]
    with config.scope(recompute_limit=config.get().gpu_recompute_limit):
        assert t not in decide_realized(g)[0]
