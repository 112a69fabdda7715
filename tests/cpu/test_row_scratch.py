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
