// The INT4 GEMV on tensor cores (gemv_int4_tc.cuh) against the library's CUDA-core kernel of that time (gemv_int4_v2.cuh), same run,
// same weights. Both validate against the CPU reference (x rounded to f16), then each shape is timed (weights
// rotated > 256 MB); last, the tensor-core kernel's loads alone and its arithmetic alone (time only).
//   make -C csrc/dev && build/dev/gemv_int4_tc_vs_simt
#include "gemv_dev.cuh"
#include "gemv_int4_v2.cuh"
#include "gemv_int4_tc.cuh"

// Time-only runs of a launch over the shapes (results are not checked: diagnostic variants compute no GEMV).
template <class F>
void time_only(const char* title, const std::vector<dev::Shape>& shapes, F launch) {
  std::printf("%s (time only)\n", title);
  for (const dev::Shape& sh : shapes) {
    const dev::Int4Weight W = dev::random_int4(sh.N, sh.K, 128, 1234u + sh.N);
    dev::DeviceCopies wc(W.file_bytes);
    float *dx = nullptr, *dy = nullptr;
    DEV_CHECK(cudaMalloc(&dx, sh.K * sizeof(float)));
    DEV_CHECK(cudaMalloc(&dy, sh.N * sizeof(float)));
    DEV_CHECK(cudaMemset(dx, 0, sh.K * sizeof(float)));
    auto args = [&](int c) { return dev::store_args(W, wc.copy(c), dx, dy); };
    const double us = dev::median_us([&](int i) { dev::must(launch(args(i), sh.N)); });
    std::printf("  %-10s %8.2f us\n", sh.name, us);
    cudaFree(dx);
    cudaFree(dy);
  }
}

// gemv_int4: f16 partial sums of 8 products (tests/test_gpu_kernels.py uses the same bound); gemv_int4_tc sums in
// f32 and is held to the same bound.
constexpr double kTolF16Unpack = 3e-3;

int main() {
  DEV_CHECK(cudaFuncSetAttribute(nq::gemv_int4_v2<nq::GEMV_STORE, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 nq::kMaxDynSmem));
  DEV_CHECK(cudaFuncSetAttribute(nq::gemv_int4_tc<nq::GEMV_STORE, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 nq::kMaxDynSmem));
  DEV_CHECK(cudaFuncSetAttribute(nq::gemv_int4_tc<nq::GEMV_STORE, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 nq::kMaxDynSmem));
  const int sms = dev::sm_count();
  std::vector<dev::Shape> shapes = dev::qwen7b_gemv_shapes();
  shapes.push_back({"7B gate+up", 2 * 18944, 3584});
  shapes.push_back({"0.5B gate", 4864, 896});
  shapes.push_back({"odd 1000x384", 1000, 384});
  int rc = dev::run_gemv_shapes("gemv_int4 (CUDA cores, 2 blocks/SM)", [&](const nq::GemvArgs& a, int rows) {
    dev::must(nq::launch_gemv_int4_v2<nq::GEMV_STORE, 2>(a, rows, sms, 0));
  }, kTolF16Unpack, true, shapes);
  rc |= dev::run_gemv_shapes("gemv_int4_tc (tensor cores, 2 blocks/SM)", [&](const nq::GemvArgs& a, int rows) {
    dev::must(nq::launch_gemv_int4_tc<nq::GEMV_STORE, 2>(a, rows, sms, 0));
  }, kTolF16Unpack, true, shapes);
  rc |= dev::run_gemv_shapes("gemv_int4_tc (tensor cores, 3 blocks/SM)", [&](const nq::GemvArgs& a, int rows) {
    dev::must(nq::launch_gemv_int4_tc<nq::GEMV_STORE, 3>(a, rows, sms, 0));
  }, kTolF16Unpack, true, shapes);
  DEV_CHECK(cudaFuncSetAttribute(nq::gemv_int4_tc<nq::GEMV_STORE, 2, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 nq::kMaxDynSmem));
  DEV_CHECK(cudaFuncSetAttribute(nq::gemv_int4_tc<nq::GEMV_STORE, 2, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 nq::kMaxDynSmem));
  time_only("gemv_int4_tc loads and work split only", shapes, [&](const nq::GemvArgs& a, int rows) {
    return nq::launch_gemv_int4_tc<nq::GEMV_STORE, 2, 1>(a, rows, sms, 0);
  });
  time_only("gemv_int4_tc unpack and MMAs only (no weight loads)", shapes, [&](const nq::GemvArgs& a, int rows) {
    return nq::launch_gemv_int4_tc<nq::GEMV_STORE, 2, 2>(a, rows, sms, 0);
  });
  return rc;
}
