"""kiln's CPU depthwise convolution (C++): one filter per channel (groups = C = K), any filter size, stride and
padding, direct.

A depthwise convolution does ``kh * kw`` multiply-adds per output value and has no reduction over channels, so
there is no GEMM to hand it to: each output pixel's channels are a vector (channels-last: contiguous), and the
filter taps accumulate into it::

    y[b, c, oy, ox] = bias[c] + sum_{dy, dx} x[b, c, oy*sh - ph + dy, ox*sw - pw + dx] * W[dy, dx, c]

    for each (b, oy) row, in parallel:
      for each block of BX output pixels along x, and each LANES-wide group of channels:
        BX accumulators start at the bias; for each tap: one weight vector, BX input vectors, BX FMAs
        epilogue: + residual, ReLU (max(0, x) keeping NaN), stored by strides (channels-last: vector stores)

``W`` is packed at compile time as ``[kh][kw][C]`` so that a tap's weights for a channel group are one vector
load, shared by the block's BX pixels (that sharing is what the block is for: without it every FMA would need
a weight load too).  The producer's ReLU can be applied as the input is read, as in the other kiln
convolutions (``library/conv/select.py``).
"""
from __future__ import annotations

import functools

from kiln.library.gemm.source import SOURCE as GEMM_SOURCE, GemmSchedule
from kiln.library.conv.source_winograd import VECTOR_HELPERS

BX = 4  # output pixels per block along x

KERNEL = r"""
// x: [n][c][h][w] by strides; wt: [kh][kw][c]; r (optional residual) and y: [n][c][ho][wo] by strides
extern "C" void kiln_conv_dw(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t xsn, int64_t xsc,
                             int64_t xsh, int64_t xsw, const float* wt, const float* bias, const float* r,
                             int64_t rsn, int64_t rsc, int64_t rsh, int64_t rsw, float* y, int64_t ysn, int64_t ysc,
                             int64_t ysh, int64_t ysw, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                             int64_t pw, int64_t ho, int64_t wo, int relu, float relu_max, int relu_in,
                             float relu_in_max, int threads) {
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oy = 0; oy < ho; ++oy) {
      const float* xb = x + b * xsn;
      for (int64_t ox0 = 0; ox0 < wo; ox0 += KILN_DW_BX) {
        const int nx = (int)(wo - ox0 < KILN_DW_BX ? wo - ox0 : KILN_DW_BX);
        for (int64_t c0 = 0; c0 < c; c0 += LANES) {
          const int64_t cn = c - c0;
          const vec bv = bias ? vloadn(bias + c0, cn) : VZERO();
          vec acc[KILN_DW_BX];
          for (int j = 0; j < KILN_DW_BX; ++j) acc[j] = bv;
          const int64_t ix0 = ox0 * sw - pw;
          if (nx == KILN_DW_BX && ix0 >= 0 && ix0 + (KILN_DW_BX - 1) * sw + kw <= w && cn >= LANES && xsc == 1) {
            // interior block, whole vectors: fixed trip counts and no bounds tests, so the BX accumulators
            // stay in registers and each tap is one weight load and BX load-FMAs (plus the producer's ReLU
            // on each load when it was moved here: the test is loop-invariant)
            for (int64_t dy = 0; dy < kh; ++dy) {
              const int64_t iy = oy * sh - ph + dy;
              if (iy < 0 || iy >= h) continue;
              const float* xr = xb + iy * xsh + ix0 * xsw + c0;
              for (int64_t dx = 0; dx < kw; ++dx) {
                const vec wv = VLOAD(wt + (dy * kw + dx) * c + c0);
                if (relu_in) {
#pragma GCC unroll 8
                  for (int j = 0; j < KILN_DW_BX; ++j)
                    acc[j] = VFMA(RELU(VLOAD(xr + (j * sw + dx) * xsw), relu_in_max), wv, acc[j]);
                } else {
#pragma GCC unroll 8
                  for (int j = 0; j < KILN_DW_BX; ++j) acc[j] = VFMA(VLOAD(xr + (j * sw + dx) * xsw), wv, acc[j]);
                }
              }
            }
          } else {
            for (int64_t dy = 0; dy < kh; ++dy) {
              const int64_t iy = oy * sh - ph + dy;
              if (iy < 0 || iy >= h) continue;
              for (int64_t dx = 0; dx < kw; ++dx) {
                const vec wv = vloadn(wt + (dy * kw + dx) * c + c0, cn);
                for (int j = 0; j < nx; ++j) {
                  const int64_t ix = (ox0 + j) * sw - pw + dx;
                  if (ix < 0 || ix >= w) continue;
                  vec v = vloads(xb + iy * xsh + ix * xsw + c0 * xsc, cn, xsc);
                  if (relu_in) v = RELU(v, relu_in_max);  // the producer's ReLU; max(0, NaN) is NaN, as torch.relu
                  acc[j] = VFMA(v, wv, acc[j]);
                }
              }
            }
          }
          for (int j = 0; j < nx; ++j) {
            const int64_t ox = ox0 + j;
            vec val = acc[j];
            if (r) val = VADD(val, vloads(r + b * rsn + oy * rsh + ox * rsw + c0 * rsc, cn, rsc));
            if (relu) val = RELU(val, relu_max);
            vstores(y + b * ysn + oy * ysh + ox * ysw + c0 * ysc, val, cn, ysc);
          }
        }
      }
    }
}
"""


@functools.lru_cache(maxsize=None)
def conv_dw_source() -> str:
    """The depthwise library: the ISA's vector definitions (from kiln's GEMM header) and the kernel.  (The GEMM
    header reads the AVX-512 tile rows, ``KILN_MR512``: without it the library did not build on AVX-512.)"""
    return f"#define KILN_MR512 {GemmSchedule().mr}\n" + GEMM_SOURCE + VECTOR_HELPERS + f"#define KILN_DW_BX {BX}\n" \
        + KERNEL
