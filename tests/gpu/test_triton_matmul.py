"""The Triton matmul template: mm/addmm with the consuming pointwise kernel fused in as its epilogue.

On CPU tensors under TRITON_INTERPRET=1 (CI) the template is forced (``Config.matmul_template_config``) with small tiles,
so edges (M, N, K not multiples of the tile) and every epilogue kind are exercised; on a GPU the same tests run
the compiled kernels, and max-autotune's measured choice is checked for correctness and recorded."""
import pytest
import torch
from torch import nn

import kiln
from kiln.library.gpu_matmul.template import MatmulConfig
from kiln.report import mark, reports_since
from tests.gpu.conftest import DEVICE, HAS_CUDA, compile_and_run


@pytest.fixture
def forced():
    small = MatmulConfig(16, 16, 16, 2, 2, 2) if not HAS_CUDA else MatmulConfig(32, 32, 32, 4, 4, 3)
    with kiln.config.scope(matmul_template_config=",".join(map(str, small.trace()))):
        yield small


class Block(nn.Module):
    """Linear -> GELU, Linear + residual, and a final Linear whose result is the graph's output."""

    def __init__(self, d=40, h=56):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)
        self.head = nn.Linear(d, 24, bias=False)

    def forward(self, x):
        y = x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        return self.head(y * 0.5), y




