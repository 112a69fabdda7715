"""The Triton code generator, op by op and kernel kind by kind, against eager PyTorch.

Runs on the GPU when there is one, else under Triton's interpreter on CPU tensors (CI).  Shapes are small:
the interpreter executes every block operation through numpy.  Inputs are fresh random values (never zeros).
"""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.report import mark, reports_since
from tests.gpu.conftest import DEVICE, HAS_CUDA

RTOL, ATOL = 1.3e-5, 1.5e-5


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def run(fn, *inputs, rtol=RTOL, atol=ATOL, ref_dtype=None):
    """Compile ``fn`` for Triton, compare with eager (in ``ref_dtype`` when given), return the report."""
    inputs = [x.to(DEVICE) for x in inputs]
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(fn, target="triton", fallback=False)(*[x.clone() for x in inputs])
        ref_inputs = [x.to(ref_dtype) if ref_dtype and x.is_floating_point() else x.clone() for x in inputs]
        expected = fn(*ref_inputs)
    if ref_dtype is not None:
        got = [g.to(ref_dtype) for g in got] if isinstance(got, (list, tuple)) else got.to(ref_dtype)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    reports = reports_since(position)
    assert reports and all(r.target == "triton" and r.fallback is None for r in reports)
    return reports[-1]


def nonzero(*shape):
    x = torch.randn(*shape)
    return torch.where(x.abs() < 0.05, torch.full_like(x, 0.5), x)


def test_unary_math():
    def f(x, p):
        return (torch.exp(x) + torch.log(p) + torch.sqrt(p) + torch.rsqrt(p) + torch.sin(x) + torch.cos(x)
                + torch.tanh(x) + torch.sigmoid(x) + torch.erf(x) + torch.expm1(x) + torch.log1p(p)
                + torch.abs(x) + torch.floor(x) + torch.ceil(x) + torch.trunc(x) + torch.round(x) + torch.sign(x)
                + torch.reciprocal(p) + torch.pow(p, x) + F.relu(x) + F.gelu(x) + F.gelu(x, approximate="tanh")
                + F.silu(x))
    run(f, torch.randn(37, 19) * 2, torch.rand(37, 19) * 3 + 0.1, rtol=2e-5, atol=2e-5)


def test_binary_comparison_where_and_casts():
    def f(x, y, i, j):
        q = torch.div(i, j, rounding_mode="floor") + torch.remainder(i, j) + torch.fmod(i, j)
        z = torch.where(x > y, x, y * 2) + torch.maximum(x, y) - torch.minimum(x, y)
        z = z.masked_fill(x < -1, 3.0) + (x >= y).float() + q.float() + torch.remainder(x, y)
        return z, (x.to(torch.int32) * 3).to(torch.int64), torch.logical_and(x > 0, y > 0)
    run(f, torch.randn(50, 9), nonzero(50, 9), torch.randint(-20, 20, (50, 9)),
        torch.randint(1, 7, (50, 9)) * (torch.randint(0, 2, (50, 9)) * 2 - 1))


def test_nan_propagates_through_max_min_and_relu():
    x = torch.randn(4, 33)
    x[1, 5] = float("nan")
    x[3, 0] = float("nan")
    run(lambda x: (torch.maximum(x, x.flip(-1)), F.relu(x), x.amax(-1), x.amin(0), x.argmax(-1)), x)


def test_broadcast_views_pad_cat_slice():
    def f(x, b, y):
        z = (x + b).permute(0, 2, 1)[:, 1:, ::2]
        w = F.pad(y, (1, 2, 0, 1), value=-1.0)
        return z * 2, torch.cat([w, w * 3], dim=1), y.t().contiguous() + 1
    run(f, torch.randn(3, 10, 12), torch.randn(12), torch.randn(7, 5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64,
                                   torch.bool])
