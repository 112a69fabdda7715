"""kiln's CPU Winograd convolution: 3x3, stride 1, on NHWC data, generated per output tile size (C++).

Winograd's minimal filtering F(m x m, 3 x 3) computes an m x m block of outputs from an alpha x alpha input tile
(alpha = m + 2) with alpha^2 multiplications per (input, output) channel pair instead of 9 m^2:

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A          (.) elementwise; g the 3x3 filter, d the input tile

Over channels the elementwise product becomes alpha^2 independent GEMMs, one per tile position p::

    V[p][tile][c]  = (B^T d_tile,c B)[p]           input transform, vectorised over channels (optionally with
                                                   the producer's ReLU applied to d as it is read)
    U[p][c][k]     = (G g_k,c G^T)[p]              weight transform, once at compile time, packed for the GEMM
    M[p]           = V[p] @ U[p]                   [tiles x C] @ [C x K]: kiln's GEMM micro-kernel (library/gemm/source.py)
    y_tile,k       = A^T M[.][tile][k] A  (+ bias, + residual, relu)   output transform with the fused epilogue

F(2x2) needs 16/36 of direct convolution's multiplications, F(4x4) 36/144; the transforms are extra
(memory-bound) work, and larger tiles lose accuracy (their matrices have larger entries), so the tile size is a
schedule choice that measurement and an accuracy check make (``library/conv/op.py``).  Tiles are processed in
blocks of ``tb`` (a run-time argument): the block's V and M stay in L2 between the three phases.

The transform matrices are not typed in: ``winograd_matrices`` derives them exactly (sympy rationals) from the
interpolation points by Cook-Toom (A, G) and by solving the bilinear identity for B, and the transforms are
emitted as straight-line vector code with the constant coefficients compiled in (zero terms dropped, +-1 as
adds).
"""
from __future__ import annotations

import functools

import sympy as sp

from kiln.library.gemm.source import SOURCE as GEMM_SOURCE

R = 3  # filter size
POINTS = {2: (0, 1, -1), 4: (0, 1, -1, 2, -2)}  # interpolation points (plus infinity) per output tile size


