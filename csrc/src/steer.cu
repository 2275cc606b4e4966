// Steered sampling step on the device: the logits step of nanoqwen_rt/logits.py (its CPU reference), then the
// device sampler, then logprobs. Order, as there: logits - penalties(counts) -> token mask (-inf) -> + logit_bias
// (on -inf it stays -inf, so the order of bias and mask does not matter) -> sample -> log-softmax of exactly
// those logits, the sampled token's value and the top_n largest (descending, lower id first on ties, finite only).
#include "kernels.h"
#include "device_util.cuh"
#include <math_constants.h>
#include <climits>

namespace nq {
namespace {

constexpr int kSteerThreads = 256;
constexpr int kTopThreads = 256;

// out[i] = logits[i] - (frequency * counts[i] + presence * (counts[i] > 0)), or -inf where the mask bit is 0
__global__ void steer_rows_kernel(const float* logits, float* out, int V, const uint32_t* mask, const int* counts,
                                  float presence, float frequency) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x) {
    float v = logits[i];
    if (counts) {
      const int c = counts[i];
      v -= frequency * (float)c + (c > 0 ? presence : 0.f);
    }
    if (mask && !((mask[i >> 5] >> (i & 31)) & 1u)) v = -CUDART_INF_F;
    out[i] = v;
  }
}

__global__ void add_bias_kernel(float* out, const int32_t* ids, const float* vals, int n) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) out[ids[j]] += vals[j];
}

__global__ void count_token_kernel(int* counts, const int32_t* token) { counts[*token] += 1; }

// (value, index) order of the top list: larger value first, lower index on ties; NaN never ranks.
__device__ __forceinline__ bool ranks_before(float v, int i, float w, int j) {
  return v > w || (v == w && i < j);
}

// Block-wide best (v, i) among the candidates this thread offers; every thread gets the result.
__device__ __forceinline__ void block_best(float& v, int& i, float* s_v, int* s_i) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ranks_before(ov, oi, v, i)) { v = ov; i = oi; }
  }
  __syncthreads();
  if (lane == 0) { s_v[warp] = v; s_i[warp] = i; }
  __syncthreads();
  v = lane < nw ? s_v[lane] : -CUDART_INF_F;
  i = lane < nw ? s_i[lane] : INT_MAX;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ranks_before(ov, oi, v, i)) { v = ov; i = oi; }
  }
}

// Stage 1: block b covers [b * slice, (b + 1) * slice): its max, sum of exp(x - max), and its top_n (rounds of a
// block-wide best below the previous one). part layout per block: [max, sumexp, top_n values], ids separately.
__global__ void __launch_bounds__(kTopThreads) logprob_partial_kernel(const float* L, int V, int slice, int top_n,
                                                                      float* part_f, int* part_i) {
  __shared__ float s_v[32];
  __shared__ int s_i[32];
  __shared__ float red[32];
  const int b = blockIdx.x, tid = threadIdx.x;
  const int lo = b * slice, hi = min(V, lo + slice);
  float m = -CUDART_INF_F;
  for (int i = lo + tid; i < hi; i += blockDim.x) m = fmaxf(m, L[i]);
  m = block_max(m, red);
  float s = 0.f;
  if (m > -CUDART_INF_F)
    for (int i = lo + tid; i < hi; i += blockDim.x) s += __expf(L[i] - m);
  s = block_sum(s, red);
  float* pf = part_f + (size_t)b * (2 + top_n);
  int* pi = part_i + (size_t)b * top_n;
  if (tid == 0) { pf[0] = m; pf[1] = s; }
  float pv = CUDART_INF_F;
  int pidx = -1;
  for (int r = 0; r < top_n; r++) {
    float v = -CUDART_INF_F;
    int idx = INT_MAX;
    for (int i = lo + tid; i < hi; i += blockDim.x) {
      const float x = L[i];
      if (ranks_before(pv, pidx, x, i) && ranks_before(x, i, v, idx)) { v = x; idx = i; }
    }
    block_best(v, idx, s_v, s_i);
    if (tid == 0) { pf[2 + r] = v; pi[r] = idx; }
    pv = v; pidx = idx;
  }
}

