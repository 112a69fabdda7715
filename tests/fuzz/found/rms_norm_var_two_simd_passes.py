# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:output
# error: output 0 (torch.float32[], rtol=7.8e-05 atol=9e-05): Scalars are not close! | Expected 1.9079855680465698 but
#        got nan. | Absolute difference: nan (up to 9e-05 allowed) | Relative difference: nan (up to 7.8e-05 allowed)
# run:   python rms_norm_var_two_simd_passes.py kiln
# a random program (seed 484, float32), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
# status: worked around (kiln/runtime/build.py workaround_flags).  kiln's kernel (kernel_1_sum_div, two passes
#   over a row) is correct C++; GCC 12.2 with -march=native on AMD Zen 3 (a tuning without hardware gathers)
#   vectorizes buf[r / 4] as an emulated gather and, with FMA contraction, computes NaN (right at -O1, with
#   -ffp-contract=off, -mtune=generic, or hardware gathers: -mtune-ctrl=use_gather_4parts).  Standalone C++
#   beside this file: rms_norm_var_two_simd_passes.cpp.
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=484, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x2 = (torch.randint(-3, 4, (1, 2, 3, 9), generator=g(seed * 64 + 2)).float()).to(FT)[..., 1::2]
    x3 = (torch.rand((7, 2, 1, 1), generator=g(seed * 64 + 3)) * 4 - 2).to(FT)  # float[7, 2, 1, 1]
    x4 = (torch.rand((7,), generator=g(seed * 64 + 4)) * 4 - 2).to(FT)  # float[7]
    x5 = (torch.rand((4,), generator=g(seed * 64 + 5)) * 4 - 2).to(FT)  # float[4]
    return [x2, x3, x4, x5]


def fn(x2, x3, x4, x5):
    v1 = F.conv2d(x2, x3, x4, stride=1, padding='same', dilation=2)
    v2 = F.rms_norm(v1, (4,), x5, eps=1e-05)
    v3 = v2.var()
    return (v3,)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(7.8e-05, 9e-05)]
# per input: None = must be left bitwise unchanged; (rtol, atol) = mutated in place by fn
INPUT_TOL = [None, None, None, None]


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
