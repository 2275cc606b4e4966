// Small kernels: embedding lookups, row RMSNorm / SwiGLU for prefill, position advance, device sampler.
#include "kernels.h"
#include "device_util.cuh"
#include "launch.h"
#include <math_constants.h>
#include <climits>

namespace nq {
namespace {

__device__ __forceinline__ float load_elem(const void* table, int dtype, size_t i) {
  if (dtype == WT_F16) return __half2float(static_cast<const __half*>(table)[i]);
  if (dtype == WT_BF16) return bf16_bits_to_float(static_cast<const uint16_t*>(table)[i]);
  return static_cast<const float*>(table)[i];
}

__global__ void embed_token_kernel(const void* table, int dtype, const int32_t* d_token, int H, float* x) {
  pdl_wait();
  pdl_trigger();
  const size_t row = (size_t)(*d_token) * H;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x)
    x[i] = load_elem(table, dtype, row + i);
}

__global__ void embed_rows_kernel(const void* table, int dtype, const int32_t* tokens, int H, float* X) {
  pdl_wait();
  pdl_trigger();
  const size_t row = (size_t)tokens[blockIdx.x] * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) X[(size_t)blockIdx.x * H + i] = load_elem(table, dtype, row + i);
}

// one block per row; K % 4 == 0 (rmsnorm_rows checks): float4 loads, so a thread's loads of the row are few and
// independent (the scalar loop left ~14 dependent-latency loads per thread at K = 3584)
__global__ void rmsnorm_rows_kernel(const float* X, const float* w, int K, float eps, __half* Y) {
  __shared__ float red[32];
  pdl_wait();
  pdl_trigger();
  const float4* x = reinterpret_cast<const float4*>(X + (size_t)blockIdx.x * K);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const int K4 = K / 4;
  float ss = 0.f;
  for (int i = threadIdx.x; i < K4; i += blockDim.x) {
    const float4 v = x[i];
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / (float)K + eps);
  __half2* y = reinterpret_cast<__half2*>(Y + (size_t)blockIdx.x * K);
  for (int i = threadIdx.x; i < K4; i += blockDim.x) {
    const float4 v = x[i], g = w4[i];
    y[2 * i] = __floats2half2_rn(v.x * inv * g.x, v.y * inv * g.y);
    y[2 * i + 1] = __floats2half2_rn(v.z * inv * g.z, v.w * inv * g.w);
  }
}

__global__ void swiglu_rows_kernel(const float* G, const float* U, size_t n, __half* H) {
  pdl_wait();
  pdl_trigger();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    H[i] = swiglu_f16(G[i], U[i]);
  }
}

__global__ void advance_pos_kernel(int* pos, int n) {
  pdl_wait();
  pdl_trigger();
  *pos += n;
}

// Batched decode: each session's device position becomes this step's position + 1.
__global__ void advance_positions_kernel(int* const* pos_of, const int* pos, int n) {
  pdl_wait();
  pdl_trigger();
  for (int i = threadIdx.x; i < n; i += blockDim.x) *pos_of[i] = pos[i] + 1;
}

// Batched decode: the step's tokens and positions from the staged inputs (kernels.h take_batch_inputs). prev_next
// is the batch's sample buffer, which this step's sampler overwrites only after every layer has run.
__global__ void take_batch_inputs_kernel(const int32_t* in, int stride, const int32_t* prev_next, int32_t* tokens,
                                         int* pos, int n) {
  pdl_wait();
  pdl_trigger();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {   // `in` is host memory the host rewrites: uncached loads
    const int c = __ldcv(in + 2 * stride + i);
    tokens[i] = c >= 0 ? prev_next[c] : __ldcv(in + i);
    pos[i] = __ldcv(in + stride + i);
  }
}

// Batched decode: the step's samples into the host's pinned slot (kernels.h publish_samples).
__global__ void publish_samples_kernel(const int32_t* next, int32_t* host_out, int n) {
  pdl_wait();
  pdl_trigger();
  for (int i = threadIdx.x; i < n; i += blockDim.x) host_out[i] = next[i];
  __threadfence_system();
}

// ---- sampler -------------------------------------------------------------------------------------------------
constexpr int kSampleThreads = 1024;

