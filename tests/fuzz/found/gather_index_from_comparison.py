# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:output
# error: output 0 (torch.int64[750], rtol=0 atol=0): Tensor-likes are not equal! | Mismatched elements: 296 / 750
#        (39.5%) | Greatest absolute difference: 1 at index (1,) | Greatest relative difference: 1.0 at index (1,)
# run:   python fuzz_44460_mismatch_output.py kiln
# a random program (seed 44460, float32), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=44460, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x0 = (torch.rand((5, 3, 10, 5), generator=g(seed * 64 + 0)) * 4 - 2).to(FT)  # float[5, 3, 10, 5]
    x2 = (torch.randn((13, 5), generator=g(seed * 64 + 2)).clamp(-3, 3)).to(FT)[3:]  # float[10, 5] offset
    x3 = (torch.randn((10, 11), generator=g(seed * 64 + 3)).clamp(-3, 3)).to(FT)[..., 1::2]  # float[10, 5] sliced
    return [x0, x2, x3]


def fn(x0, x2, x3):
    v1 = F.layer_norm(x0, (10, 5), x2, x3, eps=1e-06)
    v3 = v1 >= x0
    v5 = v3.view(1, 750)
    v7 = v5.transpose(-1, 0)
    v8 = v7.sum(dim=-1)
    v9 = torch.gather(v8, -1, v8)
    return (v9, v1)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(0, 0), (2.6e-05, 4.71e-05)]
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
