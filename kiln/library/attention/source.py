"""kiln's CPU attention: ``softmax(Q K^T * scale [+ mask] [causal]) V`` per (batch, head), on the GEMM micro-kernel.

K and V are read in place as the micro-kernel's A operand (one broadcast per element, any strides: no packing);
for each block of NR queries (AVX2 16, AVX-512 32) the scores are computed transposed, one key per row and one
query per lane::

    Q^T block     = [D x NR] B panel              (queries zero-padded)
    S^T[keys x NR] = K @ Q^T                      micro-kernel, K = D; under the causal mask only the keys up to
                                                  the block's last query
    softmax along keys, all NR queries at once    scale (+ the additive mask's transposed block), max, exp, sum:
                                                  vertical vector operations, no horizontal reductions
    O^T[D x NR]   = V^T @ P^T                     micro-kernel, K = keys in L1-sized chunks; P^T = S^T is
                                                  already the B panel layout, so the probabilities are not packed
    O rows        = O^T^T / sum                   the division once per output, not once per score

The scores of one block (keys x NR floats) stay in L2, so the ``[B, H, T, S]`` matrix is never stored.  Rows are
normalized as softmax does (max, exp of the difference, sum); the product with V is taken before the division
by the sum, a rounding-level difference (ATen's flash kernels also rescale after the product).
"""
from __future__ import annotations

import functools

from kiln.library.gemm.source import SOURCE as GEMM_SOURCE

