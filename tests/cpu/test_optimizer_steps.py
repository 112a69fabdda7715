"""Compiled optimizer steps and graphs that update their inputs (issue 20 point 3): ``_foreach_*`` ops decomposed per
parameter ([Note: foreach ops]), the elementwise chains of all parameters fused by shape ([Note: horizontal
fusion]), and each parameter's and moment's new value stored where it lies instead of copied back ([Note:
write-backs in place]) - checked against eager on random values, including the cases where a write-back must
stay a copy."""
import copy

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.report import mark, reports_since

REL = 1e-4


def _gen(k):
    return torch.Generator().manual_seed(k)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.LayerNorm(32), nn.Linear(32, 8))


OPTIMIZERS = {
    "sgd-nesterov": lambda p, fe: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01,
                                                  foreach=fe),
    "adam-amsgrad": lambda p, fe: torch.optim.Adam(p, lr=1e-2, amsgrad=True, foreach=fe),
    "adamw": lambda p, fe: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=fe),
    "rmsprop": lambda p, fe: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5, foreach=fe),
    "adagrad": lambda p, fe: torch.optim.Adagrad(p, lr=1e-2, foreach=fe),
}


def _stepped(name, foreach, steps, options=None):
    """``steps`` steps of optimizer ``name`` compiled by kiln and eager's, each on its copy of the model; the
    parameters checked within 1e-4; (model, eager's model, optimizer, eager's optimizer)."""
    model = _model()
    ref = copy.deepcopy(model)
    opt = OPTIMIZERS[name](model.parameters(), foreach)
    ref_opt = OPTIMIZERS[name](ref.parameters(), foreach)
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="kiln", options=options or {})
    for k in range(steps):
        x = torch.randn(8, 16, generator=_gen(k))
        for m, o, s in ((model, opt, step), (ref, ref_opt, ref_opt.step)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            s()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=REL, atol=REL * q.abs().max().item())
    return model, ref, opt, ref_opt


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_compiled_step_matches_eager_and_writes_in_place(name, foreach):
    """Parameters and optimizer state after 4 compiled steps within 1e-4 of eager's; no ``_foreach_*`` op or
    write-back is left to a library call, and for Adam, AdamW and SGD no copy at all (the kernels store the new
    parameters and moments where they lie)."""
    position = mark()
    model, ref, opt, ref_opt = _stepped(name, foreach, 4)
    for p, q in zip(model.parameters(), ref.parameters()):
        for key, value in ref_opt.state[q].items():
            # (relative to the tensor's scale: moments near zero differ by rounding, as parameters do)
            torch.testing.assert_close(opt.state[p][key], value, rtol=REL, atol=REL * value.abs().max().item())
    reports = reports_since(position)
    assert reports and all(r.fallback is None for r in reports), [r.fallback for r in reports]
    externs = [e for r in reports for e in (r.externs or [])]
    assert not any(e.startswith("_foreach") for e in externs), externs
    assert "copy_" not in externs, externs  # (write-backs left are copy kernels of kiln's)
    text = "".join(r.format(source=False) for r in reports)
    if name in ("adam-amsgrad", "adamw", "sgd-nesterov"):
        # (SGD: each parameter's update reads the old momentum and the momentum's the old parameter - both stored
        # in place, the old values loaded first: [Note: old values loaded first])
        assert text.count("copy_: a write-back") == 0 and "copied into input" not in text


def _compiled_report(fn, *args):
    torch._dynamo.reset()
    position = mark()
    compiled = torch.compile(fn, backend="kiln")
    return compiled, position