@functools.lru_cache(maxsize=None)
def winograd_matrices(m: int, r: int = R) -> tuple[sp.Matrix, sp.Matrix, sp.Matrix]:
    """Exact ``(A^T [m x n], G [n x r], B^T [n x n])`` with ``n = m + r - 1`` for F(m, r).

    A^T and G follow Cook-Toom: A^T[i][j] = p_j^i, G[j][k] = p_j^k / prod_{l != j}(p_j - p_l), and the point at
    infinity adds a last column/row.  B^T then follows from the identity that defines the algorithm,
    ``sum_j A^T[i][j] G[j][k] B^T[j][l] = [l == i + k]`` for every output i, tap k and input l."""
    n = m + r - 1
    points = [sp.Rational(p) for p in POINTS[m]]
    at, g = sp.zeros(m, n), sp.zeros(n, r)
    for j, p in enumerate(points):
        scale = sp.prod([p - q for q in points if q != p])
        for i in range(m):
            at[i, j] = p ** i
        for k in range(r):
            g[j, k] = p ** k / scale
    at[m - 1, n - 1] = 1
    g[n - 1, r - 1] = 1
    products = sp.Matrix(m * r, n, lambda row, j: at[row // r, j] * g[j, row % r])
    bt = sp.zeros(n, n)
    for col in range(n):
        rhs = sp.Matrix([1 if col == i + k else 0 for i in range(m) for k in range(r)])
        solution, _ = products.gauss_jordan_solve(rhs)
        bt[:, col] = solution
    return at, g, bt


def _linear(coeffs: list[sp.Rational], names: list[str]) -> str:
    """C++ vector expression for ``sum coeffs[i] * names[i]``: zero terms dropped, +-1 as add/sub."""
    terms = [(c, x) for c, x in zip(coeffs, names) if c != 0]
    if not terms:
        return "VZERO()"
    terms.sort(key=lambda t: t[0] != 1)  # start from a +1 term when there is one: no negation needed
    c, x = terms[0]
    expr = x if c == 1 else f"VMUL(VSET1({float(c)!r}f), {x})"
    for c, x in terms[1:]:
        if c == 1:
            expr = f"VADD({expr}, {x})"
        elif c == -1:
            expr = f"VSUB({expr}, {x})"
        else:
            expr = f"VFMA(VSET1({float(c)!r}f), {x}, {expr})"
    return expr


def _two_sided(t: sp.Matrix, src: str, tmp: str, dst: str) -> list[str]:
    """Statements for ``dst = t @ src @ t^T`` on square arrays of vectors (``src`` is cols x cols)."""
    rows, cols = t.shape
    lines = [f"vec {tmp}[{rows}][{cols}], {dst}[{rows}][{rows}];"]
    for i in range(rows):
        for j in range(cols):
            lines.append(f"{tmp}[{i}][{j}] = {_linear(list(t.row(i)), [f'{src}[{q}][{j}]' for q in range(cols)])};")
    for i in range(rows):
        for j in range(rows):
            lines.append(f"{dst}[{i}][{j}] = {_linear(list(t.row(j)), [f'{tmp}[{i}][{q}]' for q in range(cols)])};")
    return lines


VECTOR_HELPERS = r"""
#if defined(__AVX512F__)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VMIN(a, b) _mm512_min_ps(a, b)
static inline vec vloadn(const float* p, int64_t n) {
  return n >= LANES ? VLOAD(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
static inline void vstoren(float* p, vec v, int64_t n) {
  if (n >= LANES) VSTORE(p, v); else _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v);
}
// channels s floats apart (an NCHW tensor): gather / scatter, lane i at i * s (s * LANES < 2^31: checked by caller)
static inline vec vloads(const float* p, int64_t n, int64_t s) {
  if (s == 1) return vloadn(p, n);
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)s));
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), (__mmask16)(n >= LANES ? 0xffffu : (1u << n) - 1u), idx, p, 4);
}
static inline void vstores(float* p, vec v, int64_t n, int64_t s) {
  if (s == 1) { vstoren(p, v, n); return; }
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)s));
  _mm512_mask_i32scatter_ps(p, (__mmask16)(n >= LANES ? 0xffffu : (1u << n) - 1u), idx, v, 4);
}
#else
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VMIN(a, b) _mm256_min_ps(a, b)
static inline __m256i lanes_below(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vec vloadn(const float* p, int64_t n) {
  return n >= LANES ? VLOAD(p) : _mm256_maskload_ps(p, lanes_below(n));
}
static inline void vstoren(float* p, vec v, int64_t n) {
  if (n >= LANES) VSTORE(p, v); else _mm256_maskstore_ps(p, lanes_below(n), v);
}
static inline vec vloads(const float* p, int64_t n, int64_t s) {
  if (s == 1) return vloadn(p, n);
  alignas(32) float t[LANES] = {0};
  for (int64_t i = 0; i < n && i < LANES; ++i) t[i] = p[i * s];
  return VLOAD(t);
}
static inline void vstores(float* p, vec v, int64_t n, int64_t s) {
  if (s == 1) { vstoren(p, v, n); return; }
  alignas(32) float t[LANES];
  VSTORE(t, v);
  for (int64_t i = 0; i < n && i < LANES; ++i) p[i * s] = t[i];
}
#endif
// the convolutions' ReLU epilogue, clamped above at hi (inf: a plain ReLU; 6: ReLU6): max(0, NaN) and min(hi, NaN)
// are NaN, as torch.relu and hardtanh give (the max and min instructions return their second operand on a NaN)
#define RELU(v, hi) VCLAMP0(v, VSET1(hi))  // (the GEMM header's clamp)
static inline float relu1(float v, float hi) {  // RELU on one float
  v = v > 0.0f || v != v ? v : 0.0f;
  return v < hi || v != v ? v : hi;
}
"""

KERNEL = r"""
#define WM KILN_WINO_M
#define WA (KILN_WINO_M + 2)
#define WA2 (WA * WA)

extern "C" int kiln_winograd_alpha() { return WA; }

// x: [n][c][h][w] by strides (xs: n, c, h, w).  u: per position p, the packed [C x K] panels of kiln_pack_b.
// y (and the optional residual r): [n][k][ho][wo] by strides.  Channels-last tensors (channel stride 1) are read
// and written with vector loads and stores, others (NCHW) with gathers and scatters.
extern "C" void kiln_winograd(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t xsn,
                              int64_t xsc, int64_t xsh, int64_t xsw, const float* u, const float* bias,
                              const float* r, int64_t rsn, int64_t rsc, int64_t rsh, int64_t rsw, float* y,
                              int64_t ysn, int64_t ysc, int64_t ysh, int64_t ysw, int64_t k, int64_t ph,
                              int64_t pw, int64_t ho, int64_t wo, int relu, float relu_max, int relu_in,
                              float relu_in_max, int64_t tb, int64_t KC,
                              int threads) {
  const int64_t th = (ho + WM - 1) / WM, tw = (wo + WM - 1) / WM, tiles = n * th * tw;
  const int64_t blocks = (tiles + tb - 1) / tb, panels = (k + KILN_NR - 1) / KILN_NR;
  // With one K block (c <= KC) the input transform writes V straight in the micro-kernel's packed layout (per
  // point, MR-row panels, channel-major: what pack_a makes), so the GEMM reads it without a packing pass.  Rows
  // past the block's last tile are never read (edge tiles compute only their own rows).  Zen 3, one thread, against
  // transform-then-pack: 64@56 5-6% faster, 128@28 1-2%, 256@14 2-4%; results bit-identical.
  const bool packed_v = c <= KC;
  const int64_t vstride = packed_v ? (tb + KILN_MR - 1) / KILN_MR * KILN_MR * c : tb * c;  // floats per point
#pragma omp parallel num_threads(threads)
  {
    float* V = (float*)std::aligned_alloc(64, sizeof(float) * (WA2 * vstride + 16));
    float* M = (float*)std::aligned_alloc(64, sizeof(float) * (WA2 * tb * k + 16));
    float* ap = (float*)std::aligned_alloc(64, sizeof(float) * ((tb + KILN_MR) * (KC < c ? KC : c) + 16));
#pragma omp for schedule(dynamic)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t t0 = blk * tb, nt = tiles - t0 < tb ? tiles - t0 : tb;
      for (int64_t t = 0; t < nt; ++t) {  // input transform: V[p][t][:] = (B^T d B)[p]
        const int64_t g = t0 + t, b = g / (th * tw), ty = (g / tw) % th, tx = g % tw;
        const int64_t y0 = ty * WM - ph, x0 = tx * WM - pw;
        for (int64_t c0 = 0; c0 < c; c0 += LANES) {
          const int64_t cn = c - c0;
          vec d[WA][WA];
          for (int i = 0; i < WA; ++i)
            for (int j = 0; j < WA; ++j) {
              const int64_t yy = y0 + i, xx = x0 + j;
              d[i][j] = (yy >= 0 && yy < h && xx >= 0 && xx < w)
                            ? vloads(x + b * xsn + yy * xsh + xx * xsw + c0 * xsc, cn, xsc) : VZERO();
              if (relu_in) d[i][j] = RELU(d[i][j], relu_in_max);  // the producer's ReLU, applied as the input is read
            }
          KILN_INPUT_TRANSFORM
          if (packed_v) {
            float* vt = V + (t / KILN_MR) * KILN_MR * c + c0 * KILN_MR + t % KILN_MR;
            for (int i = 0; i < WA; ++i)
              for (int j = 0; j < WA; ++j) vstores(vt + (i * WA + j) * vstride, v[i][j], cn, KILN_MR);
          } else
            for (int i = 0; i < WA; ++i)
              for (int j = 0; j < WA; ++j) vstoren(V + (i * WA + j) * vstride + t * c + c0, v[i][j], cn);
        }
      }
      for (int p = 0; p < WA2; ++p) {  // M[p] = V[p] @ U[p]
        const float* vp = V + p * vstride;
        float* mp = M + p * tb * k;
        const float* up = u + (int64_t)p * panels * c * KILN_NR;
        for (int64_t pc = 0; pc < c; pc += KC) {
          const int64_t kc = c - pc < KC ? c - pc : KC;
          if (!packed_v) pack_a(vp + pc, c, nt, kc, ap);
          const float* a = packed_v ? vp : ap;
          for (int64_t q = 0; q < panels; ++q) {
            const int64_t jr = q * KILN_NR;
            const int nr = (int)(k - jr < KILN_NR ? k - jr : KILN_NR);
            const float* bp = up + q * c * KILN_NR + pc * KILN_NR;
            // the weight panel used next (this point's next panel, its next K block, the next point's first),
            // prefetched by the first row tile: the transformed weights are 16/9 of the filter's size and,
            // in a model, come from memory on every call
            const float* next_b = q + 1 < panels ? bp + c * KILN_NR
                                  : pc + kc < c ? up + (pc + kc) * KILN_NR
                                  : p + 1 < WA2 ? u + (int64_t)(p + 1) * panels * c * KILN_NR : nullptr;
            for (int64_t ir = 0; ir < nt; ir += KILN_MR)
              micro(a + ir * kc, bp, kc, mp + ir * k + jr, k, (int)(nt - ir < KILN_MR ? nt - ir : KILN_MR), nr,
                    pc == 0, nullptr, ir == 0 ? next_b : nullptr);
          }
        }
      }
      for (int64_t t = 0; t < nt; ++t) {  // output transform + epilogue
        const int64_t g = t0 + t, b = g / (th * tw), ty = (g / tw) % th, tx = g % tw;
        for (int64_t k0 = 0; k0 < k; k0 += LANES) {
          const int64_t kn = k - k0;
          vec m[WA][WA];
          for (int i = 0; i < WA; ++i)
            for (int j = 0; j < WA; ++j) m[i][j] = vloadn(M + ((i * WA + j) * tb + t) * k + k0, kn);
          KILN_OUTPUT_TRANSFORM
          const vec bv = bias ? vloadn(bias + k0, kn) : VZERO();
          for (int i = 0; i < WM; ++i) {
            const int64_t oy = ty * WM + i;
            if (oy >= ho) break;
            for (int j = 0; j < WM; ++j) {
              const int64_t ox = tx * WM + j;
              if (ox >= wo) break;
              vec val = VADD(o[i][j], bv);
              if (r) val = VADD(val, vloads(r + b * rsn + oy * rsh + ox * rsw + k0 * rsc, kn, rsc));
              if (relu) val = RELU(val, relu_max);
              vstores(y + b * ysn + oy * ysh + ox * ysw + k0 * ysc, val, kn, ysc);
            }
          }
        }
      }
    }
    std::free(V);
    std::free(M);
    std::free(ap);
  }
}
"""


@functools.lru_cache(maxsize=None)
def winograd_source(m: int, mr: int = 8) -> str:
    """The library for F(m x m, 3 x 3): kiln's GEMM (micro-kernel and packing, ``mr``-row tiles) plus the
    transforms generated from ``winograd_matrices(m)``."""
    at, _, bt = winograd_matrices(m)
    input_transform = " ".join(_two_sided(bt, "d", "s", "v"))
    output_transform = " ".join(_two_sided(at, "m", "q", "o"))
    kernel = (KERNEL.replace("KILN_WINO_M", str(m))
              .replace("KILN_INPUT_TRANSFORM", input_transform)
              .replace("KILN_OUTPUT_TRANSFORM", output_transform))
    return f"#define KILN_MR512 {mr}\n" + GEMM_SOURCE + VECTOR_HELPERS + kernel
