"""Column reductions ([Note: column reduction] in codegen/cpp_columns.py): reductions over a dimension that is not
the innermost, run with the vector across side-by-side rows.  Checked against eager for every reduction kind,
row counts with and without a partial last block (overlapped, or masked where the kernel may write in place),
NaN and infinities in the overlapped rows, half precision, integers, statistics with an elementwise pass over
the row (a LayerNorm over NCHW channels), that pass writing over its dying input, and the kernels that stay
row-wise."""
import pytest
import torch

from kiln.report import CompileReport
from kiln.schedule.plan import build_cpu
from tests.cpu.test_reduction_remainder import _check  # (compiled against eager, NaN-aware; returns the report)


def _columns(report) -> bool:
    return "for (int64_t c0 = 0;" in report.source


@pytest.mark.parametrize("rows", [16, 17, 49, 64, 69, 200])
def test_every_kind_over_a_leading_dimension(rows):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(3, 9, rows, generator=gen)
    report = _check(lambda t: (t.sum(1), t.mean(1), t.amax(1), t.amin(1), (t * 0.1 + 1).prod(1)), x)
    assert _columns(report)


def test_heads_averaged_in_the_kernel_that_sums_them():
    """Attention weights [1, H, L, S] averaged over the heads: the division joins the sum's kernel (its rows
    read through a size-1 dimension) and the sum runs across the S side-by-side rows."""
    x = torch.softmax(torch.randn(1, 8, 64, 69), -1)
    report = _check(lambda t: t.sum(1) / 8, x)
    assert len(report.kernels) == 1 and _columns(report)


def test_nan_and_infinities_in_the_overlapped_rows():
    """Rows 53..68 of 69 are computed by the last (overlapping) block, rows 5..63 by both blocks."""
    x = torch.randn(7, 69)
    x[2, 66] = float("nan")
    x[3, 60] = float("nan")
    x[4, 68] = float("inf")
    x[5, 5] = -float("inf")
    report = _check(lambda t: (t.amax(0), t.amin(0), t.sum(0)), x)
    assert _columns(report)


def test_half_precision_and_integers():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 11, 40, generator=gen)
    _check(lambda t: t.sum(1), x.bfloat16(), rtol=1e-2, atol=1e-2)
    _check(lambda t: t.sum(1), x.half(), rtol=1e-3, atol=1e-3)
    _check(lambda t: (t.sum(0), (t > 0.5).sum(0)), torch.randint(-50, 50, (13, 70)))


@pytest.mark.parametrize("hw", [(7, 7), (8, 8), (3, 23)])
def test_layer_norm_over_nchw_channels(hw):
    """ConvNeXt's channels-first LayerNorm: rows [N, H * W] (H and W merged into one run), two statistics
    passes and the normalizing pass over the channels, all along the rows."""
    gen = torch.Generator().manual_seed(hw[1])
    x = torch.randn(2, 32, *hw, generator=gen)
    w, b = torch.randn(32, 1, 1, generator=gen), torch.randn(32, 1, 1, generator=gen)

    def norm(t):
        u = t.mean(1, keepdim=True)
        s = (t - u).pow(2).mean(1, keepdim=True)
        return w * (t - u) / torch.sqrt(s + 1e-6) + b
    report = _check(norm, x)
    assert _columns(report)


def test_normalizing_pass_over_its_dying_input_masks_the_last_block():
    """Without an arena (the per-step allocation the GPU uses; runtime/inplace.py) the normalized result takes
    the memory of the matmul output it reads: the last block of 69 rows must not overlap the previous one,
    whose rows it would re-read after they were overwritten."""
    gen = torch.Generator().manual_seed(3)

    def inputs():
        return [torch.randn(48, 40, generator=gen), torch.randn(40, 69, generator=gen),
                torch.randn(48, 1, generator=gen), torch.randn(5, 48, generator=gen)]

    def norm(p, q, w, m):  # (arguments in the order the graph first reads them: its inputs' order)
        y = p @ q  # [48 channels, 69 positions]
        u = y.mean(0, keepdim=True)
        # (scaled per channel: normalizing the normalized rows again would give the same values)
        return m @ (w * (y - u) * torch.rsqrt((y - u).pow(2).mean(0, keepdim=True) + 1e-5) + 0.5)
    _in_place_without_arena(norm, inputs)