// Stage 2 (one block): log Z from the blocks' (max, sumexp); the top_n over all blocks' candidates; the sampled
// token's logprob. out: [logprob, n_top (as float bits of an int), top values...], out_ids: top ids.
__global__ void __launch_bounds__(kTopThreads) logprob_final_kernel(const float* L, const int32_t* token, int n_blocks,
                                                                    int top_n, const float* part_f, const int* part_i,
                                                                    float* out, int* out_ids) {
  __shared__ float s_v[32];
  __shared__ int s_i[32];
  __shared__ float red[32];
  const int tid = threadIdx.x, stride = 2 + top_n;
  float m = -CUDART_INF_F;
  for (int b = tid; b < n_blocks; b += blockDim.x) m = fmaxf(m, part_f[(size_t)b * stride]);
  m = block_max(m, red);
  float s = 0.f;
  for (int b = tid; b < n_blocks; b += blockDim.x) {
    const float bm = part_f[(size_t)b * stride];
    if (bm > -CUDART_INF_F) s += part_f[(size_t)b * stride + 1] * __expf(bm - m);
  }
  s = block_sum(s, red);
  const float log_z = m + logf(s);
  if (tid == 0) out[0] = L[*token] - log_z;
  const int n_cand = n_blocks * top_n;
  float pv = CUDART_INF_F;
  int pidx = -1, n_fin = 0;
  for (int r = 0; r < top_n; r++) {
    float v = -CUDART_INF_F;
    int idx = INT_MAX;
    for (int c = tid; c < n_cand; c += blockDim.x) {
      const int b = c / top_n, k = c % top_n;
      const float x = part_f[(size_t)b * stride + 2 + k];
      const int i = part_i[c];
      if (i != INT_MAX && ranks_before(pv, pidx, x, i) && ranks_before(x, i, v, idx)) { v = x; idx = i; }
    }
    block_best(v, idx, s_v, s_i);
    if (!(v > -CUDART_INF_F)) break;           // only finite logprobs are listed
    if (tid == 0) { out[2 + r] = v - log_z; out_ids[r] = idx; }
    n_fin = r + 1;
    pv = v; pidx = idx;
  }
  if (tid == 0) out[1] = __int_as_float(n_fin);
}

}  // namespace

int steer_logits(const SteerArgs& a, cudaStream_t st) {
  const int grid = (a.V + kSteerThreads - 1) / kSteerThreads;
  steer_rows_kernel<<<grid, kSteerThreads, 0, st>>>(a.logits, a.out, a.V, a.mask, a.counts, a.presence, a.frequency);
  NQ_LAUNCH_CHECK("steer_rows_kernel");
  if (a.n_bias > 0) {
    add_bias_kernel<<<(a.n_bias + 255) / 256, 256, 0, st>>>(a.out, a.bias_ids, a.bias_vals, a.n_bias);
    NQ_LAUNCH_CHECK("add_bias_kernel");
  }
  return NQ_OK;
}

int count_token(int* counts, const int32_t* token, cudaStream_t st) {
  count_token_kernel<<<1, 1, 0, st>>>(counts, token);
  NQ_LAUNCH_CHECK("count_token_kernel");
  return NQ_OK;
}

int logprob_blocks(int V) { return (V + kLogprobSlice - 1) / kLogprobSlice; }

int token_logprobs(const float* L, int V, const int32_t* token, int top_n, float* part_f, int* part_i, float* out,
                   int* out_ids, cudaStream_t st) {
  const int nb = logprob_blocks(V);
  logprob_partial_kernel<<<nb, kTopThreads, 0, st>>>(L, V, kLogprobSlice, top_n, part_f, part_i);
  NQ_LAUNCH_CHECK("logprob_partial_kernel");
  logprob_final_kernel<<<1, kTopThreads, 0, st>>>(L, token, nb, top_n, part_f, part_i, out, out_ids);
  NQ_LAUNCH_CHECK("logprob_final_kernel");
  return NQ_OK;
}

}  // namespace nq
