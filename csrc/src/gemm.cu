// Prefill GEMM on tensor cores: C[M, N] (+)= A[M, K] @ W[N, K]^T (+ bias), A f16, W int4 (layout 1) or f16/bf16,
// f32 accumulate (wmma m16n16k16). Block tile 64 (tokens) x 128 (weight rows) x 64 (k), 8 warps as 2 x 4, each
// warp 32 x 32. The int4 tile (128 rows x 64 k = 2 units of 32 values per row) is dequantised into shared memory
// as f16 (u - 8) * scale; the next tile's global loads are issued before the current tile's MMAs.
#include "kernels.h"
#include "device_util.cuh"
#include <mma.h>

namespace nq {
namespace {
using namespace nvcuda;

constexpr int BM = 64, BN = 128, BK = 64, LDS = BK + 8, kGemmThreads = 256;
constexpr int kSmemAB = (BM + BN) * LDS * 2;          // bytes of the A and W tiles (f16)
constexpr int kSmemC = BM * (BN + 4) * 4;             // bytes of the f32 output staging
constexpr int kGemmSmem = kSmemAB > kSmemC ? kSmemAB : kSmemC;

template <int WT>
struct WTile {  // registers holding one W tile's global data for one thread
  uint4 r[WT == WT_INT4 ? 1 : 4];
  __half s;
};

template <int WT>
__device__ __forceinline__ void load_w(const LinW& W, int n0, int k0, WTile<WT>& t) {
  const int tid = threadIdx.x;
  if (WT == WT_INT4) {
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
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int idx = tid + i * kGemmThreads;  // 128 rows x 8 chunks of 8 values
      const int row = idx >> 3, c = idx & 7;
      const int n = n0 + row;
      if (n < W.N) t.r[i] = ld_stream16(reinterpret_cast<const uint4*>(W.w) + ((size_t)n * W.K + k0) / 8 + c);
      else t.r[i] = make_uint4(0, 0, 0, 0);
    }
  }
}

template <int WT>
__device__ __forceinline__ void store_w(const WTile<WT>& t, __half* Ws) {
  const int tid = threadIdx.x;
  if (WT == WT_INT4) {
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
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int idx = tid + i * kGemmThreads;
      const int row = idx >> 3, c = idx & 7;
      uint4 v = t.r[i];
      if (WT == WT_BF16) {  // bf16 -> f16
        uint32_t vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
          vv[e] = h2_as_u32(__floats2half2_rn(bf16_bits_to_float(vv[e] & 0xffffu), bf16_bits_to_float(vv[e] >> 16)));
        v = make_uint4(vv[0], vv[1], vv[2], vv[3]);
      }
      *reinterpret_cast<uint4*>(Ws + row * LDS + c * 8) = v;
    }
  }
}

__device__ __forceinline__ void load_a(const __half* A, int lda, int M, int m0, int k0, uint4 (&r)[2]) {
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int idx = threadIdx.x + i * kGemmThreads;  // 64 rows x 8 chunks
    const int row = idx >> 3, c = idx & 7;
    const int m = m0 + row;
    r[i] = m < M ? *reinterpret_cast<const uint4*>(A + (size_t)m * lda + k0 + c * 8) : make_uint4(0, 0, 0, 0);
  }
}
__device__ __forceinline__ void store_a(const uint4 (&r)[2], __half* As) {
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int idx = threadIdx.x + i * kGemmThreads;
    const int row = idx >> 3, c = idx & 7;
    *reinterpret_cast<uint4*>(As + row * LDS + c * 8) = r[i];
  }
}

// Up to 3 weights sharing A (q/k/v, gate/up) in one launch: blockIdx.x runs over the N tiles of segment 0, then 1,
// then 2; each block computes one tile of one segment exactly as a single-weight launch would (one launch instead of
// three: the k/v GEMMs alone had only 4 x 8 blocks and took 52 us each at M = 512, as long as q's 28 x 8).
struct GemmSeg {
  LinW W;
  float* C;                // output columns of this segment (row stride ldc)
  const float* bias;       // f32 (W.N) or null
};
struct GemmGroup {
  GemmSeg s[3];
  int n = 1;               // segments used
  int tiles0 = 0, tiles1 = 0;  // N tiles of segments 0 and 1
};