def test_constants_a_graph_returns_in_every_dtype(dtype):
    """A FULL the graph returns is a kernel storing a constant: the constant is a typed scalar (a Python number
    has no ``.to``: a bf16 ``zeros(1)`` output failed to compile on the GPU, in HF GPT-2's static-cache decode)."""
    def f(x):
        d = x.device
        return (x * 2, torch.zeros(1, dtype=dtype, device=d), torch.full((3, 2), 3, dtype=dtype, device=d),
                torch.ones((), dtype=dtype, device=d))
    run(f, torch.randn(5))


def test_gather_index_select_embedding():
    table = torch.randn(30, 8)
    ids = torch.randint(0, 30, (4, 6))
    idx = torch.randint(0, 8, (5, 8))
    run(lambda t, i, j: (F.embedding(i, t) * 2, torch.index_select(t, 0, i[0]), torch.gather(t[:5], 1, j)),
        table, ids, idx)


@pytest.mark.parametrize("shape,dim", [((16, 33), -1), ((5, 7, 9), 1), ((6, 5000), -1), ((3, 4, 5), (0, 2))])
def test_reductions(shape, dim):
    """Short rows (several per program), a middle axis, a long row (looped), and several axes."""
    def f(x):
        out = [x.sum(dim), x.mean(dim), x.amax(dim), x.amin(dim), x.var(dim)]
        if isinstance(dim, int) and x.shape[dim] < 100:  # torch.prod takes one axis; long products overflow
            out.append((x * 0.5 + 1).prod(dim))
        return out
    run(f, torch.randn(shape), rtol=5e-5, atol=5e-5)


def test_argmax_argmin():
    run(lambda x: (x.argmax(-1), x.argmin(1), x.argmax(0)), torch.randn(12, 40))


@pytest.mark.parametrize("cols", [64, 1000, 3000, 6000])  # several rows a program, one (1-D), looped
def test_softmax_layer_norm_rms(cols):
    w, b = torch.randn(cols, device=DEVICE), torch.randn(cols, device=DEVICE)

    def f(x):
        return (torch.softmax(x, -1), torch.log_softmax(x, -1), F.layer_norm(x, (cols,), w, b),
                x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    r = run(f, torch.randn(6, cols), rtol=2e-5, atol=2e-5)
    assert len(r.kernels) <= 4


def test_bf16_against_fp32_reference():
    def f(x, y):
        return torch.softmax(x @ y, -1) * 2 + F.gelu(x[:, :16])
    run(f, torch.randn(24, 32).bfloat16(), torch.randn(32, 16).bfloat16(), rtol=2e-2, atol=2e-2,
        ref_dtype=torch.float32)


def test_prims_convert_element_type_is_a_cast_in_the_kernel():
    """``prims.convert_element_type`` (the training partition's rounding of a rebuilt norm output): a cast in the
    kernel, not an ATen call between kernels (each was one in ResNet-18's backward)."""
    def f(x):
        return torch.ops.prims.convert_element_type.default(x * 2, torch.bfloat16) + 1
    report = run(f, torch.randn(64, 32), rtol=1e-2, atol=1e-2)
    assert not report.externs, report.externs


@pytest.mark.parametrize("fn", [torch.erf, torch.tanh, torch.expm1, torch.rsqrt])
def test_math_of_a_constant(fn):
    """A math function of a ``full`` (left unfolded): its constant operand is made a tensor (``km.erf(0.5)``
    called ``.to`` on a Python number: Triton-target fuzz seed 11502)."""
    def f(x):
        c = torch.full(x.shape, 0.5, dtype=x.dtype, device=x.device)
        return x.sum(-1, keepdim=True) / (x.abs() + 0.5) + fn(c) ** 2
    run(f, torch.randn(8, 12))


def test_int64_extremes_of_constants():
    """amin/amax/argmin of an int64 ``full`` (printed as int32 literals) beside the identity 2**63 - 1: the
    values converted to int64 (Triton-target fuzz seed 12470: 'out of range for type int32')."""
    def f(m):
        v = torch.masked_fill(torch.full((3,), 3, dtype=torch.int64, device=m.device), m, -1)
        return v.amin(), v.amax(), v.argmin()
    run(f, torch.tensor([False, True, False]))


def test_wrong_device_input_is_a_clear_error():
    if not HAS_CUDA:
        pytest.skip("needs a GPU to have a second device")
    c = kiln.compile(lambda x: x + 1, target="triton", fallback=False)
    with torch.inference_mode():
        c(torch.randn(4, device="cuda"))
        with pytest.raises(Exception, match="cpu|cuda"):
            c(torch.randn(4))


# CUDA graphs on the GPU; on the CPU their emulation ([Note: CUDA graphs emulated on the CPU])
_GRAPHS = {} if HAS_CUDA else {"emulate_cuda_graphs": True}


def test_reduce_overhead_replays_with_new_inputs_and_keeps_old_outputs():
    lin = torch.nn.Linear(32, 16).to(DEVICE).eval()

    def f(x):
        return torch.softmax(lin(x) * 2, -1)
    compiled = kiln.compile(f, mode="reduce-overhead", fallback=False, **_GRAPHS)
    xs = [torch.randn(8, 32, device=DEVICE) for _ in range(4)]
    with torch.inference_mode():
        outs = [compiled(x) for x in xs]  # call 1 runs, calls 2-3 record on the callers' buffers, 4 on copies
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, f(x), rtol=1e-4, atol=1e-5)
        x = xs[1]
        x.mul_(-3.0)  # same buffer, new contents: the replay reads them
        torch.testing.assert_close(compiled(x), f(x), rtol=1e-4, atol=1e-5)


