# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:output
# error: output 0 (torch.float32[1, 6], rtol=0 atol=0): Tensor-likes are not equal! | Mismatched elements: 1 / 6
#        (16.7%) | Greatest absolute difference: 2.892268419265747 at index (0, 0) | Greatest relative difference:
#        1.508151650428772 at index (0, 0)
# run:   python output_view_base_in_arena.py kiln
# a random program (seed 70 (group of seeds [70, 71, 72, 73, 74]), float32), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
# status: open.  Root cause kiln/runtime/module.py:391 (_plan_memory): only graph outputs are kept out of
#   the arena, not the bases of outputs that are views (``escaping``); the base (index_select's result, read by
#   the matmul) shares arena bytes with a later intermediate (the sum), which overwrites what the caller gets.
#   Keeping ``escaping`` nodes out needs them allocated per call like outputs (module.py, not changed here).
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=70, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    p2_x2 = (torch.rand((7, 1, 6), generator=g(72 * 64 + 2)) * 4 - 2).to(FT)  # float[7, 1, 6]
    p2_x4 = torch.randint(0, 7, (1,), generator=g(72 * 64 + 4))  # int64[1]
    p2_x5 = ((torch.rand((1, 4), generator=g(72 * 64 + 5)) * 2 - 1) * 0.25).to(FT).expand((6, 4))
    p4_x1 = (torch.randn((1, 2), generator=g(74 * 64 + 1)).clamp(-3, 3)).to(FT)  # float[1, 2]
    return [p2_x2, p2_x4, p2_x5, p4_x1]


def fn(p2_x2, p2_x4, p2_x5, p4_x1):
    p2_v4 = p2_x2.index_select(0, p2_x4)
    p2_v5 = p2_v4.flatten(1, 2)
    p2_v7 = torch.matmul(p2_v4, p2_x5)
    p4_v3 = torch.cat((p4_x1, p4_x1), -2)
    p4_v4 = p4_x1.sum(dim=[0, 1])
    p4_v5 = torch.pow(p4_v3.abs() + 0.5, p4_v4.clamp(-2.0, 2.0))
    return (p2_v5, p2_v7, p4_v5)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(0, 0), (2.6e-05, 3e-05), (5.2e-05, 6e-05)]
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
