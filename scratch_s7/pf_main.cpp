static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  int64_t m = atol(argv[1]), k = atol(argv[2]), n = atol(argv[3]);
  float* a = (float*)std::aligned_alloc(64, m*k*4);
  float* c = (float*)std::aligned_alloc(64, m*n*4);
  float* b = (float*)std::aligned_alloc(64, (n+31)/32*32*k*4);
  for (int64_t i = 0; i < m*k; ++i) a[i] = 0.001f*(i%7) - 0.002f;
  for (int64_t i = 0; i < n*k; ++i) b[i] = 0.001f*(i%5) - 0.001f;
  int nbuf = 6; std::vector<float*> bps;
  for (int i = 0; i < nbuf; ++i) { float* bp = (float*)std::aligned_alloc(64, (n+31)/32*32*k*4); A::gemm_pf_pack_b(b, k, n, 1, k, bp); bps.push_back(bp); }
  int64_t KC = k <= 1024 ? k : 1024; int64_t MR = A::gemm_pf_mr(); int64_t MC = (m + MR - 1) / MR * MR; if (MC * KC * 4 > 768*1024) MC = 768*1024/(4*KC)/MR*MR;
  double fl = 2.0*m*n*k;
  std::vector<double> tp, tn;
  for (int rep = 0; rep < 15; ++rep) {
    for (int v = 0; v < 2; ++v) {
      double t0 = now();
      for (int it = 0; it < nbuf; ++it)
        if (v == 0) A::gemm_pf(a, k, bps[it], nullptr, c, n, m, n, k, KC, MC, 1);
        else B::gemm_nopf(a, k, bps[it], nullptr, c, n, m, n, k, KC, MC, 1);
      (v == 0 ? tp : tn).push_back((now() - t0) / nbuf);
    }
  }
  std::vector<double> ratio; for (size_t i = 0; i < tp.size(); ++i) ratio.push_back(tn[i] / tp[i]);
  std::sort(tp.begin(), tp.end()); std::sort(tn.begin(), tn.end()); std::sort(ratio.begin(), ratio.end());
  printf("%ldx%ldx%ld: prefetch %.1f  none %.1f GFLOP/s (medians); per-round ratio none/prefetch median %.3f [%.3f..%.3f]\n",
         m, k, n, fl/tp[7]/1e9, fl/tn[7]/1e9, ratio[7], ratio[2], ratio[12]);
}
