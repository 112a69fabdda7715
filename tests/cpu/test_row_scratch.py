"""Row scratch arrays (kernel_build.py, [Note: row scratch]) are written before any pass over the row reads them.

Found by random programs (shared/regressions/random_program_187/235/240): a shared expensive value (``pow``,
``log``) first met while building a *stored* member was given to the kernel's final loop, and a reduction built
afterwards read the scratch in an earlier pass, before anything wrote it: the row max of a ``where`` came out of
garbage.  And an argmax/argmin pass (the scalar reduction loop) never wrote the scratch values it kept."""
import pytest
import torch

import kiln
from kiln.report import mark, reports_since


def check(fn, *inputs, target="cpu"):
    position = mark()
    with torch.inference_mode():
        expected = fn(*inputs)
        got = kiln.compile(fn, fallback=False, target=target)(*inputs)
    for i, (a, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(a, e, rtol=1.3e-5, atol=1.5e-5, msg=lambda m, i=i: f"output {i}: {m}")
    return reports_since(position)[-1]


def _stored_member_then_reduction(x):
    """``where`` (stored: the caller gets it) reads ``pow`` twice; the row max of the ``where`` comes after."""
    v0 = torch.pow(x.abs() + 0.5, torch.tanh(x))
    v1 = torch.where(v0 < x, x * 0.5, v0)
    return (v1.max(dim=1).values * 4.0).long(), v1


def _softmax_of_shared_log(x):
    e = torch.erf(x)
    m = torch.maximum(e, e)
    lg = torch.log(m.abs() + 0.5)
    return torch.clamp_max(m, 0.5), torch.softmax(torch.where(lg > e, lg, e), dim=1)


def _argmax_keeps_scratch(x):
    e = torch.exp(torch.sin(x) * 2)
    return (e / e.sum(1, keepdim=True)).argmax(1), (e * 3).amax(1), e.argmin(1)


CASES = [(_stored_member_then_reduction, (23, 4)), (_softmax_of_shared_log, (3, 6)), (_argmax_keeps_scratch, (7, 33))]


@pytest.mark.parametrize("fn,shape", CASES, ids=[f.__name__ for f, _ in CASES])
def test_scratch_written_before_read(fn, shape):
    torch.manual_seed(0)
    report = check(fn, torch.rand(shape) * 4 - 2)
    assert len(report.kernels) == 1


def _residual_then_layer_norm(x, r, w, b):
    """The residual stream: ``h = layer_norm(x) + r`` is stored (the caller gets it) and the next LayerNorm's
    statistics read it - Swin's window-reverse + residual + LayerNorm kernel."""
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b) * 1.5 + r
    return h, torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b)


def test_a_stored_member_read_by_the_row_passes_is_computed_once():
    """A stored member that the statistics passes read goes to a row scratch: written once per element (by the
    first pass), read by the second and by the final loop, which stores it from there; before, each pass and the
    store recomputed it (the earlier LayerNorm's expression four times per element: 14% of Swin's kernel's memory
    limit, 96% with the scratch)."""
    gen = torch.Generator().manual_seed(3)
    x, r = torch.randn(37, 96, generator=gen), torch.randn(37, 96, generator=gen)
    w, b = torch.randn(96, generator=gen), torch.randn(96, generator=gen)
    report = check(_residual_then_layer_norm, x, r, w, b)
    assert len(report.kernels) == 1
    lines = [line.strip() for line in report.format(source=False).splitlines()]
    keeps = [line for line in lines if line.startswith("keep") and "scr0[r] =" in line]
    # h is computed once into the scratch, then stored from it; the second LayerNorm's passes read the scratch
    assert len(keeps) == 1 and "buf3[" in keeps[0], lines
    assert any(line.startswith("loop") and line.endswith("= scr0[r]") for line in lines), lines
    assert sum("scr0[r]" in line and line.startswith("reduce") for line in lines) == 2, lines


def _patch_merging(x, r, w, b):
    """Swin's patch merging: the residual stream viewed as an image, four strided slices concatenated along
    channels ([1, 5, 7, 4C]), viewed as rows ([1, 35, 4C]) and layer-normed."""
    h = (x + r).view(1, 10, 14, x.shape[-1])
    merged = torch.cat([h[:, 0::2, 0::2], h[:, 1::2, 0::2], h[:, 0::2, 1::2], h[:, 1::2, 1::2]], -1)
    merged = merged.view(1, -1, 4 * x.shape[-1])
    return (torch.nn.functional.layer_norm(merged, (merged.shape[-1],), w, b),)


@pytest.mark.parametrize("channels", [24, 5])
def test_a_concatenation_read_at_the_row_position_is_computed_once(channels):
    """The cat is not a member of the LayerNorm's kernel (it is inlined, of another shape than the rows), but
    each of the kernel's three passes read it: it goes to a row scratch, computed by the first pass (Swin's patch
    merging kernel 597 -> 277 us for a 56x56x96 input, one thread).  5 channels: rows of 20, not a multiple of
    the vector width."""
    gen = torch.Generator().manual_seed(5)
    x, r = torch.randn(1, 140, channels, generator=gen), torch.randn(1, 140, channels, generator=gen)
    w, b = torch.randn(4 * channels, generator=gen), torch.randn(4 * channels, generator=gen)
    report = check(_patch_merging, x, r, w, b)
    assert len(report.kernels) == 1
    lines = [line.strip() for line in report.format(source=False).splitlines()]
    assert sum(line.startswith("keep") and "scr0[r] = where(" in line for line in lines) == 1, lines
    # the later passes (the variance's, the normalization's) read scratch rows, never the concatenation again
    # (its row-position tests ``lt(index(r), ...)``; the row's first element, which the norms' mean is shifted by -
    # [Note: the variance of equal values] - is one element, ``index(0)``)
    later = [line for line in lines if line.startswith("loop") or line.startswith("reduce acc1")]
    assert later and all("index(r)" not in line and "scr" in line for line in later), lines
