# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:gradient
# error: gradient of input 0 (x1, float32[1, 4, 6, 1]): max |compiled - eager| 970, compiled vs float64 970, eager vs
#        float64 3.02e-08, allowed 7.75e-05 + 16x eager's error (largest gradient 0.834)
# run:   python layer_norm_of_equal_values_gradient.py kiln
# a random program (seed 22888, float32), found by kiln's differential fuzzer
# fixed: the norms' mean of equal values is the common value exactly ([Note: the variance of equal values])
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.float32  # the program's float dtype


def make_inputs(seed=22888, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x1 = (torch.rand((1, 4, 1, 1), generator=g(seed * 64 + 1)) * 2 + 0.5).to(FT).expand((1, 4, 6, 1))
    x2 = (torch.randn((9, 1), generator=g(seed * 64 + 2)).clamp(-3, 3)).to(FT)[3:]  # float[6, 1] offset
    return [x1, x2]


def fn(x1, x2):
    v1 = F.layer_norm(x1, (6, 1), x2, None, eps=1e-06)
    v3 = torch.cat([x1, v1], dim=0)
    v12 = torch.rsqrt(v3.abs() + 0.5)
    return (v12,)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(3.9e-05, 0.00503)]
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


PROGRAM = {'seed': 22888, 'ft': 'float32', 'inputs': [{'name': 'x1', 'index': 1, 'dtype': 'float', 'shape': (1, 4, 6, 1), 'layout': 'expanded', 'kind': 'positive', 'origin': None}, {'name': 'x2', 'index': 2, 'dtype': 'float', 'shape': (6, 1), 'layout': 'offset', 'kind': 'normal', 'origin': None}], 'stmts': [{'text': 'v1 = F.layer_norm(x1, (6, 1), x2, None, eps=1e-06)', 'defs': ('v1',), 'uses': ('x1', 'x2'), 'op': 'layer_norm', 'mutates': None, 'noise': 'sq(6) * mx(x1) * inv_std(x1, 2) * (1 + mx(x2))', 'weight': 2, 'checks': (), 'aliases': ()}, {'text': 'v3 = torch.cat([x1, v1], dim=0)', 'defs': ('v3',), 'uses': ('x1', 'v1'), 'op': 'cat', 'mutates': None, 'noise': '', 'weight': 0.0, 'checks': (), 'aliases': ()}, {'text': 'v12 = torch.rsqrt(v3.abs() + 0.5)', 'defs': ('v12',), 'uses': ('v3',), 'op': 'rsqrt', 'mutates': None, 'noise': 'pw', 'weight': 1, 'checks': (), 'aliases': ()}], 'outputs': ['v12'], 'out_tol': [(3.9e-05, 0.005033421583155118)], 'input_tol': [None, None], 'vars': {'x1': ('float', (1, 4, 6, 1)), 'x2': ('float', (6, 1)), 'v1': ('float', (1, 4, 6, 1)), 'v3': ('float', (2, 4, 6, 1)), 'v12': ('float', (2, 4, 6, 1))}, 'members': []}  # noqa: E501


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
