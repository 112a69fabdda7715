# REPRODUCER  backend=kiln  class=fallback  signature=fallback:AssertionError
# error: AssertionError: verify: Node(constant#949, [1, 4], f32) has type (1, 4)/torch.float32, rules give (1,
#        4)/torch.bfloat16
# run:   KILN_FALLBACK=0 python half_avg_pool_divisor_constant.py kiln
# a random program (seed 2160, bfloat16), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
# status: fixed.  kiln/frontend/lower.py _in_fp32 rebuilt a bf16 CONSTANT node as fp32 without converting its
#   tensor (graph verification failed, the graph fell back to eager); regression test
#   tests/cpu/test_half_precision.py::test_half_avg_pool_with_per_position_divisor.
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.bfloat16  # the program's float dtype


def make_inputs(seed=2160, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x0 = (torch.rand((1, 1, 6), generator=g(seed * 64 + 0)) * 4 - 2).to(FT)  # float[1, 1, 6]
    return [x0]


def fn(x0):
    v3 = F.avg_pool2d(x0, 3, stride=2, padding=1, ceil_mode=True)
    return (v3,)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(0.0312, 0.107)]
# per input: None = must be left bitwise unchanged; (rtol, atol) = mutated in place by fn
INPUT_TOL = [None]


def check(backend="kiln"):
    """Run fn eagerly and compiled on fresh copies of the inputs; compare outputs and inputs."""
    if ":" in backend:  # 'module:attr' backend callable
        import importlib
        mod, attr = backend.split(":", 1)
        backend = importlib.import_module(mod)
        for part in attr.split("."):
            backend = getattr(backend, part)
    ref_in = make_inputs()
    ref = fn(*ref_in)
    compiled = torch.compile(fn, backend=backend)
    try:  # a first call on other values (if eager takes them): what a stale cache keeps shows in the second
        fn(*make_inputs(shift=100003))
    except Exception:
        pass
    else:
        compiled(*make_inputs(shift=100003))
    inp = make_inputs()
    out = compiled(*inp)
    assert len(out) == len(ref), (len(out), len(ref))
    for i, (a, e, (rt, at)) in enumerate(zip(out, ref, OUT_TOL)):
        meta = f"{a.dtype}{list(a.shape)} vs {e.dtype}{list(e.shape)}"
        assert a.dtype == e.dtype and a.shape == e.shape, f"output {i}: {meta}"
        torch.testing.assert_close(a, e, rtol=rt, atol=at, equal_nan=True, check_stride=False,
                                   msg=lambda m, i=i: f"output {i}: {m}")
    for i, (a, e, tol) in enumerate(zip(inp, ref_in, INPUT_TOL)):
        rt, at = tol or (0.0, 0.0)
        torch.testing.assert_close(a, e, rtol=rt, atol=at, equal_nan=True, check_stride=False,
                                   msg=lambda m, i=i: f"input {i} after the call: {m}")
    print("OK: compiled matches eager")


if __name__ == "__main__":
    import sys
    torch.set_num_threads(1)
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    check(args[0] if args else "kiln")
