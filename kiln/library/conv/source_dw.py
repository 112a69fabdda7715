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
a weight load too).  For filter widths 3, 5 and 7 at strides 1 and 2 each filter row runs as a sliding window
(``dw_row``): the row's input vectors are loaded once each and multiplied into every output of the block they
reach; blocks at the padded edges copy their rows' windows into a zero-padded buffer first and run the same code.
Against one load per multiply-add (one thread, AVX-512, before -> after, oneDNN): ConvNeXt's 7x7 at 96 x 56x56
0.55 -> 0.43 ms (0.37), 384 x 14x14 0.25 -> 0.15 (0.12); MobileNet's 3x3 at 960 x 7x7 0.075 -> 0.057 (0.050)
(in ConvNeXt itself kiln's layers were faster than oneDNN's calls: see ``select.predict``).  The producer's ReLU
can be applied as the input is read, as in the other kiln convolutions (``library/conv/select.py``).  An input
whose channels are not contiguous (NCHW) is first copied into a zero-padded channels-last buffer.
"""
from __future__ import annotations

import functools

from kiln.library.gemm.source import ISA_HEADER, GemmSchedule
from kiln.library.conv.source_winograd import VECTOR_HELPERS

# output pixels per block along x: 8 with AVX-512 (32 vector registers: 8 accumulators, 7 weights of a 7-wide filter
# row and the input), 4 with AVX2 (16 registers)
BLOCK_PIXELS = """
#if defined(__AVX512F__)
#define KILN_DW_BX 8
#else
#define KILN_DW_BX 4
#endif
"""

KERNEL = r"""
// input vector I of a filter row, multiplied into every output it reaches: taps DX.. of output (I - DX) / SW
// (compile-time recursion: every index is a constant, so the accumulators stay in registers; GCC's unroll
// pragmas left the 14 x 7 loop of a 7x7 row rolled, the accumulators indexed in memory)
template <int I, int DX, int KW, int SW>
__attribute__((always_inline)) static inline void dw_taps(vec v, const vec (&wv)[KW], vec (&acc)[KILN_DW_BX]) {
  if constexpr (DX < KW) {
    constexpr int d = I - DX;
    if constexpr (d >= 0 && d % SW == 0 && d / SW < KILN_DW_BX) acc[d / SW] = VFMA(v, wv[DX], acc[d / SW]);
    dw_taps<I, DX + 1, KW, SW>(v, wv, acc);
  }
}

template <int I, int KW, int SW, bool RELU_IN>
__attribute__((always_inline)) static inline void dw_inputs(const float* __restrict xr, int64_t xsw,
                                                            const vec (&wv)[KW], vec (&acc)[KILN_DW_BX], vec hi) {
  if constexpr (I < (KILN_DW_BX - 1) * SW + KW) {
    vec v = VLOAD(xr + I * xsw);
    if (RELU_IN) v = VCLAMP0(v, hi);  // (the producer's ReLU: max(0, NaN) is NaN, as torch.relu)
    dw_taps<I, 0, KW, SW>(v, wv, acc);
    dw_inputs<I + 1, KW, SW, RELU_IN>(xr, xsw, wv, acc, hi);
  }
}

// One filter row of a block at compile-time width KW and stride SW: the block's (BX - 1) * SW + KW input vectors
// are each loaded once and multiplied into every output they reach (oneDNN's sliding window), against one load
// per multiply-add when each output pixel read its own window: a 7x7 row of 8 pixels is 21 loads for 56 FMAs
// instead of 63.  RELU_IN: the producer's ReLU on each input vector.
template <int KW, int SW, bool RELU_IN>
__attribute__((always_inline)) static inline void dw_row(const float* __restrict xr, int64_t xsw,
                                                         const float* __restrict wr, int64_t c,
                                                         vec (&acc)[KILN_DW_BX], float relu_in_max) {
  vec wv[KW];
  for (int dx = 0; dx < KW; ++dx) wv[dx] = VLOAD(wr + dx * c);
  dw_inputs<0, KW, SW, RELU_IN>(xr, xsw, wv, acc, VSET1(relu_in_max));
}

