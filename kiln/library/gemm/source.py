"""kiln's CPU GEMM: a register-blocked micro-kernel over packed operand panels (C++, generated per schedule).

``C[M, N] = A[M, K] @ B[K, N] (+ bias[N])`` in fp32, the loop nest of the BLIS family::

    for ic in M step MC:                      B is packed once (weights: at compile time, ``pack_b``) in
      for pc in K step KC:                      NR-wide panels, KC x NR floats per micro-panel
        pack A[ic:ic+MC, pc:pc+KC] -> MR-row panels, k-major (one broadcast per row per k)
        for jr in N step NR:   (threads)      the B micro-panel (KC x NR) stays in L1/L2 across the ir loop
          for ir in MC step MR:               the A block (MC x KC) stays in L2
            micro-kernel: MR x NR accumulators in vector registers, KC rank-1 updates, C += (or =) tile

The micro-kernel keeps ``MR x NR / lanes`` accumulators (AVX-512: 8 x 32 -> 16 zmm registers by default, up to
14 x 32, plus two for B and one broadcast of A); AVX2 machines get 6 x 16 (12 ymm).  The ISA is the compiling
machine's (``-march=native``; kiln compiles where it runs).  Edge tiles are computed whole into a scratch tile
(the packed panels are zero-padded) and only the valid part is written.  The tile rows are compiled in; ``KC``
and ``MC`` are arguments, chosen per shape by ``schedule_for``.
"""
from __future__ import annotations

import dataclasses

from kiln.codegen.cpp_prelude import PRELUDE, transpose_stages


@dataclasses.dataclass(frozen=True)
class GemmSchedule:
    mr: int = 8     # AVX-512 micro-tile rows (x 32 columns): 2 * MR accumulators of the 32 zmm registers
    kc: int = 1024  # depth of one rank-KC update (the B micro-panel, KC x NR floats, is read from L1/L2)
    mc: int = 192   # rows of A packed at once (a multiple of MR): MC x KC floats stay in L2

    def trace(self) -> dict[str, int]:
        return dataclasses.asdict(self)


L2_BLOCK = 768 * 1024  # bytes of packed A a block may take (of the core's 1 MiB L2)
KC_MAX = 1024


