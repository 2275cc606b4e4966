// The first INT4 GEMV ("v1"), kept for comparison: the library's row-pair kernel (gemv_rowpair: one warp per row
// pair, a two-stage software pipeline that drains and refills at every row, 3 blocks/SM) with INT4 rows. gemv_int4
// in the library runs one pipeline across all of a warp's rows and splits K over warp groups instead.
// DP4A = false: x staged as f16, the library's unit_dot_f16; DP4A = true: x quantised to int8 per 32 values in every
// block (stage_x_i8) and dp4a on the codes.
#pragma once
#include "gemv_dev.cuh"
#include "int8_x.cuh"

namespace nq {
namespace {

// Two rows at once (W0 row0, and W1 row1 when has1): all their loads of one step are issued before any use.
template <bool DP4A>
__device__ __forceinline__ void dot2_int4(const RowRef r0, const RowRef r1, bool has1, int K,
                                          const void* smem, int lane, float& y0, float& y1) {
  const int nunits = K >> 5;
  const uint4* wr0 = r0.w;
  const uint4* wr1 = r1.w;
  const __half* sr0 = r0.s;
  const __half* sr1 = r1.s;
  const int gshift0 = r0.gshift, gshift1 = r1.gshift;  // units (32 values) per group = 2^gshift
  const uint4* xs = static_cast<const uint4*>(smem);
  const int2* xq = static_cast<const int2*>(smem);
  const float* sx = reinterpret_cast<const float*>(xq + 4 * nunits);
  const int* xsum = reinterpret_cast<const int*>(sx + nunits);
  // two-stage software pipeline: the loads of step i+1 are in flight while step i is computed
  constexpr int U = kUnroll;
  float acc0 = 0.f, acc1 = 0.f;
  uint4 a0[U], a1[U];
  __half as0[U], as1[U];
  auto load = [&](int base, uint4 (&w0)[U], uint4 (&w1)[U], __half (&s0)[U], __half (&s1)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int m = base + u * 32 + lane;
      if (m < nunits) {
        w0[u] = ld_stream16(wr0 + m);
        s0[u] = sr0[m >> gshift0];
        if (has1) {
          w1[u] = ld_stream16(wr1 + m);
          s1[u] = sr1[m >> gshift1];
        }
      }
    }
  };
  load(0, a0, a1, as0, as1);
  for (int base = 0; base < nunits; base += 32 * U) {
    uint4 b0[U], b1[U];
    __half bs0[U], bs1[U];
    const bool more = base + 32 * U < nunits;
    if (more) load(base + 32 * U, b0, b1, bs0, bs1);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int m = base + u * 32 + lane;
      if (m < nunits) {
        if (DP4A) {
          const float xs8 = 8.f * (float)xsum[m];
          acc0 = fmaf(__half2float(as0[u]) * sx[m], unit_dot_i8(a0[u], xq, nunits, m) - xs8, acc0);
          if (has1) acc1 = fmaf(__half2float(as1[u]) * sx[m], unit_dot_i8(a1[u], xq, nunits, m) - xs8, acc1);
        } else {
          acc0 = fmaf(__half2float(as0[u]), unit_dot_f16(a0[u], xs, nunits, m), acc0);
          if (has1) acc1 = fmaf(__half2float(as1[u]), unit_dot_f16(a1[u], xs, nunits, m), acc1);
        }
      }
    }
    if (more) {
#pragma unroll
      for (int u = 0; u < U; u++) { a0[u] = b0[u]; a1[u] = b1[u]; as0[u] = bs0[u]; as1[u] = bs1[u]; }
    }
  }
  y0 = warp_sum(acc0);
  y1 = warp_sum(acc1);
}

template <bool DP4A>
struct Int4Rows {
  static constexpr int WT = WT_INT4;
  static constexpr int kUnitShift = 5;  // 32 values per 16-byte unit
  __device__ static void stage(const GemvArgs& a, int K, uint4* smem, float* red) {
    if (DP4A) {
      const int nunits = K >> 5;
      int2* xq = reinterpret_cast<int2*>(smem);
      float* sx = reinterpret_cast<float*>(xq + 4 * nunits);
      stage_x_i8(a, K, xq, sx, reinterpret_cast<int*>(sx + nunits), red);
    } else {
      stage_x_f16<WT_INT4>(a, K, smem, red);
    }
  }
  __device__ static void dot2(const RowRef r0, const RowRef r1, bool has1, int K, const void* smem, int lane,
                              float& y0, float& y1) {
    dot2_int4<DP4A>(r0, r1, has1, K, smem, lane, y0, y1);
  }
};

}  // namespace
}  // namespace nq

namespace dev {
// Run the v1 kernel over the 7B shapes (STORE mode) against the CPU reference with tolerance `tol`.
template <bool DP4A>
int run_gemv_v1(const char* title, double tol) {
  auto kernel = nq::gemv_rowpair<nq::Int4Rows<DP4A>, nq::GEMV_STORE>;
  DEV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, nq::kMaxDynSmem));
  const int sms = sm_count();
  return run_gemv_shapes(title, [&](const nq::GemvArgs& a, int rows) {
    const int K = a.seg[0].K;
    const size_t smem = DP4A ? (size_t)(K / 32) * (32 + 8) : (size_t)K * 2;  // int8 x + scale + sum, or f16 x
    const int grid = std::min((rows + 2 * nq::kWarps - 1) / (2 * nq::kWarps), sms * 3);
    kernel<<<grid, nq::kThreads, smem>>>(a, rows);
  }, tol, !DP4A);
}
}  // namespace dev
