"""Graphs traced with dynamic shapes on the Triton target: one plan, Triton kernels with size parameters, a launch
plan per size ([Note: GPU kernels with size parameters] in kiln/schedule/gpu_symbolic.py).  Every size checked
against eager; nothing runs eagerly; sizes of one kind of schedule share one kernel module.

Runs on the GPU when there is one, else under Triton's interpreter on CPU tensors (CI); sizes are small."""
import re

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.report import mark
from tests.cpu.test_dynamic_shapes import _GPT
from tests.gpu.conftest import DEVICE, HAS_CUDA
from tests.gpu.test_dynamic_gpu import _symbolic_report


def _check(compiled, f, *args, tol=2e-5):
    got, want = compiled(*args), f(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


def _mixed(x, w):
    """Pointwise, a row reduction (softmax), a column one (sum over the symbolic axis) and a matmul."""
    h = torch.relu(x @ w) + x.sum(-1, keepdim=True)
    return F.softmax(h, -1) * 2, h.sum(0)


def test_one_kernel_module_serves_every_size_of_a_kind():
    """Pointwise, a row reduction (softmax) and a column one (sum over the symbolic axis), a matmul between:
    sizes that are and are not multiples of 16 (Triton specializes those), one kernel text for all."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device=DEVICE)
    position = mark()
    compiled = kiln.compile(_mixed, target="triton", dynamic=True)
    with torch.inference_mode():
        for n in (3, 5, 16, 9, 32, 5):
            _check(compiled, _mixed, torch.randn(n, 16, device=DEVICE), w)
    report = _symbolic_report(position)
    dynamic = report.dynamic
    assert dynamic["eager_calls"] == 0 and dynamic["builds"] == 5, dynamic  # (5 again: its plan is kept)
    assert dynamic["kernel_sources"] == 1, dynamic
    text = report.format(source=False)
    assert "Triton kernels with size parameters: 5 size(s) planned, 1 kernel module(s)" in text, text


def test_a_row_that_outgrows_one_block_takes_the_looped_kernel():
    """A reduction over a symbolic row: persistent while the row fits one block, looped past it
    (``PERSISTENT_MAX``): two kinds of schedule, two kernel modules, both right."""
    from kiln.codegen.triton import PERSISTENT_MAX

    def f(x):
        return torch.log_softmax(x, -1) + x.amax(-1, keepdim=True)

    position = mark()
    compiled = kiln.compile(f, target="triton", dynamic=True)
    with torch.inference_mode():
        for n in (7, 100, PERSISTENT_MAX + 37):
            _check(compiled, f, torch.randn(3, n, device=DEVICE) * 4)
    dynamic = _symbolic_report(position).dynamic
    assert dynamic["eager_calls"] == 0 and dynamic["kernel_sources"] == 2, dynamic


def test_sizes_used_as_values():
    """A size in the arithmetic (``x * x.shape[1]``, a mean over a symbolic count): the kernel reads its size
    parameter as a value."""
    def f(x):
        return x * x.shape[1] + x.mean(0), (x.shape[0] - x).exp()

    position = mark()
    compiled = kiln.compile(f, target="triton", dynamic=True)
    with torch.inference_mode():
        for n, m in ((3, 4), (6, 10), (6, 4)):
            _check(compiled, f, torch.rand(n, m, device=DEVICE))
    assert _symbolic_report(position).dynamic["eager_calls"] == 0


def test_sizes_stored_as_half_precision_constants():
    """A FULL of a size expression in bf16/fp16: the stored value is a size or float parameter, which Triton may
    pass as a Python scalar (under the interpreter always), so it is cast with ``tl.cast``, not ``.to``."""
    def f(x):
        n = x.shape[0]
        return (torch.full((3,), n // 2, dtype=torch.bfloat16, device=x.device),
                torch.full((2,), n * 0.5, dtype=torch.float16, device=x.device), x + 1)

    compiled = kiln.compile(f, target="triton", dynamic=True)
    with torch.inference_mode():
        for n in (5, 8, 3):
            x = torch.randn(n, device=DEVICE)
            for g, w in zip(compiled(x), f(x)):
                torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_a_float_from_sizes_is_a_kernel_parameter():
    """Floats computed from symbolic sizes (``n / 3``, ``n ** 0.5``, a clamp's bound ``n / 2``): the kernels take
    each as an fp32 parameter after their size parameters, its value per size computed on the host in double
    precision; one kernel text for every size, nothing eager."""
    def f(x):
        n = x.shape[0]
        return x + n / 3, torch.full_like(x, n ** 0.5) * x, x.clamp(max=n / 2)

    torch._dynamo.reset()
    position = mark()
    compiled = torch.compile(f, backend="kiln", dynamic=True, options={"target": "triton", "fallback": False})
    with torch.inference_mode():
        for n in (3, 5, 7, 16):
            _check(compiled, f, torch.randn(n, 4, device=DEVICE) * n)
    report = _symbolic_report(position)
    assert report.dynamic["eager_calls"] == 0 and report.dynamic.get("kernel_sources") == 1, report.dynamic
    assert re.search(r", f0(, f\d)*, XBLOCK", report.source), report.source
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpt_over_sequence_lengths_compiles_once_and_runs_no_call_eagerly(mode):
    torch.manual_seed(0)
    model = _GPT().eval().to(DEVICE)
    position = mark()
    compiled = kiln.compile(model, target="triton", mode=mode, dynamic=True)
    with torch.inference_mode():
        for T in (5, 17, 9, 17, 33):
            ids = torch.randint(0, 97, (1, T), device=DEVICE)
            for _ in range(3 if HAS_CUDA else 1):  # (reduce-overhead records a size at its second call)
                torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-4, atol=1e-4)
    report = _symbolic_report(position)
    dynamic = report.dynamic
    assert dynamic["eager_calls"] == 0 and dynamic["builds"] == 4, dynamic
    assert dynamic["kernel_sources"] <= 2, dynamic
    if HAS_CUDA and mode == "reduce-overhead":  # each size recorded at its second call (17 maybe twice: new ids)
        assert 4 <= dynamic["recordings"] <= 5, dynamic
        assert "CUDA graph recording(s)" in report.format(source=False)



@pytest.mark.skipif(not HAS_CUDA, reason="kiln's launcher launches on a GPU")
def test_every_size_launches_through_kilns_launcher():
    """Each size's launches are records of kiln's static launcher with that size's values fixed in them
    ([Note: static launch]): no kernel goes through Triton's runner, and the results are bit for bit those of
    the same kernels launched by Triton."""
    from kiln import config
    from kiln.report import CompileReport
    from kiln.schedule.gpu_symbolic import build_triton_symbolic

    torch.manual_seed(0)
    w = torch.randn(16, 16, device=DEVICE)
    position = mark()
    device = torch.device(DEVICE)
    with torch.inference_mode():
        kiln.compile(_mixed, target="triton", dynamic=True)(torch.randn(5, 16, device=DEVICE), w)
        graph = _symbolic_report(position).optimized
        module = build_triton_symbolic(graph, CompileReport(name="kiln's launcher"), device, [])
        with config.scope(gpu_static_launch=False):
            by_triton = build_triton_symbolic(graph, CompileReport(name="Triton's launcher"), device, [])
        for n in (3, 16, 37, 3):
            x = torch.randn(n, 16, device=DEVICE)
            got = module([x, w])
            for g, want in zip(got, _mixed(x, w)):
                torch.testing.assert_close(g, want, rtol=2e-5, atol=2e-5)
            for g, want in zip(got, by_triton([x, w])):
                torch.testing.assert_close(g, want, rtol=0, atol=0)
    assert len(module.modules) == 3
    for sized, plain in zip(module.modules.values(), by_triton.modules.values()):
        launches = sum(len(steps) for steps in sized._launches)
        assert launches > 0 and sized.static_launches == launches, (sized.static_launches, launches)
        assert plain.static_launches == 0


def test_a_convolutions_output_size_with_a_negative_term():
    """A strided convolution whose input height equals its channels (Dynamo gives both one symbol, ``2*s79``):
    the output height ``(2*s79 - s18) // 2 + 1`` is kept as ``s79 + (-s18 // 2) + 1``, whose floor division of
    a negative numerator the kernel text must floor (Triton's ``//`` truncates: the reduction over channels read
    and wrote past its buffers; fuzz_symbolic --target triton, seed 251)."""
    def f(x, w):
        return torch.min(F.conv2d(x, w, stride=2, groups=2), dim=1)

    torch.manual_seed(0)
    x, w = torch.randn(2, 8, 8, 5, device=DEVICE), torch.randn(6, 4, 3, 3, device=DEVICE)
    torch._dynamo.reset()
    position = mark()
    with torch.inference_mode():
        got = torch.compile(f, backend="kiln", dynamic=True, options={"target": "triton", "fallback": False})(x, w)
        want = f(x, w)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], want[1])
    assert _symbolic_report(position).dynamic["eager_calls"] == 0
    torch._dynamo.reset()


def test_fuzzer_programs_through_kernels_with_size_parameters():
    """The fuzzer's programs compiled with ``dynamic=True`` on the Triton target (``python -m
    kiln.testing.fuzz_symbolic --compile --target triton``), the first 50 seeds, match eager.  (What its longer
    runs found in session 33 has a test of its own each: test_size_one_reductions.py, test_triton_codegen.py,
    test_triton_memory.py, this file, tests/cpu/test_dynamic_shapes.py.)"""
    from kiln.testing.fuzz_symbolic import check
    failed = {}
    for seed in range(50):
        status, detail = check(seed, "all", "ci", True, "triton", DEVICE)
        if status in ("mismatch", "crash"):
            failed[seed] = f"{status}: {detail[:200]}"
    assert not failed, failed


def test_kernel_texts_are_decided_by_their_text_keys():
    """[Note: a size's build] The modules of a graph's sizes share kernel text by ``text_key``: at sizes of every
    kind (pointwise, a row in one block or looped, a row per program, 64-bit positions), kernels with one key have
    one text - else a size would launch another size's text with its own block sizes."""
    import collections

    from kiln import config
    from kiln.codegen.triton import PERSISTENT_MAX, TritonKernelWriter, text_key
    from kiln.schedule.gpu_symbolic import kernel_at
    from kiln.schedule.plan import make_plan

    def f(x, w):
        return torch.log_softmax(x @ w, -1) + x.amax(-1, keepdim=True), x.sum(0), (x * 2).transpose(0, 1) + 1

    position = mark()
    with torch.inference_mode():
        kiln.compile(f, target="triton", dynamic=True)(torch.randn(5, 24, device=DEVICE),
                                                        torch.randn(24, 24, device=DEVICE))
    graph = _symbolic_report(position).optimized
    with config.scope(layout_optimization=True):
        plan = make_plan(graph)
    dtype_of = collections.defaultdict(lambda: torch.float32, {b: n.dtype for n, b in plan.buffer_of.items()})
    symbols = sorted({s.name for k in plan.kernels for s in k.symbols()})
    kernels = [k for k in plan.kernels if k.is_symbolic()]
    assert kernels and symbols
    texts: dict[tuple, str] = {}
    for n in (1, 2, 3, 16, 17, 100, PERSISTENT_MAX + 3, 2 ** 31 + 5):
        for k in kernels:
            at = kernel_at(k, dict.fromkeys(symbols, n))
            key = (k.name, text_key(at, True))
            assert texts.setdefault(key, TritonKernelWriter(at, dtype_of).write()) == \
                TritonKernelWriter(at, dtype_of).write(), key
    assert len(texts) >= len(kernels) + 3, sorted(texts)  # (several kinds met: the test sees what it checks)


def test_positions_and_float_sizes_over_symbolic_sizes():
    """``arange(1, n + 1)`` keeps its start, and a float of sizes divided by a product (an instance norm's backward
    scales by ``1 / (N*C*H*W / (N*C))``) keeps its grouping, on the Triton target as on the CPU."""
    def f(x):
        n = x.shape[-1]
        return x.cumsum(-1) / torch.arange(1, n + 1, device=x.device) + torch.arange(n, 0, -1, device=x.device)

    compiled = kiln.compile(f, target="triton", dynamic=True)
    with torch.inference_mode():
        for shape in ((2, 3, 5), (3, 4, 7), (2, 5, 9)):
            _check(compiled, f, torch.randn(shape, device=DEVICE))

    def norm(x, w):
        return F.instance_norm(x, weight=w)

    compiled = kiln.compile(norm, target="triton", dynamic=True)
    w = torch.randn(4, device=DEVICE)
    for batch in (2, 3, 5):
        x = torch.randn(batch, 4, 3, 5, device=DEVICE, requires_grad=True)
        x2, w1, w2 = x.detach().clone().requires_grad_(), w.clone().requires_grad_(), w.clone().requires_grad_()
        g = torch.randn(batch, 4, 3, 5, device=DEVICE)
        compiled(x, w1).backward(g)
        norm(x2, w2).backward(g)
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-4, atol=1e-4)