def _check_updates(fn, make_inputs, copies_left):
    """``fn`` compiled updates its inputs as eager does (two calls, fresh random inputs); ``copies_left`` write-backs
    stay copies (kernels of kiln's, none a library call)."""
    compiled, position = _compiled_report(fn)
    for k in range(2):
        mine = make_inputs(_gen(k))
        want = [t.clone() for t in mine]
        got_out, want_out = compiled(*mine), fn(*want)
        torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
        for a, b in zip(mine, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    (report,) = reports_since(position)
    assert "copy_" not in (report.externs or []), report.externs
    assert report.format(source=False).count("copy_: a write-back") == copies_left, report.format(source=False)
    return report


def test_an_input_read_after_its_update_keeps_its_copy():
    """The library call reads ``x``'s old value after the kernel computed its new one: written in place, it
    would read the new value."""
    def f(x, w):
        new = x * 2.0 + 1.0
        out = torch.mm(x, w)
        x.copy_(new)
        return out
    _check_updates(f, lambda g: [torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)], 1)


def test_updates_reading_each_others_inputs_keep_their_copies():
    """``a <- b + 1`` and ``b <- a * 2`` (the old ``a``): neither store may come first."""
    def f(a, b):
        na, nb = b + 1.0, a * 2.0
        a.copy_(na)
        b.copy_(nb)
        return None
    _check_updates(f, lambda g: [torch.randn(64, generator=g), torch.randn(64, generator=g)], 2)


def test_an_update_reading_its_input_elsewhere_keeps_its_copy():
    """``x <- x * 2 + x[0]``: element 0 is read by every element's update."""
    def f(x):
        x.copy_(x * 2.0 + x[0])
        return None
    _check_updates(f, lambda g: [torch.randn(64, generator=g)], 1)


def test_updates_in_place_with_later_readers_of_the_new_value():
    """A counter updated in place and read by a later kernel (which loads the input's buffer, now the new value)
    and a moment updated in place; the parameter - a transposed caller's tensor, updated in a contiguous copy and
    copied back - keeps its copy: a library call reads its new value."""
    def f(count, m, g, p):
        count.add_(1.0)
        m.mul_(0.9).add_(g, alpha=0.1)
        p.sub_(0.01 * m / (1.0 - 0.9 ** count))
        return torch.mm(p, g.t()) * count

    def inputs(gen):
        return [torch.zeros(()), torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen),
                torch.randn(5, 6, generator=gen).t()]
    report = _check_updates(f, inputs, 1)
    assert "write-back in place" in report.format(source=False)


def test_interleaved_chains_of_two_shapes_fuse_by_shape():
    """[Note: horizontal fusion]: six elementwise chains alternating between two shapes, as a foreach step writes
    them, become one kernel per shape; a library call between two chains of one shape keeps them apart."""
    def f(a, b, c, d, e, h):
        return (a * 2 + 1).sin(), (b * 3).cos(), c.exp() - a, d.relu() + b, e * e, h.sqrt()

    def g(a, b, c, w):
        x = a * 2 + 1
        y = b.exp()
        z = torch.mm(c, w)
        return x, y, z, (a + z[:1].sum()) * 3

    big = [torch.randn(32, 32) for _ in range(3)]
    small = [torch.rand(7) for _ in range(3)]
    args = [big[0], small[0], big[1], small[1], big[2], small[2]]
    compiled, position = _compiled_report(f)
    torch.testing.assert_close(compiled(*args), f(*args))
    (report,) = reports_since(position)
    assert report.source.count("static void kernel_") == 2, report.format(source=False)

    args = [torch.randn(8, 8), torch.randn(5), torch.randn(8, 8), torch.randn(8, 8)]
    compiled, position = _compiled_report(g)
    torch.testing.assert_close(compiled(*args), g(*args))
    (report,) = reports_since(position)
    assert report.source.count("static void kernel_") >= 3
    with kiln.config.scope(horizontal_fusion=False):
        compiled, position = _compiled_report(f)
        torch.testing.assert_close(compiled(*big[:1], *small[:1], *big[1:2], *small[1:2], *big[2:], *small[2:]),
                                   f(*args[:0], big[0], small[0], big[1], small[1], big[2], small[2]))
    (report,) = reports_since(position)
    assert report.source.count("static void kernel_") == 6