// every filter row of a block (dw_row), the rows outside the input skipped.  An interior block (all BX pixels'
// windows inside the input, whole channel-contiguous vectors) reads x and the weights in place; any other block
// - at the padded edges, the last of a row, a partial channel group, channels not contiguous - first copies each
// row's window into a zero-padded buffer of whole vectors (and the weights beside it), so it runs the same
// unrolled code: with 7x7 filters and padding 3, the first and last blocks of every row are edge blocks (all of
// them at 14x14), which a per-tap bounds test made 3x slower.
template <int KW, int SW, bool RELU_IN>
static inline void dw_block(const float* xb, int64_t h, int64_t w, int64_t xsc, int64_t xsh, int64_t xsw, int64_t iy0,
                            int64_t ix0, int64_t c0, int64_t cn, const float* wt, int64_t c, int64_t kh, bool interior,
                            vec* acc_io, float relu_in_max) {
  constexpr int SPAN = (KILN_DW_BX - 1) * SW + KW;
  vec acc[KILN_DW_BX];  // (a local array the unrolled rows keep in registers)
  for (int j = 0; j < KILN_DW_BX; ++j) acc[j] = acc_io[j];
  alignas(64) float win[SPAN * LANES];
  alignas(64) float wrow[KW * LANES];
  for (int64_t dy = 0; dy < kh; ++dy) {
    const int64_t iy = iy0 + dy;
    if (iy < 0 || iy >= h) continue;
    const float* xr = xb + iy * xsh + c0 * xsc;
    if (interior) {
      dw_row<KW, SW, RELU_IN>(xr + ix0 * xsw, xsw, wt + dy * KW * c + c0, c, acc, relu_in_max);
      continue;
    }
    for (int i = 0; i < SPAN; ++i) {
      const int64_t ix = ix0 + i;
      VSTORE(win + i * LANES, ix >= 0 && ix < w ? vloads(xr + ix * xsw, cn, xsc) : VZERO());
    }
    for (int dx = 0; dx < KW; ++dx) VSTORE(wrow + dx * LANES, vloadn(wt + (dy * KW + dx) * c + c0, cn));
    dw_row<KW, SW, RELU_IN>(win, LANES, wrow, LANES, acc, relu_in_max);
  }
  for (int j = 0; j < KILN_DW_BX; ++j) acc_io[j] = acc[j];
}

// the sliding-window kernels compiled for the common filter widths and strides (3, 5, 7; 1, 2); false elsewhere
static inline bool dw_block_fixed(int64_t kw, int64_t sw, int relu_in, const float* xb, int64_t h, int64_t w,
                                  int64_t xsc, int64_t xsh, int64_t xsw, int64_t iy0, int64_t ix0, int64_t c0,
                                  int64_t cn, const float* wt, int64_t c, int64_t kh, bool interior, vec* acc,
                                  float hi) {
#define KILN_DW_CASE(KW, SW)                                                                                   \
  if (kw == KW && sw == SW) {                                                                                   \
    if (relu_in) dw_block<KW, SW, true>(xb, h, w, xsc, xsh, xsw, iy0, ix0, c0, cn, wt, c, kh, interior, acc, hi);  \
    else dw_block<KW, SW, false>(xb, h, w, xsc, xsh, xsw, iy0, ix0, c0, cn, wt, c, kh, interior, acc, hi);         \
    return true;                                                                                                \
  }
  KILN_DW_CASE(3, 1) KILN_DW_CASE(3, 2) KILN_DW_CASE(5, 1) KILN_DW_CASE(5, 2) KILN_DW_CASE(7, 1) KILN_DW_CASE(7, 2)
#undef KILN_DW_CASE
  return false;
}