def schedule_for(m: int, k: int, n: int = 0) -> GemmSchedule:
    """K in equal blocks of at most ``KC_MAX`` (each block re-reads and re-writes C), A blocks of at most
    ``L2_BLOCK``, all of equal height.  8-row micro-tiles: with deep K blocks they ran as fast as 12 or 14 rows
    (Zen 5, one core: 2048^3 107 GFLOP/s; 64x1024x4096 104, where 14-row tiles made 90) and waste no rows on 64
    or 256.  Measured KC 192-1024 x MC 96-384: the deepest K blocks won on every suite shape.

    Equal A blocks: a last block of a few rows streams every B panel again for almost no work (DeiT's fc2, 197 x
    3072 -> 768, was one block of 192 rows and one of 5: 99 GFLOP/s against 103 for one of 200; 784 x 768 -> 192
    in 256 + 256 + 256 + 16 rows 96.5, in 4 x 200 97.2, on one AVX-512 core).  Where the weight (``n x k``) is
    larger than the L2, each extra A block reads it from memory once more, so an A block may overfill its share
    by up to 1/16 to save one."""
    mr = 8
    kc = -(-k // -(-k // KC_MAX)) if k > 0 else 1
    most = max(mr, L2_BLOCK // (4 * kc) // mr * mr)
    if 4 * n * k > 1024 * 1024:
        most += most // 16 // mr * mr
    return GemmSchedule(mr=mr, kc=kc, mc=equal_blocks(m, most, mr))


def equal_blocks(m: int, most: int, mr: int) -> int:
    """The height (a multiple of ``mr``) of the fewest equal blocks of ``m`` rows no taller than ``most``."""
    blocks = -(-m // most) if m > 0 else 1
    return max(mr, -(-(-(-m // blocks)) // mr) * mr)


_ISA = r"""
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <cstdlib>

#if defined(__AVX512F__)
#define KILN_MR KILN_MR512
#define KILN_NR 32
typedef __m512 vec;
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VZERO() _mm512_setzero_ps()
#define VCLAMP0(v, hi) _mm512_min_ps(hi, _mm512_max_ps(_mm512_setzero_ps(), v))
#define LANES 16
#elif defined(__AVX2__) && defined(__FMA__)
#define KILN_MR 6
#define KILN_NR 16
typedef __m256 vec;
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VSET1(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VZERO() _mm256_setzero_ps()
#define VCLAMP0(v, hi) _mm256_min_ps(hi, _mm256_max_ps(_mm256_setzero_ps(), v))
#define LANES 8
#else
#error "kiln's GEMM needs AVX2+FMA or AVX-512"
#endif
#define NV (KILN_NR / LANES)
"""

_BODY = r"""#ifndef KILN_B_PREFETCH
#define KILN_B_PREFETCH 1  // 0: no prefetch of the next B panel (benchmarks/cpu_gemm_variants.py)
#endif
#ifndef KILN_C_PREFETCH
#define KILN_C_PREFETCH 1  // 0: no prefetch of the C tile (benchmarks/cpu_gemm_variants.py)
#endif
#ifndef KILN_K_UNROLL
#define KILN_K_UNROLL 4  // the micro-kernel's k loop unroll factor (benchmarks/cpu_gemm_variants.py)
#endif
#define KILN_PRAGMA_TEXT(x) #x
#define KILN_UNROLL(n) _Pragma(KILN_PRAGMA_TEXT(GCC unroll n))

typedef float kv8f __attribute__((vector_size(32)));
// r[i] becomes column i of the 8 x 8 block whose row i it held
static inline void transpose8(kv8f* r) {
""" + transpose_stages(8, "kv8f") + r"""
}

extern "C" int kiln_gemm_mr() { return KILN_MR; }
extern "C" int kiln_gemm_nr() { return KILN_NR; }

// B[K, N] given by strides (a weight W[N, K] is B = W^T: sbk = 1, sbn = K) -> panels [ceil(N/NR)][K][NR]
extern "C" void kiln_pack_b(const float* b, int64_t k, int64_t n, int64_t sbk, int64_t sbn, float* out) {
  int64_t panels = (n + KILN_NR - 1) / KILN_NR;
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = out + p * k * KILN_NR;
    for (int64_t kk = 0; kk < k; ++kk)
      for (int j = 0; j < KILN_NR; ++j) {
        int64_t col = p * KILN_NR + j;
        dst[kk * KILN_NR + j] = col < n ? b[kk * sbk + col * sbn] : 0.0f;
      }
  }
}

// Rows [0, rows) of ``src`` (row r at src + r * lds, k contiguous), k in [0, kc) -> a k-major panel W floats wide:
// dst[k * W + r], rows [rows, W) zero.  Eight k of eight rows at a time are transposed in registers: the element
// loop's eight strided reads per k cost ~1.2 cycles an element, 15% of a 3136 x 384 -> 96 product (whose packed A
// serves only three column panels), 2-5% of most others.  GEMM A panels (W = MR), attention's K^T panels (W = NR)
// and the narrow-column path's A^T (W = 4 vectors) all pack this way.
template <int W>
static void pack_kmajor(const float* src, int64_t lds, int rows, int64_t kc, float* dst) {
  int64_t kk = 0;
  for (; kk + 8 <= kc; kk += 8)
    for (int g = 0; g < W; g += 8) {  // rows g..g+7 of the panel (beyond ``rows``: zeros)
      kv8f r[8];
      for (int i = 0; i < 8; ++i) {
        if (g + i < rows) std::memcpy(&r[i], src + (g + i) * lds + kk, sizeof(kv8f));
        else r[i] = kv8f{};
      }
      transpose8(r);
      for (int j = 0; j < 8; ++j) {  // k = kk + j: the panel's rows g.. (W - g of them when fewer than 8)
        if (g + 8 <= W) std::memcpy(dst + (kk + j) * W + g, &r[j], sizeof(kv8f));
        else std::memcpy(dst + (kk + j) * W + g, &r[j], sizeof(float) * (W % 8));
      }
    }
  for (; kk < kc; ++kk) {
    for (int r = 0; r < rows; ++r) dst[kk * W + r] = src[r * lds + kk];
    for (int r = rows; r < W; ++r) dst[kk * W + r] = 0.0f;
  }
}

// A[ic:ic+mc, pc:pc+kc] -> ceil(mc/MR) panels of kc x MR (k-major), zero-padded rows
static void pack_a(const float* a, int64_t lda, int64_t mc, int64_t kc, float* out) {
  for (int64_t i0 = 0; i0 < mc; i0 += KILN_MR)
    pack_kmajor<KILN_MR>(a + i0 * lda, lda, (int)(mc - i0 < KILN_MR ? mc - i0 : KILN_MR), kc, out + i0 * kc);
}

// one ROWS x NR tile (ROWS <= MR; A panels are packed MR rows wide): acc = sum_k A[:, k] B[k, :]; C (=|+=) acc
// (+ bias on the first K block).  ``next_b`` (or null): a B micro-panel to prefetch into L1, one line per k step.
// On Zen 3 this made the suite's GEMMs 3-5% faster (benchmarks/cpu_gemm.py's shapes, one core); an inner K split
// of the B panel instead was 2-5% slower.  An edge tile computes only its own rows (64 = 10 x 6 + 4).
// PACKED false: A is read in place, element (i, k) at ap[i * ars + k * aks] (each is one broadcast either way;
// attention's K and V^T need no packing).  CLAMP_A: each A element enters as min(a_hi, max(0, a)), NaN kept (a
// convolution's input ReLU, applied as the broadcast is made: its input is read in place, not packed).
template <bool PREFETCH, int ROWS, bool PACKED, bool CLAMP_A = false, int PW = KILN_NR>
static inline void micro_t(const float* __restrict ap, int64_t ars, int64_t aks, const float* __restrict bp, int64_t kc,
                           float* c, int64_t ldc, int nr, bool first, const float* bias, const float* next_b,
                           float a_hi = 0.0f) {
  constexpr int NVW = PW / LANES;  // vectors per tile row: PW (the B panel's width) columns
  const vec hi = VSET1(a_hi);
  vec acc[ROWS][NVW];
  for (int i = 0; i < ROWS; ++i)
    for (int v = 0; v < NVW; ++v) acc[i][v] = VZERO();
  if (KILN_C_PREFETCH)  // the tile's rows of C, read (a later K block) or written at the end: fetched now, so
    for (int i = 0; i < ROWS; ++i)  // the loads and stores after the k loop do not wait on L3 or memory
      for (int l = 0; l < PW; l += 16) {
        __builtin_prefetch(c + i * ldc + l, 1, 3);
        __builtin_prefetch(c + i * ldc + l + 15, 1, 3);  // (C rows need not start on a cache line)
      }
  // unrolled KILN_K_UNROLL (4) times: on Zen 3 (one core) the suite's GEMMs ran 5-12% faster than with one k step
  // per iteration, whose five loop-control ops per 12 FMAs competed with the loads for dispatch slots (8: no better)
  KILN_UNROLL(KILN_K_UNROLL)
  for (int64_t kk = 0; kk < kc; ++kk) {
    // one line of the B micro-panel the caller runs next, per k step, while this one computes
    if (PREFETCH)  // (a template argument: a run-time test here cost the loop 15%)
      for (int l = 0; l < PW; l += 16) _mm_prefetch((const char*)(next_b + kk * PW + l), _MM_HINT_T0);
    vec bv[NVW];
    for (int v = 0; v < NVW; ++v) bv[v] = VLOAD(bp + kk * PW + v * LANES);
#pragma GCC unroll 16
    for (int i = 0; i < ROWS; ++i) {
      vec av = VSET1(PACKED ? ap[kk * KILN_MR + i] : ap[i * ars + kk * aks]);
      if (CLAMP_A) av = VCLAMP0(av, hi);
      for (int v = 0; v < NVW; ++v) acc[i][v] = VFMA(av, bv[v], acc[i][v]);
    }
  }
  if (nr == PW) {
    for (int i = 0; i < ROWS; ++i)
      for (int v = 0; v < NVW; ++v) {
        float* p = c + i * ldc + v * LANES;
        vec x = acc[i][v];
        if (!first) x = VADD(x, VLOAD(p));
        else if (bias) x = VADD(x, VLOAD(bias + v * LANES));
        VSTORE(p, x);
      }
    return;
  }
  alignas(64) float tile[ROWS * PW];
  for (int i = 0; i < ROWS; ++i)
    for (int v = 0; v < NVW; ++v) VSTORE(tile + i * PW + v * LANES, acc[i][v]);
  for (int i = 0; i < ROWS; ++i)
    for (int j = 0; j < nr; ++j) {
      float x = tile[i * PW + j];
      c[i * ldc + j] = first ? x + (bias ? bias[j] : 0.0f) : c[i * ldc + j] + x;
    }
}

// micro_t<P, mr, PACKED, CLAMP_A, PW> for a run-time row count 1 <= mr <= MR
template <bool PREFETCH, int ROWS, bool PACKED, bool CLAMP_A = false, int PW = KILN_NR>
struct micro_rows {
  static inline void run(int mr, const float* __restrict ap, int64_t ars, int64_t aks, const float* __restrict bp,
                         int64_t kc, float* c, int64_t ldc, int nr, bool first, const float* bias,
                         const float* next_b, float a_hi = 0.0f) {
    if (mr == ROWS)
      micro_t<PREFETCH, ROWS, PACKED, CLAMP_A, PW>(ap, ars, aks, bp, kc, c, ldc, nr, first, bias, next_b, a_hi);
    else
      micro_rows<PREFETCH, ROWS - 1, PACKED, CLAMP_A, PW>::run(mr, ap, ars, aks, bp, kc, c, ldc, nr, first, bias,
                                                               next_b, a_hi);
  }
};
template <bool PREFETCH, bool PACKED, bool CLAMP_A, int PW>
struct micro_rows<PREFETCH, 0, PACKED, CLAMP_A, PW> {
  static inline void run(int, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int, bool,
                         const float*, const float*, float = 0.0f) {}
};

static inline void micro(const float* __restrict ap, const float* __restrict bp, int64_t kc, float* c, int64_t ldc,
                         int mr, int nr, bool first, const float* bias, const float* next_b = nullptr) {
  if (next_b) micro_rows<true, KILN_MR, true>::run(mr, ap, 0, 0, bp, kc, c, ldc, nr, first, bias, next_b);
  else micro_rows<false, KILN_MR, true>::run(mr, ap, 0, 0, bp, kc, c, ldc, nr, first, bias, nullptr);
}

// micro() with A read in place: element (i, k) at a[i * ars + k * aks]; B panels PW wide (default NR)
template <int PW = KILN_NR>
static inline void micro_strided(const float* __restrict a, int64_t ars, int64_t aks, const float* __restrict bp,
                                 int64_t kc, float* c, int64_t ldc, int mr, int nr, bool first) {
  micro_rows<false, KILN_MR, false, false, PW>::run(mr, a, ars, aks, bp, kc, c, ldc, nr, first, nullptr, nullptr);
}

// gelu(x) = x * Phi(x) on an mr x nr tile, in place: the function the kernel kiln generates for a graph's gelu
// calls (frontend/aten.py), so fusing it here changes no bit of the result
static inline float gelu1(float x) { return kiln_rt::k_gelu_erf(x); }

static void gelu_tile(float* c, int64_t ldc, int mr, int nr) {
  if (nr == KILN_NR) {  // whole rows: vector loops of compile-time length (no remainders), in place
    for (int i = 0; i < mr; ++i) {
      float* row = c + i * ldc;
#pragma omp simd
      for (int j = 0; j < KILN_NR; ++j) row[j] = gelu1(row[j]);
    }
    return;
  }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) c[i * ldc + j] = gelu1(c[i * ldc + j]);
}

// C[M, N] (row stride ldc) = A[M, K] (row stride lda, unit column stride) @ packed B (+ bias), then gelu when
// ``act`` is 1 (applied to each tile as its last K block leaves it, while the tile is in L1).
// Threads share each packed A block and split its NR-wide column panels (so a 64-row product, one block,
// still uses every thread); the implicit barriers of the two omp-for loops order packing and use.
extern "C" void kiln_gemm(const float* a, int64_t lda, const float* bpacked, const float* bias, float* c,
                          int64_t ldc, int64_t m, int64_t n, int64_t k, int64_t KC, int64_t MC, int act,
                          int threads) {
  float* ap = (float*)std::aligned_alloc(64, sizeof(float) * (MC + KILN_MR) * KC + 64);
  int64_t panels = (n + KILN_NR - 1) / KILN_NR;
#pragma omp parallel num_threads(threads)
  for (int64_t ic = 0; ic < m; ic += MC) {
    int64_t mc = m - ic < MC ? m - ic : MC;
    for (int64_t pc = 0; pc < k; pc += KC) {
      int64_t kc = k - pc < KC ? k - pc : KC;
#pragma omp for schedule(static)
      for (int64_t i0 = 0; i0 < mc; i0 += KILN_MR)
        pack_a(a + (ic + i0) * lda + pc, lda, mc - i0 < KILN_MR ? mc - i0 : KILN_MR, kc, ap + i0 * kc);
#pragma omp for schedule(static)
      for (int64_t p = 0; p < panels; ++p) {
        int64_t jr = p * KILN_NR;
        const float* bp = bpacked + p * k * KILN_NR + pc * KILN_NR;
        int nr = (int)(n - jr < KILN_NR ? n - jr : KILN_NR);
        // the first row tile also prefetches this thread's next B micro-panel, line by line, so that panel
        // arrives from memory during this one's compute instead of stalling the next tile's first loads
        const float* next_b = KILN_B_PREFETCH && p + 1 < panels ? bp + k * KILN_NR : nullptr;
        for (int64_t ir = 0; ir < mc; ir += KILN_MR) {
          int mr = (int)(mc - ir < KILN_MR ? mc - ir : KILN_MR);
          float* ct = c + (ic + ir) * ldc + jr;
          micro(ap + ir * kc, bp, kc, ct, ldc, mr, nr, pc == 0, bias ? bias + jr : nullptr, ir == 0 ? next_b : nullptr);
          if (act == 1 && pc + kc >= k) gelu_tile(ct, ldc, mr, nr);
        }
      }
    }
  }
  std::free(ap);
}

// Columns [0, nr) of one batch's C when they are few (the last column panel of N = 69 keys: 5 of 32): the vector
// runs along M instead - A^T packed 4 vectors of rows wide per k, each column one broadcast of B per k - so those
// columns cost nr x 4 FMAs per k, not the full panel's 2 x MR per row tile.  ``at``, ``bt``, ``ct``, ``dt``: the
// batch's A, and B, C, D at the panel's first column; ``scratch``: k x 4 * LANES floats.
static void bmm_columns(const float* at, int64_t sam, int64_t sak, const float* bt, int64_t sbk, int64_t sbn,
                        const float* dt, int64_t sdm, int64_t sdn, float* ct, int64_t scm, int64_t m, int nr,
                        int64_t k, float* scratch) {
  const int CB = 4 * LANES;
  alignas(64) float col[4 * LANES];
  for (int64_t i0 = 0; i0 < m; i0 += CB) {
    int rows = (int)(m - i0 < CB ? m - i0 : CB);
    if (sak == 1) {  // rows of A contiguous along k (attention's Q): transposed 8 x 8 in registers
      pack_kmajor<4 * LANES>(at + i0 * sam, sam, rows, k, scratch);
    } else {
      for (int64_t kk = 0; kk < k; ++kk) {
        const float* src = at + i0 * sam + kk * sak;
        float* dst = scratch + kk * CB;
        for (int i = 0; i < rows; ++i) dst[i] = src[i * sam];
        for (int i = rows; i < CB; ++i) dst[i] = 0.0f;
      }
    }
    for (int j = 0; j < nr; ++j) {
      vec acc[4] = {VZERO(), VZERO(), VZERO(), VZERO()};
      const float* bj = bt + j * sbn;
      for (int64_t kk = 0; kk < k; ++kk) {
        vec bv = VSET1(bj[kk * sbk]);
        const float* ap = scratch + kk * CB;
        for (int v = 0; v < 4; ++v) acc[v] = VFMA(VLOAD(ap + v * LANES), bv, acc[v]);
      }
      for (int v = 0; v < 4; ++v) VSTORE(col + v * LANES, acc[v]);
      for (int i = 0; i < rows; ++i)
        ct[(i0 + i) * scm + j] = dt ? col[i] + dt[(i0 + i) * sdm + j * sdn] : col[i];
    }
  }
}

// Batched products of two run-time operands (attention's scores and weighted values, ``torch.bmm``):
// C[t] = A[t] @ B[t] (+ D[t]) for t < batch.  Element (i, k) of A[t] at a[t*sab + i*sam + k*sak], (k, j) of B[t]
// at b[t*sbb + k*sbk + j*sbn], (i, j) of C[t] at c[t*scb + i*scm + j] and of D[t] (or null) at
// d[t*sdb + i*sdm + j*sdn] (a mask or bias, broadcast by zero strides).  A is read in place, one broadcast per
// row per k as from a packed panel, so neither Q nor a transposed K is copied; each (t, NR-wide column panel) work
// item packs its KC x NR slices of B into the thread's scratch and runs the row tiles over it, except a last panel
// of at most NR / 2 columns, which ``bmm_columns`` computes.  Threads split the work items, so one batch of a few
// heads still spreads.
extern "C" void kiln_bmm(const float* a, int64_t sab, int64_t sam, int64_t sak, const float* b, int64_t sbb,
                         int64_t sbk, int64_t sbn, const float* d, int64_t sdb, int64_t sdm, int64_t sdn, float* c,
                         int64_t scb, int64_t scm, int64_t batch, int64_t m, int64_t n, int64_t k, int threads) {
  const int64_t KCB = 512;  // the B slice (KCB x NR floats, 64 KiB) stays in L2 across the row tiles
  int64_t panels = (n + KILN_NR - 1) / KILN_NR;
  int64_t kcmax = k < KCB ? k : KCB;
  int last = (int)(n - (panels - 1) * KILN_NR);  // columns of the last panel
  bool narrow = last <= KILN_NR / 2;
#pragma omp parallel num_threads(threads)
  {
    float* bp = (float*)std::aligned_alloc(64, sizeof(float) * kcmax * KILN_NR + 64);
    float* ap = narrow ? (float*)std::aligned_alloc(64, sizeof(float) * k * 4 * LANES + 64) : nullptr;
#pragma omp for schedule(static)
    for (int64_t w = 0; w < batch * panels; ++w) {
      int64_t t = w / panels, jr = (w % panels) * KILN_NR;
      int nr = (int)(n - jr < KILN_NR ? n - jr : KILN_NR);
      const float* at = a + t * sab;
      const float* bt = b + t * sbb + jr * sbn;
      float* ct = c + t * scb + jr;
      const float* dt = d ? d + t * sdb + jr * sdn : nullptr;
      if (narrow && nr == last) {
        bmm_columns(at, sam, sak, bt, sbk, sbn, dt, sdm, sdn, ct, scm, m, nr, k, ap);
        continue;
      }
      for (int64_t pc = 0; pc < k; pc += KCB) {
        int64_t kc = k - pc < KCB ? k - pc : KCB;
        if (sbk == 1 && sbn != 1) {  // B = K^T: each column is a contiguous row of K, read along k
          pack_kmajor<KILN_NR>(bt + pc, sbn, nr, kc, bp);
        } else {
          for (int64_t kk = 0; kk < kc; ++kk) {
            const float* src = bt + (pc + kk) * sbk;
            float* dst = bp + kk * KILN_NR;
            if (sbn == 1 && nr == KILN_NR) std::memcpy(dst, src, sizeof(float) * KILN_NR);
            else for (int j = 0; j < KILN_NR; ++j) dst[j] = j < nr ? src[j * sbn] : 0.0f;
          }
        }
        for (int64_t ir = 0; ir < m; ir += KILN_MR) {
          int mr = (int)(m - ir < KILN_MR ? m - ir : KILN_MR);
          micro_strided(at + ir * sam + pc * sak, sam, sak, bp, kc, ct + ir * scm, scm, mr, nr, pc == 0);
        }
      }
      if (dt)  // (a mask or bias row is usually contiguous: then a vector loop)
        for (int64_t i = 0; i < m; ++i) {
          float* cr = ct + i * scm;
          const float* dr = dt + i * sdm;
          if (sdn == 1) {
#pragma omp simd
            for (int j = 0; j < nr; ++j) cr[j] += dr[j];
          } else {
            for (int j = 0; j < nr; ++j) cr[j] += dr[j * sdn];
          }
        }
    }
    std::free(bp);
    std::free(ap);
  }
}
"""

# the math prelude first: the gelu epilogue evaluates kiln_rt::k_gelu_erf, as generated kernels do
SOURCE = PRELUDE + _ISA + _BODY

#: the prelude and the ISA's vector definitions alone (vec, VLOAD, VFMA, LANES, KILN_NR, ...): what a library that
#: does not call the GEMM needs (the depthwise convolution: 5.3 s of g++ with the GEMM's kernels, 3.1 without)
ISA_HEADER = PRELUDE + _ISA


def gemm_source(schedule: GemmSchedule) -> str:
    """The library for this schedule's compile-time part (the tile rows); KC and MC are arguments."""
    return f"#define KILN_MR512 {schedule.mr}\n" + SOURCE
