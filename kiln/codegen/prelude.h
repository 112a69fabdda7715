// kiln's C++ runtime prelude: the float math every generated translation unit includes (pasted at its top by
// kiln/codegen/cpp_prelude.py, which documents the accuracy of each function and appends the generated
// in-register transposes).  Bump PRELUDE_VERSION there when this file changes (it is part of the build keys).
#include <cstdint>
#include <cmath>
#include <cstring>
#include <omp.h>

#if defined(__GNUC__)
#define KILN_INLINE static inline __attribute__((always_inline))
#else
#define KILN_INLINE static inline
#endif

namespace kiln_rt {
namespace kdetail {

// Horner's rule, highest coefficient first: poly(x, c_n, ..., c_1, c_0) = ((c_n x + c_{n-1}) x + ...) x + c_0,
// the same operations in the same order as writing the chain out (one polynomial per function below).
template <class T>
KILN_INLINE T poly(T, T p) { return p; }
template <class T, class... C>
KILN_INLINE T poly(T x, T p, T c, C... rest) { return poly(x, p * x + c, rest...); }

KILN_INLINE uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, sizeof u); return u; }
KILN_INLINE float u2f(uint32_t u) { float f; std::memcpy(&f, &u, sizeof f); return f; }
KILN_INLINE uint64_t d2u(double f) { uint64_t u; std::memcpy(&u, &f, sizeof u); return u; }
KILN_INLINE double u2d(uint64_t u) { double f; std::memcpy(&f, &u, sizeof f); return f; }

// |r| with the sign of s (r must be >= 0 or NaN).
KILN_INLINE float with_sign_of(float r, float s) {
  return u2f(f2u(r) | (f2u(s) & 0x80000000u));
}

// x*x == hi + lo exactly (x >= 0, x*x finite and not tiny).
KILN_INLINE void exact_square(float x, float& hi, float& lo) {
  hi = x * x;
#if defined(__FMA__) || defined(__FMA4__) || defined(__FP_FAST_FMAF) || defined(__aarch64__)
  lo = __builtin_fmaf(x, x, -hi);
#else  // Dekker split; without FMA hardware nothing can be contracted.
  const float c = 4097.0f * x;
  const float xh = c - (c - x);
  const float xl = x - xh;
  lo = ((xh * xh - hi) + 2.0f * xh * xl) + xl * xl;
#endif
}

constexpr float kLn2Hi = 0.693145751953125f;    // 15 significant bits: k*kLn2Hi is exact
constexpr float kLn2Lo = 1.428606765330187e-06f;
constexpr float kLog2e = 1.44269504f;
constexpr float kRound = 12582912.0f;           // 1.5*2^23: x + kRound rounds x to an integer

// x = n*ln2 + r, |r| <= ln2/2 (plus rounding); requires |x| < 2^21.
KILN_INLINE float exp_reduce(float x, int32_t& n) {
  float kf = x * kLog2e + kRound;
  n = (int32_t)(f2u(kf) - 0x4B400000u);
  kf = kf - kRound;
  float r = x - kf * kLn2Hi;     // exact
  return r - kf * kLn2Lo;
}

// expm1(r) for |r| <= 0.35 (minimax, ~0.25 ulp).
KILN_INLINE float expm1_poly(float r) {
  float q = kdetail::poly(r, 0.00138706958f, 0.00836627185f, 0.0416674353f, 0.166665465f, 0.49999997f);
  return r + (r * r) * q;
}

KILN_INLINE float pow2i(int32_t e) {  // 2^e for -126 <= e <= 127
  return u2f((uint32_t)(e + 127) << 23);
}

// log(1 + f) for f = m - 1, m in [sqrt(1/2), sqrt(2)):
// with s = f/(2+f), log(1+f) = 2 atanh(s) = f - f^2/2 + s*(f^2/2 + R(s^2)).
KILN_INLINE float log_core(float f) {
  const float s = f / (2.0f + f);
  const float z = s * s;
  float R = kdetail::poly(z, 0.298714697f, 0.399775684f, 0.666667759f);
  R = R * z;
  const float hfsq = 0.5f * f * f;
  return f + (s * (hfsq + R) - hfsq);
}

