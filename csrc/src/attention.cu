// Paged-KV attention (decode and prefill share it) + RoPE/KV-cache write.
//
// Grid (n_kv, n_split, M): block (h, s, t) serves query token t (position *pos0 + t) for the G = n_heads/n_kv
// query heads of KV head h, over keys [s*kps, min((s+1)*kps, pos+1)): the G heads share one read of K and V.
// kps = max(keys_per_split, ceil32((pos+1)/n_split)) is computed from the position at run time, so every split
// has work at any context length and one captured graph serves all positions; blocks past the last used split
// return at once.
//
// v2 (this version): the block copies K and V in tiles of kKT = 32 keys into shared memory with cp.async (two
// tiles in flight: double buffer; one memory round trip before the first score), then
//   scores + online softmax: warp w takes heads w, w+4 (lane = key; the K row is read from shared memory),
//   P.V: thread tid owns dim tid % D of heads tid / D + kTPD*i (V read from shared memory, P broadcast),
// all loops short and rolled over the heads' registers only: the code is a few KB (v1 fully unrolled 8 heads x
// 32 V rows into ~100-150 KB of SASS per kernel, whose instruction fetch, not its memory traffic, made it a
// fixed ~30 us per block: bench/NOTES.md). One split: the block writes the f16 output itself. Several: each
// writes a partial (m, l, o[D]) per head; the last block of (t, h) to finish (atomic counter over the USED
// splits) merges them and re-arms the counter.
// Decode (write_kv): the block whose key range holds the current position writes rope(k), v into the cache and
// puts the same f16 row into its shared tile directly (no write-then-read round trip).
#include "kernels.h"
#include "device_util.cuh"
#include "launch.h"
#include <math_constants.h>