def test_a_reduction_of_a_mask_joins_the_mask_kernel_across_a_library_call():
    """[Note: horizontal fusion] across a library call: a padding mask turned into an additive mask and, after a
    product, tested for rows with every key masked - one kernel loading the mask once, not two.  Not where the
    two share no load (the later result would only live longer)."""
    def related(x, w, mask, other):
        return torch.where(mask, float("-inf"), 0.0), torch.mm(x, w), mask.all(-1)

    def unrelated(x, w, mask, other):
        return torch.where(mask, float("-inf"), 0.0), torch.mm(x, w), other.all(-1)

    def kernels(fn, args):
        compiled, position = _compiled_report(fn)
        torch.testing.assert_close(compiled(*args), fn(*args))
        (report,) = reports_since(position)
        return report.source.count("static void kernel_"), report.format(source=False)

    masks = torch.rand(2, 6, 7) > 0.5
    masks[:, 2] = True  # a row with every key masked
    args = [torch.randn(6, 5), torch.randn(5, 7), masks[0], masks[1]]
    count, text = kernels(related, args)
    assert count == 1 and "prologue fused" in text, text
    assert kernels(unrelated, args)[0] == 2
    with kiln.config.scope(horizontal_fusion=False):
        assert kernels(related, args)[0] == 2


def test_kiln_check_runs_a_step_that_updates_its_inputs_in_place():
    """KILN_CHECK compares each kernel's stores with the reference: a kernel that stores an input's new value
    is judged against that value (not the input's old one), and a later kernel reading the updated input is
    judged against the stored value (not one computed again from the updated input - a step counter incremented
    twice)."""
    position = mark()
    _stepped("adamw", True, 3, {"check": True, "fallback": False})
    assert any("write-back in place" in r.format(source=False) for r in reports_since(position))


def test_a_scalar_chain_read_by_every_element_is_computed_once():
    """[Note: scalars computed once]: ``sqrt(1 - 0.999 ** step)`` (a bias correction) read by a large elementwise
    kernel is a scalar kernel's result, not a ``pow`` and a ``sqrt`` per element."""
    def f(x, step):
        return x / (1.0 - 0.999 ** step).sqrt() + 1.0

    compiled, position = _compiled_report(f)
    x, step = torch.randn(64, 64), torch.tensor(3.0)
    torch.testing.assert_close(compiled(x, step), f(x, step))
    (report,) = reports_since(position)
    large = [k for k in report.kernels if k.outer and k.outer != (1,)]
    assert large and not any("pow(" in k.format() or "sqrt(" in k.format() for k in large), \
        [k.format() for k in report.kernels]
    assert any("pow(" in k.format() for k in report.kernels if not large or k not in large)


@pytest.mark.parametrize("name", ["sgd-nesterov", "adamw"])
def test_a_step_over_large_parameters_runs_loops_over_few_arrays(name):
    """[Note: loops over few streams]: the joined kernel of a step over four 1 MiB weights (12-16 arrays) splits
    into loops over at most ``MAX_STREAMS`` arrays, each parameter's update whole in one of them; the parameters
    and moments match eager's after three steps."""
    from kiln.schedule.streams import MAX_STREAMS, arrays
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(512, 512)) for _ in range(4)]
    ref = [nn.Parameter(p.detach().clone()) for p in params]
    opt, ref_opt = OPTIMIZERS[name](params, True), OPTIMIZERS[name](ref, True)
    torch._dynamo.reset()
    position = mark()
    step = torch.compile(opt.step, backend="kiln")
    for k in range(3):
        for ps, s in ((params, step), (ref, ref_opt.step)):
            g = _gen(k)
            for p in ps:
                p.grad = torch.randn(p.shape, generator=g)
            s()
    for p, q in zip(params, ref):
        torch.testing.assert_close(p, q, rtol=REL, atol=REL * q.abs().max().item())
        for key, value in ref_opt.state[q].items():
            torch.testing.assert_close(opt.state[p][key], value, rtol=REL, atol=REL * value.abs().max().item())
    kernels = [k for r in reports_since(position) for k in r.kernels if k.outer == (512, 512) or k.outer == (262144,)]
    split = [k for k in kernels if "loops over few streams" in k.reason]
    assert split, [k.reason for k in kernels]
    for k in split:
        assert len(arrays(k)) <= MAX_STREAMS
