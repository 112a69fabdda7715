"""The generated straight-line call (kiln.codegen.gpu_call) against the interpreted program and eager."""
import pytest
import torch
from torch import nn

from kiln.runtime.triton_module import TritonGraph
from kiln.schedule.plan import triton_graph
from tests.gpu.conftest import DEVICE, compile_and_run
from tests.gpu.test_triton_memory import Block


class Net(Block):
    """A library call with an epilogue kernel over its result, a residual read twice, views handed to a
    library (flatten, transposed weight), and two outputs, one a view."""

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        z = y * torch.sigmoid(y) + y
        logits = self.fc(z.flatten(1))
        return logits.softmax(-1), z[:, :2].permute(0, 2, 3, 1)


def _module(report) -> TritonGraph:
    return triton_graph(report.optimized, report, torch.device(DEVICE))


@pytest.fixture
def net():
    model = Net().to(DEVICE).eval()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    return model


def test_wrapper_matches_the_interpreted_call_and_eager(net):
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        expected = net(x)
        got, report = compile_and_run(net, x)
        module = _module(report)
        wrapped = module([x])
        interpreted = module.interpret([x])
    assert report.wrapper.startswith("def call(inputs):") and "del v" in report.wrapper
    for g, w, i, e in zip(got, wrapped, interpreted, expected):
        torch.testing.assert_close(w, i, rtol=0, atol=0)
        assert w.stride() == i.stride()
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(w, e, rtol=1e-4, atol=1e-5)


def test_wrapper_checks_inputs_and_copies_strided_ones(net):
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        _, report = compile_and_run(net, x)
        module = _module(report)
        with pytest.raises(ValueError, match=r"input 0 expected torch.float32 of shape \[2, 4, 6, 6\]"):
            module([torch.randn(2, 4, 6, 7, device=DEVICE)])
        with pytest.raises(ValueError, match="expected torch.float32"):
            module([x.double()])
        strided = torch.randn(2, 4, 6, 12, device=DEVICE)[..., ::2]
        torch.testing.assert_close(module([strided])[0], net(strided)[0], rtol=1e-4, atol=1e-5)


def test_wrapper_reuses_the_memory_of_values_that_die():
    """The ``del`` lines free what the interpreted program frees: a long chain of library calls and kernels
    holds at most a few buffers at once (on the CPU the caching allocator is absent, so the check is that
    every intermediate is deleted before the call returns)."""
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(6)]).to(DEVICE).eval()
    x = torch.randn(4, 16, device=DEVICE)
    with torch.inference_mode():
        got, report = compile_and_run(layers, x)
        torch.testing.assert_close(got, layers(x), rtol=1e-4, atol=1e-5)
    lines = report.wrapper.splitlines()
    assigned = {ln.split(" = ")[0].strip() for ln in lines if ln.startswith("    v") and " = " in ln}
    inputs = {ln.split(" = ")[0].strip() for ln in lines if " = inputs[" in ln}
    deleted = {ln.split()[1] for ln in lines if ln.strip().startswith("del ")}
    returned = set(lines[-1].removeprefix("    return [").removesuffix("]").split(", "))
    assert len(deleted) >= 10
    assert assigned - deleted <= returned | inputs


@pytest.mark.parametrize("view", [False, True])
def test_wrapper_hands_out_library_results_in_eagers_layout(view):
    """A convolution whose library writes channels-last (on the CPU: oneDNN with a prepacked weight), returned
    as is or as a view: the caller gets eager's strides, as from the interpreted call."""
    conv = nn.Conv2d(4, 8, 3).to(DEVICE).eval()
    model = (lambda x: conv(x).flatten(1)) if view else conv
    x = torch.randn(2, 4, 9, 9, device=DEVICE)
    with torch.inference_mode():
        expected = model(x)
        got, report = compile_and_run(model, x)
        module = _module(report)
        wrapped = module([x])[0]
        interpreted = module.interpret([x])[0]
    assert ("OUTPUT_" in report.wrapper) == bool(module.plan.strides_of)
    for t in (got, wrapped, interpreted):
        torch.testing.assert_close(t, expected, rtol=1e-4, atol=1e-5)
        assert t.stride() == expected.stride()