// monotone map float -> uint32 (larger float -> larger key)
__device__ __forceinline__ uint32_t fkey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One block draws one token from a.logits (all kSampleThreads threads of the block call it).
__device__ __forceinline__ void sample_block(const SampleArgs& a) {
  __shared__ float red[32];
  __shared__ float s_val[32];
  __shared__ int s_idx[32];
  __shared__ int s_tok;
  __shared__ float s_max;
  __shared__ float s_scan[kSampleThreads];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* L = a.logits;
  const int V = a.V;
  const float temperature = a.params->temperature, top_p = a.params->top_p;
  const int top_k = a.params->top_k;
  const unsigned long long seed = a.params->seed;
  // 1. argmax, lowest index on ties (NaN never wins); its value is the maximum, the offset of the exponentials below.
  // One pass over the row in 16-byte loads where the row allows (4 in flight per thread): a row is 0.6 MB on the 7B and
  // one block reads it, so loads in flight set its time. Each thread sees its indices in increasing order, so the strict
  // comparison keeps its lowest tied index; the reduction breaks ties by index.
  float best = -CUDART_INF_F;
  int bi = INT_MAX;
  const int nv = (V % 4 == 0 && reinterpret_cast<uintptr_t>(L) % 16 == 0) ? V / 4 : 0;
  const float4* L4 = reinterpret_cast<const float4*>(L);
#pragma unroll 4
  for (int j = tid; j < nv; j += kSampleThreads) {
    const float4 q = L4[j];
    const int i = 4 * j;
    if (q.x > best) { best = q.x; bi = i; }
    if (q.y > best) { best = q.y; bi = i + 1; }
    if (q.z > best) { best = q.z; bi = i + 2; }
    if (q.w > best) { best = q.w; bi = i + 3; }
  }
  for (int i = 4 * nv + tid; i < V; i += kSampleThreads) {
    const float v = L[i];
    if (v > best) { best = v; bi = i; }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
  }
  if (lane == 0) { s_val[warp] = best; s_idx[warp] = bi; }
  __syncthreads();
  if (warp == 0) {
    best = s_val[lane]; bi = s_idx[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    if (lane == 0) { s_tok = bi == INT_MAX ? 0 : bi; s_max = best; }
  }
  __syncthreads();
  const float m_all = s_max;   // -inf when no logit is a number
  if (temperature > 0.f) {
    const float invT = 1.f / temperature;
    // 2. top-k threshold: largest key t with count(key >= t) >= k
    uint32_t thr = 0;
    if (top_k > 0 && top_k < V) {
      uint32_t ans = 0;
      for (int bit = 31; bit >= 0; bit--) {
        const uint32_t cand = ans | (1u << bit);
        float c = 0.f;
        for (int i = tid; i < V; i += kSampleThreads) c += fkey(L[i]) >= cand ? 1.f : 0.f;
        c = block_sum(c, red);
        if (c >= (float)top_k) ans = cand;
      }
      thr = ans;
    }
    // 3. top-p threshold over the kept set: largest t >= thr with mass(key >= t) >= top_p * mass(key >= thr)
    auto mass = [&](uint32_t t) {
      float s = 0.f;
      for (int i = tid; i < V; i += kSampleThreads) {
        const float v = L[i];
        if (fkey(v) >= t) s += exp2f((v - m_all) * invT * 1.4426950408889634f);
      }
      return block_sum(s, red);
    };
    if (top_p < 1.f) {
      const float target = top_p * mass(thr);
      unsigned long long lo = thr, hi = 0x100000000ull;
      while (hi - lo > 1) {
        const unsigned long long mid = (lo + hi) >> 1;
        if (mass((uint32_t)mid) >= target) lo = mid; else hi = mid;
      }
      thr = (uint32_t)lo;
    }
    // 4. inverse-CDF draw in index order over the kept set
    const int chunk = (V + kSampleThreads - 1) / kSampleThreads;
    const int i0 = min(V, tid * chunk), i1 = min(V, i0 + chunk);
    float local = 0.f;
    int last_kept = -1;
    for (int i = i0; i < i1; i++) {
      const float v = L[i];
      if (fkey(v) >= thr) { local += exp2f((v - m_all) * invT * 1.4426950408889634f); last_kept = i; }
    }
    s_scan[tid] = local;
    __syncthreads();
    // inclusive scan (Hillis-Steele) over 1024 partial sums
    for (int off = 1; off < kSampleThreads; off <<= 1) {
      const float add = tid >= off ? s_scan[tid - off] : 0.f;
      __syncthreads();
      s_scan[tid] += add;
      __syncthreads();
    }
    const float total = s_scan[kSampleThreads - 1];
    // last kept index overall (fallback when round-off puts the draw at the very end)
    int lk = last_kept;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) lk = max(lk, __shfl_xor_sync(0xffffffffu, lk, o));
    __syncthreads();
    if (lane == 0) s_idx[warp] = lk;
    __syncthreads();
    if (tid == 0) {
      int m = -1;
      for (int w = 0; w < kSampleThreads / 32; w++) m = max(m, s_idx[w]);
      s_tok = m;
    }
    __syncthreads();
    const unsigned long long c = *a.counter;
    const double u = (double)(splitmix64(seed * 0x9E3779B97F4A7C15ull + c) >> 11) * (1.0 / 9007199254740992.0);
    const float target = (float)(u * (double)total);
    const float excl = tid > 0 ? s_scan[tid - 1] : 0.f;  // exact partition: [excl, s_scan[tid])
    if (local > 0.f && excl <= target && target < s_scan[tid]) {
      float run = excl;
      int found = last_kept;
      for (int i = i0; i < i1; i++) {
        const float v = L[i];
        if (fkey(v) >= thr) {
          run += exp2f((v - m_all) * invT * 1.4426950408889634f);
          if (run > target) { found = i; break; }
        }
      }
      s_tok = found;
    }
    __syncthreads();
  }
  if (tid == 0) {
    const unsigned long long c = *a.counter;
    const int tok = s_tok;
    *a.token_out = tok;
    if (a.host_ring) a.host_ring[c % (unsigned long long)a.ring_size] = tok;
    *a.counter = c + 1;
  }
}

