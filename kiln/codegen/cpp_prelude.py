"""C++ prelude pasted at the top of every kiln-generated translation unit: ``prelude.h`` beside this file (a real
header: an editor and a compiler read it as C++) and the generated in-register transposes below.

Generated kernels are plain scalar C++ loops (``#pragma omp simd`` on the inner
loop) that GCC auto-vectorizes.  Calls into libm (``std::exp``, ``std::tanh``,
``erff``, ...) block that, because without ``-ffast-math`` GCC has no vector
variants for them.  The prelude therefore provides our own float math:

* every function is ``static inline`` + ``always_inline`` and branch-free
  (only ``?:`` selects, which GCC if-converts into vector blends), so a loop
  calling it is vectorized after inlining -- no ``#pragma omp declare simd``
  is needed (and we avoid it: simd clones cost compile time);
* bit manipulation goes through ``std::memcpy`` (vectorizes as a plain
  register reinterpretation);
* results are robust to the default ``-ffp-contract=fast`` of g++ (FMA
  contraction): no formula relies on a separate rounding of ``a*b``;
* special values follow torch / C99 (overflow -> inf, underflow -> 0,
  NaN propagation, ``log(0) = -inf``, ``log(<0) = NaN``, signed zeros for
  odd functions, C99 ``pow`` special cases).

Accuracy (float32 in, float32 out; max error vs torch float64 over dense
sweeps + special values, see ``tests/cpu/test_cpp_prelude.py``; "ulp" is
measured where |result| >= 1e-6, below that the absolute error is < 1e-12):

  exp 1.0  expm1 1.6  log 0.8  log1p 1.3  tanh 1.3  sigmoid 2.2  silu 3.1
  erf 1.3  erfc 4.6  ndtr 4.1 (5.4 where the error is below 1e-7)
  sin/cos 1.6 (every finite input: table-free Payne-Hanek style reduction in double)  pow 0.5  rsqrt 1.5
  gelu_erf: 2 for x >= 0; absolute error < 1e-6 for x < 0 (a rational Phi without exp, absolute like
  ATen's 0.5 x (1 + erf(x / sqrt 2)), whose error there is ~3e-7)
  gelu_tanh: 1.7 for x >= 0, 2.6 on [-1, 0), up to ~25 for x < -1 where the
  inner cubic, computed in float as torch does, dominates
  (gelu_tanh: absolute error < 5e-8 for x < -1)

Single-thread cost, ns/element on 4M floats (Zen 4, AVX-512): exp 0.30,
tanh 0.54, erf 0.79, erfc 0.65, ndtr 0.47, sigmoid/silu 0.44, gelu_erf 0.30 (L1-resident), gelu_tanh 0.55,
log 0.43, sin 1.6, pow 3.2 (libm: exp 2.3, tanh 14.8, erf 16.6, sin 7.8,
pow 4.4).

Double overloads simply call ``std::`` (double math is rare in generated code
and those loops are not expected to vectorize).

Public API (namespace ``kiln_rt``), float and double overloads:

  k_exp k_expm1 k_log k_log1p k_tanh k_sigmoid k_erf k_erfc k_ndtr k_sin k_cos
  k_pow(x, y) k_rsqrt k_gelu_erf k_gelu_tanh k_silu k_relu
  k_maximum(a, b) k_minimum(a, b)      (templates; NaN if either is NaN)

Compiled with ``g++ -O3 -march=native -fopenmp -shared -fPIC -std=c++17
-fno-math-errno -fno-trapping-math``.  Only ``<cstdint> <cmath> <cstring>
<omp.h>`` are included to keep the per-graph compile time low.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PRELUDE", "PRELUDE_VERSION", "PRELUDE_FUNCTIONS", "transpose_stages"]

#: Bump whenever the text of PRELUDE (prelude.h, the transposes below) changes (it is part of kernel cache keys).
PRELUDE_VERSION = "14"

#: Names of the public float math functions defined in namespace ``kiln_rt``.
PRELUDE_FUNCTIONS = (
    "k_exp", "k_expm1", "k_log", "k_log1p", "k_tanh", "k_sigmoid", "k_erf", "k_erfc", "k_ndtr",
    "k_sin", "k_cos", "k_pow", "k_rsqrt", "k_gelu_erf", "k_gelu_tanh", "k_silu",
    "k_relu", "k_maximum", "k_minimum",
)



def transpose_stages(n: int = 16, vector_type: str = "kv16f") -> str:
    """The shuffles of an n x n in-register transpose of the vectors ``r[0..n)`` (n a power of two): log2(n)
    stages, each swapping one bit of the row index with the same bit of the column index between row pairs
    (p, p | bit).  After all of them, element (r, c) sits at (c, r).  GCC lowers each two-source shuffle to one
    permute (vpermt2ps) with AVX-512, to one or two shuffles with AVX2."""
    lines = []
    for b in range(n.bit_length() - 1):
        d = 1 << b
        for p in range(n):
            if p & d:
                continue
            q = p | d
            lo = [c if not c & d else n + c - d for c in range(n)]
            hi = [c + d if not c & d else n + c for c in range(n)]
            lines.append(f"  {{ const {vector_type} x = __builtin_shufflevector(r[{p}], r[{q}], "
                         f"{', '.join(map(str, lo))});\n"
                         f"    r[{q}] = __builtin_shufflevector(r[{p}], r[{q}], {', '.join(map(str, hi))}); "
                         f"r[{p}] = x; }}")
    return "\n".join(lines)


# Tiles for kernels that read channels-last data and write NCHW (or the reverse): see codegen/cpp_tile.py.
_TRANSPOSE = r"""namespace kiln_rt {
typedef float kv16f __attribute__((vector_size(64)));
// dst[a * 16 + b] = src[b * ld + a] for a, b < 16, in registers (float).
KILN_INLINE void transpose16(const float* src, int64_t ld, float* dst) {
  kv16f r[16];
  for (int i = 0; i < 16; ++i) std::memcpy(&r[i], src + i * ld, sizeof(kv16f));
""" + transpose_stages() + r"""
  for (int i = 0; i < 16; ++i) std::memcpy(dst + i * 16, &r[i], sizeof(kv16f));
}
// Other element types: the same tile, element by element.
template <typename T>
KILN_INLINE void transpose16(const T* src, int64_t ld, T* dst) {
  for (int b = 0; b < 16; ++b)
    for (int a = 0; a < 16; ++a) dst[a * 16 + b] = src[b * ld + a];
}
}  // namespace kiln_rt
"""

PRELUDE = ("// ===== kiln runtime prelude v" + PRELUDE_VERSION + " (kiln/codegen/prelude.h) =====\n"
           + (Path(__file__).parent / "prelude.h").read_text() + _TRANSPOSE
           + "// ===== end of kiln runtime prelude =====\n")
