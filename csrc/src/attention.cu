// Paged-KV attention (decode and prefill share it) + RoPE/KV-cache write.
//
// Grid (n_kv, n_split, M): block (h, s, t) serves query token t (position *pos0 + t) for the G = n_heads/n_kv
// query heads of KV head h, over keys [s*kps, min((s+1)*kps, pos+1)): the G heads share one read of K and V.
// kps = max(keys_per_split, ceil32((pos+1)/n_split)) is computed from the position at run time, so every split
// has work at any context length and one captured graph serves all positions.
// 4 warps; each warp takes tiles of 32 keys (lane = key for the scores, lane = dims for the V sum), keeping an
// online softmax (log2 domain) per head. Blocks write a partial (m, l, o[D]) per head; the last block of
// (t, h) to finish (atomic counter) merges the splits and writes the f16 output, then re-arms the counter.
// Decode (write_kv): the block whose key range holds the current position first writes rope(k), v there.
#include "kernels.h"
#include "device_util.cuh"
#include "launch.h"
#include <math_constants.h>

namespace nq {
namespace {

constexpr int kAttnWarps = 4, kAttnThreads = kAttnWarps * 32, kMaxG = 8;
constexpr int kMaxSplits = 128;  // attention splits per (token, KV head): bounds the merge's shared memory
constexpr int kVBatch = 32;      // V rows whose loads are issued together (one 32-key tile: one round trip)

__device__ __forceinline__ size_t kv_index(const AttnArgs& a, int key, int h, int D) {
  const int page = a.page_table[key / kPage];
  return (((size_t)page * a.n_kv + h) * kPage + (key % kPage)) * (size_t)D;
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads) attn_kernel(const AttnArgs a) {
  constexpr int DPL = D / 32;  // dims per lane in the V accumulation
  __shared__ __align__(16) float qs[kMaxG][D];
  __shared__ float wm[kAttnWarps][kMaxG], wl[kAttnWarps][kMaxG];
  __shared__ float wo[kAttnWarps][kMaxG][D];
  __shared__ int s_last;
  __shared__ float s_wm[kMaxG][kMaxSplits], s_wl[kMaxG][kMaxSplits], s_inv[kMaxG];  // merge of the splits

  pdl_wait();  // position, qkv and the cache come from earlier kernels
  pdl_trigger();
  const int h = blockIdx.x, split = blockIdx.y, t = blockIdx.z;
  const int G = a.n_heads / a.n_kv;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int pos = *a.pos0 + t;
  const int n_keys = pos + 1;
  // keys per split: at least keys_per_split, and large enough that n_split splits cover the n_keys keys
  const int kps = max(a.keys_per_split, ((n_keys + a.n_split - 1) / a.n_split + 31) / 32 * 32);
  const int k0 = split * kps;
  const int k1 = min(n_keys, k0 + kps);
  const float* qkv = a.qkv + (size_t)t * a.qkv_stride;
  const float2* rope = a.rope + (size_t)pos * (D / 2);

  if (k0 < k1) {
    if (a.write_kv && pos >= k0 && pos < k1) {
      const float* kin = qkv + a.n_heads * D + h * D;
      const float* vin = qkv + (a.n_heads + a.n_kv) * D + h * D;
      const size_t idx = kv_index(a, pos, h, D);
      for (int i = tid; i < D / 2; i += kAttnThreads) {
        const float2 cs = rope[i];
        const float x0 = kin[i], x1 = kin[i + D / 2];
        a.kv.k[idx + i] = __float2half_rn(x0 * cs.x - x1 * cs.y);
        a.kv.k[idx + i + D / 2] = __float2half_rn(x1 * cs.x + x0 * cs.y);
        a.kv.v[idx + i] = __float2half_rn(vin[i]);
        a.kv.v[idx + i + D / 2] = __float2half_rn(vin[i + D / 2]);
      }
    }
    // roped q of the G heads, scaled by log2(e)/sqrt(D) so scores are in the log2 domain
    const float qscale = 1.4426950408889634f * rsqrtf((float)D);
    for (int i = tid; i < G * (D / 2); i += kAttnThreads) {
      const int g = i / (D / 2), d = i % (D / 2);
      const float* qin = qkv + (h * G + g) * D;
      const float2 cs = rope[d];
      const float x0 = qin[d], x1 = qin[d + D / 2];
      qs[g][d] = (x0 * cs.x - x1 * cs.y) * qscale;
      qs[g][d + D / 2] = (x1 * cs.x + x0 * cs.y) * qscale;
    }
    __syncthreads();  // q staged; the KV write above is visible to the whole block

    float m[kMaxG], l[kMaxG], o[kMaxG][DPL];
#pragma unroll
    for (int g = 0; g < kMaxG; g++) {
      m[g] = -CUDART_INF_F;
      l[g] = 0.f;
#pragma unroll
      for (int e = 0; e < DPL; e++) o[g][e] = 0.f;
    }
    for (int kb = k0 + warp * 32; kb < k1; kb += kAttnWarps * 32) {
      const int key = kb + lane;
      const bool valid = key < k1;
      const size_t kidx = valid ? kv_index(a, key, h, D) : 0;  // this lane's key row (same offset in V)
      float s[kMaxG];
#pragma unroll
      for (int g = 0; g < kMaxG; g++) s[g] = 0.f;
      if (valid) {
        const uint4* kr = reinterpret_cast<const uint4*>(a.kv.k + kidx);
#pragma unroll
        for (int c0 = 0; c0 < D / 8; c0 += 8) {
          uint4 kv[8];  // 8 loads in flight before the first use
#pragma unroll
          for (int c = 0; c < 8; c++) kv[c] = kr[c0 + c];
#pragma unroll
          for (int c = 0; c < 8; c++) {
            const float2 k01 = __half22float2(u32_as_h2(kv[c].x)), k23 = __half22float2(u32_as_h2(kv[c].y));
            const float2 k45 = __half22float2(u32_as_h2(kv[c].z)), k67 = __half22float2(u32_as_h2(kv[c].w));
#pragma unroll
            for (int g = 0; g < kMaxG; g++) {
              if (g < G) {
                const float4 qa = *reinterpret_cast<const float4*>(&qs[g][(c0 + c) * 8]);
                const float4 qb = *reinterpret_cast<const float4*>(&qs[g][(c0 + c) * 8 + 4]);
                s[g] += qa.x * k01.x + qa.y * k01.y + qa.z * k23.x + qa.w * k23.y +
                        qb.x * k45.x + qb.y * k45.y + qb.z * k67.x + qb.w * k67.y;
              }
            }
          }
        }
      }
      float p[kMaxG];
#pragma unroll
      for (int g = 0; g < kMaxG; g++) {
        if (g < G) {
          const float mt = warp_max(valid ? s[g] : -CUDART_INF_F);
          const float mn = fmaxf(m[g], mt);
          const float corr = exp2f(m[g] - mn);
          p[g] = valid ? exp2f(s[g] - mn) : 0.f;
          l[g] = l[g] * corr + warp_sum(p[g]);
          m[g] = mn;
#pragma unroll
          for (int e = 0; e < DPL; e++) o[g][e] *= corr;
        } else {
          p[g] = 0.f;
        }
      }
      // V: lanes over dims; keys in batches of kVBatch whose loads are all issued first (was 8: four dependent
      // round trips per 32-key tile)
      const int nvalid = min(32, k1 - kb);
      for (int j0 = 0; j0 < nvalid; j0 += kVBatch) {
        uint2 vraw[kVBatch];
#pragma unroll
        for (int jj = 0; jj < kVBatch; jj++) {
          const int j = (j0 + jj) & 31;
          const unsigned long long vi = __shfl_sync(0xffffffffu, (unsigned long long)kidx, j);
          vraw[jj] = make_uint2(0u, 0u);
          if (j0 + jj < nvalid) {
            const __half* vr = a.kv.v + vi + lane * DPL;
            if (DPL == 4) vraw[jj] = *reinterpret_cast<const uint2*>(vr);
            else vraw[jj].x = *reinterpret_cast<const uint32_t*>(vr);
          }
        }
#pragma unroll
        for (int jj = 0; jj < kVBatch; jj++) {
          const int j = (j0 + jj) & 31;
          float vf[DPL];
          const float2 a01 = __half22float2(u32_as_h2(vraw[jj].x));
          vf[0] = a01.x; vf[1 % DPL] = a01.y;
          if (DPL == 4) {
            const float2 a23 = __half22float2(u32_as_h2(vraw[jj].y));
            vf[2 % DPL] = a23.x; vf[3 % DPL] = a23.y;
          }
#pragma unroll
          for (int g = 0; g < kMaxG; g++) {
            if (g < G) {
              const float pj = __shfl_sync(0xffffffffu, p[g], j);
#pragma unroll
              for (int e = 0; e < DPL; e++) o[g][e] = fmaf(pj, vf[e], o[g][e]);
            }
          }
        }
      }
    }
    // merge the warps
#pragma unroll
    for (int g = 0; g < kMaxG; g++) {
      if (g < G) {
        if (lane == 0) { wm[warp][g] = m[g]; wl[warp][g] = l[g]; }
#pragma unroll
        for (int e = 0; e < DPL; e++) wo[warp][g][lane * DPL + e] = o[g][e];
      }
    }
    __syncthreads();
    for (int i = tid; i < G * D; i += kAttnThreads) {
      const int g = i / D, d = i % D;
      float mm = -CUDART_INF_F;
#pragma unroll
      for (int w = 0; w < kAttnWarps; w++) mm = fmaxf(mm, wm[w][g]);
      float ll = 0.f, oo = 0.f;
#pragma unroll
      for (int w = 0; w < kAttnWarps; w++) {
        const float f = exp2f(wm[w][g] - mm);  // warps without keys have m = -inf -> 0
        ll += wl[w][g] * f;
        oo += wo[w][g][d] * f;
      }
      const size_t ph = ((size_t)t * a.n_heads + h * G + g) * a.n_split + split;
      a.part_o[ph * D + d] = oo;
      if (d == 0) { a.part_ml[ph * 2] = mm; a.part_ml[ph * 2 + 1] = ll; }
    }
  }
  // last block of (t, h) merges the splits
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int prev = atomicAdd(&a.counters[t * a.n_kv + h], 1);
    s_last = prev == (int)gridDim.y - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const int n_used = (n_keys + kps - 1) / kps;  // <= n_split <= kMaxSplits
  // (m, l) of every used split of the G heads into shared memory: one round of independent L2 loads
  for (int i = tid; i < G * n_used; i += kAttnThreads) {
    const int g = i / n_used, sp = i % n_used;
    const size_t ph = ((size_t)t * a.n_heads + h * G + g) * a.n_split + sp;
    s_wm[g][sp] = __ldcg(a.part_ml + ph * 2);
    s_wl[g][sp] = __ldcg(a.part_ml + ph * 2 + 1);
  }
  __syncthreads();
  if (tid < G) {  // per head: split weights exp2(m_s - max) and 1 / sum(l_s * weight), shared memory only
    float mm = -CUDART_INF_F;
    for (int sp = 0; sp < n_used; sp++) mm = fmaxf(mm, s_wm[tid][sp]);
    float ll = 0.f;
    for (int sp = 0; sp < n_used; sp++) {
      const float f = exp2f(s_wm[tid][sp] - mm);  // every used split has >= 1 key: m is finite
      s_wm[tid][sp] = f;
      ll += s_wl[tid][sp] * f;
    }
    s_inv[tid] = 1.f / ll;
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kAttnThreads) {
    const int g = i / D, d = i % D;
    const float* po = a.part_o + ((size_t)t * a.n_heads + h * G + g) * a.n_split * D + d;
    float oo = 0.f;
#pragma unroll 8
    for (int sp = 0; sp < n_used; sp++) oo = fmaf(__ldcg(po + (size_t)sp * D), s_wm[g][sp], oo);
    a.out[(size_t)t * a.n_heads * D + (h * G + g) * D + d] = __float2half_rn(oo * s_inv[g]);
  }
  if (tid == 0) a.counters[t * a.n_kv + h] = 0;
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

int attention(const AttnArgs& a, cudaStream_t st) {
  if (a.n_kv <= 0 || a.n_heads % a.n_kv || a.n_heads / a.n_kv > kMaxG)
    return fail(NQ_E_UNSUPPORTED, "attention: n_heads %d / n_kv %d (at most %d query heads per KV head)", a.n_heads, a.n_kv, kMaxG);
  if (a.n_split < 1 || a.n_split > kMaxSplits)
    return fail(NQ_E_INVALID_ARG, "attention: n_split %d not in [1, %d]", a.n_split, kMaxSplits);
  if (a.keys_per_split <= 0 || a.keys_per_split % 32)
    return fail(NQ_E_INVALID_ARG, "attention: keys_per_split %d", a.keys_per_split);
  dim3 grid(a.n_kv, a.n_split, a.M);
  if (a.D == 128) return launch_pdl("attn_kernel", attn_kernel<128>, grid, dim3(kAttnThreads), 0, st, a);
  if (a.D == 64) return launch_pdl("attn_kernel", attn_kernel<64>, grid, dim3(kAttnThreads), 0, st, a);
  return fail(NQ_E_UNSUPPORTED, "attention: head_dim %d (64 or 128)", a.D);
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
