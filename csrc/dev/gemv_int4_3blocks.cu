// The library's gemv_int4 as it was then (gemv_int4_v2.cuh) built for 3 resident blocks per SM (80 registers, ~4 spill accesses per unit and row)
// instead of 2 (125-128 registers, no spills). Lost on every shape above 0.5B: 7B gate/up 29.12 vs 23.88 us, down
// 19.16 vs 15.36 us, decode 2.968 vs 2.741 ms/token on the H200 (bench/NOTES.md, "INT4 GEMV v2"): the loop is
// bound by bytes in flight per SM, which the extra block does not add once registers spill.
//   make -C csrc/dev && build/dev/gemv_int4_3blocks
#include "gemv_dev.cuh"
#include "gemv_int4_v2.cuh"

// Same arithmetic as the library kernel (tests/test_gpu_kernels.py uses the same bound): x in f16, f16 partial
// sums of 8 products, f32 above.
constexpr double kTolF16Unpack = 3e-3;

int main() {
  dev::raise_smem(nq::gemv_int4_v2<nq::GEMV_STORE, 3>);
  const int sms = dev::sm_count();
  return dev::run_gemv_shapes("gemv_int4 at 3 blocks/SM", [&](const nq::GemvArgs& a, int rows) {
    dev::must(nq::launch_gemv_int4_v2<nq::GEMV_STORE, 3>(a, rows, sms, 0));
  }, kTolF16Unpack, true);
}
