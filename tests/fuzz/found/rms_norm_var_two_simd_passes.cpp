// The kernel kiln generates for tests/fuzz/found/rms_norm_var_two_simd_passes.py (kernel_1_sum_div), standalone.
// g++ 12.2 (Debian 12.2.0-14), AVX2 (znver3): wrong result with
//   g++ -O3 -march=native -fno-tree-vectorize -fopenmp -std=c++17 -fno-math-errno -fno-trapping-math THIS.cpp
// (prints 1.421636 instead of 1.004692); right at -O2, without -march=native, or with either '#pragma omp simd'
// removed or replaced by '#pragma GCC ivdep'.  Inside kiln's whole unit it is wrong at plain -O3 -march=native.
// valgrind reports no invalid read: a suspected GCC wrong-code bug (two omp simd lane loops that compute the
// same expression 1/sqrt(s[r/4]/4 + eps)).
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <random>
// kernel_1_sum_div: %12=sum %19=sum %21=div
static void kernel_1_sum_div(void** b) {
  const float* __restrict__ buf0 = (const float*)b[0];
  const float* __restrict__ buf1 = (const float*)b[1];
  float* __restrict__ buf2 = (float*)b[2];
  float acc0;
  {
    float acc0_l[16];
    for (int l = 0; l < 16; ++l) acc0_l[l] = 0.0f;
    int64_t r0 = 0;
    for (; r0 + 16 <= 84; r0 += 16) {
      #pragma omp simd
      for (int64_t l = 0; l < 16; ++l) {
        const int64_t r = r0 + l;
        const float t0 = buf0[r];
        const float t1 = buf1[((r) / 4)];
        const float t2 = (t1 / 4.0f);
        const float t3 = (t2 + 1e-05f);
        const float t4 = (float(1) / std::sqrt(t3));
        const float t5 = (t0 * t4);
        acc0_l[l] = (acc0_l[l] + t5);
      }
    }
    for (int64_t r = r0; r < 84; ++r) {
      const float t6 = buf0[r];
      const float t7 = buf1[((r) / 4)];
      const float t8 = (t7 / 4.0f);
      const float t9 = (t8 + 1e-05f);
      const float t10 = (float(1) / std::sqrt(t9));
      const float t11 = (t6 * t10);
      acc0_l[0] = (acc0_l[0] + t11);
    }
    acc0 = acc0_l[0];
    for (int l = 1; l < 16; ++l) acc0 = (acc0 + acc0_l[l]);
  }
  float acc1;
  {
    float acc1_l[16];
    for (int l = 0; l < 16; ++l) acc1_l[l] = 0.0f;
    int64_t r0 = 0;
    for (; r0 + 16 <= 84; r0 += 16) {
      #pragma omp simd
      for (int64_t l = 0; l < 16; ++l) {
        const int64_t r = r0 + l;
        const float t12 = buf0[r];
        const float t13 = buf1[((r) / 4)];
        const float t14 = (t13 / 4.0f);
        const float t15 = (t14 + 1e-05f);
        const float t16 = (float(1) / std::sqrt(t15));
        const float t17 = (t12 * t16);
        const float t18 = (acc0 / 84.0f);
        const float t19 = (t17 - t18);
        const float t20 = (t19 * t19);
        acc1_l[l] = (acc1_l[l] + t20);
      }
    }
    for (int64_t r = r0; r < 84; ++r) {
      const float t21 = buf0[r];
      const float t22 = buf1[((r) / 4)];
      const float t23 = (t22 / 4.0f);
      const float t24 = (t23 + 1e-05f);
      const float t25 = (float(1) / std::sqrt(t24));
      const float t26 = (t21 * t25);
      const float t27 = (acc0 / 84.0f);
      const float t28 = (t26 - t27);
      const float t29 = (t28 * t28);
      acc1_l[0] = (acc1_l[0] + t29);
    }
    acc1 = acc1_l[0];
    for (int l = 1; l < 16; ++l) acc1 = (acc1 + acc1_l[l]);
  }
  const float t30 = (acc1 / 83.0f);
  const float row2 = t30;
  buf2[0] = row2;
}

int main() {
  float in[84], b1[21], out[1];
  std::mt19937 g(1); std::normal_distribution<float> d;
  for (auto& x : in) x = d(g);
  for (int i = 0; i < 21; ++i) { b1[i] = 0; for (int j = 0; j < 4; ++j) b1[i] += in[4*i+j]*in[4*i+j]; }
  void* b[3] = {in, b1, out};
  kernel_1_sum_div(b);
  double vals[84], mean = 0; for (int r = 0; r < 84; ++r) { vals[r] = in[r] / std::sqrt(b1[r/4]/4 + 1e-5); mean += vals[r]; }
  mean /= 84; double v = 0; for (int r = 0; r < 84; ++r) v += (vals[r]-mean)*(vals[r]-mean);
  printf("kiln %f ref %f\n", out[0], v / 83);
}