KERNEL = r"""
#include <type_traits>
// e^x for the softmax's x = score - row max: x <= 0, -inf (a masked key) or NaN.  k_exp without what it needs for
// x > 0 and for results below 2^-126 (its upper clamp, its two-step scaling into the denormals): results under
// e^-87 = 1.6e-38 are 0 here, which changes no probability (the row's sum is at least 1) and no output by more
// than 1.6e-38 |v|.  The same reduction and polynomial as k_exp otherwise (bit-equal above e^-87).
static inline float exp_nonpositive(float x) {
  const float xc = x < -87.0f ? -87.0f : x;  // (NaN passes: the comparison is false)
  int32_t n;
  const float r = kiln_rt::kdetail::exp_reduce(xc, n);
  const float e = (1.0f + kiln_rt::kdetail::expm1_poly(r)) * kiln_rt::kdetail::pow2i(n);  // n >= -126
  return x < -87.0f ? 0.0f : e;
}

// q, k, v, mask, o: [B, H, T|S, D] by strides (b, h, t[, d]); q and o have unit stride along D.  mask (or null):
// an additive [B, H, T, S] float mask by strides (zero strides broadcast).  causal: keys after the query are
// masked (S == T).  zero_empty: a row whose scores are all -inf gives zeros (ATen's flash kernels) instead of
// NaN (softmax written out: 0 / 0).
extern "C" void kiln_attention(const float* q, const float* k, const float* v, const float* mask, float* o,
                               int64_t B, int64_t H, int64_t T, int64_t S, int64_t D,
                               int64_t qsb, int64_t qsh, int64_t qst, int64_t ksb, int64_t ksh, int64_t kst,
                               int64_t ksd, int64_t vsb, int64_t vsh, int64_t vst, int64_t vsd, int64_t msb,
                               int64_t msh, int64_t mst, int64_t mss, int64_t osb, int64_t osh, int64_t ost,
                               float scale, int causal, int zero_empty, int threads) {
  constexpr int NR = KILN_NR;          // queries per block: the GEMMs' B panels are NR wide
  constexpr int NARROW = LANES == 16 && NR > 16 ? 16 : NR;  // a last block of at most 16 queries (AVX-512)
  constexpr int64_t KB = 4096 / NR;    // keys per rank update of the second GEMM: its B chunk is 16 KiB (L1)
  const int64_t kpanels = (S + KILN_MR - 1) / KILN_MR, vpanels = (D + KILN_MR - 1) / KILN_MR;
  const int64_t blocks = (T + NR - 1) / NR;
  const bool tiles = D % 16 == 0;      // Q in and O out through 16 x 16 register transposes
#pragma omp parallel num_threads(threads)
  {
    float* qb = (float*)std::aligned_alloc(64, sizeof(float) * (D * NR + 16));
    float* st = (float*)std::aligned_alloc(64, sizeof(float) * (kpanels * KILN_MR * NR + 16));
    float* ot = (float*)std::aligned_alloc(64, sizeof(float) * (vpanels * KILN_MR * NR + 16));
    alignas(64) float tile[256];
#pragma omp for schedule(static)
    for (int64_t job = 0; job < B * H * blocks; ++job) {
      const int64_t bh = job / blocks, b = bh / H, h = bh % H, i0 = job % blocks * NR;
      const int nq = (int)(T - i0 < NR ? T - i0 : NR);
      // The last block of a sequence (T = 197: 5 queries) as a 16-wide block where it fits (AVX-512): its products
      // and softmax then cost half of a 32-wide block's.  Each query is one lane either way, so the results are
      // the same bits.
      auto block = [&](auto width) {
        constexpr int NRB = decltype(width)::value;
        const float* qrow = q + b * qsb + h * qsh + i0 * qst;
        // Q^T of the block as one B panel [D x NRB], queries past T zero
        if (tiles && nq == NRB) {
          for (int c0 = 0; c0 < NRB; c0 += 16)
            for (int64_t d0 = 0; d0 < D; d0 += 16) {
              kiln_rt::transpose16(qrow + c0 * qst + d0, qst, tile);  // tile[a * 16 + c] = Q[c0 + c, d0 + a]
              for (int a = 0; a < 16; ++a) std::memcpy(qb + (d0 + a) * NRB + c0, tile + a * 16, 16 * sizeof(float));
            }
        } else {
          for (int64_t kk = 0; kk < D; ++kk) {
            for (int c = 0; c < nq; ++c) qb[kk * NRB + c] = qrow[c * qst + kk];
            for (int c = nq; c < NRB; ++c) qb[kk * NRB + c] = 0.0f;
          }
        }
        const int64_t cols = causal ? (i0 + nq < S ? i0 + nq : S) : S;
        // S^T [cols x NRB] = K Q^T, K read in place: row j holds key j's score for each query of the block (the B
        // panel layout of the second product, so P^T needs no packing)
        const float* kh = k + b * ksb + h * ksh;
        for (int64_t p = 0; p * KILN_MR < cols; ++p) {
          const int mr = (int)(cols - p * KILN_MR < KILN_MR ? cols - p * KILN_MR : KILN_MR);
          micro_strided<NRB>(kh + p * KILN_MR * kst, kst, ksd, qb, D, st + p * KILN_MR * NRB, NRB, mr, NRB, true);
        }
        // softmax along keys for every query at once (vertical: each lane one query)
        bool scaled = false;
        if (mask) {
          const float* mrow = mask + b * msb + h * msh + i0 * mst;
          int c0 = 0;
          if (mss == 1)
            for (; c0 + 16 <= nq; c0 += 16) {
              int64_t j0 = 0;
              for (; j0 + 16 <= cols; j0 += 16) {
                kiln_rt::transpose16(mrow + c0 * mst + j0, mst, tile);  // tile[a * 16 + c] = mask[c0 + c, j0 + a]
                for (int a = 0; a < 16; ++a) {
                  float* row = st + (j0 + a) * NRB + c0;
#pragma omp simd
                  for (int c = 0; c < 16; ++c) row[c] = row[c] * scale + tile[a * 16 + c];
                }
              }
              for (int c = c0; c < c0 + 16; ++c)
                for (int64_t j = j0; j < cols; ++j) st[j * NRB + c] = st[j * NRB + c] * scale + mrow[c * mst + j];
            }
          for (int c = c0; c < nq; ++c)
            for (int64_t j = 0; j < cols; ++j) st[j * NRB + c] = st[j * NRB + c] * scale + mrow[c * mst + j * mss];
          scaled = true;
        }
        alignas(64) float mx[NRB], sum[NRB];
#pragma omp simd
        for (int c = 0; c < NRB; ++c) mx[c] = -INFINITY;
        const float by = scaled ? 1.0f : scale;
        for (int64_t j = 0; j < cols; ++j) {
          float* row = st + j * NRB;
          const int64_t first = causal ? j - i0 : 0;  // causal: queries i0 + c < j see no key j (only c < first)
#pragma omp simd
          for (int c = 0; c < NRB; ++c) {
            const float x = c < first ? -INFINITY : row[c] * by;
            row[c] = x;
            mx[c] = x > mx[c] ? x : mx[c];
          }
        }
#pragma omp simd
        for (int c = 0; c < NRB; ++c) {
          mx[c] = mx[c] == -INFINITY ? 0.0f : mx[c];  // all -inf: exp gives zeros
          sum[c] = 0.0f;
        }
        for (int64_t j = 0; j < cols; ++j) {
          float* row = st + j * NRB;
#pragma omp simd
          for (int c = 0; c < NRB; ++c) {
            const float e = exp_nonpositive(row[c] - mx[c]);
            row[c] = e;
            sum[c] += e;
          }
        }
        // O^T [D x NRB] = V^T P^T, V read in place, keys in KB chunks (accumulated in ot)
        const float* vh = v + b * vsb + h * vsh;
        for (int64_t j0 = 0; j0 < cols; j0 += KB) {
          const int64_t kc = cols - j0 < KB ? cols - j0 : KB;
          for (int64_t p = 0; p < vpanels; ++p) {
            const int mr = (int)(D - p * KILN_MR < KILN_MR ? D - p * KILN_MR : KILN_MR);
            micro_strided<NRB>(vh + p * KILN_MR * vsd + j0 * vst, vsd, vst, st + j0 * NRB, kc,
                               ot + p * KILN_MR * NRB, NRB, mr, NRB, j0 == 0);
          }
        }
        // O = (E V) / sum: the division once per output instead of once per score.  A row of -inf scores (sum 0):
        // NaN as softmax gives (0 / 0), or zeros as ATen's flash kernels give (E V is 0 there).
        alignas(64) float inv[NRB];
        for (int c = 0; c < NRB; ++c) inv[c] = sum[c] == 0.0f ? (zero_empty ? 0.0f : NAN) : 1.0f / sum[c];
        float* orow = o + b * osb + h * osh + i0 * ost;
        if (tiles) {
          for (int c0 = 0; c0 < nq; c0 += 16)
            for (int64_t d0 = 0; d0 < D; d0 += 16) {
              kiln_rt::transpose16(ot + d0 * NRB + c0, NRB, tile);  // tile[c * 16 + a] = O^T[d0 + a, c0 + c]
              for (int c = 0; c < 16 && c0 + c < nq; ++c) {
                float* out = orow + (c0 + c) * ost + d0;
                const float f = inv[c0 + c];
#pragma omp simd
                for (int a = 0; a < 16; ++a) out[a] = tile[c * 16 + a] * f;
              }
            }
        } else {
          for (int c = 0; c < nq; ++c)
            for (int64_t d = 0; d < D; ++d) orow[c * ost + d] = ot[d * NRB + c] * inv[c];
        }
      };
      if (NARROW < NR && nq <= NARROW) block(std::integral_constant<int, NARROW>{});
      else block(std::integral_constant<int, NR>{});
    }
    std::free(qb);
    std::free(st);
    std::free(ot);
  }
}
"""


@functools.lru_cache(maxsize=None)
def attention_source(mr: int = 8) -> str:
    """The kernel prelude (vector exp), kiln's GEMM (``mr``-row micro-tiles) and the attention kernel."""
    return f"#define KILN_MR512 {mr}\n" + GEMM_SOURCE + KERNEL  # (GEMM_SOURCE starts with the prelude)