// erf(a) for 0 <= a <= 0.875: a + a*P(a^2).
KILN_INLINE float erf_small(float a) {
  const float z = a * a;
  float p = kdetail::poly(z, 7.86240707e-05f, -0.000802566996f, 0.00519090937f, -0.0268553607f, 0.112836227f,
                          -0.376126289f, 0.128379166f);
  return a + a * p;
}

}  // namespace kdetail

// ------------------------------------------------------------------ exp family
KILN_INLINE float k_exp(float x) {
  float xc = x > 88.8f ? 88.8f : x;          // NaN passes through both clamps
  xc = xc < -104.0f ? -104.0f : xc;
  int32_t n;
  const float r = kdetail::exp_reduce(xc, n);
  const float p = 1.0f + kdetail::expm1_poly(r);
  const int32_t n1 = n >> 1;                 // two-step scaling: exact for
  const int32_t n2 = n - n1;                 // overflow and denormal results
  return p * kdetail::pow2i(n1) * kdetail::pow2i(n2);
}

KILN_INLINE float k_expm1(float x) {
  float xc = x > 88.8f ? 88.8f : x;
  xc = xc < -26.0f ? -26.0f : xc;            // expm1(x) == -1.0f below ~-17.4
  int32_t n;
  const float r = kdetail::exp_reduce(xc, n);
  const float p = kdetail::expm1_poly(r);
  // expm1(x) = 2^n*(1+p) - 1 = t*p + (t - 1), with 2^n = t*u, u in {1, 2}
  const int32_t nt = n > 127 ? 127 : n;
  const float t = kdetail::pow2i(nt);
  const float u = kdetail::pow2i(n - nt);
  float y = t * p + (t - 1.0f);
  y = y * u + (u - 1.0f);
  return x == 0.0f ? x : y;                  // keep the sign of -0
}

