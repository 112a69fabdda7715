"""kiln's CPU attention: ``softmax(Q K^T * scale [+ causal mask]) V`` per (batch, head), on the GEMM micro-kernel.

For each head, K^T and V are packed once into the GEMM's NR-wide panels; then for each block of MR query rows::

    S[MR x cols]  = Q_rows @ K^T[:, :cols]       micro-kernel, K = D (cols = i0 + MR under the causal mask:
                                                 panels entirely above the diagonal are skipped)
    P             = softmax(S * scale) per row    in place, vectorised exp (the kernel prelude's k_exp);
                                                 masked columns become exact zeros
    O_rows        = P @ V[:cols, :]               micro-kernel, K = cols, written straight into the output

The scores of one row block (MR x T floats) stay in L1/L2, so the ``[B, H, T, T]`` matrix is never stored
(ATen's CPU flash kernel for GPT's 12 x 256 x 64 heads, one thread: 3.4 ms a layer; this kernel: see
``library/attention/op.py``).  Rows are softmaxed exactly as written in the model: max, exp of the
difference, sum, division.
"""
from __future__ import annotations

import functools

from kiln.library.gemm.source import SOURCE as GEMM_SOURCE

KERNEL = r"""
// q, k, v, o: [B, H, T|S, D] by strides (b, h, t); q and o have unit stride along D, k and v any (ksd, vsd).
extern "C" void kiln_attention(const float* q, const float* k, const float* v, float* o, int64_t B, int64_t H,
                               int64_t T, int64_t S, int64_t D, int64_t qsb, int64_t qsh, int64_t qst,
                               int64_t ksb, int64_t ksh, int64_t kst, int64_t ksd, int64_t vsb, int64_t vsh,
                               int64_t vst, int64_t vsd, int64_t osb, int64_t osh, int64_t ost, float scale,
                               int causal, int threads) {
  const int64_t kpanels = (S + KILN_NR - 1) / KILN_NR, vpanels = (D + KILN_NR - 1) / KILN_NR;
  const int64_t lds = kpanels * KILN_NR;
#pragma omp parallel num_threads(threads)
  {
    float* kp = (float*)std::aligned_alloc(64, sizeof(float) * (kpanels * KILN_NR * D + 16));
    float* vp = (float*)std::aligned_alloc(64, sizeof(float) * (vpanels * KILN_NR * S + 16));
    float* qa = (float*)std::aligned_alloc(64, sizeof(float) * (KILN_MR * D + 16));
    float* s = (float*)std::aligned_alloc(64, sizeof(float) * (KILN_MR * lds + 16));
    float* pa = (float*)std::aligned_alloc(64, sizeof(float) * (KILN_MR * lds + 16));
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      kiln_pack_b(k + b * ksb + h * ksh, D, S, ksd, kst, kp);  // K^T [D x S]
      kiln_pack_b(v + b * vsb + h * vsh, S, D, vst, vsd, vp);  // V [S x D]
      for (int64_t i0 = 0; i0 < T; i0 += KILN_MR) {
        const int mr = (int)(T - i0 < KILN_MR ? T - i0 : KILN_MR);
        pack_a(q + b * qsb + h * qsh + i0 * qst, qst, mr, D, qa);
        const int64_t cols = causal ? (i0 + mr < S ? i0 + mr : S) : S;
        const int64_t np = (cols + KILN_NR - 1) / KILN_NR;
        for (int64_t p = 0; p < np; ++p) micro(qa, kp + p * D * KILN_NR, D, s + p * KILN_NR, lds, mr, KILN_NR, true,
                                               nullptr);
        for (int r = 0; r < mr; ++r) {
          float* row = s + r * lds;
          const int64_t valid = causal ? (i0 + r + 1 < cols ? i0 + r + 1 : cols) : cols;
          float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
          for (int64_t j = 0; j < valid; ++j) {
            row[j] *= scale;
            mx = row[j] > mx ? row[j] : mx;
          }
          if (mx == -INFINITY) mx = 0.0f;  // a row of -inf scores: exp gives zeros, the division NaN, as torch
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < valid; ++j) {
            row[j] = kiln_rt::k_exp(row[j] - mx);
            sum += row[j];
          }
#pragma omp simd
          for (int64_t j = 0; j < valid; ++j) row[j] = row[j] / sum;
          for (int64_t j = valid; j < cols; ++j) row[j] = 0.0f;
        }
        pack_a(s, lds, mr, cols, pa);
        for (int64_t p = 0; p < vpanels; ++p) {
          const int nr = (int)(D - p * KILN_NR < KILN_NR ? D - p * KILN_NR : KILN_NR);
          micro(pa, vp + p * S * KILN_NR, cols, o + b * osb + h * osh + i0 * ost + p * KILN_NR, ost, mr, nr, true,
                nullptr);
        }
      }
    }
    std::free(kp);
    std::free(vp);
    std::free(qa);
    std::free(s);
    std::free(pa);
  }
}
"""


@functools.lru_cache(maxsize=None)
def attention_source(mr: int = 8) -> str:
    """The kernel prelude (vector exp), kiln's GEMM (``mr``-row micro-tiles) and the attention kernel."""
    return f"#define KILN_MR512 {mr}\n" + GEMM_SOURCE + KERNEL  # (GEMM_SOURCE starts with the prelude)