def test_reduce_overhead_outputs_are_not_copied_and_stay_the_callers():
    """Outputs are aliases of the graph's buffers (no copy); one the caller keeps is moved onto a copy before
    the next replay, a view the caller keeps makes the call run without the graph, an output fed back as the
    next input works, and outputs sharing storage come out right (under inference mode: its tensors keep no
    version counter, which moving a held output read - a crash on the H100, session 45)."""
    lin = torch.nn.Linear(32, 32).to(DEVICE).eval()

    def f(x):
        y = torch.tanh(lin(x)) + x
        return y, y.t(), x * 2

    compiled = kiln.compile(f, mode="reduce-overhead", fallback=False, **_GRAPHS)
    x = torch.randn(8, 32, device=DEVICE)
    with torch.inference_mode():
        for _ in range(3):  # run, record, replay
            compiled(x)
        first = compiled(x)[0]
        ptr = first.data_ptr()
        expected = f(x)[0]
        del first
        again = compiled(x)[0]
        assert again.data_ptr() == ptr  # the dropped output's buffer is written again: no copy was made
        kept = again
        x2 = torch.randn(8, 32, device=DEVICE)
        x.copy_(x2)
        newer = compiled(x)
        torch.testing.assert_close(kept, expected, rtol=1e-4, atol=1e-5)  # moved onto a copy, unchanged
        for got, want in zip(newer, f(x2)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        view = newer[0][1:3]  # a view of an output pins its buffer: the next call runs without the graph
        held = view.clone()
        del newer
        x.normal_()
        for got, want in zip(compiled(x), f(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(view, held)
        h = x.clone()
        for _ in range(4):  # fed back: the output buffer is the next call's input
            want = f(h)[0]
            h = compiled(h)[0]
            torch.testing.assert_close(h, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 20, 24, 40), (1, 7, 9, 33), (2, 8, 8, 64), (1, 5, 9, 64), (3, 8, 16, 33)])
def test_transposed_operand_runs_in_2d_tiles(shape):
    """out[n, c, h, w] = f(x[n, h, w, c]): loads coalesce along c, stores along h*w; a bound the tile divides
    (64 channels, 128 positions) is not tested (codegen/triton.py [Note: masks a tile cannot need])."""
    r = run(lambda x, b: torch.relu(x.permute(0, 3, 1, 2) * 2.0 + b), torch.randn(shape),
            torch.randn(shape[3], 1, 1))
    assert "tl.program_id(2)" in r.source
    _, h, w, c = shape
    assert (f"< {c})" in r.source) == (c % 32 != 0), r.source  # (TILE_Y = 32 along the channels)
    assert (f"< {h * w})" in r.source) == (h * w % 64 != 0), r.source  # (TILE_X = 64 along the positions)


def test_exact_gelu_uses_erf_form_on_triton():
    """The Triton target lowers exact GELU as ATen's CUDA kernel does, x/2 * (1 + erf(x/sqrt 2)) (erf is cheaper
    than erfc); far into the negative tail both round to eager's values."""
    x = torch.cat([torch.randn(300) * 3, torch.linspace(-12, 12, 97)])
    report = run(lambda t: F.gelu(t), x)
    assert "km.erf(" in report.source and "km.erfc(" not in report.source, report.source


def test_erf_erfc_ndtr_rsqrt_over_their_whole_range():
    """kiln's own erf/erfc/ndtr/rsqrt (runtime/triton_math.py, [Note: no libdevice]: the same code on the GPU and
    in the interpreter): every branch and its edges - erf's two pieces meeting at |x| = 1, erfc's tail to 10 and
    its underflow, the 1/x polynomial's ends - and inf, NaN, signed zero, against eager."""
    x = torch.cat([torch.linspace(-12, 12, 4001), torch.tensor([0.0, -0.0, 1.0, -1.0, 0.99999994, 1.0000001, 4.0,
                                                                 -4.0, 10.0, 9.999999, float("inf"), float("-inf"),
                                                                 float("nan")])])
    p = torch.cat([torch.rand(2000) * 1e3 + 1e-30, torch.tensor([1e-37, 1e-20, 1.0, 3e38, 0.0, float("inf")])])
    run(lambda t: (torch.erf(t), torch.erfc(t), torch.special.ndtr(t)), x)
    report = run(lambda t: torch.rsqrt(t), p)
    assert "km.rsqrt(" in report.source, report.source


def test_row_scratch_written_in_the_final_loop():
    """wav2vec2's feature encoder in bf16 (convolution, GroupNorm with a group per channel, GELU) gives a reduction
    kernel whose row scratch (the normalized row, shared by the stores) is written by its final loop, not by a
    reduction pass: the Triton writer once tried to store it as a buffer (KeyError 'scr0', an eager fallback on
    the H200).  Row scratch is recomputed where read on this target."""
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(1, 8, 10, stride=5, bias=False).to(DEVICE, torch.bfloat16)
    norm = torch.nn.GroupNorm(8, 8).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)

    def f(x):
        return F.gelu(norm(conv(x[:, None])))

    report = run(f, torch.randn(2, 1600, dtype=torch.bfloat16), rtol=2e-2, atol=2e-2)
    assert len(report.kernels) == 1, [k.name for k in report.kernels]


