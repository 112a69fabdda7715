// The kernel kiln generated for tests/fuzz/found/gather_index_from_comparison.py (kernel_1_gather), standalone.
// g++ 12.2 (Debian 12.2.0-14), AVX-512 (znver3/znver4 with -march=native; also -march=skylake-avx512):
//   g++ -O3 -march=native -std=c++17 THIS.cpp && ./a.out      prints "bad 24" (or another count: it varies)
// right with -O1, -fno-tree-vectorize or AVX2 alone (-mavx2 -mfma); -mtune-ctrl=use_gather... does not help.
// The vectorized loop extracts each lane's index from the comparison's 16-bit mask register as if its bits
// were bytes (kmovw %k0, %ebx; movsbq %bl, ...), so the indices are garbage.  kiln now wraps such an index in
// k_opaque_index (an empty asm; [Note: gather index from a comparison], kiln/codegen/cpp_expr.py).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
extern "C" __attribute__((noinline)) void kernel_1_gather(void** b) {
  const float* __restrict__ buf0 = (const float*)b[0];
  const float* __restrict__ buf3 = (const float*)b[3];
  int64_t* __restrict__ buf4 = (int64_t*)b[4];
  #pragma omp simd
  for (int64_t i0 = 0; i0 < 750; ++i0) {
    const float t0 = buf3[i0];
    const float t1 = buf0[i0];
    const bool t2 = (t0 >= t1);
    const int64_t t3 = static_cast<int64_t>(t2);
    const bool t4 = (t3 < INT64_C(0));
    const int64_t t5 = (t4 ? (t3 + INT64_C(750)) : t3);
    const float t6 = buf3[t5];
    const float t7 = buf0[t5];
    const bool t8 = (t6 >= t7);
    const int64_t t9 = static_cast<int64_t>(t8);
    buf4[i0] = t9;
  }
}
int main() {
  float a[750], c[750];
  int64_t out[750];
  srand(1);
  for (int i = 0; i < 750; ++i) { a[i] = rand() / (float)RAND_MAX; c[i] = rand() / (float)RAND_MAX; }
  a[0] = 0.1f; c[0] = 0.9f;
  a[1] = 0.2f; c[1] = 0.8f;
  void* b[5] = {a, 0, 0, c, out};
  kernel_1_gather(b);
  int bad = 0;
  for (int i = 0; i < 750; ++i) {
    int64_t v = c[i] >= a[i];
    if (out[i] != (c[v] >= a[v])) ++bad;
  }
  printf("bad %d\n", bad);
}
