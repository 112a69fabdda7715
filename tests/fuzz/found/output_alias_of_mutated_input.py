# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:output
# error: output 0 (torch.float32[1], rtol=0 atol=0): Tensor-likes are not equal! | Mismatched elements: 1 / 1 (100.0%)
#        | Greatest absolute difference: 0.6660001277923584 at index (0,) | Greatest relative difference:
#        1.6009613275527954 at index (0,)
# run:   python output_alias_of_mutated_input.py kiln
# a random program (seed 4591, float32), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
# status: fixed (kiln/compiler.py _alias_fixes): ``v0[0:1] = x4`` functionalizes to copy(amax, x4), which
#   kiln simplifies to x4 itself, returned after the graph's own copy_ into x4 (the masked_fill_) had run: the
#   output showed the update.  Outputs that kiln computes as an input are now rebuilt on a copy (taken before
#   the call when the graph updates that input); ``lambda x: x.clone()`` returned the caller's x itself.
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=4591, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x0 = (torch.rand((3,), generator=g(seed * 64 + 0)) * 2 + 0.5).to(FT)[..., 1::2]  # float[1] sliced
    x4 = (torch.rand((1,), generator=g(seed * 64 + 4)) * 4 - 2).to(FT)  # float[1]
    x5 = (torch.rand((1,), generator=g(seed * 64 + 5)) < 0.7)  # bool[1]
    return [x0, x4, x5]


def fn(x0, x4, x5):
    v0 = x0.amax(dim=[-1], keepdim=True)
    v0[0:1] = x4
    x4.masked_fill_(x5, 0.25)
    return (v0,)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(0, 0)]
# per input: None = must be left bitwise unchanged; (rtol, atol) = mutated in place by fn
INPUT_TOL = [None, (0, 0), None]


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