namespace nq {
namespace {

constexpr int kAttnWarps = 4, kAttnThreads = kAttnWarps * 32, kMaxG = 8;
constexpr int kMaxSplits = 128;  // attention splits per (token, KV head): bounds the merge's shared memory
constexpr int kKT = 32;          // keys per shared-memory tile (= lanes of a warp in the score phase)

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

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

__device__ __forceinline__ size_t kv_row(const AttnArgs& a, int key, int h, int D) {
  const int page = a.page_table[key / kPage];
  return (((size_t)page * a.n_kv + h) * kPage + (key % kPage)) * (size_t)D;
}

// cp.async the K and V rows of keys [kt0, min(kt0 + kKT, k1)) into buffer `buf` (the row at `skip` excepted:
// the decode block fills it from registers); one commit group per tile.
template <int D>
__device__ __forceinline__ void load_tile(const AttnArgs& a, AttnSmem<D>& S, int buf, int kt0, int k1, int h, int skip) {
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < kKT * CPR; c += kAttnThreads) {
    const int j = c / CPR, part = c % CPR, key = kt0 + j;
    if (key < k1 && key != skip) {
      const size_t off = kv_row(a, key, h, D) + part * 8;
      cp_async16(&S.u.t.k[buf][j][part * 8], a.kv.k + off);
      cp_async16(&S.u.t.v[buf][j][part * 8], a.kv.v + off);
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
  const int pos = *a.pos0 + t;
  const int n_keys = pos + 1;
  // keys per split: at least keys_per_split, and large enough that n_split splits cover the n_keys keys
  const int kps = max(a.keys_per_split, ((n_keys + a.n_split - 1) / a.n_split + kKT - 1) / kKT * kKT);
  const int n_used = (n_keys + kps - 1) / kps;  // splits with keys (<= n_split)
  if (split >= n_used) return;                  // uniform per block: no barrier is skipped by part of it
  const int k0 = split * kps, k1 = min(n_keys, k0 + kps);
  const int ntiles = (k1 - k0 + kKT - 1) / kKT;
  const bool own = a.write_kv && pos >= k0 && pos < k1;  // this block writes the cache row at pos
  const int skip = own ? pos : -1;

  load_tile<D>(a, S, 0, k0, k1, h, skip);
  if (ntiles > 1) load_tile<D>(a, S, 1, k0 + kKT, k1, h, skip);

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
    const size_t idx = kv_row(a, pos, h, D);
    for (int i = tid; i < D / 2; i += kAttnThreads) {
      const float2 cs = rope[i];
      const float x0 = kin[i], x1 = kin[i + D / 2];
      const __half k0h = __float2half_rn(x0 * cs.x - x1 * cs.y), k1h = __float2half_rn(x1 * cs.x + x0 * cs.y);
      const __half v0h = __float2half_rn(vin[i]), v1h = __float2half_rn(vin[i + D / 2]);
      a.kv.k[idx + i] = k0h; a.kv.k[idx + i + D / 2] = k1h;
      a.kv.v[idx + i] = v0h; a.kv.v[idx + i + D / 2] = v1h;
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
    if (it + 2 < ntiles) load_tile<D>(a, S, buf, kt0 + 2 * kKT, k1, h, skip);
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

// ---- Prefill attention (M > 1 query tokens, causal) ------------------------------------------------------------
// Grid (n_kv, ceil(M / kPQ)): block (h, b) serves query tokens b*kPQ .. b*kPQ+kPQ-1 for the G heads of KV head h:
// R = kPQ*G <= 64 rows (row r = token r / G, head r % G), all keys 0 .. the block's last position, in tiles of kKT
// keys (cp.async, double buffer) shared by all rows: one K/V read per kPQ tokens instead of one per token (the
// decode kernel above, launched per token, re-read K/V and ran at ~1/4 of this rate; bench/NOTES.md).
// Thread (tr = tid / 8, tk = tid % 8) owns rows tr + 16 i (i < 4) and, per tile, keys tk + 8 j (j < 4) in the
// score phase and output dims tk*4 + 32 jj + e (jj < D/32, e < 4) in the P.V phase; a row's 32 scores sit in the 8
// lanes of one group, so its online softmax (m, l) is reduced with 3 shuffles and kept in those lanes, which also
// own the row's outputs: the rescale needs no shared memory.
constexpr int kPQ = 8;   // query tokens per prefill block
constexpr int kPR = 64;  // rows per block (kPQ * G <= kPQ * kMaxG = 64)

template <int D>
struct PrefSmem {
  static constexpr int QLD = D + 4;   // f32 q row stride: 4 rows read together by a warp hit distinct banks
  static constexpr int KLD = D + 8;   // as AttnSmem
  static constexpr int PLD = kKT + 1;
  float q[kPR][QLD];                  // roped q * log2(e)/sqrt(D); rows >= R or past M are zero
  __half k[2][kKT][KLD];
  __half v[2][kKT][D];
  float p[kPR][PLD];                  // probabilities of the current tile
};

template <int D>
__device__ __forceinline__ void load_tile_rows(const AttnArgs& a, PrefSmem<D>& S, int buf, int kt0, int k1, int h) {
  constexpr int CPR = D / 8;
  for (int c = threadIdx.x; c < kKT * CPR; c += kAttnThreads) {
    const int j = c / CPR, part = c % CPR, key = kt0 + j;
    if (key < k1) {
      const size_t off = kv_row(a, key, h, D) + part * 8;
      cp_async16(&S.k[buf][j][part * 8], a.kv.k + off);
      cp_async16(&S.v[buf][j][part * 8], a.kv.v + off);
    }
  }
  cp_async_commit();
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads) attn_prefill_kernel(const AttnArgs a) {
  constexpr int NJ = D / 32;  // 4-dim groups per thread in the P.V phase
  extern __shared__ __align__(16) unsigned char attn_smem[];
  PrefSmem<D>& S = *reinterpret_cast<PrefSmem<D>*>(attn_smem);
  pdl_wait();
  pdl_trigger();
  const int h = blockIdx.x, t0 = blockIdx.y * kPQ;
  const int G = a.n_heads / a.n_kv, R = kPQ * G;
  const int tid = threadIdx.x, tr = tid >> 3, tk = tid & 7;
  const int pos0 = *a.pos0;
  const int nq = min(kPQ, a.M - t0);
  const int n_keys = pos0 + t0 + nq;  // keys 0 .. the position of the block's last token
  const int ntiles = (n_keys + kKT - 1) / kKT;
  load_tile_rows<D>(a, S, 0, 0, n_keys, h);
  if (ntiles > 1) load_tile_rows<D>(a, S, 1, kKT, n_keys, h);

  const float qscale = 1.4426950408889634f * rsqrtf((float)D);
  for (int i = tid; i < kPR * (D / 2); i += kAttnThreads) {
    const int r = i / (D / 2), d = i % (D / 2), tq = r / G, g = r % G;
    float y0 = 0.f, y1 = 0.f;
    if (r < R && tq < nq) {
      const float* qin = a.qkv + (size_t)(t0 + tq) * a.qkv_stride + (h * G + g) * D;
      const float2 cs = a.rope[(size_t)(pos0 + t0 + tq) * (D / 2) + d];
      const float x0 = qin[d], x1 = qin[d + D / 2];
      y0 = (x0 * cs.x - x1 * cs.y) * qscale;
      y1 = (x1 * cs.x + x0 * cs.y) * qscale;
    }
    S.q[r][d] = y0;
    S.q[r][d + D / 2] = y1;
  }
  int rpos[4];  // position of each owned row's token; -1: no such row (all keys masked, never written)
  float m[4], l[4], o[4][NJ * 4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int r = tr + 16 * i;
    rpos[i] = (r < R && r / G < nq) ? pos0 + t0 + r / G : -1;
    m[i] = -CUDART_INF_F;
    l[i] = 0.f;
#pragma unroll
    for (int e = 0; e < NJ * 4; e++) o[i][e] = 0.f;
  }

  for (int it = 0; it < ntiles; it++) {
    const int buf = it & 1, kt0 = it * kKT, nvalid = min(kKT, n_keys - kt0);
    if (it + 1 < ntiles) cp_async_wait<1>(); else cp_async_wait<0>();
    __syncthreads();  // tile landed for all threads; q staged
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) s[i][j] = 0.f;
#pragma unroll 2
    for (int c = 0; c < D / 4; c++) {
      float4 qv[4];
#pragma unroll
      for (int i = 0; i < 4; i++) qv[i] = *reinterpret_cast<const float4*>(&S.q[tr + 16 * i][c * 4]);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint2 kk = *reinterpret_cast<const uint2*>(&S.k[buf][tk + 8 * j][c * 4]);
        const float2 k01 = __half22float2(u32_as_h2(kk.x)), k23 = __half22float2(u32_as_h2(kk.y));
#pragma unroll
        for (int i = 0; i < 4; i++) s[i][j] += qv[i].x * k01.x + qv[i].y * k01.y + qv[i].z * k23.x + qv[i].w * k23.y;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int key = kt0 + tk + 8 * j;
        s[i][j] = key <= rpos[i] ? s[i][j] : -CUDART_INF_F;  // causal mask (and rows that do not exist)
        mx = fmaxf(mx, s[i][j]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float m_new = fmaxf(m[i], mx);
      const bool none = m_new == -CUDART_INF_F;  // no key of this row seen yet
      const float corr = none ? 1.f : exp2f(m[i] - m_new);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float p = s[i][j] == -CUDART_INF_F ? 0.f : exp2f(s[i][j] - m_new);
        S.p[tr + 16 * i][tk + 8 * j] = p;
        sum += p;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      l[i] = l[i] * corr + sum;
      m[i] = m_new;
#pragma unroll
      for (int e = 0; e < NJ * 4; e++) o[i][e] *= corr;
    }
    __syncthreads();  // P complete
#pragma unroll 2
    for (int j = 0; j < nvalid; j++) {
      float pj[4];
#pragma unroll
      for (int i = 0; i < 4; i++) pj[i] = S.p[tr + 16 * i][j];
#pragma unroll
      for (int jj = 0; jj < NJ; jj++) {
        const uint2 vv = *reinterpret_cast<const uint2*>(&S.v[buf][j][tk * 4 + 32 * jj]);
        const float2 v01 = __half22float2(u32_as_h2(vv.x)), v23 = __half22float2(u32_as_h2(vv.y));
#pragma unroll
        for (int i = 0; i < 4; i++) {
          o[i][jj * 4 + 0] = fmaf(pj[i], v01.x, o[i][jj * 4 + 0]);
          o[i][jj * 4 + 1] = fmaf(pj[i], v01.y, o[i][jj * 4 + 1]);
          o[i][jj * 4 + 2] = fmaf(pj[i], v23.x, o[i][jj * 4 + 2]);
          o[i][jj * 4 + 3] = fmaf(pj[i], v23.y, o[i][jj * 4 + 3]);
        }
      }
    }
    __syncthreads();  // buffer `buf` and P are free
    if (it + 2 < ntiles) load_tile_rows<D>(a, S, buf, kt0 + 2 * kKT, n_keys, h);
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    if (rpos[i] < 0) continue;
    const int r = tr + 16 * i, tq = r / G, g = r % G;
    const float inv = 1.f / l[i];  // l >= 1: the row's maximum contributes exp2(0)
    __half* dst = a.out + (size_t)(t0 + tq) * a.n_heads * D + (h * G + g) * D + tk * 4;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
      __half2* d2 = reinterpret_cast<__half2*>(dst + 32 * jj);
      d2[0] = __floats2half2_rn(o[i][jj * 4 + 0] * inv, o[i][jj * 4 + 1] * inv);
      d2[1] = __floats2half2_rn(o[i][jj * 4 + 2] * inv, o[i][jj * 4 + 3] * inv);
    }
  }
}

template <int D>
__global__ void rope_kv_kernel(const float* qkv, int qkv_stride, const int* pos0, KvLayer kv, const int* page_table,
                               const float2* rope, int n_heads, int n_kv) {
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
  if (a.M > 1) {  // prefill: kPQ query tokens per block, no splits (the cache rows were written by rope_kv_write)
    if (a.write_kv) return fail(NQ_E_INVALID_ARG, "attention: write_kv with M = %d > 1", a.M);
    const dim3 grid(a.n_kv, (a.M + kPQ - 1) / kPQ);
    if (a.D == 128) return launch_prefill<128>(grid, a, st);
    return launch_prefill<64>(grid, a, st);
  }
  const dim3 grid(a.n_kv, a.n_split, 1);
  if (a.D == 128) return launch_pdl("attn_kernel", attn_kernel<128>, grid, dim3(kAttnThreads), 0, st, a);
  return launch_pdl("attn_kernel", attn_kernel<64>, grid, dim3(kAttnThreads), 0, st, a);
}

int rope_kv_write(const float* qkv, int qkv_stride, int M, const int* pos0, KvLayer kv, const int* page_table,
                  const float2* rope, int n_heads, int n_kv, int D, cudaStream_t st) {
  dim3 grid(M, n_kv);
  if (D == 128) rope_kv_kernel<128><<<grid, 64, 0, st>>>(qkv, qkv_stride, pos0, kv, page_table, rope, n_heads, n_kv);
  else if (D == 64) rope_kv_kernel<64><<<grid, 32, 0, st>>>(qkv, qkv_stride, pos0, kv, page_table, rope, n_heads, n_kv);
  else return fail(NQ_E_UNSUPPORTED, "rope_kv_write: head_dim %d", D);
  NQ_LAUNCH_CHECK("rope_kv_kernel");
  return NQ_OK;
}

}  // namespace nq
