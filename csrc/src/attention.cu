// Paged-KV attention (decode and prefill share it) + RoPE/KV-cache write.
//
// Grid (n_kv, n_split, M): block (h, s, t) serves query token t (position *pos0 + t; in a batched decode, token t of
// sequence t at pos_of[t] in kv_of[t] through page_table_of[t]) for the G = n_heads/n_kv
// query heads of KV head h, over keys [s*kps, min((s+1)*kps, pos+1)): the G heads share one read of K and V.
// kps = max(keys_per_split, ceil32((pos+1)/n_split)) is computed from the position at run time, so every split
// has work at any context length and one captured graph serves all positions; blocks past the last used split
// return at once.
//
// The block copies K and V in tiles of kKT = 32 keys into shared memory with cp.async (two tiles in flight: double
// buffer; one memory round trip before the first score), then
//   scores + online softmax: warp w takes heads w, w+4 (lane = key; the K row is read from shared memory),
//   P.V: thread tid owns dim tid % D of heads tid / D + kTPD*i (V read from shared memory, P broadcast),
// all loops short and rolled over the heads' registers only: the code is a few KB (a fully unrolled version grew to
// ~100-150 KB of SASS per kernel, whose instruction fetch made it a fixed ~30 us per block: bench/NOTES.md).
// One split: the block writes the f16 output itself. Several: each writes a partial (m, l, o[D]) per head; the last
// block of (t, h) to finish (atomic counter over the USED splits) merges them and re-arms the counter.
// Decode (write_kv): the block whose key range holds the current position writes rope(k), v into the cache and
// puts the same f16 row into its shared tile directly (no write-then-read round trip).
#include "kernels.h"
#include "device_util.cuh"
#include "launch.h"
#include "cp_async.cuh"
#include <math_constants.h>