template <int WT>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(const GemmGroup g, const __half* A, int lda, int M,
                                                            int ldc, int add) {
  extern __shared__ __align__(16) unsigned char gsm[];
  __half* As = reinterpret_cast<__half*>(gsm);
  __half* Ws = As + BM * LDS;
  float* Cs = reinterpret_cast<float*>(gsm);
  const int bx = blockIdx.x;
  const bool in1 = g.n > 1 && bx >= g.tiles0, in2 = g.n > 2 && bx >= g.tiles0 + g.tiles1;  // segment by tile
  const LinW W = in2 ? g.s[2].W : in1 ? g.s[1].W : g.s[0].W;
  float* const C = in2 ? g.s[2].C : in1 ? g.s[1].C : g.s[0].C;
  const float* const bias = in2 ? g.s[2].bias : in1 ? g.s[1].bias : g.s[0].bias;
  const int n0 = (bx - (in2 ? g.tiles0 + g.tiles1 : in1 ? g.tiles0 : 0)) * BN, m0 = blockIdx.y * BM;
  const int warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps, 32 x 32 each
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);

  uint4 ar[2];
  WTile<WT> wt;
  load_a(A, lda, M, m0, 0, ar);
  load_w<WT>(W, n0, 0, wt);
  for (int k0 = 0; k0 < W.K; k0 += BK) {
    __syncthreads();  // previous tile's MMAs are done with the shared tiles
    store_a(ar, As);
    store_w<WT>(wt, Ws);
    __syncthreads();
    if (k0 + BK < W.K) {  // prefetch the next tile while the tensor cores work
      load_a(A, lda, M, m0, k0 + BK, ar);
      load_w<WT>(W, n0, k0 + BK, wt);
    }
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], As + (wm * 32 + i * 16) * LDS + kk, LDS);
#pragma unroll
      for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], Ws + (wn * 32 + j * 16) * LDS + kk, LDS);
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 2; j++)
      wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * (BN + 4) + wn * 32 + j * 16, acc[i][j], BN + 4,
                              wmma::mem_row_major);
  __syncthreads();
  for (int idx = threadIdx.x; idx < BM * BN; idx += kGemmThreads) {
    const int r = idx / BN, c = idx % BN;
    const int m = m0 + r, n = n0 + c;
    if (m < M && n < W.N) {
      float v = Cs[r * (BN + 4) + c] + (bias ? bias[n] : 0.f);
      float* dst = C + (size_t)m * ldc + n;
      if (add) v += *dst;
      *dst = v;
    }
  }
}

template <int WT>
int launch_gemm(const GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add, cudaStream_t st) {
  static bool raised = false;
  if (!raised) {
    NQ_CUDA(cudaFuncSetAttribute(gemm_kernel<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kGemmSmem));
    raised = true;
  }
  dim3 grid(tiles, (M + BM - 1) / BM);
  gemm_kernel<WT><<<grid, kGemmThreads, kGemmSmem, st>>>(g, A, lda, M, ldc, add ? 1 : 0);
  NQ_LAUNCH_CHECK("gemm_kernel");
  return NQ_OK;
}

}  // namespace

int gemm_multi(const LinW* W, float* const* C, const float* const* bias, int n, const __half* A, int lda, int M,
               int ldc, bool add, cudaStream_t st) {
  if (n < 1 || n > 3) return fail(NQ_E_INVALID_ARG, "gemm: %d segments (1..3)", n);
  for (int i = 0; i < n; i++)
    if (M <= 0 || W[i].K % BK != 0 || lda % 8 != 0)
      return fail(NQ_E_UNSUPPORTED, "gemm: needs K %% 64 == 0 (K=%d), lda %% 8 == 0 (lda=%d), M > 0 (M=%d)", W[i].K,
                  lda, M);
  bool same = true;
  for (int i = 1; i < n; i++) same = same && W[i].K == W[0].K && W[i].type == W[0].type;
  if (!same) {  // segments of different K or dtype: one launch each
    for (int i = 0; i < n; i++) NQ_TRY(gemm_multi(W + i, C + i, bias + i, 1, A, lda, M, ldc, add, st));
    return NQ_OK;
  }
  GemmGroup g;
  g.n = n;
  int tiles = 0;
  for (int i = 0; i < n; i++) {
    g.s[i].W = W[i];
    g.s[i].C = C[i];
    g.s[i].bias = bias[i];
    const int t = (W[i].N + BN - 1) / BN;
    if (i == 0) g.tiles0 = t;
    if (i == 1) g.tiles1 = t;
    tiles += t;
  }
  if (W[0].type == WT_INT4) return launch_gemm<WT_INT4>(g, tiles, A, lda, M, ldc, add, st);
  if (W[0].type == WT_F16) return launch_gemm<WT_F16>(g, tiles, A, lda, M, ldc, add, st);
  if (W[0].type == WT_BF16) return launch_gemm<WT_BF16>(g, tiles, A, lda, M, ldc, add, st);
  return fail(NQ_E_UNSUPPORTED, "gemm: weight type %d", W[0].type);
}

int gemm(const LinW& W, const __half* A, int lda, int M, float* C, int ldc, const float* bias, bool add,
         cudaStream_t st) {
  return gemm_multi(&W, &C, &bias, 1, A, lda, M, ldc, add, st);
}

}  // namespace nq
