# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:output
# error: output 0 (torch.float16[4, 1], rtol=0.00391 atol=0.00391): Tensor-likes are not close! | Mismatched elements:
#        3 / 4 (75.0%) | Greatest absolute difference: 1.6494140625 at index (0, 0) (up to 0.00390625 allowed) |
#        Greatest relative difference: 1.2197265625 at index (0, 0) (up to 0.00390625 allowed)
# run:   python read_before_an_input_update.py kiln
# a random program (seed 11444, float16), found by kiln's differential fuzzer
# fixed: a value read before an in-place update is computed before it
#   ([Note: reads before an in-place update], schedule/fuse.py)
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float16  # the program's float dtype


def make_inputs(seed=11444, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x0 = torch.randint(-5, 6, (11, 1), generator=g(seed * 64 + 0))  # int64[11, 1]
    x2 = (torch.rand((11, 1), generator=g(seed * 64 + 2)) < 0.3)  # bool[11, 1]
    x4 = (torch.rand((1,), generator=g(seed * 64 + 4)) * 4 - 2).to(FT)  # float[1]
    x6 = torch.randperm(1, generator=g(seed * 64 + 6))[:1]  # int64[1]
    x7 = (torch.rand((1,), generator=g(seed * 64 + 7)) * 4 - 2).to(FT)  # float[1]
    return [x0, x2, x4, x6, x7]


def fn(x0, x2, x4, x6, x7):
    v0 = torch.full(x0.shape, 0.25, dtype=FT, device=x0.device)
    v2 = torch.where(x2, v0, x4)
    v4, v5, v6 = torch.tensor_split(v2, 3, dim=0)
    x4.index_put_((x6,), x7, accumulate=True)
    v6.mul_(x7)
    return (v4,)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(0.00391, 0.00391)]
# per input: None = must be left bitwise unchanged; (rtol, atol) = mutated in place by fn
INPUT_TOL = [None, None, (0.00391, 0.0226), None, None]


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
