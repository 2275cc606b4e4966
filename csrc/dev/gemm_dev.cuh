// The GEMM programs' common main loop: the Qwen2.5-7B prefill GEMM shapes at M = 512 tokens, random INT4 weights and
// activations, one launch checked against the CPU reference on 4096 sampled outputs (the full float64 product would
// take minutes on the host), then the timing (weights rotated over > 256 MB, median of 11 x 20 launches).
#pragma once
#include "dev_common.cuh"
#include "gemm_kernels.cuh"

namespace dev {

// launch(W, A, M, C) enqueues C[M, N] = A[M, K] @ W^T (f16 A, row stride K; f32 C, row stride N).
using GemmLaunch = std::function<void(const nq::LinW&, const __half*, int, float*)>;

// A is rounded to f16 by the caller's upload and the reference sees the same values; the weights are dequantised
// to f16 ((u - 8) * scale rounds once: 2^-12 relative) and products accumulate in f32 on tensor cores: ~2.4e-4
// relative Frobenius error expected, tests/test_gpu_gemm.py allows 1e-3 for the library kernel.
constexpr double kTolGemmF16 = 1e-3;

inline int run_gemm_shapes(const char* title, const GemmLaunch& launch) {
  int dev = 0;
  cudaDeviceProp prop;
  DEV_CHECK(cudaGetDevice(&dev));
  DEV_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s on %s\n", title, prop.name);
  const int M = 512, group = 128;
  const Shape shapes[] = {{"7B q/o", 3584, 3584}, {"7B gate", 18944, 3584}, {"7B down", 3584, 18944}};
  for (const Shape& sh : shapes) {
    const Int4Weight W = random_int4(sh.N, sh.K, group, 4321u + sh.N);
    const std::vector<float> A = round_f16(random_vector((size_t)M * sh.K, 7u + sh.K, 1.f));
    std::vector<__half> Ah(A.size());
    for (size_t i = 0; i < A.size(); i++) Ah[i] = __float2half_rn(A[i]);
    DeviceCopies wc(W.file_bytes);
    __half* dA = nullptr;
    float* dC = nullptr;
    DEV_CHECK(cudaMalloc(&dA, Ah.size() * sizeof(__half)));
    DEV_CHECK(cudaMalloc(&dC, (size_t)M * sh.N * sizeof(float)));
    DEV_CHECK(cudaMemcpy(dA, Ah.data(), Ah.size() * sizeof(__half), cudaMemcpyHostToDevice));
    DEV_CHECK(cudaMemset(dC, 0xff, (size_t)M * sh.N * sizeof(float)));  // poison
    auto lin = [&](int c) {
      nq::LinW L;
      L.w = wc.copy(c);
      L.scales = reinterpret_cast<const __half*>(wc.copy(c) + W.scales_offset());
      L.N = sh.N; L.K = sh.K; L.group = group; L.type = nq::WT_INT4;
      return L;
    };
    launch(lin(0), dA, M, dC);
    DEV_CHECK(cudaDeviceSynchronize());
    std::vector<float> C((size_t)M * sh.N);
    DEV_CHECK(cudaMemcpy(C.data(), dC, C.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::mt19937 rng(5);
    std::vector<float> got, ref;
    for (int s = 0; s < 4096; s++) {
      const int m = (int)(rng() % M), n = (int)(rng() % sh.N);
      double acc = 0.0;
      for (int k = 0; k < sh.K; k++) acc += (double)A[(size_t)m * sh.K + k] * W.w[(size_t)n * sh.K + k];
      got.push_back(C[(size_t)m * sh.N + n]);
      ref.push_back((float)acc);
    }
    for (float v : C)
      if (!std::isfinite(v)) { std::printf("  %s: FAIL, unwritten output\n", sh.name); return 1; }
    char what[96];
    std::snprintf(what, sizeof what, "  %-8s M=%d N=%5d K=%5d (4096 sampled outputs)", sh.name, M, sh.N, sh.K);
    validate_result(what, got.data(), ref, kTolGemmF16);
    const double us = median_us([&](int i) { launch(lin(i), dA, M, dC); }, 20);
    std::printf("  %-8s %8.1f us  %5.0f TFLOP/s\n", sh.name, us, 2.0 * M * sh.N * sh.K / (us * 1e-6) / 1e12);
    cudaFree(dA);
    cudaFree(dC);
  }
  return 0;
}

// One weight as a one-segment GemmGroup, as gemm_multi builds it.
inline nq::GemmGroup single(const nq::LinW& W, float* C, int bn) {
  nq::GemmGroup g;
  g.n = 1;
  g.s[0].W = W;
  g.s[0].C = C;
  g.s[0].bias = nullptr;
  g.tiles0 = (W.N + bn - 1) / bn;
  return g;
}

}  // namespace dev
