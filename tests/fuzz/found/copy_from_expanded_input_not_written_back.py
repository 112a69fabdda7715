# REPRODUCER  backend=kiln  class=crash  signature=crash:RuntimeError
# error: RuntimeError in the first call, on other input values: unsupported operation: more than one element of the
#        written-to tensor refers to a single memory location. Please clone() the tensor before performing the
#        operation.
# run:   python fuzz_47252_crash_RuntimeError.py kiln
# a random program (seed 47252, float32), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=47252, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x0 = (torch.randint(-3, 4, (12, 5), generator=g(seed * 64 + 0)).float()).to(FT).transpose(-1, -2)
    x2 = (torch.rand((1, 12), generator=g(seed * 64 + 2)) * 4 - 2).to(FT).expand((5, 12))  # float[5, 12] expanded
    return [x0, x2]


def fn(x0, x2):
    x0.copy_(x2)
    return (x2,)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(0, 0)]
# per input: None = must be left bitwise unchanged; (rtol, atol) = mutated in place by fn
INPUT_TOL = [(0, 0), None]


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
