# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:output
# error: output 0 (torch.float32[], rtol=3.9e-05 atol=4.5e-05): Scalars are not close! | Expected -1.7058172225952148
#        but got -0.7584712505340576. | Absolute difference: 0.9473459720611572 (up to 4.5e-05 allowed) | Relative
#        difference: 0.5553619458829673 (up to 3.9e-05 allowed)
# run:   python scratch_read_before_its_pass.py kiln
# a random program (seed 22702, float32), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
# status: fixed (kiln/schedule/kernel_build.py _reads_scratch_of_later): the row kernel (LayerNorm's two sums,
#   the argmin of its output, v3 = v1 - x1 stored, the amin of v3, the logsumexp) put the amin in the first pass
#   over the row, with the mean's sum: its claimed row scratch (v3) reads v1's scratch, which the argmin's pass
#   (the third) writes, so the amin and v3 read v1 before it existed.  The check for a scratch of a later pass
#   looked at the reduction's own reads only, not at those of the scratch stores it brings along.  Found at seed
#   22702 of a 3,600-seed run (session 25); wrong since the row scratch existed.
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=22702, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x1 = (torch.rand((8,), generator=g(seed * 64 + 1)) * 4 - 2).to(FT)  # float[8]
    x2 = (torch.rand((8,), generator=g(seed * 64 + 2)) * 4 - 2).to(FT)  # float[8]
    x3 = (torch.rand((8,), generator=g(seed * 64 + 3)) * 4 - 2).to(FT)  # float[8]
    return [x1, x2, x3]


def fn(x1, x2, x3):
    v1 = F.layer_norm(x1, (8,), x3, x2, eps=1e-05)
    v2 = v1.argmin(dim=0, keepdim=True)
    v3 = torch.sub(v1, x1)
    v4 = v3.amin()
    v5 = v2.squeeze()
    v6 = v1.logsumexp(dim=[-1])
    return (v4, v5, v6, v3)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(3.9e-05, 4.5e-05), (0, 0), (5.2e-05, 6e-05), (3.9e-05, 4.5e-05)]
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
