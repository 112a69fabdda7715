"""kiln's CPU convolution as an implicit GEMM (C++): any filter size, stride and padding, groups 1.

Output pixels are GEMM rows and output channels its columns; the reduction runs over the filter taps and input
channels, ordered (dy, dx, c) so that one tap's channels are contiguous in a channels-last input::

    C[g = (b, oy, ox)][k] = sum_{dy, dx, c} x[b, c, oy*sh - ph + dy, ox*sw - pw + dx] * W[k, c, dy, dx]

    for block of MB output pixels:
      for pc in Kg step KC:                  Kg = kh * kw * C
        pack A: the block's rows of the implicit im2col matrix, columns pc..pc+KC, in MR-row panels,
                read straight from x (zeros where the window leaves the image; the producer's ReLU applied
                here when asked) - im2col is never materialized
        for each NR-wide panel of the packed weight (packed at compile time, ``kiln_pack_b``):
          for each MR-row tile: kiln's GEMM micro-kernel (``library/gemm/source.py``), into the block's C (ldc = K)
      epilogue: + residual, ReLU (max(0, x) keeping NaN), written to y by strides (channels-last: vector
                stores; NCHW: scatters); the bias comes in with the first K block

Packing costs one pass over the block's window per output block, against 2 * K flops per packed value; it
matters for few output channels (the 64-channel stem) and not for ResNet's deeper layers.

A 1x1 stride-1 unpadded convolution whose input pixels lie at one stride (channels-last, or one NCHW image) is a
plain GEMM of the input itself: the micro-kernel reads it in place (an input ReLU applied to each broadcast), a
dense channels-last output is C itself, and the epilogue runs on each tile as its last K block leaves it.  On
MobileNet-V2's 1x1 layers (one thread, AVX-512) against packing them: 16 -> 96 at 112x112 0.93 -> 0.55 ms,
32 -> 16 0.80 -> 0.35, 192 -> 32 at 28x28 0.20 -> 0.13 (oneDNN: 0.49, 0.21, 0.13); the model 15.1 -> 11.1 ms.

For few input channels (a network's first layer, 3 channels) ``kiln_conv_direct`` skips the packing: blocks of
``DIRECT_PIXELS`` output pixels x one NR-wide panel of output channels accumulate in registers, each tap one row
of the same packed weight and a broadcast input value per pixel (ResNet's 7x7 stem on the AVX2 box: 1.1x
oneDNN's time, against 1.6x packed).
"""
from __future__ import annotations

import functools

from kiln.library.gemm.source import SOURCE as GEMM_SOURCE
from kiln.library.conv.source_winograd import VECTOR_HELPERS

DIRECT_PIXELS = 6  # output pixels per register block of kiln_conv_direct (x NR output channels)
DIRECT_MAX_CHANNELS = 8  # input channels up to which the pack-free kernel is a candidate