@pytest.mark.parametrize("rows", [20, 1])
def test_template_with_fused_epilogues_matches_eager(forced, rows):
    model = Block().to(DEVICE).eval()
    x = torch.randn(rows, 40, device=DEVICE)
    with torch.inference_mode():
        expected = model(x)
    got, report = compile_and_run(model, x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    m = report.matmuls
    assert m.candidates == 3 and len(m.fused) == 3
    assert sum("no epilogue" not in line for line in m.fused) == 2  # GELU and the residual add are fused
    assert "tl.dot" not in report.source  # the templates live in modules of their own, not the kernel module
    assert not any("mm" in e for e in report.externs)
    assert "3 run as templates, 0 stay on cuBLAS" in report.format(source=False)  # kiln.explain says so


def test_template_on_transposed_and_batched_operands(forced):
    """mm on a transposed activation (a strided operand) and a 3-D input flattened for the Linear."""
    lin = nn.Linear(36, 28).to(DEVICE).eval()

    def f(x, y):
        return torch.relu(lin(x)) + (y.t() @ y).sum()
    x, y = torch.randn(2, 5, 36, device=DEVICE), torch.randn(19, 23, device=DEVICE)
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(f, target="triton", fallback=False, fullgraph=True)(x, y)
        torch.testing.assert_close(got, f(x, y), rtol=1e-4, atol=1e-4)
    [report] = reports_since(position)
    assert len(report.matmuls.fused) == 2


@pytest.mark.skipif(not HAS_CUDA, reason="measures on the GPU")
def test_max_autotune_measures_once_then_reads_the_database(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    model = Block(256, 512).to(DEVICE).to(torch.bfloat16).eval()
    x = torch.randn(64, 256, device=DEVICE, dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = [t.float() for t in Block.forward(model.float(), x.float())]
        model.to(torch.bfloat16)
    got, first = compile_and_run(model, x, mode="max-autotune", cache_dir=str(tmp_path))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.float(), e, rtol=2e-2, atol=2e-2)
    assert first.matmuls.measured > 3 and first.matmuls.from_database == 0
    _, second = compile_and_run(model, x, mode="max-autotune", cache_dir=str(tmp_path))
    assert second.matmuls.measured == 0 and second.matmuls.from_database == 2  # the head has no epilogue


def test_cost_model_ranks_filling_tiles_first():
    """The ranking prefers tiles that give every SM work on a skinny problem and large tiles on a big one, and
    never proposes a configuration whose pipeline does not fit in shared memory."""
    from kiln.library.gpu_matmul.template import MatmulSpec
    from kiln.library.gpu_matmul.tune import SHARED_MEMORY, estimate_s, rank_configs

    def spec(m, n, k):
        return MatmulSpec("t", m, n, k, torch.bfloat16, torch.bfloat16, False, None, "c")
    big = rank_configs(spec(4096, 4096, 4096), sms=132)[0]
    assert big.block_m * big.block_n >= 128 * 128
    skinny = rank_configs(spec(64, 1024, 4096), sms=132)[0]
    assert (-(-64 // skinny.block_m)) * (-(-1024 // skinny.block_n)) >= 16  # not 4 programs on 132 SMs
    huge = MatmulConfig(256, 256, 128, 8, 8, 5)
    assert (huge.num_stages * 512 * 128 * 2 > SHARED_MEMORY) and estimate_s(huge, 4096, 4096, 4096,
                                                                           torch.bfloat16, 132) == float("inf")


def test_database_key_needs_no_allocation(tmp_path, monkeypatch):
    """Default mode looks every candidate up in the tuning database: the key (template text and operand strides)
    comes from meta tensors, and equals the key real tensors give; with no record, the plan is left alone."""
    from kiln.library.gpu_matmul.template import template_source
    from kiln.library.gpu_matmul.fusion import _key, _spec, fuse_matmuls
    from kiln.schedule.plan import make_plan
    from kiln.library.gpu_matmul.tune import operand_tensors
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    model = Block().to(DEVICE).eval()
    x = torch.randn(6, 40, device=DEVICE)
    # (unfuse_bias off: on a GPU its fp32 addmm would become mm, and the test looks the addmm up)
    _, report = compile_and_run(model, x, matmul_templates=False, disabled_passes="unfuse_bias")
    with kiln.config.scope(layout_optimization=True):  # (as the Triton target plans)
        plan = make_plan(report.optimized)
    dtype_of = {b: n.dtype for n, b in plan.buffer_of.items()}
    steps, stats = fuse_matmuls(plan.steps, report.optimized.outputs, plan.buffer_of, plan.strides_of,
                                torch.device(DEVICE), tune=False)
    assert steps == plan.steps and stats.candidates == 2 and stats.from_database == 0
    node = next(s.node for s in plan.steps if getattr(s, "node", None) is not None and "addmm" in str(
        s.node.attr("target")))
    spec = _spec(node, None, plan.buffer_of)
    source = template_source(spec, dtype_of)
    keys = {_key(source, spec, operand_tensors(node, plan.buffer_of, plan.strides_of, torch.device(d)))
            for d in ("meta", DEVICE)}
    assert len(keys) == 1


def test_fuse_matmuls_before_and_after():
    """The plan-level pass ``fuse_matmuls`` (library/gpu_matmul/fusion.py), before/after: each matmul and the
    one kernel that consumes its product become one template step that writes the kernel's buffers (the
    product itself is never stored); a matmul whose result is the graph's output is a template alone.  The
    fused plan computes what eager does (the other tests of this file run it)."""
    from kiln.library.gpu_matmul.fusion import fuse_matmuls
    from kiln.schedule.plan import make_plan
    model = Block().to(DEVICE).eval()
    x = torch.randn(6, 40, device=DEVICE)
    # unfuse_bias off so the plan reads the same on the GPU as on CPU tensors (on a GPU it turns fp32 addmm whose
    # product a kernel reads into mm + the bias in that kernel; tests/gpu/test_unfuse_bias.py covers it)
    _, report = compile_and_run(model, x, matmul_templates=False, disabled_passes="unfuse_bias")
    with kiln.config.scope(layout_optimization=True, matmul_template_config="16,16,16,2,2,2"):
        plan = make_plan(report.optimized)
        assert plan.format() == "\n".join([
            "  0 extern aten.addmm.default(buf1, buf2, view(buf0)) -> buf6",
            "  1 kernel kernel_0_mul: reads buf6; writes buf7",
            "  2 extern aten.addmm.default(buf4, buf7, view(buf3)) -> buf8",
            "  3 kernel kernel_1_add_mul: reads buf2, buf8; writes buf10, buf9",
            "  4 extern aten.mm.default(buf10, view(buf5)) -> buf11"])
        plan.steps, stats = fuse_matmuls(plan.steps, report.optimized.outputs, plan.buffer_of, plan.strides_of,
                                         torch.device(DEVICE), tune=False)
    tile = "[16x16x16 group 2, 2 warps, 2 stages]"
    assert plan.format() == "\n".join([
        f"  0 MatmulStep matmul_kernel_0_mul: 6x56x40 epilogue kernel_0_mul {tile}: operands buf1, buf2, "
        f"view(buf0); reads -; writes buf7",
        f"  1 MatmulStep matmul_kernel_1_add_mul: 6x40x56 epilogue kernel_1_add_mul {tile}: operands buf4, buf7, "
        f"view(buf3); reads buf2; writes buf10, buf9",
        f"  2 MatmulStep matmul_buf11: 6x24x40 no epilogue {tile}: operands buf10, view(buf5); reads -; "
        f"writes buf11"])
    assert stats.candidates == 3 and len(stats.fused) == 3
