// The product's prefill attention kernel before Session 13's promotion (attn_prefill_kernel of csrc/src/attention.cu
// at 2b3fde4, "v1"), kept only as a baseline for csrc/dev/attn_prefill_fa.cu. Its design is in the comment below;
// bench/NOTES.md "Session 13: prefill attention (helper)" says why it was replaced.
#pragma once
#include "kernels.h"
#include "device_util.cuh"
#include "launch.h"
#include "cp_async.cuh"
#include <math_constants.h>

namespace nq {
namespace v1 {

constexpr int kAttnWarps = 4, kAttnThreads = kAttnWarps * 32, kMaxG = 8;
constexpr int kKT = 32;          // keys per shared-memory tile

__device__ __forceinline__ size_t kv_row(const int* page_table, int n_kv, int key, int h, int D) {
  const int page = page_table[key / kPage];
  return (((size_t)page * n_kv + h) * kPage + (key % kPage)) * (size_t)D;
}

// ---- Prefill attention (M > 1 query tokens, causal), tensor cores ------------------------------------------------
// Grid (n_kv, ceil(M / kPQ)): block (h, b) serves query tokens b*kPQ .. b*kPQ+kPQ-1 for the G heads of KV head h:
// R = kPQ*G <= 64 rows (row r = token r / G, head r % G; rows >= R or past M are zero and never written), all keys
// 0 .. the block's last position, in tiles of kKT = 32 keys (cp.async, double buffer) shared by all rows.
// Warp w owns rows 16w .. 16w+15 and computes, per tile, S = Q K^T (m16 x n32, 8 k-steps over D = 128) and
// O += P V (m16 x nD, 2 k-steps over the 32 keys) with mma.sync m16n8k16 (f16 in, f32 accumulate), the FA2 way:
//   A(Q)  : ldmatrix.x4 of Q rows (row-major [row][d]) -> a01 a23 a45 a67 (loaded once, kept in registers);
//   B(K)  : ldmatrix.x4 of K rows ([key][d] is B's "col" layout: B[k=d][n=key]) -> b01 b23 of two key tiles;
//   S     : c01 = (row g, keys 8n+2t, +1), c23 = (row g+8, same keys), g = lane/4, t = lane%4;
//   A(P)  : the S fragments of key tiles 2k, 2k+1 ARE the A fragment of k-step k (rounded to f16 pairs);
//   B(V)  : ldmatrix.x4.trans of V rows ([key][d]: B[k=key][n=d] needs the transpose) -> b01 b23 of two dim tiles.
// Online softmax per row in the log2 domain: the 4 lanes of a quad hold a row's 32 scores (max: 2 shuffles);
// each lane keeps a partial row sum l, reduced over the quad once at the end (on CUDA cores the same work took
// 181 us per 7B layer at M = 512; bench/NOTES.md).
constexpr int kPQ = 8;   // query tokens per prefill block
constexpr int kPR = 64;  // rows per block (kPQ * G <= kPQ * kMaxG = 64): 4 warps x m16

template <int D>
struct PrefSmem {
  static constexpr int LD = D + 8;  // f16 row stride: 8 rows read by one ldmatrix phase are 16 B apart mod 128 B
  __half q[kPR][LD];                // roped q * log2(e)/sqrt(D), f16
  __half k[2][kKT][LD];
  __half v[2][kKT][LD];
};

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) { return h2_as_u32(__floats2half2_rn(lo, hi)); }

// K and V rows of keys [kt0, kt0 + kKT) into buffer `buf`; rows at or past k1 are zeroed (P is 0 there, but
// 0 * (stale NaN) would not be).
template <int D>
__device__ __forceinline__ void load_tile_rows(const AttnArgs& a, PrefSmem<D>& S, int buf, int kt0, int k1, int h) {
  constexpr int CPR = D / 8;
  for (int c = threadIdx.x; c < kKT * CPR; c += kAttnThreads) {
    const int j = c / CPR, part = c % CPR, key = kt0 + j;
    if (key < k1) {
      const size_t off = kv_row(a.page_table, a.n_kv, key, h, D) + part * 8;
      cp_async16(&S.k[buf][j][part * 8], a.kv.k + off);
      cp_async16(&S.v[buf][j][part * 8], a.kv.v + off);
    } else {
      *reinterpret_cast<uint4*>(&S.k[buf][j][part * 8]) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(&S.v[buf][j][part * 8]) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  cp_async_commit();
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads) attn_prefill_kernel_v1(const AttnArgs a) {
  constexpr int KS = D / 16;  // k-steps of Q K^T
  constexpr int ND = D / 8;   // n8 tiles of the output dims
  extern __shared__ __align__(16) unsigned char attn_smem[];
  PrefSmem<D>& S = *reinterpret_cast<PrefSmem<D>*>(attn_smem);
  pdl_wait();
  pdl_trigger();
  // the token tiles in reverse: blocks start in blockIdx order, and a later tile reads more keys (causal), so the
  // longest blocks start first and the short ones fill the last wave (a grid of several waves: long prompts)
  const int h = blockIdx.x, t0 = (gridDim.y - 1 - blockIdx.y) * kPQ;
  const int G = a.n_heads / a.n_kv, R = kPQ * G;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int pos0 = *a.pos0;
  const int nq = min(kPQ, a.M - t0);
  const int n_keys = pos0 + t0 + nq;  // keys 0 .. the position of the block's last token
  const int ntiles = (n_keys + kKT - 1) / kKT;
  load_tile_rows<D>(a, S, 0, 0, n_keys, h);
  if (ntiles > 1) load_tile_rows<D>(a, S, 1, kKT, n_keys, h);

  const float qscale = 1.4426950408889634f * rsqrtf((float)D);
  // kPR * D/2 pairs over the block's threads, unrolled so that several iterations' global loads (q from QKV, the
  // rope row) are in flight at once instead of one L2 round trip per iteration
  static_assert(kPR * (D / 2) % kAttnThreads == 0, "q staging: whole iterations per thread");
#pragma unroll 8
  for (int it = 0; it < kPR * (D / 2) / kAttnThreads; it++) {
    const int i = tid + it * kAttnThreads;
    const int r = i / (D / 2), d = i % (D / 2);
    // rows past R or past the block's tokens are zero; they load row 0's values (token t0 exists) instead of
    // branching, so the loads of the unrolled iterations issue together
    const bool valid = r < R && r / G < nq;
    const int tq = valid ? r / G : 0, hg = valid ? r % G : 0;
    const float* qin = a.qkv + (size_t)(t0 + tq) * a.qkv_stride + (h * G + hg) * D;
    const float2 cs = a.rope[(size_t)(pos0 + t0 + tq) * (D / 2) + d];
    const float x0 = qin[d], x1 = qin[d + D / 2];
    const float y0 = valid ? (x0 * cs.x - x1 * cs.y) * qscale : 0.f;
    const float y1 = valid ? (x1 * cs.x + x0 * cs.y) * qscale : 0.f;
    S.q[r][d] = __float2half_rn(y0);
    S.q[r][d + D / 2] = __float2half_rn(y1);
  }
  __syncthreads();  // q staged
  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: this lane addresses row mr of matrix mi
  uint32_t qa[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ks++) ldsm_x4(qa[ks], &S.q[warp * 16 + (mi & 1) * 8 + mr][ks * 16 + (mi >> 1) * 8]);

  int rpos[2];  // positions of rows g and g+8 of this warp; -1: no such row (all keys masked)
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int r = warp * 16 + g + hr * 8;
    rpos[hr] = (r < R && r / G < nq) ? pos0 + t0 + r / G : -1;
  }
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f};
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  for (int it = 0; it < ntiles; it++) {
    const int buf = it & 1, kt0 = it * kKT;
    if (it + 1 < ntiles) cp_async_wait<1>(); else cp_async_wait<0>();
    __syncthreads();  // this tile landed for every thread
    float sc[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
#pragma unroll
      for (int np = 0; np < 2; np++) {  // key tiles 2np, 2np+1
        uint32_t b[4];
        ldsm_x4(b, &S.k[buf][np * 16 + (mi >> 1) * 8 + mr][ks * 16 + (mi & 1) * 8]);
        mma16816(sc[2 * np], qa[ks], b[0], b[1]);
        mma16816(sc[2 * np + 1], qa[ks], b[2], b[3]);
      }
    }
    float corr[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int key = kt0 + n * 8 + 2 * t + e;
          float& v = sc[n][hr * 2 + e];
          v = key <= rpos[hr] ? v : -CUDART_INF_F;  // causal mask (and rows that do not exist)
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[hr], mx);
      const bool none = m_new == -CUDART_INF_F;  // no key of this row seen yet
      corr[hr] = none ? 1.f : exp2f(m[hr] - m_new);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float& v = sc[n][hr * 2 + e];
          v = v == -CUDART_INF_F ? 0.f : exp2f(v - m_new);
          sum += v;
        }
      l[hr] = l[hr] * corr[hr] + sum;  // this lane's part of the row sum
      m[hr] = m_new;
    }
#pragma unroll
    for (int n = 0; n < ND; n++) {
      o[n][0] *= corr[0]; o[n][1] *= corr[0];
      o[n][2] *= corr[1]; o[n][3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {  // keys 16kk .. 16kk+15
      uint32_t pa[4];
      pa[0] = pack_h2(sc[2 * kk][0], sc[2 * kk][1]);
      pa[1] = pack_h2(sc[2 * kk][2], sc[2 * kk][3]);
      pa[2] = pack_h2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
      pa[3] = pack_h2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < ND / 2; dp++) {  // dim tiles 2dp, 2dp+1
        uint32_t b[4];
        ldsm_x4_t(b, &S.v[buf][kk * 16 + (mi & 1) * 8 + mr][dp * 16 + (mi >> 1) * 8]);
        mma16816(o[2 * dp], pa, b[0], b[1]);
        mma16816(o[2 * dp + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // buffer `buf` is free
    if (it + 2 < ntiles) load_tile_rows<D>(a, S, buf, kt0 + 2 * kKT, n_keys, h);
  }
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    float lt = l[hr];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    if (rpos[hr] < 0) continue;
    const int r = warp * 16 + g + hr * 8, tq = r / G, hg = r % G;
    const float inv = 1.f / lt;  // lt >= 1: the row's maximum contributes exp2(0)
    __half* dst = a.out + (size_t)(t0 + tq) * a.n_heads * D + (h * G + hg) * D + 2 * t;
#pragma unroll
    for (int n = 0; n < ND; n++)
      *reinterpret_cast<__half2*>(dst + n * 8) = __floats2half2_rn(o[n][hr * 2] * inv, o[n][hr * 2 + 1] * inv);
  }
}

template <int D>
int launch_prefill_v1(dim3 grid, const AttnArgs& a, cudaStream_t st) {
  const size_t smem = sizeof(PrefSmem<D>);  // > 48 KB: opt in once per instantiation
  static const cudaError_t raised =
      cudaFuncSetAttribute(attn_prefill_kernel_v1<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (raised != cudaSuccess) return fail(NQ_E_CUDA, "attention: shared memory opt-in: %s", cudaGetErrorString(raised));
  return launch_pdl("attn_prefill_kernel_v1", attn_prefill_kernel_v1<D>, grid, dim3(kAttnThreads), smem, st, a);
}

// v1's prefill path of attention(): n_split 1, M > 1, no pos_of
inline int attention_prefill_v1(const AttnArgs& a, cudaStream_t st) {
  const dim3 grid(a.n_kv, (a.M + kPQ - 1) / kPQ);
  if (a.D == 128) return launch_prefill_v1<128>(grid, a, st);
  return launch_prefill_v1<64>(grid, a, st);
}

}  // namespace v1
}  // namespace nq