__global__ void __launch_bounds__(kSampleThreads) sample_kernel(const SampleArgs a) {
  pdl_wait();
  pdl_trigger();
  sample_block(a);
}

// Batched decode: block i draws sequence i's token with its own arguments (device array).
__global__ void __launch_bounds__(kSampleThreads) sample_rows_kernel(const SampleArgs* args) {
  pdl_wait();
  pdl_trigger();
  sample_block(args[blockIdx.x]);
}

}  // namespace

int embed_token(const void* table, int dtype, const int32_t* d_token, int H, float* x, cudaStream_t st) {
  return launch_pdl("embed_token_kernel", embed_token_kernel, dim3((H + 255) / 256), dim3(256), 0, st, table, dtype,
                    d_token, H, x);
}
int embed_rows(const void* table, int dtype, const int32_t* tokens, int M, int H, float* X, cudaStream_t st) {
  return launch_pdl("embed_rows_kernel", embed_rows_kernel, dim3(M), dim3(256), 0, st, table, dtype, tokens, H, X);
}
int rmsnorm_rows(const float* X, const float* w, int M, int K, float eps, __half* Y, cudaStream_t st) {
  if (K % 4 != 0 || reinterpret_cast<uintptr_t>(X) % 16 || reinterpret_cast<uintptr_t>(w) % 16 ||
      reinterpret_cast<uintptr_t>(Y) % 8)
    return fail(NQ_E_UNSUPPORTED, "rmsnorm_rows: needs K %% 4 == 0 (K=%d) and 16-byte aligned rows", K);
  return launch_pdl("rmsnorm_rows_kernel", rmsnorm_rows_kernel, dim3(M), dim3(256), 0, st, X, w, K, eps, Y);
}
int swiglu_rows(const float* G, const float* U, int M, int I, __half* H, cudaStream_t st) {
  const size_t n = (size_t)M * I;
  const int grid = (int)std::min<size_t>((n + 255) / 256, 4096);
  return launch_pdl("swiglu_rows_kernel", swiglu_rows_kernel, dim3(grid), dim3(256), 0, st, G, U, n, H);
}
int advance_pos(int* pos, int n, cudaStream_t st) {
  return launch_pdl("advance_pos_kernel", advance_pos_kernel, dim3(1), dim3(1), 0, st, pos, n);
}

int advance_positions(int* const* pos_of, const int* pos, int n, cudaStream_t st) {
  return launch_pdl("advance_positions_kernel", advance_positions_kernel, dim3(1), dim3(128), 0, st, pos_of, pos, n);
}
int sample(const SampleArgs& a, cudaStream_t st) {
  return launch_pdl("sample_kernel", sample_kernel, dim3(1), dim3(kSampleThreads), 0, st, a);
}
int take_batch_inputs(const int32_t* in, int stride, const int32_t* prev_next, int32_t* tokens, int* pos, int n,
                      cudaStream_t st) {
  return launch_pdl("take_batch_inputs_kernel", take_batch_inputs_kernel, dim3(1), dim3(256), 0, st, in, stride,
                    prev_next, tokens, pos, n);
}

int publish_samples(const int32_t* next, int32_t* host_out, int n, cudaStream_t st) {
  return launch_pdl("publish_samples_kernel", publish_samples_kernel, dim3(1), dim3(256), 0, st, next, host_out, n);
}

int sample_rows(const SampleArgs* d_args, int n, cudaStream_t st) {
  return launch_pdl("sample_rows_kernel", sample_rows_kernel, dim3(n), dim3(kSampleThreads), 0, st, d_args);
}

}  // namespace nq
