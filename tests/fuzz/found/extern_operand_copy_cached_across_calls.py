# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:output
# error: output 0 (torch.float32[8, 4], rtol=3.9e-05 atol=0.000195): Tensor-likes are not close! | Mismatched elements:
#        32 / 32 (100.0%) | Greatest absolute difference: 53.060096740722656 at index (4, 3) (up to
#        0.00019526635333022568 allowed) | Greatest relative difference: 4.132034778594971 at index (4, 2) (up to
#        3.9e-05 allowed)
# run:   python extern_operand_copy_cached_across_calls.py kiln
# a random program (seed 1148, float32), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
# status: fixed in 9668eba by the runtime's owner (found independently by the model zoo): kiln/runtime/
#   module.py _value cached a view chain of an arena buffer for all later calls, but reshape(expand(...))
#   (repeat) is a copy, not a view: the linear's operand kept the first call's values.
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=1148, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x0 = ((torch.rand((8, 9), generator=g(seed * 64 + 0)) * 2 - 1) * 0.25).to(FT)[..., 1::2]  # float[8, 4] sliced
    x2 = torch.randint(-5, 6, (4,), generator=g(seed * 64 + 2))  # int64[4]
    return [x0, x2]


def fn(x0, x2):
    v2 = x0 + x2
    v6 = v2.repeat(1, 2)
    v9 = F.linear(v6, v2.t())
    return (v9,)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(3.9e-05, 0.000195)]
# per input: None = must be left bitwise unchanged; (rtol, atol) = mutated in place by fn
INPUT_TOL = [None, None]


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
