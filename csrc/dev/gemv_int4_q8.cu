// "gemv_int4" below is the library's kernel of that time, kept as gemv_int4_v2 (gemv_int4_v2.cuh).
// gemv_int4's split-K skeleton with int8 activations: x quantised per 32 values in a vectorised per-block prologue,
// dp4a on the codes, 4 units per lane and row per stage (the int8 path needs 98 instead of 128 registers). Lost to
// the f16 unpack: 7B per-layer GEMVs 51.6 vs 50.5 us (gate/up 21.50 vs 23.85 won, qkv/o/down lost to the
// prologue), decode 2.206 vs 2.122 ms/token on the H200 (bench/NOTES.md, "INT8-activation GEMV on the v2 kernel").
//   make -C csrc/dev && build/dev/gemv_int4_q8
#include "gemv_dev.cuh"
#include "gemv_int4_v2.cuh"
#include "int8_x.cuh"

namespace nq {
namespace {

// gemv_int4's unit arithmetic with int8 x: the shared memory holds [4][nunits] packed int8 x, then a scale and the
// sum of the int8 values per 32-value unit.
struct Q8Units {
  static constexpr int kUnroll = 4;  // units per lane and row per stage (98 registers at 2 leave room for it)
  __device__ static void stage(const GemvArgs& a, int K, uint4* smem, float* red) {
    const int nunits = K >> 5;
    int2* xq = reinterpret_cast<int2*>(smem);
    float* sx = reinterpret_cast<float*>(xq + 4 * nunits);
    stage_x_q8(a, K, xq, sx, reinterpret_cast<int*>(sx + nunits), red);
  }
  __device__ static float fma(const uint4 w, __half s, const uint4* smem, int nunits, int m, float acc) {
    // sum (u - 8) x = sum u x - 8 sum x, in exact int32; one float conversion per unit and row
    const int2* xq = reinterpret_cast<const int2*>(smem);
    const float* sx = reinterpret_cast<const float*>(xq + 4 * nunits);
    const int* xsum = reinterpret_cast<const int*>(sx + nunits);
    return fmaf(__half2float(s) * sx[m], unit_dot_i8(w, xq, nunits, m) - 8.f * (float)xsum[m], acc);
  }
};

}  // namespace
}  // namespace nq

// Against W @ x in float64: the int8 quantisation of x (~4e-3 relative on a row at these K, bench/NOTES.md)
// dominates; 1.5e-2 keeps every draw of these K >= 3584 shapes inside while an indexing mistake fails.
constexpr double kTolInt8Activations = 1.5e-2;

int main() {
  dev::raise_smem(nq::gemv_int4_v2<nq::GEMV_STORE, 2, nq::Q8Units>);
  const int sms = dev::sm_count();
  return dev::run_gemv_shapes("gemv_int4 with int8 x + dp4a", [&](const nq::GemvArgs& a, int rows) {
    dev::must(nq::launch_gemv_int4_v2<nq::GEMV_STORE, 2, nq::Q8Units>(a, rows, sms, 0));
  }, kTolInt8Activations, false);
}