namespace nq {
namespace {

constexpr int kAttnWarps = 4, kAttnThreads = kAttnWarps * 32, kMaxG = 8;
constexpr int kMaxSplits = 128;  // attention splits per (token, KV head): bounds the merge's shared memory
constexpr int kKT = 32;          // keys per shared-memory tile (= lanes of a warp in the score phase)

template <int D>
struct AttnSmem {
  static constexpr int KLD = D + 8;  // K row stride (halves): rows 16 B apart mod 128 B -> the score phase's
                                     // 16-byte loads (8 lanes = 8 rows at one column) hit distinct banks
  float q[kMaxG][D];                 // roped q of the G heads, times log2(e)/sqrt(D): scores in the log2 domain
  union {
    struct {
      __half k[2][kKT][KLD];         // K tiles (double buffer)
      __half v[2][kKT][D];           // V tiles
    } t;
    struct {
      float w[kMaxG][kMaxSplits];    // merge: per split m, then its weight exp2(m_s - max)
      float l[kMaxG][kMaxSplits];    // merge: per split l
    } mg;
  } u;
  float p[kMaxG][kKT];               // probabilities of the current tile (0 for keys past the range)
  float m[kMaxG], l[kMaxG], corr[kMaxG], inv[kMaxG];
  __align__(16) __half knew[D];      // decode: this step's roped k and v (the cache row at pos)
  __align__(16) __half vnew[D];
  int last;
};

__device__ __forceinline__ size_t kv_row(const int* page_table, int n_kv, int key, int h, int D) {
  const int page = page_table[key / kPage];
  return (((size_t)page * n_kv + h) * kPage + (key % kPage)) * (size_t)D;
}

// cp.async the K and V rows of keys [kt0, min(kt0 + kKT, k1)) into buffer `buf` (the row at `skip` excepted:
// the decode block fills it from registers); one commit group per tile.
template <int D>
__device__ __forceinline__ void load_tile(const KvLayer& kv, const int* pt, int n_kv, AttnSmem<D>& S, int buf, int kt0,
                                          int k1, int h, int skip) {
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < kKT * CPR; c += kAttnThreads) {
    const int j = c / CPR, part = c % CPR, key = kt0 + j;
    if (key < k1 && key != skip) {
      const size_t off = kv_row(pt, n_kv, key, h, D) + part * 8;
      cp_async16(&S.u.t.k[buf][j][part * 8], kv.k + off);
      cp_async16(&S.u.t.v[buf][j][part * 8], kv.v + off);
    }
  }
  cp_async_commit();
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads) attn_kernel(const AttnArgs a) {
  constexpr int kTPD = kAttnThreads / D;  // threads per output dim in the P.V phase (1 for D=128, 2 for D=64)
  constexpr int kHPT = kMaxG / kTPD;      // heads per thread in the P.V phase
  __shared__ __align__(16) AttnSmem<D> S;

  pdl_wait();  // position, qkv and the cache come from earlier kernels
  pdl_trigger();
  const int h = blockIdx.x, split = blockIdx.y, t = blockIdx.z;
  const int G = a.n_heads / a.n_kv;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int pos = a.pos_of ? a.pos_of[t] : *a.pos0 + t;
  const KvLayer kv = a.kv_of ? a.kv_of[t] : a.kv;                  // this token's sequence: its cache
  const int* pt = a.page_table_of ? a.page_table_of[t] : a.page_table;   // and its page table
  const int n_keys = pos + 1;
  // keys per split: at least keys_per_split, and large enough that n_split splits cover the n_keys keys
  const int kps = max(a.keys_per_split, ((n_keys + a.n_split - 1) / a.n_split + kKT - 1) / kKT * kKT);
  const int n_used = (n_keys + kps - 1) / kps;  // splits with keys (<= n_split)
  if (split >= n_used) return;                  // uniform per block: no barrier is skipped by part of it
  const int k0 = split * kps, k1 = min(n_keys, k0 + kps);
  const int ntiles = (k1 - k0 + kKT - 1) / kKT;
  const bool own = a.write_kv && pos >= k0 && pos < k1;  // this block writes the cache row at pos
  const int skip = own ? pos : -1;

  load_tile<D>(kv, pt, a.n_kv, S, 0, k0, k1, h, skip);
  if (ntiles > 1) load_tile<D>(kv, pt, a.n_kv, S, 1, k0 + kKT, k1, h, skip);

  const float* qkv = a.qkv + (size_t)t * a.qkv_stride;
  const float2* rope = a.rope + (size_t)pos * (D / 2);
  const float qscale = 1.4426950408889634f * rsqrtf((float)D);
  for (int i = tid; i < G * (D / 2); i += kAttnThreads) {
    const int g = i / (D / 2), d = i % (D / 2);
    const float* qin = qkv + (h * G + g) * D;
    const float2 cs = rope[d];
    const float x0 = qin[d], x1 = qin[d + D / 2];
    S.q[g][d] = (x0 * cs.x - x1 * cs.y) * qscale;
    S.q[g][d + D / 2] = (x1 * cs.x + x0 * cs.y) * qscale;
  }
  if (own) {
    const float* kin = qkv + a.n_heads * D + h * D;
    const float* vin = qkv + (a.n_heads + a.n_kv) * D + h * D;
    const size_t idx = kv_row(pt, a.n_kv, pos, h, D);
    for (int i = tid; i < D / 2; i += kAttnThreads) {
      const float2 cs = rope[i];
      const float x0 = kin[i], x1 = kin[i + D / 2];
      const __half k0h = __float2half_rn(x0 * cs.x - x1 * cs.y), k1h = __float2half_rn(x1 * cs.x + x0 * cs.y);
      const __half v0h = __float2half_rn(vin[i]), v1h = __float2half_rn(vin[i + D / 2]);
      kv.k[idx + i] = k0h; kv.k[idx + i + D / 2] = k1h;
      kv.v[idx + i] = v0h; kv.v[idx + i + D / 2] = v1h;
      S.knew[i] = k0h; S.knew[i + D / 2] = k1h;
      S.vnew[i] = v0h; S.vnew[i + D / 2] = v1h;
    }
  }
  if (tid < kMaxG) { S.m[tid] = -CUDART_INF_F; S.l[tid] = 0.f; }

  float o[kHPT];
#pragma unroll
  for (int i = 0; i < kHPT; i++) o[i] = 0.f;
  const int od = tid % D, og = tid / D;  // P.V: output dim, first head

  for (int it = 0; it < ntiles; it++) {
    const int buf = it & 1, kt0 = k0 + it * kKT, nvalid = min(kKT, k1 - kt0);
    if (it + 1 < ntiles) cp_async_wait<1>(); else cp_async_wait<0>();
    __syncthreads();  // this tile's copies (all threads') landed; q, knew/vnew, m/l staged
    if (own && pos >= kt0 && pos < kt0 + nvalid && tid < D / 8) {
      *reinterpret_cast<uint4*>(&S.u.t.k[buf][pos - kt0][tid * 8]) = *reinterpret_cast<const uint4*>(&S.knew[tid * 8]);
      *reinterpret_cast<uint4*>(&S.u.t.v[buf][pos - kt0][tid * 8]) = *reinterpret_cast<const uint4*>(&S.vnew[tid * 8]);
      __threadfence_block();
    }
    __syncthreads();
    // scores + online softmax: heads warp, warp + 4 (lane = key)
    {
      const int g0 = warp, g1 = warp + kAttnWarps;
      const bool has1 = g1 < G, valid = lane < nvalid;
      float s0 = 0.f, s1 = 0.f;
      if (g0 < G && valid) {
        const __half* kr = S.u.t.k[buf][lane];
#pragma unroll 4
        for (int c = 0; c < D / 8; c++) {
          const uint4 kk = *reinterpret_cast<const uint4*>(kr + c * 8);
          const float2 f0 = __half22float2(u32_as_h2(kk.x)), f1 = __half22float2(u32_as_h2(kk.y));
          const float2 f2 = __half22float2(u32_as_h2(kk.z)), f3 = __half22float2(u32_as_h2(kk.w));
          const float4 qa = *reinterpret_cast<const float4*>(&S.q[g0][c * 8]);
          const float4 qb = *reinterpret_cast<const float4*>(&S.q[g0][c * 8 + 4]);
          s0 += qa.x * f0.x + qa.y * f0.y + qa.z * f1.x + qa.w * f1.y + qb.x * f2.x + qb.y * f2.y + qb.z * f3.x + qb.w * f3.y;
          if (has1) {
            const float4 qc = *reinterpret_cast<const float4*>(&S.q[g1][c * 8]);
            const float4 qd = *reinterpret_cast<const float4*>(&S.q[g1][c * 8 + 4]);
            s1 += qc.x * f0.x + qc.y * f0.y + qc.z * f1.x + qc.w * f1.y + qd.x * f2.x + qd.y * f2.y + qd.z * f3.x + qd.w * f3.y;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int g = r ? g1 : g0;
        if (g < G) {  // warp-uniform
          const float s = valid ? (r ? s1 : s0) : -CUDART_INF_F;
          const float m_old = S.m[g];
          const float m_new = fmaxf(m_old, warp_max(s));  // finite: the tile has >= 1 valid key
          const float p = valid ? exp2f(s - m_new) : 0.f;
          const float lsum = warp_sum(p);
          S.p[g][lane] = p;
          __syncwarp();  // every lane has read S.m[g] / S.l[g] before lane 0 rewrites them (racecheck: intra-warp hazard)
          if (lane == 0) {
            const float c = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
            S.corr[g] = c;
            S.l[g] = S.l[g] * c + lsum;
            S.m[g] = m_new;
          }
        }
      }
    }
    __syncthreads();
    // P.V: o[i] (dim od of head og + kTPD*i) = corr * o + sum_j p_j v_j
#pragma unroll
    for (int i = 0; i < kHPT; i++) {
      const int g = og + kTPD * i;
      if (g < G) o[i] *= S.corr[g];
    }
    const __half* vc = &S.u.t.v[buf][0][od];
#pragma unroll 4
    for (int j = 0; j < nvalid; j++) {
      const float vj = __half2float(vc[j * D]);
#pragma unroll
      for (int i = 0; i < kHPT; i++) {
        const int g = og + kTPD * i;
        if (g < G) o[i] = fmaf(S.p[g][j], vj, o[i]);
      }
    }
    __syncthreads();  // buffer `buf`, p and corr are free
    if (it + 2 < ntiles) load_tile<D>(kv, pt, a.n_kv, S, buf, kt0 + 2 * kKT, k1, h, skip);
  }

  __half* out = a.out + (size_t)t * a.n_heads * D + h * G * D;
  if (n_used == 1) {  // one split: final output directly
#pragma unroll
    for (int i = 0; i < kHPT; i++) {
      const int g = og + kTPD * i;
      if (g < G) out[g * D + od] = __float2half_rn(o[i] / S.l[g]);
    }
    return;
  }
  // partial (m, l, o) of this split, then the last of the n_used blocks merges
  const size_t ph0 = ((size_t)t * a.n_heads + h * G) * a.n_split;  // row of (head 0 of this group, split 0)
#pragma unroll
  for (int i = 0; i < kHPT; i++) {
    const int g = og + kTPD * i;
    if (g < G) a.part_o[(ph0 + (size_t)g * a.n_split + split) * D + od] = o[i];
  }
  if (tid < G) {
    a.part_ml[(ph0 + (size_t)tid * a.n_split + split) * 2] = S.m[tid];
    a.part_ml[(ph0 + (size_t)tid * a.n_split + split) * 2 + 1] = S.l[tid];
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) S.last = atomicAdd(&a.counters[t * a.n_kv + h], 1) == n_used - 1;
  __syncthreads();
  if (!S.last) return;
  __threadfence();
  for (int i = tid; i < G * n_used; i += kAttnThreads) {
    const int g = i / n_used, sp = i % n_used;
    const size_t r = ph0 + (size_t)g * a.n_split + sp;
    S.u.mg.w[g][sp] = __ldcg(a.part_ml + r * 2);
    S.u.mg.l[g][sp] = __ldcg(a.part_ml + r * 2 + 1);
  }
  __syncthreads();
  if (tid < G) {  // per head: split weights exp2(m_s - max) and 1 / sum(l_s * weight)
    float mm = -CUDART_INF_F;
    for (int sp = 0; sp < n_used; sp++) mm = fmaxf(mm, S.u.mg.w[tid][sp]);
    float ll = 0.f;
    for (int sp = 0; sp < n_used; sp++) {
      const float f = exp2f(S.u.mg.w[tid][sp] - mm);  // every used split has >= 1 key: m is finite
      S.u.mg.w[tid][sp] = f;
      ll += S.u.mg.l[tid][sp] * f;
    }
    S.inv[tid] = 1.f / ll;
  }
  __syncthreads();
  // outputs as float4 over dims: (g, d4) pairs over the threads; 8 splits' partials loaded per batch
  for (int i = tid; i < G * (D / 4); i += kAttnThreads) {
    const int g = i / (D / 4), d4 = i % (D / 4);
    const float4* po = reinterpret_cast<const float4*>(a.part_o + (ph0 + (size_t)g * a.n_split) * D) + d4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int sp = 0; sp < n_used; sp++) {
      const float4 v = __ldcg(po + (size_t)sp * (D / 4));
      const float w = S.u.mg.w[g][sp];
      acc.x = fmaf(v.x, w, acc.x); acc.y = fmaf(v.y, w, acc.y); acc.z = fmaf(v.z, w, acc.z); acc.w = fmaf(v.w, w, acc.w);
    }
    const float inv = S.inv[g];
    __half2* o2 = reinterpret_cast<__half2*>(out + g * D + d4 * 4);
    o2[0] = __floats2half2_rn(acc.x * inv, acc.y * inv);
    o2[1] = __floats2half2_rn(acc.z * inv, acc.w * inv);
  }
  if (tid == 0) a.counters[t * a.n_kv + h] = 0;
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
__global__ void __launch_bounds__(kAttnThreads) attn_prefill_kernel(const AttnArgs a) {
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
__global__ void rope_kv_kernel(const float* qkv, int qkv_stride, const int* pos0, KvLayer kv, const int* page_table,
                               const float2* rope, int n_heads, int n_kv) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x, h = blockIdx.y;
  const int pos = *pos0 + t;
  const float* kin = qkv + (size_t)t * qkv_stride + n_heads * D + h * D;
  const float* vin = qkv + (size_t)t * qkv_stride + (n_heads + n_kv) * D + h * D;
  const int page = page_table[pos / kPage];
  const size_t idx = (((size_t)page * n_kv + h) * kPage + pos % kPage) * D;
  const float2* r = rope + (size_t)pos * (D / 2);
  for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
    const float2 cs = r[i];
    const float x0 = kin[i], x1 = kin[i + D / 2];
    kv.k[idx + i] = __float2half_rn(x0 * cs.x - x1 * cs.y);
    kv.k[idx + i + D / 2] = __float2half_rn(x1 * cs.x + x0 * cs.y);
    kv.v[idx + i] = __float2half_rn(vin[i]);
    kv.v[idx + i + D / 2] = __float2half_rn(vin[i + D / 2]);
  }
}

}  // namespace

template <int D>
int launch_prefill(dim3 grid, const AttnArgs& a, cudaStream_t st) {
  const size_t smem = sizeof(PrefSmem<D>);  // > 48 KB: opt in once per instantiation
  static const cudaError_t raised =
      cudaFuncSetAttribute(attn_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (raised != cudaSuccess) return fail(NQ_E_CUDA, "attention: shared memory opt-in: %s", cudaGetErrorString(raised));
  return launch_pdl("attn_prefill_kernel", attn_prefill_kernel<D>, grid, dim3(kAttnThreads), smem, st, a);
}

int attention(const AttnArgs& a, cudaStream_t st) {
  if (a.n_kv <= 0 || a.n_heads % a.n_kv || a.n_heads / a.n_kv > kMaxG)
    return fail(NQ_E_UNSUPPORTED, "attention: n_heads %d / n_kv %d (at most %d query heads per KV head)", a.n_heads, a.n_kv, kMaxG);
  if (a.n_split < 1 || a.n_split > kMaxSplits)
    return fail(NQ_E_INVALID_ARG, "attention: n_split %d not in [1, %d]", a.n_split, kMaxSplits);
  if (a.keys_per_split <= 0 || a.keys_per_split % 32)
    return fail(NQ_E_INVALID_ARG, "attention: keys_per_split %d", a.keys_per_split);
  if (a.D != 128 && a.D != 64) return fail(NQ_E_UNSUPPORTED, "attention: head_dim %d (64 or 128)", a.D);
  if (a.M > 1 && a.pos_of == nullptr) {  // prefill: rope_kv_write wrote the cache
    if (a.write_kv) return fail(NQ_E_INVALID_ARG, "attention: write_kv with M = %d > 1", a.M);
    if (a.n_split == 1) {  // kPQ query tokens per block, all keys in series
      const dim3 grid(a.n_kv, (a.M + kPQ - 1) / kPQ);
      if (a.D == 128) return launch_prefill<128>(grid, a, st);
      return launch_prefill<64>(grid, a, st);
    }
    // a few tokens with the keys split: the decode kernel, token t at *pos0 + t (session_prefill's choice)
  } else if (a.M > 1 && !(a.write_kv && a.kv_of && a.page_table_of)) {
    return fail(NQ_E_INVALID_ARG, "attention: a batched decode of %d sequences needs write_kv, kv_of, page_table_of", a.M);
  }
  const dim3 grid(a.n_kv, a.n_split, a.M);
  if (a.D == 128) return launch_pdl("attn_kernel", attn_kernel<128>, grid, dim3(kAttnThreads), 0, st, a);
  return launch_pdl("attn_kernel", attn_kernel<64>, grid, dim3(kAttnThreads), 0, st, a);
}

int rope_kv_write(const float* qkv, int qkv_stride, int M, const int* pos0, KvLayer kv, const int* page_table,
                  const float2* rope, int n_heads, int n_kv, int D, cudaStream_t st) {
  dim3 grid(M, n_kv);
  if (D == 128)
    return launch_pdl("rope_kv_kernel", rope_kv_kernel<128>, grid, dim3(64), 0, st, qkv, qkv_stride, pos0, kv,
                      page_table, rope, n_heads, n_kv);
  if (D == 64)
    return launch_pdl("rope_kv_kernel", rope_kv_kernel<64>, grid, dim3(32), 0, st, qkv, qkv_stride, pos0, kv,
                      page_table, rope, n_heads, n_kv);
  return fail(NQ_E_UNSUPPORTED, "rope_kv_write: head_dim %d", D);
}

}  // namespace nq