def test_one_row_persistent_reductions_written_1d():
    """A persistent schedule of one row per program (``XBLOCK = 1``) is written with 1-D blocks (the form
    Inductor gives its LayerNorms).  Reductions of every kind, arg-reductions with NaN, row values stored (the
    mean), a 0-d result and a per-row epilogue, all under that schedule."""
    from kiln import config
    w, b = torch.randn(40, device=DEVICE), torch.randn(40, device=DEVICE)

    def f(x, i):
        y = x.clone()
        y[2, 3] = float("nan")
        return (x.sum(-1), x.mean(-1, keepdim=True), x.amax(-1), x.amin(1), x.var(-1), (x * 0.1 + 1).prod(-1),
                y.argmax(-1), x.argmin(-1), i.argmax(-1), x.sum(), torch.softmax(x, -1),
                F.layer_norm(x, (40,), w, b))
    with config.scope(triton_persistent_schedule="1,4"):
        report = run(f, torch.randn(12, 40), torch.randint(-50, 50, (12, 40)), rtol=5e-5, atol=5e-5)
        assert "tl.zeros([1], tl.int32)" in report.source and "[None, :]" not in report.source, report.source
        pytest.importorskip("triton.backends.nvidia.driver")
        from kiln.schedule.plan import triton_graph
        from kiln.testing.gpu_build import gpu_build_errors
        assert gpu_build_errors(triton_graph(report.optimized, report, torch.device(DEVICE))) == {}


