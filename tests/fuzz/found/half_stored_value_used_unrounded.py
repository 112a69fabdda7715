# REPRODUCER  backend=kiln  class=mismatch  signature=mismatch:gradient
# error: gradient of input 0 (x0, bfloat16[6, 1, 12]): max |compiled - eager| nan, compiled vs float64 nan, eager vs
#        float64 0.0024, allowed 0.241 + 16x eager's error (largest gradient 0.541)
# run:   python half_stored_value_used_unrounded.py kiln
# a random program (seed 9185, bfloat16), found by kiln's differential fuzzer
# fixed (Triton target): a stored half value used as stored ([Note: stored values as stored], codegen/triton_expr.py)
# (python -m kiln.testing.fuzz) and shrunk; its tolerances come from kiln/testing/fuzz_numerics.py
import torch
import torch.nn.functional as F  # noqa: F401

FT = torch.bfloat16  # the program's float dtype


def make_inputs(seed=9185, shift=0):
    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged
        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts
    x0 = (torch.rand((6, 1, 12), generator=g(seed * 64 + 0)) * 4 - 2).to(FT)  # float[6, 1, 12]
    x1 = ((torch.rand((1, 12), generator=g(seed * 64 + 1)) * 2 - 1) * 0.25).to(FT).expand((6, 12))
    return [x0, x1]


def fn(x0, x1):
    v0, v1 = torch.max(x0, dim=1)
    v3 = torch.pow(v0.abs() + 0.5, x1.clamp(-2.0, 2.0))
    v7 = v3.cos()
    v8 = v3.select(1, -4)
    v10 = v7.amax(dim=[-2], keepdim=True)
    return (v8, v10)


# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)
OUT_TOL = [(0.0625, 0.0625), (0.0938, 0.0938)]
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


PROGRAM = {'seed': 9185, 'ft': 'bfloat16', 'inputs': [{'name': 'x0', 'index': 0, 'dtype': 'float', 'shape': (6, 1, 12), 'layout': 'contiguous', 'kind': 'uniform', 'origin': None}, {'name': 'x1', 'index': 1, 'dtype': 'float', 'shape': (6, 12), 'layout': 'expanded', 'kind': 'small', 'origin': None}], 'stmts': [{'text': 'v0, v1 = torch.max(x0, dim=1)', 'defs': ('v0', 'v1'), 'uses': ('x0',), 'op': 'max_dim', 'mutates': None, 'noise': '', 'weight': 0.0, 'checks': (('gap', 'x0', '1', 'max', 'strict'),), 'aliases': ()}, {'text': 'v3 = torch.pow(v0.abs() + 0.5, x1.clamp(-2.0, 2.0))', 'defs': ('v3',), 'uses': ('v0', 'x1'), 'op': 'pow', 'mutates': None, 'noise': 'pw', 'weight': 2, 'checks': (), 'aliases': ()}, {'text': 'v7 = v3.cos()', 'defs': ('v7',), 'uses': ('v3',), 'op': 'cos', 'mutates': None, 'noise': 'pw', 'weight': 1, 'checks': (), 'aliases': ()}, {'text': 'v8 = v3.select(1, -4)', 'defs': ('v8',), 'uses': ('v3',), 'op': 'select', 'mutates': None, 'noise': '', 'weight': 0.0, 'checks': (), 'aliases': ()}, {'text': 'v10 = v7.amax(dim=[-2], keepdim=True)', 'defs': ('v10',), 'uses': ('v7',), 'op': 'reduce_amax', 'mutates': None, 'noise': '', 'weight': 0, 'checks': (), 'aliases': ()}], 'outputs': ['v8', 'v10'], 'out_tol': [(0.0625, 0.0625), (0.09375, 0.09375)], 'input_tol': [None, None], 'vars': {'x0': ('float', (6, 1, 12)), 'x1': ('float', (6, 12)), 'v0': ('float', (6, 12)), 'v1': ('int64', (6, 12)), 'v3': ('float', (6, 12)), 'v7': ('float', (6, 12)), 'v8': ('float', (6,)), 'v10': ('float', (1, 12))}, 'members': []}  # noqa: E501


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
