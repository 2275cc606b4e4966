// INT4 GEMV v1: one warp per row pair, a two-stage pipeline drained and refilled at every row, f16 unpack,
// 3 blocks/SM. Lost to gemv_int4 (split-K groups, one pipeline across rows): 7B per-layer GEMVs 72.0 vs 51.0 us,
// decode 3.272 vs 2.741 ms/token on the H200 (bench/NOTES.md, "INT4 GEMV v2").
//   make -C csrc/dev && build/dev/gemv_int4_v1
#include "gemv_v1.cuh"

// x rounded to f16 (2^-12 relative), f16 products with 8-deep f16 partial sums (~2^-12 each), f32 above: ~5e-4
// expected against the float64 reference of W @ f16(x).
constexpr double kTolF16Unpack = 3e-3;

int main() { return dev::run_gemv_v1<false>("gemv_int4_v1 (f16 unpack, per-row pipeline)", kTolF16Unpack); }
