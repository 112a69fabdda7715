# REPRODUCER  backend=kiln  class=crash  signature=crash:SIGSEGV
# error: the worker died from signal SIGSEGV; stderr:
# run:   python measured_on_random_out_of_range_indices.py kiln
# a random program (seed 20033 (group of seeds [20033, 20035, 20037, 20038]), float16), found by kiln's differential fuzzer
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
# status: fixed (kiln/compiler.py _example_inputs, schedule/choose.py): with a convolution in the graph, kiln
#   measured its two layout plans on random inputs, whose int64 values (0 or 1) were out-of-range indices for the
#   gather over a size-1 dim; kiln's gather kernel does not check indices and read past its buffer (SIGSEGV when
#   the merged programs' buffers fell at a page end).  Plans are now measured on copies of the call's inputs.
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float16  # the program's float dtype


def make_inputs(seed=20033, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    p2_x1 = (torch.rand((1, 4, 4, 2), generator=g(20037 * 64 + 1)) * 4 - 2).to(FT)  # float[1, 4, 4, 2]
    p2_x4 = ((torch.rand((7, 1, 1, 2), generator=g(20037 * 64 + 4)) * 2 - 1) * 0.25).to(FT)[3:]
    p2_x5 = (torch.randint(-3, 4, (7,), generator=g(20037 * 64 + 5)).float()).to(FT)[3:]  # float[4] offset
    p3_x3 = (torch.rand((1, 1, 1, 4), generator=g(20038 * 64 + 3)) * 4 - 2).to(FT).expand((1, 1, 7, 4))
    p3_x4 = torch.randint(0, 3, (1, 2, 5), generator=g(20038 * 64 + 4))  # int64[1, 2, 5]
    p3_x6 = torch.randint(0, 1, (2, 2, 2), generator=g(20038 * 64 + 6))  # int64[2, 2, 2]
    return [p2_x1, p2_x4, p2_x5, p3_x3, p3_x4, p3_x6]


def fn(p2_x1, p2_x4, p2_x5, p3_x3, p3_x4, p3_x6):
    p2_v3 = F.max_pool2d(p2_x1, 2, stride=1, padding=0)
    p2_v5 = F.pad(p2_v3, (0, 2, -1, -1,), value=-0.5)
    p2_v10 = torch.cat((p2_v5, p2_v5), -4)
    p2_v13 = F.conv2d(p2_v10, p2_x4, p2_x5, stride=2, padding=0, groups=4)
    p3_v1 = F.adaptive_avg_pool2d(p3_x3, (2, 3))
    p3_v3 = p3_v1.mean(dim=[1])
    p3_v6 = torch.gather(p3_v3, 2, p3_x4)
    p3_v11 = torch.gather(p3_v6, 0, p3_x6)
    return (p2_v13, p3_v11)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(0.00781, 0.0531), (0.0117, 0.0117)]
# per input: None = must be left bitwise unchanged; (rtol, atol) = mutated in place by fn
INPUT_TOL = [None, None, None, None, None, None]


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
