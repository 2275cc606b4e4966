// INT4 GEMV v1 with int8 activations: every block quantises x per 32 values (scale amax/127, scalar loads), the
// inner loop is dp4a on the codes (~3x fewer instructions per byte). Lost to the f16 unpack: 7B down 47.28 vs
// 25.12 us, qkv 11.11 vs 7.99 us, gate a tie (17.91 vs 17.76); the per-block quantisation prologue dominates at
// large K (bench/NOTES.md, "INT4 GEMV v1: f16 unpack vs int8-activation dp4a").
//   make -C csrc/dev && build/dev/gemv_int4_dp4a
#include "gemv_v1.cuh"

// Against W @ x in float64: x quantised to int8 per 32 values adds ~1/(2*127*sqrt(3)) ~ 2.3e-3 relative error per
// value, ~4e-3 relative on a row at these K (bench/NOTES.md); the f16-level errors are far smaller. 1.5e-2 keeps
// every draw of these K >= 3584 shapes inside while any indexing mistake (error ~1) fails.
constexpr double kTolInt8Activations = 1.5e-2;

int main() { return dev::run_gemv_v1<true>("gemv_int4_v1 with int8 x + dp4a", kTolInt8Activations); }