// x: [n][c][h][w] by strides; wt: [kh][kw][c]; r (optional residual) and y: [n][c][ho][wo] by strides
static void conv_dw(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t xsn, int64_t xsc,
                    int64_t xsh, int64_t xsw, const float* wt, const float* bias, const float* r, int64_t rsn,
                    int64_t rsc, int64_t rsh, int64_t rsw, float* y, int64_t ysn, int64_t ysc, int64_t ysh, int64_t ysw,
                    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho, int64_t wo,
                    int relu, float relu_max, int relu_in, float relu_in_max, int threads) {
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
          // (a last block of fewer pixels computes all BX where their windows lie in the input, and stores nx)
          const bool interior = ix0 >= 0 && ix0 + (KILN_DW_BX - 1) * sw + kw <= w && cn >= LANES && xsc == 1;
          if (dw_block_fixed(kw, sw, relu_in, xb, h, w, xsc, xsh, xsw, oy * sh - ph, ix0, c0, cn, wt, c, kh,
                             interior, acc, relu_in_max)) {
          } else if (interior) {
            // other filter widths: fixed trip counts and no bounds tests, so the BX accumulators stay in registers
            // and each tap is one weight load and BX load-FMAs (plus the producer's ReLU on each load when it was
            // moved here: the test is loop-invariant)
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


// An input whose channels are not contiguous (NCHW: a graph's input read directly) would put every block on the
// gathering path (a ConvNeXt 7x7 layer of 96 x 56x56: 1.47 ms against 0.35 channels-last): it is first copied
// into a zero-padded channels-last buffer, wide and tall enough for every block's window (the producer's ReLU
// applied as it is copied), after which every block of whole vectors is interior.
extern "C" void kiln_conv_dw(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t xsn, int64_t xsc,
                             int64_t xsh, int64_t xsw, const float* wt, const float* bias, const float* r,
                             int64_t rsn, int64_t rsc, int64_t rsh, int64_t rsw, float* y, int64_t ysn, int64_t ysc,
                             int64_t ysh, int64_t ysw, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                             int64_t pw, int64_t ho, int64_t wo, int relu, float relu_max, int relu_in,
                             float relu_in_max, int threads) {
  if (xsc == 1 || c < LANES || n * c * ho * wo == 0) {
    conv_dw(x, n, h, w, c, xsn, xsc, xsh, xsw, wt, bias, r, rsn, rsc, rsh, rsw, y, ysn, ysc, ysh, ysw, kh, kw, sh, sw,
            ph, pw, ho, wo, relu, relu_max, relu_in, relu_in_max, threads);
    return;
  }
  const int64_t blocks = (wo + KILN_DW_BX - 1) / KILN_DW_BX;
  const int64_t cols = (blocks * KILN_DW_BX - 1) * sw + kw, rows = (ho - 1) * sh + kh;  // read, from (-ph, -pw)
  const int64_t wb = cols > pw + w ? cols : pw + w, hb = rows > ph + h ? rows : ph + h;
  float* buf = (float*)std::calloc((size_t)(n * hb * wb * c), sizeof(float));
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t iy = 0; iy < h; ++iy)
      for (int64_t ci = 0; ci < c; ++ci) {  // (x's rows along W are contiguous in NCHW: read them in order)
        const float* src = x + b * xsn + ci * xsc + iy * xsh;
        float* dst = buf + ((b * hb + iy + ph) * wb + pw) * c + ci;
        for (int64_t ix = 0; ix < w; ++ix) dst[ix * c] = relu_in ? relu1(src[ix * xsw], relu_in_max) : src[ix * xsw];
      }
  conv_dw(buf, n, hb, wb, c, hb * wb * c, 1, wb * c, c, wt, bias, r, rsn, rsc, rsh, rsw, y, ysn, ysc, ysh, ysw, kh, kw,
          sh, sw, 0, 0, ho, wo, relu, relu_max, 0, relu_in_max, threads);
  std::free(buf);
}
"""


@functools.lru_cache(maxsize=None)
def conv_dw_source() -> str:
    """The depthwise library: the ISA's vector definitions (kiln's GEMM header without its kernels: the library
    built in 5.3 s with them) and the kernel.  (The header reads the AVX-512 tile rows, ``KILN_MR512``: without it
    the library did not build on AVX-512.)"""
    return f"#define KILN_MR512 {GemmSchedule().mr}\n" + ISA_HEADER + VECTOR_HELPERS + BLOCK_PIXELS + KERNEL
