# REPRODUCER  backend=kiln  class=crash  signature=crash:ValueError
# error: ValueError in the first call, on other input values: Cannot view a tensor with shape torch.Size([3, 4, 11])
#        and strides (44, 1, 4) as a tensor with shape (12, 11)!
# run:   python baddbmm_decomposition_strides.py kiln
# a random program (seed 9521, float32), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
# status: fixed (kiln/frontend/decompositions.py keeps baddbmm whole; kiln/frontend/dynamo.py runs a graph
#   eagerly, and says why, when AOTAutograd's capture fails).  torch's baddbmm decomposition takes a transposed
#   self's strides, where eager's result is contiguous; the view after it failed in the capture, and the error
#   reached the user.
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=9521, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x2 = (torch.rand((3, 4, 24), generator=g(seed * 64 + 2)) * 4 - 2).to(FT)  # float[3, 4, 24]
    x3 = (torch.rand((24, 11), generator=g(seed * 64 + 3)) * 4 - 2).to(FT)  # float[24, 11]
    x4 = (torch.randn((1, 11, 4), generator=g(seed * 64 + 4)).clamp(-3, 3)).to(FT).transpose(-1, -2)
    return [x2, x3, x4]


def fn(x2, x3, x4):
    v1 = torch.baddbmm(x4, x2, x3.expand(3, -1, -1))
    v10 = v1.view(-1, 11)
    return (v10,)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(2.6e-05, 3.47e-05)]
# per input: None = must be left bitwise unchanged; (rtol, atol) = mutated in place by fn
INPUT_TOL = [None, None, None]


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
