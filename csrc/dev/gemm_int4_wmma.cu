// The first prefill GEMM for INT4 weights: the wmma m16n16k16 kernel (the library's f16/bf16 path) with the int4
// tile dequantised into shared memory as f16 (u - 8) * scale by every block. Lost to gemm_int4_mma (mma.sync, the
// words consumed as stored): 7B at M = 512 gate+up 671.8 vs 448.6 us, down 373.7 vs 278.2 us, per layer 1297 vs 992
// us, TTFT(512) 39.7 vs 30.9 ms on the H200 (bench/NOTES.md, "Prefill GEMM v2").
//   make -C csrc/dev && build/dev/gemm_int4_wmma
#include "gemm_dev.cuh"

namespace nq {
namespace {
// INT4 hooks of gemm_kernel (gemm_kernels.cuh): one 16-byte unit (32 values) and its scale per thread, dequantised
// into the f16 W tile.
template <>
struct WTile<WT_INT4> {
  uint4 r[1];
  __half s;
};

template <>
__device__ __forceinline__ void load_w<WT_INT4>(const LinW& W, int n0, int k0, WTile<WT_INT4>& t) {
  const int tid = threadIdx.x;
  const int row = tid >> 1, unit = tid & 1;  // 128 rows x 2 units
  const int n = n0 + row;
  if (n < W.N) {
    const int nunits = W.K >> 5;
    const int m = (k0 >> 5) + unit;
    t.r[0] = ld_stream16(reinterpret_cast<const uint4*>(W.w) + (size_t)n * nunits + m);
    t.s = W.scales[(size_t)n * (W.K / W.group) + (m * 32) / W.group];
  } else {
    t.r[0] = make_uint4(0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u);  // codes 8 = 0
    t.s = __float2half(0.f);
  }
}

template <>
__device__ __forceinline__ void store_w<WT_INT4>(const WTile<WT_INT4>& t, __half* Ws) {
  const int tid = threadIdx.x;
  const int row = tid >> 1, unit = tid & 1;
  const __half2 magic = __half2half2(__ushort_as_half((unsigned short)0x6408));
  const __half2 s2 = __half2half2(t.s);
  const uint32_t ws[4] = {t.r[0].x, t.r[0].y, t.r[0].z, t.r[0].w};
  __half* dst = Ws + row * LDS + unit * 32;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    uint4 o;
    const uint32_t q = ws[j];
    o.x = h2_as_u32(__hmul2(__hsub2(u32_as_h2((q & 0x000F000Fu) | 0x64006400u), magic), s2));
    o.y = h2_as_u32(__hmul2(__hsub2(u32_as_h2(((q >> 4) & 0x000F000Fu) | 0x64006400u), magic), s2));
    o.z = h2_as_u32(__hmul2(__hsub2(u32_as_h2(((q >> 8) & 0x000F000Fu) | 0x64006400u), magic), s2));
    o.w = h2_as_u32(__hmul2(__hsub2(u32_as_h2(((q >> 12) & 0x000F000Fu) | 0x64006400u), magic), s2));
    *reinterpret_cast<uint4*>(dst + j * 8) = o;
  }
}
}  // namespace
}  // namespace nq

int main() {
  return dev::run_gemm_shapes("wmma m16n16k16 with int4 dequantised into shared memory", [](const nq::LinW& W,
                                                                                          const __half* A, int M,
                                                                                          float* C) {
    const nq::GemmGroup g = dev::single(W, C, nq::BN);
    dev::must(nq::launch_gemm<nq::WT_INT4>(g, g.tiles0, A, W.K, M, W.N, false, 0));
  });
}
