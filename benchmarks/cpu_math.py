"""Cost of kiln's vectorised math (``codegen/cpp_prelude.py``) per element, one thread, against eager's ops.

Each expression is compiled the way generated kernels are (prelude, ``#pragma omp simd`` loop, kiln's flags) and
timed inside the library over ``--n`` floats in [-6, 6], best of ``--rounds``; eager's op runs on the same tensor
(with its output preallocated), timed from Python.  ``gelu (erf form)`` is what graphs computed before gelu was
lowered to erfc: ``x/2 * (1 + erf(x/sqrt 2))``.

    python -m benchmarks.cpu_math [--n 262144] [--rounds 50]
"""
from __future__ import annotations

import argparse
import ctypes
import time

import torch

EXPRESSIONS = {  # name -> (C++ expression of float x, eager op writing into out)
    "exp": ("k_exp(x)", lambda t, out: torch.exp(t, out=out)),
    "erf": ("k_erf(x)", lambda t, out: torch.erf(t, out=out)),
    "erfc": ("k_erfc(x)", lambda t, out: torch.erfc(t, out=out)),
    "gelu (erfc form, kiln's lowering)": ("(x * 0.5f) * k_erfc(x * -0.7071067811865476f)",
                                          lambda t, out: torch.ops.aten.gelu.out(t, out=out)),
    "gelu (erf form)": ("(x * 0.5f) * (k_erf(x * 0.7071067811865476f) + 1.0f)", None),
}

TIMER = r"""
#include <chrono>
extern "C" double bench_NAME(const float* __restrict in, float* __restrict out, long n, int rounds) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp simd
    for (long i = 0; i < n; ++i) { const float x = in[i]; out[i] = EXPR; }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 18)
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from kiln.codegen.cpp_expr import HELPERS
    from kiln.codegen.cpp_prelude import PRELUDE
    from kiln.runtime.build import load_module
    source = PRELUDE + HELPERS + "#include <algorithm>\n" + "".join(
        TIMER.replace("NAME", str(i)).replace("EXPR", expr) for i, (expr, _) in enumerate(EXPRESSIONS.values()))
    lib = load_module(source, name="kiln_math_bench").lib
    x = torch.rand(args.n, generator=torch.Generator().manual_seed(0)) * 12 - 6
    out = torch.empty_like(x)
    print(f"{'function':36s} kiln ns/elem   eager ns/elem")
    for i, (name, (_, eager)) in enumerate(EXPRESSIONS.items()):
        fn = getattr(lib, f"bench_{i}")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
        fn.restype = ctypes.c_double
        kiln_ns = fn(x.data_ptr(), out.data_ptr(), args.n, args.rounds) / args.n * 1e9
        eager_ns = float("nan")
        if eager is not None:
            best = float("inf")
            for _ in range(args.rounds):
                start = time.perf_counter()
                eager(x, out)
                best = min(best, time.perf_counter() - start)
            eager_ns = best / args.n * 1e9
        print(f"{name:36s} {kiln_ns:12.2f}   {eager_ns:13.2f}", flush=True)


if __name__ == "__main__":
    main()
