# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:gradient
# error: gradient of input 1 (x3, float32[5, 7, 1]): max |compiled - eager| 1.78, compiled vs float64 1.78, eager vs
#        float64 5.25e-08, allowed 4.27e-05 + 16x eager's error (largest gradient 0.488)
# run:   python std_of_equal_values_gradient.py kiln
# a random program (seed 9304, float32), found by kiln's differential fuzzer
# fixed: var/std of equal values exactly 0 ([Note: the variance of equal values], frontend/aten.py)
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=9304, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x2 = ((torch.rand((1, 5, 3, 7), generator=g(seed * 64 + 2)) * 2 - 1) * 0.25).to(FT).transpose(-1, -2)
    x3 = (torch.rand((5, 7, 1), generator=g(seed * 64 + 3)) * 4 - 2).to(FT)  # float[5, 7, 1]
    return [x2, x3]


def fn(x2, x3):
    v0 = torch.max(x2, x3)
    v2 = v0.std(dim=[3], keepdim=True)
    return (v2,)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(2.6e-05, 9.08e+24)]
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


PROGRAM = {'seed': 9304, 'ft': 'float32', 'inputs': [{'name': 'x2', 'index': 2, 'dtype': 'float', 'shape': (1, 5, 7, 3), 'layout': 'transposed', 'kind': 'small', 'origin': None}, {'name': 'x3', 'index': 3, 'dtype': 'float', 'shape': (5, 7, 1), 'layout': 'contiguous', 'kind': 'uniform', 'origin': None}], 'stmts': [{'text': 'v0 = torch.max(x2, x3)', 'defs': ('v0',), 'uses': ('x2', 'x3'), 'op': 'max_binary', 'mutates': None, 'noise': '', 'weight': 0, 'checks': (), 'aliases': ()}, {'text': 'v2 = v0.std(dim=[3], keepdim=True)', 'defs': ('v2',), 'uses': ('v0',), 'op': 'reduce_std', 'mutates': None, 'noise': 'sq(6) * mx(v0) ** 2 / (2 * mn(v2) + 1e-30)', 'weight': 2, 'checks': (), 'aliases': ()}], 'outputs': ['v2'], 'out_tol': [(2.6e-05, 9.08115833998942e+24)], 'input_tol': [None, None], 'vars': {'x2': ('float', (1, 5, 7, 3)), 'x3': ('float', (5, 7, 1)), 'v0': ('float', (1, 5, 7, 3)), 'v2': ('float', (1, 5, 7, 1))}, 'members': []}  # noqa: E501


def check_gradients(backend="kiln"):
    """The failure is in the gradients ([Note: fuzzing gradients], kiln/testing/fuzz_grad.py): the inputs'
    gradients of the compiled training call against eager's, judged by a float64 run."""
    from kiln.testing.fuzz_grad import check_gradients as run
    from kiln.testing.fuzz_program import Program
    torch._dynamo.reset()
    status, _, detail = run(Program.from_json(PROGRAM), lambda f: torch.compile(f, backend=backend))
    assert status in ("ok", "skip"), detail
    print("OK: compiled gradients match eager's")


if __name__ == "__main__":
    check_gradients(args[0] if args else "kiln")