def test_kernels_that_differ_only_in_buffer_numbering_compile_once():
    """Two layers' residual LayerNorms: the first reads the graph input (buffer 0, before its weights), the
    second a product computed after its weights.  The parameters follow the body's first use, not the buffer
    numbers, so both have one text: one definition, the other an alias (encoder_fast: 7 kernels -> 5)."""
    def f(x, w1, b1, m, w2, b2):
        h = F.layer_norm(x + torch.tanh(x), (32,), w1, b1)
        g = h @ m
        return F.layer_norm(g + torch.tanh(g), (32,), w2, b2)
    report = run(f, torch.randn(8, 32), torch.randn(32), torch.randn(32), torch.randn(32, 32) / 6,
                 torch.randn(32), torch.randn(32), rtol=5e-5, atol=5e-5)
    assert report.source.count("@triton.jit") == 1, report.source
    assert report.source.count("# the same kernel as") == 1, report.source


def test_a_gather_whose_index_is_one_element():
    """``x.gather(-1, idx)`` with a one-element index, then pointwise: the gathered position comes from a loaded
    scalar alone, so the masked load's pointer is made a block of the mask's shape (tl.load refuses a block mask
    with a scalar pointer; fuzz_symbolic --target triton, seed 247)."""
    def fn(x, idx):
        v = x.gather(-1, idx)
        return F.log_softmax(v, dim=-2), F.pad(torch.softmax(v, dim=0), (1, 1, 0, 1), value=-0.5)

    x, idx = torch.randn(1, 1, device=DEVICE), torch.zeros(1, 1, dtype=torch.long, device=DEVICE)
    with torch.inference_mode():
        got = kiln.compile(fn, target="triton", fallback=False)(x, idx)
    for g, e in zip(got, fn(x, idx)):
        torch.testing.assert_close(g, e)