KERNEL = r"""
#define WHOLE_B_FLOATS (48 * 1024)  // a K block of all panels up to this size: tile by tile (192 KiB)

// the output pixel after (b, oy, ox) in (n, ho, wo) order
static inline void next_pixel(int64_t& b, int64_t& oy, int64_t& ox, int64_t ho, int64_t wo) {
  if (++ox == wo) {
    ox = 0;
    if (++oy == ho) {
      oy = 0;
      ++b;
    }
  }
}

// the micro-kernel on A read in place (element (i, k) at a[i * ars + k * aks]), prefetching next_b when given;
// relu_in: A's elements clamped to [0, relu_in_max] (NaN kept) as they are broadcast
static inline void micro_in_place(const float* a, int64_t ars, int64_t aks, const float* bp, int64_t kc, float* c,
                                  int64_t ldc, int mr, int nr, bool first, const float* bias, const float* next_b,
                                  int relu_in, float relu_in_max) {
  if (relu_in) {
    if (next_b)
      micro_rows<true, KILN_MR, false, true>::run(mr, a, ars, aks, bp, kc, c, ldc, nr, first, bias, next_b,
                                                  relu_in_max);
    else
      micro_rows<false, KILN_MR, false, true>::run(mr, a, ars, aks, bp, kc, c, ldc, nr, first, bias, nullptr,
                                                   relu_in_max);
  } else if (next_b) {
    micro_rows<true, KILN_MR, false>::run(mr, a, ars, aks, bp, kc, c, ldc, nr, first, bias, next_b);
  } else {
    micro_rows<false, KILN_MR, false>::run(mr, a, ars, aks, bp, kc, c, ldc, nr, first, bias, nullptr);
  }
}

// one output pixel's epilogue: nc channels of C at co (unit stride) + the residual at ro (stride rsc, or null),
// ReLU clamped at relu_max when relu, stored at yo with channel stride ysc (co may be yo: in place)
static inline void epilogue_pixel(const float* co, const float* ro, int64_t rsc, float* yo, int64_t ysc, int64_t nc,
                                  int relu, float relu_max) {
  for (int64_t k0 = 0; k0 < nc; k0 += LANES) {
    const int64_t kn = nc - k0;
    vec val = vloadn(co + k0, kn);
    if (ro) val = VADD(val, vloads(ro + k0 * rsc, kn, rsc));
    if (relu) val = RELU(val, relu_max);
    vstores(yo + k0 * ysc, val, kn, ysc);
  }
}

// the epilogue (+ residual r by strides, ReLU clamped at relu_max) in place on rows g .. g+mr, channels
// j0 .. j0+nc of y, whose pixels lie at stride ysw with unit channel stride: applied to a tile as its last K block
// leaves it, while it is in L1 (as a pass over the block's output it cost MobileNet's 16 -> 96 expansion 40%)
static inline void tile_epilogue(float* y, int64_t ysw, const float* r, int64_t rsn, int64_t rsc, int64_t rsh,
                                 int64_t rsw, int64_t ho, int64_t wo, int64_t g, int mr, int64_t j0, int64_t nc,
                                 int relu, float relu_max) {
  int64_t b = 0, oy = 0, ox = 0;
  if (r) b = g / (ho * wo), oy = (g / wo) % ho, ox = g % wo;
  for (int i = 0; i < mr; ++i) {
    float* yo = y + (g + i) * ysw + j0;
    epilogue_pixel(yo, r ? r + b * rsn + oy * rsh + ox * rsw + j0 * rsc : nullptr, rsc, yo, 1, nc, relu, relu_max);
    if (r) next_pixel(b, oy, ox, ho, wo);
  }
}

// rows g0 .. g0+rows of the implicit im2col matrix, columns pc .. pc+kc, into MR-row panels (k-major)
static void pack_conv(const float* x, int64_t h, int64_t w, int64_t c, int64_t xsn, int64_t xsc, int64_t xsh,
                      int64_t xsw, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                      int64_t wo, int relu_in, float relu_in_max, int64_t g0, int64_t rows, int64_t pc, int64_t kc,
                      float* out) {
  for (int64_t i0 = 0; i0 < rows; i0 += KILN_MR) {
    float* panel = out + i0 * kc;
    const int64_t g = g0 + i0;  // the panel's first row; the others advance (ox, oy, b) without divisions
    int64_t b = g / (ho * wo), oy = (g / wo) % ho, ox = g % wo;
    for (int r = 0; r < KILN_MR; ++r, next_pixel(b, oy, ox, ho, wo)) {
      float* d = panel + r;
      if (i0 + r >= rows) {  // zero rows pad the last panel
        for (int64_t kk = 0; kk < kc; ++kk) d[kk * KILN_MR] = 0.0f;
        continue;
      }
      int64_t tap = pc / c, ci = pc % c;
      for (int64_t kk = 0; kk < kc; ++tap, ci = 0) {
        const int64_t run = c - ci < kc - kk ? c - ci : kc - kk;
        const int64_t iy = oy * sh - ph + tap / kw, ix = ox * sw - pw + tap % kw;
        float* dk = d + kk * KILN_MR;
        if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
          for (int64_t j = 0; j < run; ++j) dk[j * KILN_MR] = 0.0f;
        } else {
          const float* s = x + b * xsn + iy * xsh + ix * xsw + ci * xsc;
          if (relu_in)  // the producer's ReLU (clamped at relu_in_max), NaN kept as torch.relu
            for (int64_t j = 0; j < run; ++j) dk[j * KILN_MR] = relu1(s[j * xsc], relu_in_max);
          else
            for (int64_t j = 0; j < run; ++j) dk[j * KILN_MR] = s[j * xsc];
        }
        kk += run;
      }
    }
  }
}

// x: [n][c][h][w] by strides.  wp: the [kh*kw*c x k] weight packed by kiln_pack_b.  y and the optional residual
// r: [n][k][ho][wo] by strides.  mb output pixels per block, kc-deep K blocks.
extern "C" void kiln_conv_gemm(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t xsn,
                               int64_t xsc, int64_t xsh, int64_t xsw, const float* wp, const float* bias,
                               const float* r, int64_t rsn, int64_t rsc, int64_t rsh, int64_t rsw, float* y,
                               int64_t ysn, int64_t ysc, int64_t ysh, int64_t ysw, int64_t k, int64_t kh,
                               int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho, int64_t wo,
                               int relu, float relu_max, int relu_in, float relu_in_max, int64_t mb,
                               int64_t KC, int threads) {
  const int64_t rows = n * ho * wo, kg = kh * kw * c;
  const int64_t panels = (k + KILN_NR - 1) / KILN_NR;
  // A 1x1 stride-1 unpadded convolution whose input pixels lie at one stride is a GEMM of x itself: row g is pixel
  // g, read in place by the micro-kernel (no packing: with 16-32 input channels packing cost as much as the
  // products, MobileNet's expansions).  A channels-last output whose pixels lie at one stride is then C itself.
  const bool in_place = kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && xsh == w * xsw &&
                        (n == 1 || xsn == h * xsh);
  const bool c_is_y = in_place && ysc == 1 && ysh == wo * ysw && (n == 1 || ysn == ho * ysh);
  // the epilogue tile by tile where C is y, else as a pass over each block's C
  const bool tile_last = c_is_y && (r || relu), epilogue = !c_is_y;
  float* ap = in_place ? nullptr
                       : (float*)std::aligned_alloc(64, sizeof(float) * ((mb + KILN_MR) * (KC < kg ? KC : kg) + 16));
  float* cb = c_is_y ? nullptr : (float*)std::aligned_alloc(64, sizeof(float) * (mb * k + 16));
  // Threads share each block (its packed A and its C) and split the packing by row panels, the GEMM by column
  // panels and the epilogue by rows, as kiln_gemm does: a 7x7 layer (49 rows, one block) still uses them all.
#pragma omp parallel num_threads(threads)
  for (int64_t g0 = 0; g0 < rows; g0 += mb) {
    const int64_t nt = rows - g0 < mb ? rows - g0 : mb;
    float* cblock = c_is_y ? y + g0 * ysw : cb;
    const int64_t ldc = c_is_y ? ysw : k;
    for (int64_t pc = 0; pc < kg; pc += KC) {
      const int64_t kc = kg - pc < KC ? kg - pc : KC;
      if (!in_place) {
#pragma omp for schedule(static)
        for (int64_t i0 = 0; i0 < nt; i0 += KILN_MR)
          pack_conv(x, h, w, c, xsn, xsc, xsh, xsw, kw, sh, sw, ph, pw, ho, wo, relu_in, relu_in_max, g0 + i0,
                    nt - i0 < KILN_MR ? nt - i0 : KILN_MR, pc, kc, ap + i0 * kc);
      }
      if (in_place && kc * panels * KILN_NR <= WHOLE_B_FLOATS) {
        // the K block of every panel fits in L2: each tile's rows are read once and written whole (8 rows of a
        // dense output: one contiguous run) - MobileNet's 16 -> 96 expansion at 112x112: 1.6x faster than panel
        // by panel, which wrote each output row in NR-wide strips
#pragma omp for schedule(static)
        for (int64_t ir = 0; ir < nt; ir += KILN_MR) {
          const int mr = (int)(nt - ir < KILN_MR ? nt - ir : KILN_MR);
          for (int64_t q = 0; q < panels; ++q) {
            const int64_t jr = q * KILN_NR;
            micro_in_place(x + (g0 + ir) * xsw + pc * xsc, xsw, xsc, wp + q * kg * KILN_NR + pc * KILN_NR, kc,
                           cblock + ir * ldc + jr, ldc, mr, (int)(k - jr < KILN_NR ? k - jr : KILN_NR), pc == 0,
                           bias ? bias + jr : nullptr, nullptr, relu_in, relu_in_max);
          }
          if (tile_last && pc + kc == kg)
            tile_epilogue(y, ysw, r, rsn, rsc, rsh, rsw, ho, wo, g0 + ir, mr, 0, k, relu, relu_max);
        }
        continue;
      }
#pragma omp for schedule(static)
      for (int64_t q = 0; q < panels; ++q) {
        const int64_t jr = q * KILN_NR;
        const int nr = (int)(k - jr < KILN_NR ? k - jr : KILN_NR);
        const float* bp = wp + q * kg * KILN_NR + pc * KILN_NR;
        const float* next_b = q + 1 < panels ? bp + kg * KILN_NR : nullptr;
        for (int64_t ir = 0; ir < nt; ir += KILN_MR) {
          const int mr = (int)(nt - ir < KILN_MR ? nt - ir : KILN_MR);
          const float* bias_q = bias ? bias + jr : nullptr;
          if (in_place) {
            micro_in_place(x + (g0 + ir) * xsw + pc * xsc, xsw, xsc, bp, kc, cblock + ir * ldc + jr, ldc, mr, nr,
                           pc == 0, bias_q, ir == 0 ? next_b : nullptr, relu_in, relu_in_max);
            if (tile_last && pc + kc == kg)
              tile_epilogue(y, ysw, r, rsn, rsc, rsh, rsw, ho, wo, g0 + ir, mr, jr, nr, relu, relu_max);
          } else
            micro(ap + ir * kc, bp, kc, cblock + ir * ldc + jr, ldc, mr, nr, pc == 0, bias_q,
                  ir == 0 ? next_b : nullptr);
        }
      }
    }
    if (!epilogue) continue;  // (the omp for above ended with a barrier: the block is written)
#pragma omp for schedule(static)
    for (int64_t t0 = 0; t0 < nt; t0 += KILN_MR) {  // epilogue: residual, ReLU, the output's layout
      const int64_t g = g0 + t0;
      int64_t b = g / (ho * wo), oy = (g / wo) % ho, ox = g % wo;
      for (int64_t t = t0; t < nt && t < t0 + KILN_MR; ++t, next_pixel(b, oy, ox, ho, wo)) {
        epilogue_pixel(cb + t * k, r ? r + b * rsn + oy * rsh + ox * rsw : nullptr, rsc,
                       y + b * ysn + oy * ysh + ox * ysw, ysc, k, relu, relu_max);
      }
    }
  }
  std::free(ap);
  std::free(cb);
}

// The same convolution without packing, for few input channels (a network's first layer: 3 channels, where
// packing the im2col rows cost more than the products).  Per row of outputs, blocks of KILN_PB pixels x one
// NR-wide panel of output channels accumulate in registers; each filter tap is NV weight vectors (the packed
// weight's row) and KILN_PB broadcasts of input values read straight from x.  x is unpadded and every block's
// window, KILN_PB whole pixels, lies in it (kiln_conv_direct pads a copy to make it so): no tests in the taps.
static void conv_direct(const float* x, int64_t n, int64_t c, int64_t xsn, int64_t xsc, int64_t xsh, int64_t xsw,
                        const float* wp, const float* bias, const float* r, int64_t rsn, int64_t rsc, int64_t rsh,
                        int64_t rsw, float* y, int64_t ysn, int64_t ysc, int64_t ysh, int64_t ysw, int64_t k,
                        int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ho, int64_t wo, int relu,
                        float relu_max, int threads) {
  const int64_t kg = kh * kw * c, panels = (k + KILN_NR - 1) / KILN_NR;
  // the input offset of every tap (dy, dx, ci), in the packed weight's row order: the taps run as one flat loop,
  // without the short dx and ci loops (the stem has 3 channels).  ResNet's 7x7/2 stem: 8% faster than the nested
  // loops (unrolling the flat loop 3x: slower)
  int64_t* tap = (int64_t*)std::malloc(sizeof(int64_t) * (kg > 0 ? kg : 1));
  for (int64_t dy = 0, t = 0; dy < kh; ++dy)
    for (int64_t dx = 0; dx < kw; ++dx)
      for (int64_t ci = 0; ci < c; ++ci) tap[t++] = dy * xsh + dx * xsw + ci * xsc;
  const int64_t pstride = sw * xsw;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oy = 0; oy < ho; ++oy) {
      for (int64_t ox0 = 0; ox0 < wo; ox0 += KILN_PB) {
        // (a last block of fewer pixels computes all KILN_PB, their windows in the padded image, and stores np)
        const int np = (int)(wo - ox0 < KILN_PB ? wo - ox0 : KILN_PB);
        const float* xo = x + b * xsn + oy * sh * xsh + ox0 * sw * xsw;
        for (int64_t q = 0; q < panels; ++q) {
          const float* bp = wp + q * kg * KILN_NR;
          const int64_t k0 = q * KILN_NR;
          vec acc[KILN_PB][NV];
          for (int v = 0; v < NV; ++v) {
            const int64_t kn = k - k0 - v * LANES;
            const vec bv = bias && kn > 0 ? vloadn(bias + k0 + v * LANES, kn) : VZERO();
            for (int p = 0; p < KILN_PB; ++p) acc[p][v] = bv;
          }
          for (int64_t t = 0; t < kg; ++t) {
            vec wv[NV];
            for (int v = 0; v < NV; ++v) wv[v] = VLOAD(bp + t * KILN_NR + v * LANES);
            const float* xt = xo + tap[t];
#pragma GCC unroll 8
            for (int p = 0; p < KILN_PB; ++p) {
              const vec xs = VSET1(xt[p * pstride]);
#pragma GCC unroll 4
              for (int v = 0; v < NV; ++v) acc[p][v] = VFMA(xs, wv[v], acc[p][v]);
            }
          }
          for (int p = 0; p < np; ++p) {
            const int64_t ox = ox0 + p;
            float* yo = y + b * ysn + oy * ysh + ox * ysw;
            const float* ro = r ? r + b * rsn + oy * rsh + ox * rsw : nullptr;
            for (int v = 0; v < NV; ++v) {
              const int64_t kk = k0 + v * LANES, kn = k - kk;
              if (kn <= 0) break;
              vec val = acc[p][v];
              if (ro) val = VADD(val, vloads(ro + kk * rsc, kn, rsc));
              if (relu) val = RELU(val, relu_max);
              vstores(yo + kk * ysc, val, kn, ysc);
            }
          }
        }
      }
    }
  std::free(tap);
}

// Padding, an input ReLU, or a last block reaching past the right edge would need tests in the tap loop (the
// stem: 13% of its blocks went down such a path, whose per-tap tests made them several times slower).  So the
// input is then first copied into a zero-padded NCHW buffer wide enough for every block's window, the ReLU applied
// as it is copied (a few channels: small): on Zen 3 the stem 6% faster, 8 channels at 56x56 14%.
extern "C" void kiln_conv_direct(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t xsn,
                                 int64_t xsc, int64_t xsh, int64_t xsw, const float* wp, const float* bias,
                                 const float* r, int64_t rsn, int64_t rsc, int64_t rsh, int64_t rsw, float* y,
                                 int64_t ysn, int64_t ysc, int64_t ysh, int64_t ysw, int64_t k, int64_t kh,
                                 int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho, int64_t wo,
                                 int relu, float relu_max, int relu_in, float relu_in_max,
                                 int threads) {
  const int64_t span = ((wo + KILN_PB - 1) / KILN_PB * KILN_PB - 1) * sw + kw;  // columns the last block reads
  if (ph == 0 && pw == 0 && !relu_in && span <= w) {
    conv_direct(x, n, c, xsn, xsc, xsh, xsw, wp, bias, r, rsn, rsc, rsh, rsw, y, ysn, ysc, ysh, ysw, k, kh, kw, sh,
                sw, ho, wo, relu, relu_max, threads);
    return;
  }
  // rows and columns the output reads: more than 2 * padding past the input where the bottom/right padding is
  // larger than the top/left one (a four-sided padding); the zeros of calloc stand for it
  const int64_t rows_read = (ho - 1) * sh + kh;
  const int64_t hp = h + 2 * ph > rows_read ? h + 2 * ph : rows_read, wpad = w + 2 * pw > span ? w + 2 * pw : span;
  float* xp = (float*)std::calloc((size_t)(n * c * hp * wpad), sizeof(float));
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t iy = 0; iy < h; ++iy) {
        const float* src = x + b * xsn + ci * xsc + iy * xsh;
        float* dst = xp + ((b * c + ci) * hp + iy + ph) * wpad + pw;
        for (int64_t ix = 0; ix < w; ++ix) {
          const float v = src[ix * xsw];
          dst[ix] = relu_in ? relu1(v, relu_in_max) : v;  // max(0, v) keeping NaN (clamped at relu_in_max)
        }
      }
  conv_direct(xp, n, c, c * hp * wpad, hp * wpad, wpad, 1, wp, bias, r, rsn, rsc, rsh, rsw, y, ysn, ysc, ysh, ysw,
              k, kh, kw, sh, sw, ho, wo, relu, relu_max, threads);
  std::free(xp);
}
"""


@functools.lru_cache(maxsize=None)
def conv_gemm_source(mr: int = 8) -> str:
    """The library: kiln's GEMM (micro-kernel, B packing; ``mr``-row tiles on AVX-512) and the convolution."""
    return f"#define KILN_MR512 {mr}\n#define KILN_PB {DIRECT_PIXELS}\n" + GEMM_SOURCE + VECTOR_HELPERS + KERNEL
