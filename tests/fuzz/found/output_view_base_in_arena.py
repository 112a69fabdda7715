# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:output
# error: output 2 (torch.float32[3, 1, 2], rtol=0 atol=0): Tensor-likes are not equal! | Mismatched elements: 5 / 6
#        (83.3%) | Greatest absolute difference: 3.388878583908081 at index (0, 0, 1) | Greatest relative difference:
#        63.12586212158203 at index (0, 0, 1)
# run:   python output_view_base_in_arena.py kiln
# a random program (seed 2960, float32), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
# status: fixed (kiln/runtime/module.py _plan_memory): only graph outputs were kept out of the arena, not the
#   bases of outputs that are views; here the stack's result (read by the bmm) is returned as a view (v1) and
#   shared arena bytes with the linear's result (mm's .out), which overwrote it.  Every node in ``escaping`` now
#   gets a per-call buffer like an output.  It was the commonest failure of the fuzz runs (CI groups 70-74,
#   195-199, seeds 10041, 2597 ff.).
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=2960, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x0 = (torch.rand((1, 2), generator=g(seed * 64 + 0)) * 4 - 2).to(FT)  # float[1, 2]
    x2 = (torch.rand((2, 1), generator=g(seed * 64 + 2)) * 4 - 2).to(FT)  # float[2, 1]
    x3 = (torch.rand((5, 2), generator=g(seed * 64 + 3)) * 4 - 2).to(FT)  # float[5, 2]
    x5 = (torch.rand((5,), generator=g(seed * 64 + 5)) * 4 - 2).to(FT)  # float[5]
    return [x0, x2, x3, x5]


def fn(x0, x2, x3, x5):
    v1 = torch.stack([x0, x0, x0], dim=-3)
    v2 = torch.bmm(v1, x2.expand(3, -1, -1))
    v3 = F.linear(x0, x3)
    v8 = x5 / (v3.abs() + 0.5)
    return (v2, v8, v1)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(2.6e-05, 3e-05), (3.9e-05, 4.5e-05), (0, 0)]
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