def _in_place_without_arena(fn, inputs):
    """``fn`` compiled (a column kernel whose last block is masked), then built without an arena, where a result
    takes the memory of an input it reads: twice on fresh inputs, each output against eager."""
    report = _check(fn, *inputs())
    assert _columns(report) and "l < live" in report.source
    per_step = CompileReport("no arena")
    with torch.inference_mode():
        module = build_cpu(report.optimized, per_step, arena=False)
        assert per_step.memory["in_place"] >= 1
        for _ in range(2):
            args = inputs()
            want = fn(*args)
            for got, expected in zip(module(args), want if isinstance(want, tuple) else (want,)):
                torch.testing.assert_close(got, expected, rtol=1.3e-5, atol=1.5e-5)


def test_contiguous_and_short_rows_stay_row_wise():
    x = torch.randn(6, 5, 8)
    assert not _columns(_check(lambda t: t.sum(2), x))    # reduced elements side by side
    assert not _columns(_check(lambda t: t.sum(0), x[:, 0, :]))  # 8 rows: less than a vector


def test_column_sums_reading_a_value_per_reduced_element():
    """A LayerNorm backward's weight and bias gradients: column sums over the tokens of ``[T, C]`` that read a
    per-token mean and rstd (contiguous along ``r``, the same for every row: a broadcast per ``r``), with the input
    gradient's elementwise pass in the same kernel - all along the rows."""
    gen = torch.Generator().manual_seed(5)
    g, x = torch.randn(70, 48, generator=gen), torch.randn(70, 48, generator=gen)
    mean, rstd = torch.randn(70, 1, generator=gen), torch.rand(70, 1, generator=gen) + 0.5

    def grads(g, x, mean, rstd):
        xhat = (x - mean) * rstd
        return (g * xhat).sum(0), g.sum(0), g * rstd + xhat
    report = _check(grads, g, x, mean, rstd)
    assert _columns(report)


def _gelu_grad(g, x):
    """GELU's backward, the elementwise value a bias gradient sums: erf and exp per element (the row writer kept it
    in a row scratch and gathered along ``r``)."""
    return g * (0.5 * (1 + torch.erf(x * 0.7071067811865476)) + x * torch.exp(-0.5 * x * x) * 0.3989422804014327)


@pytest.mark.parametrize("cols", [64, 69, 200])
def test_elementwise_output_stored_from_the_reduction_loop(cols):
    """[Note: a column reduction's elementwise output]: the input gradient and the bias gradient summed from it
    over the tokens - one kernel, the value stored and accumulated in the same lanes, no row scratch."""
    gen = torch.Generator().manual_seed(cols)
    g, x = torch.randn(32, cols, generator=gen), torch.randn(32, cols, generator=gen) * 2

    def grads(g, x):
        d = _gelu_grad(g, x)
        return d, d.sum(0)
    report = _check(grads, g, x)
    assert _columns(report) and "scr0" not in report.source


def test_elementwise_output_over_its_dying_input():
    """Without an arena the stored value may take the memory of the incoming gradient it reads (runtime/
    inplace.py); the last block of 69 columns is then masked, not overlapped (its lanes would re-read columns
    already overwritten)."""
    gen = torch.Generator().manual_seed(11)

    def inputs():
        return [torch.randn(32, 40, generator=gen), torch.randn(40, 69, generator=gen),
                torch.randn(32, 69, generator=gen)]

    def grads(p, q, x):
        d = _gelu_grad(p @ q, x)
        return d, d.sum(0)
    _in_place_without_arena(grads, inputs)


def test_pass_reading_the_row_result_keeps_its_scratch():
    """A last pass that reads the row's sum (a softmax backward's ``y * (g - sum)``-like form over a leading
    dimension) cannot store from the reduction loop: such kernels keep the row writer's scratch, and match."""
    gen = torch.Generator().manual_seed(12)
    g, x = torch.randn(32, 72, generator=gen), torch.randn(32, 72, generator=gen)

    def grads(g, x):
        d = _gelu_grad(g, x)
        return d * d.sum(0, keepdim=True)
    _check(grads, g, x)