KILN_INLINE float k_sigmoid(float x) {
  const float e = k_exp(-std::fabs(x));     // in (0, 1]: no overflow
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

KILN_INLINE float k_silu(float x) {
  const float e = k_exp(-std::fabs(x));
  return (x >= 0.0f ? x : x * e) / (1.0f + e);
}

// ------------------------------------------------------------------ log family
KILN_INLINE float k_log(float x) {
  const bool sub = x < 1.17549435e-38f;      // denormal (or <= 0): rescale
  const float xs = sub ? x * 8388608.0f : x;
  const int32_t ix = (int32_t)(kdetail::f2u(xs) - 0x3f3504f3u);
  const int32_t k = ix >> 23;
  const float m = kdetail::u2f(((uint32_t)ix & 0x007fffffu) + 0x3f3504f3u);
  const float kf = (float)k - (sub ? 23.0f : 0.0f);
  float r = kdetail::log_core(m - 1.0f);
  r = kf * kdetail::kLn2Hi + (r + kf * kdetail::kLn2Lo);
  r = x == 0.0f ? -INFINITY : r;
  r = x < 0.0f ? NAN : r;
  r = x == INFINITY ? INFINITY : r;
  return x != x ? x : r;
}

KILN_INLINE float k_log1p(float x) {
  const float u = 1.0f + x;
  const float c = x - (u - 1.0f);            // rounding error of 1 + x (exact)
  float r = k_log(u) + c / u;
  r = x == -1.0f ? -INFINITY : r;
  r = x == INFINITY ? INFINITY : r;
  return x == 0.0f ? x : r;                  // also keeps -0
}

// ------------------------------------------------------------------ tanh
KILN_INLINE float k_tanh(float x) {
  const float a = std::fabs(x);
  const float z = a * a;
  float p = kdetail::poly(z, 0.00215268391f, -0.00819001347f, 0.021706894f, -0.0539481789f, 0.133332208f,
                          -0.333333313f);
  const float small = a + a * (z * p);
  const float big = 1.0f - 2.0f / (k_exp(2.0f * a) + 1.0f);
  return kdetail::with_sign_of(a < 0.625f ? small : big, x);
}

// ------------------------------------------------------------------ erf family
namespace kdetail {
// exp(t) in double, relative error ~1e-11; t <= 130 (beyond: returns exp(130)).
KILN_INLINE double exp_d(double t) {
  double tc = t > 130.0 ? 130.0 : t;
  tc = tc < -160.0 ? -160.0 : tc;            // float results are 0 below -104
  double kd = tc * 1.4426950408889634 + 6755399441055744.0;  // 1.5*2^52
  const int64_t n = (int64_t)(d2u(kd) - 0x4338000000000000ull);
  kd = kd - 6755399441055744.0;
  const double r = tc - kd * 0.6931471805599453;
  double p = kdetail::poly(r, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0,
                           1.0 / 6.0, 0.5, 1.0, 1.0);
  return p * u2d((uint64_t)(n + 1023) << 52);
}
}  // namespace kdetail

namespace kdetail {
// erfc(a) for 0.875 <= a <= 4 without a division (erf's upper branch): log(erfc(a)) + a^2 is smooth and small
// there, so a degree-8 polynomial in u = (a - 2.4375) / 1.5625 (kiln's own Chebyshev least-squares fit, in
// double, coefficients rounded to float) gives it to ~1e-8; erfc = exp(poly - a^2), a^2 taken by one FMA.
// erf = 1 - erfc is then within 1.4 ulp (float evaluation included).
KILN_INLINE float erfc_mid(float a) {
  const float u = (a - 2.4375f) * 0.64f;
  float p = kdetail::poly(u, 5.70364064e-05f, -0.00032080416f, 0.00121406466f, -0.00419381587f, 0.0137153845f,
                          -0.0435507894f, 0.142075539f, -0.56222403f, -1.53455091f);
  return k_exp(std::fma(-a, a, p));
}
}  // namespace kdetail

KILN_INLINE float k_erf(float x) {
  float a = std::fabs(x);
  a = a > 4.0f ? 4.0f : a;                   // erf rounds to 1 in float from a = 3.92
  const float r = a < 0.875f ? kdetail::erf_small(a) : 1.0f - kdetail::erfc_mid(a);
  return kdetail::with_sign_of(r, x);
}

// erfc(x) in one branch: for a = |x|, erfc(a) = exp(-a^2) * t * P(1 - t) with t = 1/(1 + a/2) and P of degree 9
// (kiln's own weighted least-squares fit of erfcx(a)/t on 0 <= a <= 10 in double, coefficients rounded to
// float one at a time, lowest first, refitting the rest; fit error 2e-8 relative).  a^2 is split exactly
// (hi + lo) so exp(-a^2) keeps its accuracy for large a.  Up to |x| = 9.25 exp(-a^2) scales by one normal
// power of two (a second scaling step cost gelu 9%); beyond, erfc < 4.2e-39 and 0 is returned (absolute error
// below 4.2e-39).  x < 0: 2 - erfc(|x|).  No cancellation anywhere, so relative
// accuracy holds across the tail (gelu, once lowered on this function, now uses k_ndtr below).
KILN_INLINE float k_erfc(float x) {
  const float ax = std::fabs(x);
  const float a = ax < 9.25f ? ax : 9.25f;   // beyond, erfc < 4.2e-39 (denormal) and 0 is returned
  const float t = 1.0f / (1.0f + 0.5f * a);
  const float u = (0.5f * a) * t;            // 1 - t without cancellation: P is evaluated around a = 0
  float p = kdetail::poly(u, -0.0131481457f, -0.00915301498f, 0.108733274f, -0.0809345916f, -0.057494022f,
                          -0.108684622f, 0.21311879f, 0.486381829f, -1.25675583f, 1.0f);
  float hi, lo;
  kdetail::exact_square(a, hi, lo);
  int32_t n;
  const float r = kdetail::exp_reduce(-hi, n);
  float e = (1.0f + kdetail::expm1_poly(r)) * kdetail::pow2i(n);  // n >= -124: one normal power of two
  e = e - e * lo;                            // exp(-hi - lo) ~= exp(-hi) * (1 - lo)
  const float c = ax < 9.25f ? e * (t * p) : 0.0f;  // (exactly 0: x * erfc(|x|) -> 0 for x << 0, no -x * 4e-39)
  const float r2 = x < 0.0f ? 2.0f - c : c;
  return x != x ? x : r2;
}

// Phi(x), the standard normal CDF (torch.special.ndtr), in one branch: for a = |x|, h = Phi(-a) =
// exp(-a^2/2) * t * P(u) with t = 1/(1 + c a), u = c a t = 1 - t (without cancellation, so P is evaluated
// around a = 0, where P(0) = 1/2 exactly) and P of degree 7 (kiln's own fit: Lawson's minimax of the relative
// error of h on 0 <= a <= 13, in double, coefficients rounded to float one at a time, lowest first, refitting
// the rest; fit error 9e-8 relative); Phi = h for x < 0, 1 - h otherwise.  a^2 is split exactly (hi + lo),
// so exp(-a^2/2) keeps its accuracy in the tail; a^2/2 <= 84.5 scales by one normal power of two.  Beyond
// a = 13 h < 6e-39 and 0 is returned.  Cheaper than erfc's degree-9 fit around 1/(1 + a/2): gelu is lowered
// to x * Phi(x) on this function (0.47 against 0.65 ns per element through k_erfc, one AVX-512 core).
KILN_INLINE float k_ndtr(float x) {
  const float ax = std::fabs(x);
  const float a = ax < 13.0f ? ax : 13.0f;
  const float ca = 0.3035f * a;
  const float t = 1.0f / (1.0f + ca);
  const float u = ca * t;
  const float p = kdetail::poly(u, -0.036710955f, 0.10143615f, -0.03161034f, -0.1229926f, -0.059910685f,
                                0.5852994f, -0.81447685f, 0.5f);
  float hi, lo;
  kdetail::exact_square(a, hi, lo);
  int32_t n;
  const float r = kdetail::exp_reduce(-0.5f * hi, n);
  float e = (1.0f + kdetail::expm1_poly(r)) * kdetail::pow2i(n);
  e = e - e * (0.5f * lo);                   // exp(-hi/2 - lo/2) ~= exp(-hi/2) * (1 - lo/2)
  const float h = ax < 13.0f ? e * (t * p) : 0.0f;
  const float phi = x < 0.0f ? h : 1.0f - h;
  return x != x ? x : phi;
}

// The exact (erf) GELU, x * Phi(x), for graphs and the GEMM's epilogue: Phi(x) = 1/2 + x R(x^2) with R = P/Q of
// degree 5 over 5 (kiln's own fit: linearized least squares, then Lawson's reweighting toward the minimax of
// the absolute error of Phi on |x| <= 4 sqrt 2, in double; coefficients rounded to float one at a time, lowest
// first, refitting the rest; fit error 1.4e-8).  Beyond -4 sqrt 2 Phi is taken as 0 (x * Phi(x) > -4.4e-8
// there), beyond +4 sqrt 2 as 1 (within 7.7e-9).  No exponential and one division:
// 0.30 ns per element against 0.61 for x * k_ndtr(x) (L1-resident, one AVX-512 core), which matters where gelu
// is the epilogue of a GEMM with small K (ConvNeXt's 3136 x 96 -> 384: 0.88 of 3.24 ms went to k_ndtr).
// Accuracy is absolute in the negative tail, like ATen's own 0.5 x (1 + erf(x / sqrt 2)), whose 1 + erf
// cancels: |error| < 1e-6 everywhere with FMA, 1.6e-6 without (ATen's: ~3e-7), and <= 2 ulp for x >= 0
// (float evaluation of 1/2 + v with v near 1/2 dominates the fit).  NaN propagates (x * NaN), gelu(-0) = -0, gelu(-inf) = NaN as in ATen.
KILN_INLINE float k_gelu_erf(float x) {
  const float c = 5.65685425f;               // 4 sqrt 2
  const float s = x * x;
  const float p = kdetail::poly(s, 2.14983125e-08f, 6.3801981e-06f, 0.000180403309f, 0.00474700751f,
                                0.0350411832f, 0.398942202f);
  const float q = kdetail::poly(s, 1.16299475e-06f, 7.70854895e-05f, 0.00195030356f, 0.0293180514f,
                                0.254500628f, 1.0f);
  const float v = (x * p) / q;               // erf(x / sqrt 2) / 2; for |x| > c it may overflow, replaced below
  const float w = x < -c ? -0.5f : v;        // (NaN passes through both selects)
  return x * (0.5f + (x > c ? 0.5f : w));
}

// 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715 x^3))) == x * sigmoid(2*inner)
KILN_INLINE float k_gelu_tanh(float x) {
  const float v = x * (1.59576912f + 0.0713548162f * (x * x));
  const float e = k_exp(-std::fabs(v));
  return (v >= 0.0f ? x : x * e) / (1.0f + e);
}

// ------------------------------------------------------------------ sin / cos
namespace kdetail {
// For a >= 0 (or NaN): a = (q + f) * pi/2 with integer q (returned mod 4 in q)
// and |f| <= 1/2.  a*2/pi mod 4 is computed exactly-enough in double from
// 24-bit chunks of 2/pi (each product a*chunk is exact), so the reduction is
// correct for every finite float.  Returns r = f*pi/2 and z = r^2.
KILN_INLINE float trig_reduce(float a, int32_t& q, float& z) {
  const double x = a;
  double t0 = x * 0x1.45f306p-1;
  double t1 = x * 0x1.b93910p-26;
  double t2 = x * 0x1.529fc0p-52;
  double t3 = x * 0x1.3abe88p-75;
  double t4 = x * 0x1.ea69bap-97;
  double t5 = x * 0x1.81b6c4p-121;
  const double t6 = x * 0x1.2b3278p-145;
  const double t7 = x * 0x1.0e4104p-170;
  t0 = t0 - 4.0 * std::floor(t0 * 0.25);     // all exact
  t1 = t1 - 4.0 * std::floor(t1 * 0.25);
  t2 = t2 - 4.0 * std::floor(t2 * 0.25);
  t3 = t3 - 4.0 * std::floor(t3 * 0.25);
  t4 = t4 - 4.0 * std::floor(t4 * 0.25);
  t5 = t5 - 4.0 * std::floor(t5 * 0.25);
  double y = t0 + t1;
  y = y - 4.0 * std::floor(y * 0.25);
  y = y + (t2 + (t3 + (t4 + (t5 + (t6 + t7)))));
  const double k = std::floor(y + 0.5);
  const double rd = (y - k) * 1.5707963267948966;
  q = (int32_t)(k == k ? k : 0.0);           // (NaN/inf input: result is NaN anyway)
  z = (float)(rd * rd);
  return (float)rd;
}

KILN_INLINE float sin_poly(float r, float z) {  // |r| <= pi/4
  float p = kdetail::poly(z, -0.000195179062f, 0.00833218731f, -0.166666552f);
  return r + r * (z * p);
}

KILN_INLINE float cos_poly(float z) {
  float p = kdetail::poly(z, -2.88784491e-07f, 2.48220076e-05f, -0.001388898f, 0.0416666679f);
  return 1.0f + z * (z * p - 0.5f);
}

KILN_INLINE float trig_quadrant(int32_t q, float s, float c) {
  const float v = (q & 1) ? c : s;
  return (q & 2) ? -v : v;
}
}  // namespace kdetail

KILN_INLINE float k_sin(float x) {
  int32_t q;
  float z;
  const float r = kdetail::trig_reduce(std::fabs(x), q, z);
  const float v = kdetail::trig_quadrant(q, kdetail::sin_poly(r, z), kdetail::cos_poly(z));
  return kdetail::u2f(kdetail::f2u(v) ^ (kdetail::f2u(x) & 0x80000000u));
}

KILN_INLINE float k_cos(float x) {
  int32_t q;
  float z;
  const float r = kdetail::trig_reduce(std::fabs(x), q, z);
  return kdetail::trig_quadrant(q + 1, kdetail::sin_poly(r, z), kdetail::cos_poly(z));
}

// ------------------------------------------------------------------ pow
namespace kdetail {
// log(a) in double, relative error ~1e-12, for a > 0 finite (float input).
KILN_INLINE double log_d(float a) {
  const bool sub = a < 1.17549435e-38f;
  const float as = sub ? a * 8388608.0f : a;
  const int32_t ix = (int32_t)(f2u(as) - 0x3f3504f3u);
  const int32_t k = ix >> 23;
  const double m = (double)u2f(((uint32_t)ix & 0x007fffffu) + 0x3f3504f3u);
  const double kd = (double)k - (sub ? 23.0 : 0.0);
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  double p = kdetail::poly(z, 1.0 / 13.0, 1.0 / 11.0, 1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0);
  return kd * 0.6931471805599453 + (2.0 * s + 2.0 * s * (z * p));
}

}  // namespace kdetail

// std::pow semantics (C99 Annex F special cases), ~1 ulp.
KILN_INLINE float k_pow(float x, float y) {
  const float ax = std::fabs(x);
  float r = (float)kdetail::exp_d((double)y * kdetail::log_d(ax));
  r = ax == 0.0f ? (y > 0.0f ? 0.0f : INFINITY) : r;
  r = ax == INFINITY ? (y > 0.0f ? INFINITY : 0.0f) : r;
  r = (ax == 1.0f && std::fabs(y) == INFINITY) ? 1.0f : r;    // pow(-1, +-inf) = 1
  r = y != y ? y : r;
  r = x != x ? x : r;
  const float yt = std::trunc(y);                               // yt == y also for +-inf
  const bool y_odd = yt == y && std::trunc(y * 0.5f) * 2.0f != y;
  r = (x < 0.0f && x > -INFINITY && yt != y) ? NAN : r;
  // negative base (incl. -0, -inf) with odd integer exponent: flip the sign
  r = kdetail::u2f(kdetail::f2u(r) ^ (kdetail::f2u(x) & (y_odd ? 0x80000000u : 0u)));
  r = x == 1.0f ? 1.0f : r;
  return y == 0.0f ? 1.0f : r;
}

// ------------------------------------------------------------------ misc
KILN_INLINE float k_rsqrt(float x) { return 1.0f / std::sqrt(x); }

// An index the compiler may not see through (see [Note: gather index from a comparison], kiln/codegen/
// cpp_expr.py): the empty asm keeps the value in a register and the loop around it scalar.
template <class T>
KILN_INLINE T k_opaque_index(T v) {
  __asm__("" : "+r"(v));
  return v;
}

template <class T>
KILN_INLINE T k_relu(T x) { return x < T(0) ? T(0) : x; }   // relu(NaN) = NaN

template <class T>
KILN_INLINE T k_maximum(T a, T b) {
  T r = a > b ? a : b;
  r = b != b ? b : r;
  return a != a ? a : r;
}

template <class T>
KILN_INLINE T k_minimum(T a, T b) {
  T r = a < b ? a : b;
  r = b != b ? b : r;
  return a != a ? a : r;
}

// ------------------------------------------------------------------ double
// Double math is rare in generated kernels: defer to libm (not vectorized).
KILN_INLINE double k_exp(double x) { return std::exp(x); }
KILN_INLINE double k_expm1(double x) { return std::expm1(x); }
KILN_INLINE double k_log(double x) { return std::log(x); }
KILN_INLINE double k_log1p(double x) { return std::log1p(x); }
KILN_INLINE double k_tanh(double x) { return std::tanh(x); }
KILN_INLINE double k_erf(double x) { return std::erf(x); }
KILN_INLINE double k_erfc(double x) { return std::erfc(x); }
KILN_INLINE double k_ndtr(double x) { return 0.5 * std::erfc(x * -0.70710678118654752); }
KILN_INLINE double k_sin(double x) { return std::sin(x); }
KILN_INLINE double k_cos(double x) { return std::cos(x); }
KILN_INLINE double k_pow(double x, double y) { return std::pow(x, y); }
KILN_INLINE double k_rsqrt(double x) { return 1.0 / std::sqrt(x); }
KILN_INLINE double k_sigmoid(double x) {
  const double e = std::exp(-std::fabs(x));
  return (x >= 0.0 ? 1.0 : e) / (1.0 + e);
}
KILN_INLINE double k_silu(double x) {
  const double e = std::exp(-std::fabs(x));
  return (x >= 0.0 ? x : x * e) / (1.0 + e);
}
KILN_INLINE double k_gelu_erf(double x) { return 0.5 * x * std::erfc(-x * 0.70710678118654752); }
KILN_INLINE double k_gelu_tanh(double x) {
  const double v = x * (1.5957691216057308 + 0.07135481627260025 * (x * x));
  const double e = std::exp(-std::fabs(v));
  return (v >= 0.0 ? x : x * e) / (1.0 + e);
}

}  // namespace kiln_rt
