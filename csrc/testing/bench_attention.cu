// Attention timing entry points of libnanoqwen_testing: the attention kernel alone on random f16 K/V.
// nq_bench_attention: decode (M = 1: write_kv, as in the decode step) or prefill (M > 1 query tokens at positions
// n_pos-M .. n_pos-1, causal); nq_bench_attention_batch: the batched decode step's attention (rows sequences, one
// token each at position n_pos-1 of its own pages, write_kv). `iters` launches are captured in one CUDA graph (as
// the decode step is) and the graph replayed; the launches rotate over enough layers' caches to exceed the 60 MB L2,
// so K/V come from HBM as in a real step.
#include "testing_util.h"

using namespace nq;
using namespace nq::testing;

namespace {
__global__ void fill_half(__half* p, size_t n, uint32_t seed) {  // uniform [-1, 1): never zeros
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __float2half((float)(h >> 8) * (2.f / 16777216.f) - 1.f);
  }
}

// Capture launch(i, st) for i < iters in one graph, replay it 4 times (the first warms up), microseconds per launch
// of the best of the other three into *us.
template <class Launch>
int time_launches(Launch launch, int iters, float* us) {
  cudaStream_t st;
  NQ_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  int rc = NQ_OK;
  auto done = [&](int r) {
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaStreamDestroy(st);
    return r;
  };
  if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
    return done(fail(NQ_E_CUDA, "bench attention: begin capture failed"));
  for (int i = 0; i < iters && rc == NQ_OK; i++) rc = launch(i, st);
  const cudaError_t ce = cudaStreamEndCapture(st, &g);
  if (rc != NQ_OK) return done(rc);
  if (ce != cudaSuccess) return done(fail(NQ_E_CUDA, "bench attention: capture: %s", cudaGetErrorString(ce)));
  if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess || cudaEventCreate(&e0) != cudaSuccess ||
      cudaEventCreate(&e1) != cudaSuccess)
    return done(fail(NQ_E_CUDA, "bench attention: graph instantiate / events failed"));
  float best = 1e30f;
  for (int r = 0; r < 4; r++) {  // replay 0 warms up; the best of the other three
    cudaEventRecord(e0, st);
    cudaGraphLaunch(ge, st);
    cudaEventRecord(e1, st);
    const cudaError_t se = cudaEventSynchronize(e1);
    if (se != cudaSuccess) return done(fail(NQ_E_CUDA, "bench attention: %s", cudaGetErrorString(se)));
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r > 0) best = std::min(best, ms);
  }
  *us = best * 1e3f / iters;
  return done(NQ_OK);
}
}  // namespace