def test_wrapper_can_be_turned_off(net):
    """``gpu_call_wrapper=False`` (Config): the plan is interpreted step by step, with the same results."""
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        expected = net(x)
        got, report = compile_and_run(net, x, gpu_call_wrapper=False)
    assert report.wrapper == ""
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_kernels_read_views_of_buffers_through_the_tensor_they_alias():
    """[Note: loose views] A kernel writing into a dead buffer's memory, and views at a buffer's first element,
    take the buffer's tensor object (``v7 = v3``) where only kernels read them; a library call reading one gets it
    in its own layout (on the GPU the chain's reshapes back to the product's layout cost no line at all).  Checked
    against eager, and against the wrapper with every view laid out (the interpreted plan)."""
    import re
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32))
                             for _ in range(3)]).to(DEVICE).eval()
    x = torch.randn(2, 5, 32, device=DEVICE)
    with torch.inference_mode():
        got, report = compile_and_run(layers, x)
        module = _module(report)
        torch.testing.assert_close(got, layers(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(module([x])[0], module.interpret([x])[0], rtol=0, atol=0)
    aliases = [ln for ln in report.wrapper.splitlines() if re.fullmatch(r"\s+v\d+ = v\d+(  #.*)?", ln)]
    if DEVICE == "cuda":  # (on the CPU the interpreter's launches get tensors as laid out: few stay loose)
        assert len(aliases) >= 3, report.wrapper


@pytest.mark.skipif(DEVICE != "cuda", reason="kiln's launcher calls the CUDA driver")
def test_kernels_launch_through_kilns_launcher_and_match_tritons(net):
    """Every kernel kiln compiled ahead launches through runtime/gpu_launch (the wrapper's LAUNCH lines for
    aligned buffers, the launcher object for the rest), and the results are Triton's launcher's to the bit; a
    caller's misaligned input goes through Triton's JIT entry.  Kiln loads those kernels itself: Triton's C
    launcher of a kernel is never built ([Note: no Triton launcher])."""
    from kiln.runtime.triton_module import _Launcher
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        got, report = compile_and_run(net, x)
        module = _module(report)
        assert module.static_launches == sum(len(s) for s in module.segments) > 0
        assert "LAUNCH_" in report.wrapper and "RUN_" not in report.wrapper
        launchers = [fn for steps in module._launches for fn, _, _ in steps if isinstance(fn, _Launcher)]
        assert launchers and all("runner" not in vars(fn) and fn.compiled._run is None for fn in launchers)
        triton_got, _ = compile_and_run(net, x, gpu_static_launch=False)
        for a, b in zip(got, triton_got):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        shifted = torch.randn(2 * 4 * 6 * 6 + 1, device=DEVICE)[1:].view(2, 4, 6, 6)  # 4-byte aligned only
        shifted.copy_(x)
        for a, b in zip(module([shifted]), got):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_launch_records_describe_pointer_and_size_parameters():
    """A record holds the grid, threads, shared memory and each parameter's pointer-table slot (Triton's two
    scratch pointers null); an int size parameter is a fixed value of the record (one record per size), found by
    name among the kernel's parameters, and an fp32 one (a float computed from sizes) as its bits.  A kernel with
    a scalar the record was not given or cannot pass (fp64), or a per-launch scratch buffer gets none."""
    from types import SimpleNamespace
    from kiln.runtime import gpu_launch
    md = SimpleNamespace(num_ctas=1, launch_cooperative_grid=False, launch_pdl=False, global_scratch_size=0,
                         profile_scratch_size=0, num_warps=4, shared=1024)
    kernel = SimpleNamespace(metadata=md, function=1234,
                             src=SimpleNamespace(signature={"a": "*bf16", "b": "*fp32", "XBLOCK": "constexpr"}))
    r = gpu_launch.record(kernel, (7, 1, 1), [3, 0])
    assert (r.grid_x, r.grid_y, r.grid_z, r.threads, r.shared, r.nargs) == (7, 1, 1, 128, 1024, 4)
    assert list(r.slot[:4]) == [3, 0, -1, -1] and list(r.value[:4]) == [0, 0, 0, 0]
    # s1 == 1 was specialized by Triton into a constant: no parameter
    sized = SimpleNamespace(metadata=md, function=1, src=SimpleNamespace(
        signature={"a": "*fp32", "b": "*fp32", "s0": "i32", "s1": "constexpr", "s2": "i64", "XBLOCK": "constexpr"}))
    r = gpu_launch.record(sized, (5, 1, 1), [1, 0], scalars={"s0": 37, "s1": 1, "s2": 2**40})
    assert r.nargs == 6 and list(r.slot[:6]) == [1, 0, -1, -1, -1, -1]
    assert list(r.value[:6]) == [0, 0, 37, 2**40, 0, 0]
    assert gpu_launch.record(sized, (5, 1, 1), [1, 0], scalars={"s0": 37}) is None  # s2 unknown
    assert gpu_launch.record(sized, (5, 1, 1), [1], scalars={"s0": 37, "s2": 3}) is None  # a pointer short
    scalar = SimpleNamespace(metadata=md, function=1, src=SimpleNamespace(signature={"a": "*fp32", "x": "fp32"}))
    assert gpu_launch.record(scalar, (1, 1, 1), [0]) is None  # (a float it was not given)
    r = gpu_launch.record(scalar, (1, 1, 1), [0], scalars={"x": 0.125})  # a float computed from sizes: its bits
    assert list(r.value[:2]) == [0, 0x3E000000]
    odd = SimpleNamespace(metadata=md, function=1, src=SimpleNamespace(signature={"a": "*fp32", "x": "fp64"}))
    assert gpu_launch.record(odd, (1, 1, 1), [0], scalars={"x": 0.125}) is None
    scratch = SimpleNamespace(metadata=SimpleNamespace(**{**vars(md), "global_scratch_size": 64}), function=1,
                              src=kernel.src)
    assert gpu_launch.record(scratch, (1, 1, 1), [0, 1]) is None


def test_the_launch_extension_checks_alignment_before_launching():
    """The extension builds here too (no GPU needed to load it): with no kernel to launch it answers 0, and -1
    before any launch when a buffer is not 16-byte aligned (the wrapper then takes Triton's JIT entry)."""
    from kiln.runtime import gpu_launch
    ext = gpu_launch.build_extension()
    aligned, shifted = torch.randn(64), torch.randn(65)[1:]
    assert ext.launch(0, 0, 0, aligned) == 0
    assert ext.launch(0, 0, 0, aligned, shifted) == -1
    with pytest.raises(TypeError):
        ext.launch(0, 0)


class _Heads(nn.Module):
    """Attention-style head split: a library product, then views of it, one of which must copy (a reshape of a
    permuted value) before the next library call."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(32, dim=-1)
        q = q.reshape(b, t, 4, 8).permute(0, 2, 1, 3).reshape(b * 4, t, 8)
        k = k.reshape(b, t, 4, 8).permute(0, 2, 3, 1).reshape(b * 4, 8, t)
        s = torch.bmm(q, k).softmax(-1)
        return torch.bmm(s, v.reshape(b, t, 4, 8).permute(0, 2, 1, 3).reshape(b * 4, t, 8))


def test_library_operands_a_view_cannot_give_are_copied_by_kernels_of_kilns():
    """Heads split and merged around bmm: a reshape of a permuted value is no view of its buffer.  Each such
    operand is written contiguous by copy kernels of kiln's (schedule/layout.relayout_copies), not by ATen's
    strided copy inside the call; every other view is one as_strided, and no view op runs by itself."""
    model = _Heads().to(DEVICE).eval()
    x = torch.randn(2, 6, 32, device=DEVICE)
    with torch.inference_mode():
        got, report = compile_and_run(model, x, library_selection=False)
        expected = model(x)
        module = _module(report)
        interpreted = module.interpret([x])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, interpreted[0], rtol=0, atol=0)
    lines = report.wrapper.splitlines()
    # q, k and v each written by a copy kernel (q's and v's by one: both read the projection, [Note: horizontal
    # fusion] joins v's copy to q's across the first product)
    copies = [k for k in report.kernels if k.name.endswith("_copy")]
    assert sum(len(k.buffers()[1]) for k in copies) == 3, report.wrapper
    assert sum(ln.endswith("_copy") and "# kernel_" in ln for ln in lines) == len(copies), report.wrapper
    assert not [ln for ln in lines if "(copies)" in ln or "VIEW_" in ln], report.wrapper


def test_library_calls_are_written_out_with_their_arguments(no_tf32):
    """Each extern is the op called with its arguments in place (no generic closure); a channels-last
    convolution's input is converted only where its layout is not known to be channels-last already (the
    graph's NCHW input, not the kernel output between the convolutions); results equal the interpreted call's."""
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)).to(DEVICE).eval()
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        got, report = compile_and_run(model, x, library_selection=False)
        module = _module(report)
        interpreted = module.interpret([x])
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, interpreted[0], rtol=0, atol=0)
    calls = [ln for ln in report.wrapper.splitlines() if "aten.convolution" in ln]
    assert len(calls) == 2 and all("(None, " not in ln for ln in calls), report.wrapper
    # through torch's C binding of the op (ir/extern.fast_callable), not the OpOverload
    bound = {name for name, value in module._wrapped.__globals__.items() if value is torch.convolution}
    assert all(ln.split("(")[0].split("= ")[-1] in bound for ln in calls), report.wrapper
    assert [("memory_format=torch.channels_last" in ln) for ln in calls] == [True, False], report.wrapper


def test_a_library_result_is_written_over_only_when_the_call_holds_it_alone(no_tf32):
    """The kernel after a convolution writes over the convolution's result when nothing else holds that storage;
    when something else does (here the test keeps a view of it, as a library caching its result would), the
    generated call allocates instead and the view keeps its values."""
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)).to(DEVICE).eval()
    x = torch.randn(2, 4, 6, 6, device=DEVICE)
    with torch.inference_mode():
        got, report = compile_and_run(model, x, library_selection=False)
        module = _module(report)
    assert "storage.nbytes()" in report.wrapper, report.wrapper  # the reuse is written out with its check
    line = next(ln for ln in report.wrapper.splitlines() if "aten.convolution" in ln)
    name = line.split("(")[0].split("= ")[-1]
    ns = module._wrapped.__globals__
    library = ns[name]
    held, values = [], []

    def keeping(*args):
        result = library(*args)
        if keep:
            held.append(result.detach())  # another tensor on the same storage
            values.append(result.clone())
        return result

    ns[name] = keeping
    try:
        with torch.inference_mode():
            for keep in (False, True):
                torch.testing.assert_close(module([x])[0], got, rtol=0, atol=0)
    finally:
        ns[name] = library
    assert torch.equal(held[0], values[0])  # not overwritten by the ReLU kernel


@pytest.mark.parametrize("strided", [False, True])
def test_wrapper_updates_the_callers_input_in_place(strided):
    """A decode step's static cache: the graph writes the new row into the caller's cache in place and reads the
    whole cache after.  The generated call serves it (before session 35 such graphs were interpreted step by
    step); a strided cache is updated in a contiguous copy and copied back at the end of the call."""
    def step(x, cache, pos):
        cache.index_copy_(1, pos, x)
        return torch.softmax(cache.sum(-1), -1), cache.amax(1) * 2

    def fresh():
        cache = torch.randn(2, 8, 16, device=DEVICE)
        return cache.transpose(1, 2).contiguous().transpose(1, 2) if strided else cache

    x, pos = torch.randn(2, 1, 16, device=DEVICE), torch.tensor([5], device=DEVICE)
    want_cache = fresh()
    mine = want_cache.clone(memory_format=torch.preserve_format)
    assert mine.is_contiguous() != strided
    with torch.inference_mode():
        expected = step(x, want_cache, pos)
        got, report = compile_and_run(step, x, mine, pos)
    assert report.wrapper.startswith("def call(inputs):")
    assert "back0 = (v0, v0.contiguous())" in report.wrapper and "# aten.index_put_.default" in report.wrapper
    torch.testing.assert_close(mine, want_cache, rtol=0, atol=0)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_wrapper_takes_every_output_of_a_multi_output_op_from_one_call():
    """[Note: one call for a multi-output extern] in the generated call: dropout's output and mask agree."""
    class Drop(nn.Module):
        def forward(self, x):
            out, mask = torch.ops.aten.native_dropout(x * 2, 0.5, True)
            return out + 1, mask

    x = torch.randn(64, 128, device=DEVICE)
    (out, mask), report = compile_and_run(Drop(), x)
    torch.testing.assert_close(out - 1, torch.where(mask, x * 4, torch.zeros_like(x)))
    assert 0.4 < mask.float().mean().item() < 0.6


@torch.library.custom_op("kiln_wrapper_test::dense_only", mutates_args=())
def _dense_only(x: torch.Tensor) -> torch.Tensor:
    """A library op that refuses strided operands (as the CPU ``native_group_norm`` does)."""
    if not x.is_contiguous():
        raise RuntimeError("dense_only: a non-contiguous operand")
    return x.flatten().cumsum(0).view(x.shape)


@_dense_only.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def test_library_calls_get_the_contiguous_operands_they_were_traced_with():
    """[Note: externs get the layouts they were traced with] in the generated call's written-out library call:
    the captured graph's ``contiguous`` is no node of kiln's, so the op is handed a permuted view of the product
    - and made contiguous at the call, as the runtime's closure does."""
    class Net(nn.Module):
        def forward(self, x):
            return _dense_only((x * 2).permute(0, 2, 1).contiguous()) + 1

    x = torch.randn(4, 5, 6, device=DEVICE)
    got, report = compile_and_run(Net(), x)
    torch.testing.assert_close(got, Net()(x), rtol=1e-5, atol=1e-5)
    assert ".contiguous())  # kiln_wrapper_test.dense_only" in report.wrapper


def test_a_callers_input_updated_in_place_is_not_written_over():
    """An update of the caller's input made in place (``index_put_``, passes/inplace_updates.py) returns the
    input itself: the buffer of ``x * x`` may not take its memory when it dies - the generated call's check that
    it holds a library result alone counts tensors, and the caller's input is that one tensor (fuzz seed 168)."""
    def fn(x, i, v):
        x[i] = v
        return x * x

    x = torch.rand(7, 1, 2, device=DEVICE) * 4 - 2
    i = torch.randperm(7, device=DEVICE)[:5]
    v = torch.randint(-3, 4, (5, 1, 2), device=DEVICE).float()
    expected_x = x.clone()
    expected = fn(expected_x, i, v)
    got, report = compile_and_run(fn, x, i, v)
    torch.testing.assert_close(x, expected_x, rtol=0, atol=0)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
