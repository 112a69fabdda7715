"""Row reductions whose length leaves a remainder past the last full vector ([Note: overlapped remainder] in
codegen/cpp.py): the remainder runs as one vector overlapping the previous one, its already-reduced lanes masked
out of the accumulation.  Checked against eager for sums, max/min with NaN and infinities placed in the overlap,
softmax (a scratch written again by the overlap), integer sums and rows just above one vector."""
import pytest
import torch

import kiln
from kiln.report import mark, reports_since


def _check(fn, *inputs, rtol=1.3e-5, atol=1.5e-5):
    position = mark()
    with torch.inference_mode():
        expected = fn(*inputs)
        got = kiln.compile(fn, fallback=False)(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True)
    return reports_since(position)[-1]


@pytest.mark.parametrize("width", [20, 21, 37, 69, 197, 1500])
def test_softmax_and_layer_norm_rows(width):
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(33, width, generator=gen) * 3
    w, b = torch.randn(width, generator=gen), torch.randn(width, generator=gen)
    report = _check(lambda t: (torch.softmax(t, -1), torch.nn.functional.layer_norm(t, (width,), w, b)), x)
    source = report.source
    if width % 16 >= 4:  # (AVX-512 and AVX2 builds both reduce 16 lanes of fp32)
        assert "? " in source and "r >= r0" in source, "expected an overlapped remainder vector"


def test_max_min_see_nan_and_infinities_only_in_the_remainder():
    """Rows of 69: elements 64..68 are reduced only by the overlapped vector, elements 53..63 by both the last
    full vector and (masked out) the overlap."""
    x = torch.randn(6, 69)
    x[0, 66] = float("nan")
    x[1, 68] = float("inf")
    x[2, 64] = -float("inf")
    x[3, 60] = float("nan")  # in the overlap's masked lanes: seen once, by the full vector
    x[4, 60] = 1e30
    _check(lambda t: (t.amax(1), t.amin(1), t.sum(1)), x)


def test_integer_sums_of_rows_with_a_remainder():
    x = torch.randint(-1000, 1000, (9, 45))
    _check(lambda t: t.sum(1), x)
    _check(lambda t: (t > 3).sum(1), torch.randn(9, 53))
