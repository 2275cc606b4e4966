// The INT4 GEMV on tensor cores (gemv_int4_tc.cuh) against the library's CUDA-core kernel of that time (gemv_int4_v2.cuh), same run,
// same weights. Both validate against the CPU reference (x rounded to f16), then each shape is timed (weights
// rotated > 256 MB); last, the tensor-core kernel's loads alone and its arithmetic alone (time only).
//   make -C csrc/dev && build/dev/gemv_int4_tc_vs_simt
#include "gemv_dev.cuh"
#include "gemv_int4_v2.cuh"
#include "gemv_int4_tc.cuh"

// gemv_int4: f16 partial sums of 8 products (tests/test_gpu_kernels.py uses the same bound); gemv_int4_tc sums in
// f32 and is held to the same bound.
constexpr double kTolF16Unpack = 3e-3;

int main() {
  dev::raise_smem(nq::gemv_int4_v2<nq::GEMV_STORE, 2>);
  dev::raise_smem(nq::gemv_int4_tc<nq::GEMV_STORE, 2>);
  dev::raise_smem(nq::gemv_int4_tc<nq::GEMV_STORE, 3>);
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
  dev::raise_smem(nq::gemv_int4_tc<nq::GEMV_STORE, 2, 1>);
  dev::raise_smem(nq::gemv_int4_tc<nq::GEMV_STORE, 2, 2>);
  dev::time_diagnostics("gemv_int4_tc halves", shapes, sms, {
      {"loads+split", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_tc<nq::GEMV_STORE, 2, 1>(a, r, sms, 0); }},
      {"unpack+MMAs", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_tc<nq::GEMV_STORE, 2, 2>(a, r, sms, 0); }},
  });
  return rc;
}