def test_pow_with_a_one_element_base_or_exponent():
    """``torch.pow`` where the base or the exponent is one gathered element (a scalar in the kernel) and the other
    a block (fuzz_symbolic --target triton, seeds 319 and 535: the interpreter's pow combined their tests)."""
    def fn(x, idx):
        one = torch.gather(x, 1, idx) * 0.5
        base, exponent = x.abs() + 0.5, x.clamp(-2.0, 2.0)
        return torch.pow(base, one.clamp(-2.0, 2.0)), torch.pow(one.abs() + 0.5, exponent)

    x, idx = torch.randn(3, 7, device=DEVICE), torch.zeros(1, 1, dtype=torch.long, device=DEVICE)
    with torch.inference_mode():
        got = kiln.compile(fn, target="triton", fallback=False)(x, idx)
    for g, e in zip(got, fn(x, idx)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bool_and_small_int_casts_to_half_are_exact(dtype):
    """A bool or a small int cast to a half type is exact (fuzz_symbolic --target triton, seeds 402 and 594)."""
    def fn(b, i):
        return b.to(dtype) * 1, i.to(dtype) + 0

    b = torch.rand(2, 4, 4, device=DEVICE) < 0.5
    i = torch.randint(-200, 200, (2, 4, 4), device=DEVICE)
    with torch.inference_mode():
        got = kiln.compile(fn, target="triton", fallback=False)(b, i)
    for g, e in zip(got, fn(b, i)):
        assert torch.equal(g, e)


def test_pow_of_a_literal_base():
    """``2.0 ** x`` (bloom's ALiBi slopes): a literal base with a block exponent."""
    def fn(x):
        return torch.pow(2.0, x) + torch.pow(x.abs() + 0.5, 3.0)

    x = torch.randn(3, 7, device=DEVICE)
    with torch.inference_mode():
        got = kiln.compile(fn, target="triton", fallback=False)(x)
    torch.testing.assert_close(got, fn(x), rtol=1e-5, atol=1e-5)


def test_a_constant_cast_in_a_kernel():
    """A kernel that stores a cast constant (an int64 ``full`` a training forward returns): a Python number has no
    ``.to`` - ``3.to(tl.int64)`` did not even parse, and the graph fell back (fuzz seed 5 with gradients)."""
    def fn(x):
        return x.softmax(-1), torch.full((8,), 3, dtype=torch.int64, device=x.device)

    x = torch.randn(3, 5, device=DEVICE, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    probs, threes = kiln.compile(fn, target="triton", fallback=False)(x)
    expected = fn(ref)
    torch.testing.assert_close(threes, expected[1], rtol=0, atol=0)
    (probs * torch.arange(5.0, device=DEVICE)).sum().backward()
    (expected[0] * torch.arange(5.0, device=DEVICE)).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_reduction_of_a_constant(dtype):
    """Kernels over a constant alone (a ``full``, repeated, its product and a minimum, returned): a stored value
    whose text is a Python number converts with ``tl.cast`` (``0.5.to(tl.bfloat16)`` failed; fuzz seed 548)."""
    def fn(x):
        c = torch.full(x.shape, 0.5, dtype=x.dtype, device=x.device)
        r = c.repeat(1, 1).contiguous()
        return c.reshape(-1), torch.minimum(r.prod(dim=0, keepdim=True), r), c, x * 2

    x = torch.randn(4, 2, device=DEVICE).to(dtype)
    with torch.inference_mode():
        got = kiln.compile(fn, target="triton", fallback=False)(x)
    for g, e in zip(got, fn(x)):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_amin_backward_compares_values_as_they_were_rounded(dtype):
    """amin's backward finds the reduced values equal to the result - ``x * -1.25`` recomputed in the backward
    against the ``amin`` the forward stored rounded to ``dtype``: compared unrounded, no element was equal and
    the gradient a 0/0 (NaN; fuzz seed 2003 with gradients).  Gradients are eager's."""
    def fn(x):
        m = (x * -1.25).amin(dim=[0, 1])
        return torch.maximum(m, x) + m

    base = (torch.rand(1, 1, 256, device=DEVICE) * 2 + 0.5).to(dtype)
    x, ref = base.clone().requires_grad_(), base.clone().requires_grad_()
    kiln.compile(fn, target="triton", fallback=False)(x).sum().backward()
    fn(ref).sum().backward()
    assert torch.isfinite(x.grad).all()
    torch.testing.assert_close(x.grad, ref.grad, rtol=0, atol=0)


def test_a_scalar_comparison_anded_with_a_block():
    """Kernel text kiln writes for a one-element buffer's value compared and ANDed with a block of bools (fuzz
    seeds 294, 394 with gradients): valid Triton; Triton 3.6's interpreter needs tests/gpu/conftest.py's patch
    ([Note: the interpreter's scalar comparisons])."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(p_scalar, p_x, p_out, BLOCK: tl.constexpr):
        r = tl.arange(0, BLOCK)
        x = tl.load(p_x + r)
        s = tl.load(p_scalar + (0))
        tl.store(p_out + r, tl.where((s == 0.5) & (x >= 0.0), x, -1.0))

    x = torch.randn(16, device=DEVICE)
    for value in (0.5, 0.25):
        out = torch.empty_like(x)
        kernel[(1,)](torch.tensor([value], device=DEVICE), x, out, BLOCK=16)
        expected = torch.where((x >= 0) & (value == 0.5), x, torch.full_like(x, -1.0))
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_amax_mask_beside_the_amax_compares_rounded_values(dtype):
    """The forward computes amax's backward mask in the kernel of the amax, from the product held in row scratch
    (not stored, computed again): compared unrounded with the rounded amax, nothing was equal - NaN gradients
    (fuzz seed 257 with gradients).  Gradients are eager's."""
    def fn(a, b):
        p = a * b
        return p.amax(), p

    base_a = (torch.rand(64, 1, device=DEVICE) * 4 - 2).to(dtype)
    base_b = (torch.rand(1, device=DEVICE) * 4 - 2).to(dtype)
    got, expected = [], []
    for out, run in ((got, kiln.compile(fn, target="triton", fallback=False)), (expected, fn)):
        a, b = base_a.clone().requires_grad_(), base_b.clone().requires_grad_()
        m, p = run(a, b)
        (m.float() * 3 + p.float().sum()).backward()
        out += [a.grad, b.grad]
    for g, e in zip(got, expected):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2)