extern "C" int nq_bench_attention(int32_t n_heads, int32_t n_kv, int32_t head_dim, int32_t n_pos, int32_t M,
                                         int32_t keys_per_split, int32_t n_split, int32_t iters, float* us) {
  if (!us || n_kv <= 0 || n_heads <= 0 || n_heads % n_kv || n_pos <= 0 || M <= 0 || M > n_pos || iters <= 0 ||
      n_split <= 0 || keys_per_split <= 0)
    return fail(NQ_E_INVALID_ARG, "nq_bench_attention: bad argument");
  const int D = head_dim, pages = (n_pos + kPage - 1) / kPage;
  const size_t kv_elems = (size_t)pages * n_kv * kPage * D;  // per layer, K or V
  const int layers = (int)std::min<size_t>(64, std::max<size_t>(1, (256u << 20) / (kv_elems * 4)));
  const int qkv_stride = (n_heads + 2 * n_kv) * D;
  DBuf bk, bv, bqkv, bpo, bpm, bout, bpt, bpos0, brope;
  NQ_TRY(bk.alloc(kv_elems * layers * sizeof(__half)));
  NQ_TRY(bv.alloc(kv_elems * layers * sizeof(__half)));
  NQ_TRY(bqkv.alloc((size_t)M * qkv_stride * sizeof(float)));
  NQ_TRY(bpo.alloc((size_t)M * n_heads * n_split * D * sizeof(__half)));
  NQ_TRY(bpm.alloc((size_t)M * n_heads * n_split * 2 * sizeof(float)));
  NQ_TRY(bout.alloc((size_t)M * n_heads * D * sizeof(__half)));
  NQ_TRY(bpt.alloc(pages * sizeof(int)));
  NQ_TRY(bpos0.alloc(sizeof(int)));
  NQ_TRY(brope.alloc((size_t)n_pos * (D / 2) * sizeof(float2)));
  __half *k = bk.as<__half>(), *v = bv.as<__half>(), *out = bout.as<__half>();
  float *qkv = bqkv.as<float>(), *pm = bpm.as<float>();
  __half* po = bpo.as<__half>();
  int *pt = bpt.as<int>(), *pos0 = bpos0.as<int>();
  float2* rope = brope.as<float2>();
  fill_half<<<1024, 256>>>(k, kv_elems * layers, 1u);
  fill_half<<<1024, 256>>>(v, kv_elems * layers, 2u);
  NQ_LAUNCH_CHECK("fill_half");
  {
    std::vector<float> hq((size_t)M * qkv_stride);
    for (size_t i = 0; i < hq.size(); i++) hq[i] = (float)((i * 7919) % 2003) / 1001.f - 1.f;
    NQ_CUDA(cudaMemcpy(qkv, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int> hpt(pages);
    for (int i = 0; i < pages; i++) hpt[i] = pages - 1 - i;  // reversed physical order, as the tests do
    NQ_CUDA(cudaMemcpy(pt, hpt.data(), pages * 4, cudaMemcpyHostToDevice));
    const int p0 = n_pos - M;
    NQ_CUDA(cudaMemcpy(pos0, &p0, 4, cudaMemcpyHostToDevice));
    std::vector<float2> hr((size_t)n_pos * (D / 2), make_float2(0.8f, 0.6f));
    NQ_CUDA(cudaMemcpy(rope, hr.data(), hr.size() * sizeof(float2), cudaMemcpyHostToDevice));
  }
  AttnArgs a;
  a.qkv = qkv; a.qkv_stride = qkv_stride; a.M = M; a.pos0 = pos0; a.page_table = pt; a.rope = rope;
  a.n_heads = n_heads; a.n_kv = n_kv; a.D = D; a.keys_per_split = keys_per_split; a.n_split = n_split;
  a.write_kv = M == 1; a.part_o = po; a.part_ml = pm; a.out = out;
  a.max_keys = n_pos;   // as session_prefill: picks the prefill kernel's build
  if (M == 1) bound_decode_keys(a, n_pos);   // decode: as a session's graphs bound the keys
  return time_launches([&](int i, cudaStream_t st) {
    a.kv.k = k + kv_elems * (i % layers);
    a.kv.v = v + kv_elems * (i % layers);
    return attention(a, st);
  }, iters, us);
}

extern "C" int nq_bench_attention_batch(int32_t n_heads, int32_t n_kv, int32_t head_dim, int32_t n_pos, int32_t rows,
                                        int32_t keys_per_split, int32_t n_split, int32_t iters, float* us) {
  if (!us || n_kv <= 0 || n_heads <= 0 || n_heads % n_kv || n_pos <= 0 || rows <= 0 || iters <= 0 || n_split <= 0 ||
      keys_per_split <= 0)
    return fail(NQ_E_INVALID_ARG, "nq_bench_attention_batch: bad argument");
  const int D = head_dim, pp = (n_pos + kPage - 1) / kPage, pages = rows * pp;   // pp pages per sequence
  const size_t kv_elems = (size_t)pages * n_kv * kPage * D;  // per layer, K or V (every sequence's pages)
  const int layers = (int)std::min<size_t>(64, std::max<size_t>(1, (256u << 20) / (kv_elems * 4)));
  const int qkv_stride = (n_heads + 2 * n_kv) * D;
  DBuf bk, bv, bqkv, bpo, bpm, bout, bpt, bpts, bpos, bkvof, brope;
  NQ_TRY(bk.alloc(kv_elems * layers * sizeof(__half)));
  NQ_TRY(bv.alloc(kv_elems * layers * sizeof(__half)));
  NQ_TRY(bqkv.alloc((size_t)rows * qkv_stride * sizeof(float)));
  NQ_TRY(bpo.alloc((size_t)rows * n_heads * n_split * D * sizeof(__half)));
  NQ_TRY(bpm.alloc((size_t)rows * n_heads * n_split * 2 * sizeof(float)));
  NQ_TRY(bout.alloc((size_t)rows * n_heads * D * sizeof(__half)));
  NQ_TRY(bpt.alloc((size_t)pages * sizeof(int)));
  NQ_TRY(bpts.alloc((size_t)rows * sizeof(int*)));
  NQ_TRY(bpos.alloc((size_t)rows * sizeof(int)));
  NQ_TRY(bkvof.alloc((size_t)layers * rows * sizeof(KvLayer)));
  NQ_TRY(brope.alloc((size_t)n_pos * (D / 2) * sizeof(float2)));
  __half *k = bk.as<__half>(), *v = bv.as<__half>();
  fill_half<<<1024, 256>>>(k, kv_elems * layers, 1u);
  fill_half<<<1024, 256>>>(v, kv_elems * layers, 2u);
  NQ_LAUNCH_CHECK("fill_half");
  {
    std::vector<float> hq((size_t)rows * qkv_stride);
    for (size_t i = 0; i < hq.size(); i++) hq[i] = (float)((i * 7919) % 2003) / 1001.f - 1.f;
    NQ_CUDA(cudaMemcpy(bqkv.p, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int> hpt(pages);   // sequence r owns pages [r * pp, (r + 1) * pp), in reversed physical order
    for (int i = 0; i < pages; i++) hpt[i] = (i / pp) * pp + (pp - 1 - i % pp);
    NQ_CUDA(cudaMemcpy(bpt.p, hpt.data(), pages * 4, cudaMemcpyHostToDevice));
    std::vector<const int*> hpts(rows);
    for (int r = 0; r < rows; r++) hpts[r] = bpt.as<int>() + (size_t)r * pp;
    NQ_CUDA(cudaMemcpy(bpts.p, hpts.data(), rows * sizeof(int*), cudaMemcpyHostToDevice));
    std::vector<int> hpos(rows, n_pos - 1);
    NQ_CUDA(cudaMemcpy(bpos.p, hpos.data(), rows * 4, cudaMemcpyHostToDevice));
    std::vector<KvLayer> hkv((size_t)layers * rows);
    for (int l = 0; l < layers; l++)
      for (int r = 0; r < rows; r++) hkv[(size_t)l * rows + r] = KvLayer{k + kv_elems * l, v + kv_elems * l};
    NQ_CUDA(cudaMemcpy(bkvof.p, hkv.data(), hkv.size() * sizeof(KvLayer), cudaMemcpyHostToDevice));
    std::vector<float2> hr((size_t)n_pos * (D / 2), make_float2(0.8f, 0.6f));
    NQ_CUDA(cudaMemcpy(brope.p, hr.data(), hr.size() * sizeof(float2), cudaMemcpyHostToDevice));
  }
  AttnArgs a;   // as batch.cu sets it for its step (kv / page_table / pos0 unused with the per-sequence arrays)
  a.qkv = bqkv.as<float>(); a.qkv_stride = qkv_stride; a.M = rows; a.pos0 = bpos.as<int>(); a.rope = brope.as<float2>();
  a.n_heads = n_heads; a.n_kv = n_kv; a.D = D; a.keys_per_split = keys_per_split; a.n_split = n_split;
  a.write_kv = true; a.part_o = bpo.as<__half>(); a.part_ml = bpm.as<float>();
  a.out = bout.as<__half>(); a.pos_of = bpos.as<int>(); a.page_table_of = bpts.as<const int*>();
  return time_launches([&](int i, cudaStream_t st) {
    a.kv_of = bkvof.as<KvLayer>() + (size_t)(i % layers) * rows;
    return attention(a, st);
  }, iters, us);
}
