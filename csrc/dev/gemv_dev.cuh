// The GEMV programs' common main loop: for each Qwen2.5-7B layer shape, random INT4 weights and x, one launch
// checked against the CPU reference, then the timing (weights rotated over > 256 MB, median of 11 x 100 launches).
#pragma once
#include "dev_common.cuh"
#include "gemv_kernels.cuh"

namespace dev {

// launch(args, rows) enqueues one STORE-mode GEMV y = W @ x (x f32, no RMSNorm) on the default stream.
using GemvLaunch = std::function<void(const nq::GemvArgs&, int)>;

// STORE-mode arguments y = W @ x for one INT4 weight whose file bytes are at `bytes` (a DeviceCopies copy).
inline nq::GemvArgs store_args(const Int4Weight& W, const uint8_t* bytes, const float* x, float* y) {
  nq::GemvArgs a;
  a.seg[0].w = bytes;
  a.seg[0].scales = reinterpret_cast<const __half*>(bytes + W.scales_offset());
  a.seg[0].N = W.N; a.seg[0].K = W.K; a.seg[0].group = W.group; a.seg[0].type = nq::WT_INT4;
  a.x_f32 = x; a.out_f32 = y; a.mode = nq::GEMV_STORE;
  return a;
}

// ref_x_f16: the kernel stages x as f16, so the reference multiplies f16(x) (else x itself). Returns 0.
inline int run_gemv_shapes(const char* title, const GemvLaunch& launch, double tol, bool ref_x_f16,
                           const std::vector<Shape>& shapes = qwen7b_gemv_shapes()) {
  int dev = 0;
  cudaDeviceProp prop;
  DEV_CHECK(cudaGetDevice(&dev));
  DEV_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s on %s\n", title, prop.name);
  const int group = 128;
  for (const Shape& sh : shapes) {
    const Int4Weight W = random_int4(sh.N, sh.K, group, 1234u + sh.N);
    const std::vector<float> x = random_vector(sh.K, 99u + sh.K, 1.f);
    const std::vector<float> ref = gemv_ref(W, ref_x_f16 ? round_f16(x) : x);
    DeviceCopies wc(W.file_bytes);
    float *dx = nullptr, *dy = nullptr;
    DEV_CHECK(cudaMalloc(&dx, sh.K * sizeof(float)));
    DEV_CHECK(cudaMalloc(&dy, sh.N * sizeof(float)));
    DEV_CHECK(cudaMemcpy(dx, x.data(), sh.K * sizeof(float), cudaMemcpyHostToDevice));
    DEV_CHECK(cudaMemset(dy, 0xff, sh.N * sizeof(float)));  // poison: NaN unless written
    auto args = [&](int c) { return store_args(W, wc.copy(c), dx, dy); };
    launch(args(0), sh.N);
    DEV_CHECK(cudaDeviceSynchronize());
    std::vector<float> y(sh.N);
    DEV_CHECK(cudaMemcpy(y.data(), dy, sh.N * sizeof(float), cudaMemcpyDeviceToHost));
    char what[96];
    std::snprintf(what, sizeof what, "  %-8s N=%5d K=%5d", sh.name, sh.N, sh.K);
    validate_result(what, y.data(), ref, tol);
    const double us = median_us([&](int i) { launch(args(i), sh.N); });
    const double gbs = (double)(W.bytes()) / (us * 1e-6) / 1e9;
    std::printf("  %-8s %8.2f us  %6.0f GB/s\n", sh.name, us, gbs);
    cudaFree(dx);
    cudaFree(dy);
  }
  return 0;
}

// Let `kernel` use up to nq::kMaxDynSmem of dynamic shared memory (each GEMV instantiation a program launches).
template <class Kernel>
void raise_smem(Kernel kernel) {
  DEV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, nq::kMaxDynSmem));
}

// Time-only diagnostics, one row per shape: the read-only stream over the weight bytes, then each launch of
// `columns` (STORE args of random INT4 weights and an all-zero x; the results are not checked: diagnostic
// variants compute no GEMV). A launch returns its status (NQ_OK).
struct TimedLaunch { const char* label; std::function<int(const nq::GemvArgs&, int)> launch; };
inline void time_diagnostics(const char* title, const std::vector<Shape>& shapes, int sms,
                             const std::vector<TimedLaunch>& columns) {
  unsigned* sink = nullptr;
  DEV_CHECK(cudaMalloc(&sink, 4096 * sizeof(unsigned)));
  std::printf("%s (time only, us)\n  %-12s %10s", title, "shape", "read");
  for (const TimedLaunch& c : columns) std::printf(" %14s", c.label);
  std::printf(" %10s\n", "MB");
  for (const Shape& sh : shapes) {
    const Int4Weight W = random_int4(sh.N, sh.K, 128, 1234u + sh.N);
    DeviceCopies wc(W.file_bytes);
    float *dx = nullptr, *dy = nullptr;
    DEV_CHECK(cudaMalloc(&dx, sh.K * sizeof(float)));
    DEV_CHECK(cudaMalloc(&dy, sh.N * sizeof(float)));
    DEV_CHECK(cudaMemset(dx, 0, sh.K * sizeof(float)));
    auto args = [&](int c) { return store_args(W, wc.copy(c), dx, dy); };
    const size_t n16 = W.bytes() / 16;
    std::printf("  %-12s %10.2f", sh.name, median_us([&](int i) {
      read_ceiling<<<sms * 8, kCeilThreads>>>(reinterpret_cast<const uint4*>(wc.copy(i)), n16, sink);
    }));
    for (const TimedLaunch& c : columns)
      std::printf(" %14.2f", median_us([&](int i) { must(c.launch(args(i), sh.N)); }));
    std::printf(" %10.1f\n", W.bytes() / 1e6);
    cudaFree(dx);
    cudaFree(dy);
  }
  cudaFree(sink);
}

inline int sm_count() {
  int dev = 0, n = 0;
  DEV_CHECK(cudaGetDevice(&dev));
  DEV_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

}  // namespace dev
