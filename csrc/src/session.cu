// Session: buffers, the decode forward pass (captured once as a CUDA graph), the batched prefill pass, and
// generation with the device sampler. Per layer, decode runs 5 kernels (6 past the short-context bound):
//   qkv GEMV (input RMSNorm fused, bias) -> attention (rope + KV write fused, split-K; short contexts merge the
//   splits in a cluster, longer ones in attn_merge_kernel after it) -> o_proj GEMV (+= residual) -> gate/up GEMV
//   (RMSNorm fused, SwiGLU epilogue) -> down GEMV (+= residual)
// then the lm_head GEMV (final RMSNorm fused) and pos += 1. Everything reads position/token from device memory.
#include "session.h"
#include "launch.h"
#include <atomic>
#include <cmath>
#include <cstring>

namespace nq {

Session::~Session() {
  if (st) cudaStreamSynchronize(st);
  if (pool) d_rope = nullptr;   // the pool's rope table and prefill buffers are not this session's to free
  else pre.free();
  for (DecodeGraph* gs : {decode_only, decode_sample})
    for (int cls = 0; cls < 2; cls++) {
      if (gs[cls].exec) cudaGraphExecDestroy(gs[cls].exec);
      if (gs[cls].graph) cudaGraphDestroy(gs[cls].graph);
    }
  void* dev[] = {d_pos, d_token, d_counter, d_samp, d_page_table, d_rope, kv_base, x, qkv, att, hmlp, logits, part_o,
                 part_ml, d_steer, d_counts, d_mask, d_bias_ids, d_bias_vals, d_lp_part_f, d_lp_part_i,
                 d_lp_out, d_lp_ids};
  for (void* p : dev)
    if (p) cudaFree(p);
  if (h_tokens) cudaFreeHost(h_tokens);
  if (h_table) cudaFreeHost(h_table);
  if (h_ring) cudaFreeHost(h_ring);
  for (cudaEvent_t e : ring_ev)
    if (e) cudaEventDestroy(e);
  if (h_steer_out) cudaFreeHost(h_steer_out);
  if (st) cudaStreamDestroy(st);
  if (pool) kv_pool_release(pool);
}

KvPool::~KvPool() {
  if (st) cudaStreamSynchronize(st);
  void* dev[] = {base, d_rope};
  for (void* p : dev)
    if (p) cudaFree(p);
  pre.free();
  if (poisoned) cudaEventDestroy(poisoned);
  if (st) cudaStreamDestroy(st);
}

int PrefillBuffers::alloc(const Model& m, int C) {
  const nq_config& c = m.cfg;
  const int H = c.hidden_size, I = c.intermediate_size, Nq = c.n_heads * c.head_dim;
  const int Nqkv = Nq + 2 * c.n_kv_heads * c.head_dim;
  // G and U (f32 gate and up outputs, 2 x C x I x 4 bytes: 310 MB for the 7B at 2,048 tokens) feed swiglu_rows;
  // gemm_swiglu's ORDER_FRAG_PAIR path writes HM from its epilogue and never touches them
  bool swiglu_scratch = false;
  for (const Layer& L : m.layers) swiglu_scratch |= L.gate.order != ORDER_FRAG_PAIR || L.up.order != ORDER_FRAG_PAIR;
  int rc = NQ_OK;
  if ((rc = dalloc(&d_tokens, C, "prefill tokens")) || (rc = dalloc(&X, (size_t)C * H, "X")) ||
      (rc = dalloc(&Xn, (size_t)C * std::max(std::max(H, I), Nq), "Xn")) ||
      (rc = dalloc(&QKV, (size_t)C * Nqkv, "QKV")) || (rc = dalloc(&ATT, (size_t)C * Nq, "ATT")) ||
      (swiglu_scratch && (rc = dalloc(&G, (size_t)C * I, "G"))) ||
      (swiglu_scratch && (rc = dalloc(&U, (size_t)C * I, "U"))) || (rc = dalloc(&HM, (size_t)C * I, "HM")) ||
      (rc = dalloc(&part_o, (size_t)kSplitPrefillRows * c.n_heads * c.head_dim, "prefill attention partials")) ||
      (rc = dalloc(&part_ml, (size_t)kSplitPrefillRows * c.n_heads * 2, "prefill attention partials")))
    return rc;
  return NQ_OK;
}

void PrefillBuffers::free() {
  void* dev[] = {d_tokens, X, Xn, QKV, ATT, G, U, HM, part_o, part_ml};
  for (void* p : dev)
    if (p) cudaFree(p);
  *this = PrefillBuffers{};
}

void kv_pool_release(KvPool* p) {
  if (p && p->refs.fetch_sub(1) == 1) delete p;
}

namespace {

// HF rotary embedding (transformers' modeling_rope_utils, mirrored step for step by nanoqwen_rt/rope.py, which the
// CPU tests check against transformers): inv_freq = 1 / theta^(2i/D) in float32 (the power rounded once), angle =
// float32(pos * inv_freq), cos/sin of that angle. Linear scaling divides inv_freq by the factor. YaRN (beta_fast
// 32, beta_slow 1, attention_factor 0.1 ln(factor) + 1) blends interpolated and extrapolated frequencies over a
// linear ramp between the correction dimensions and multiplies cos and sin by the attention factor.
std::vector<float2> rope_table(const nq_config& c, int max_ctx) {
  const int D = c.head_dim, half = D / 2;
  std::vector<float> pos_freq(half), inv(half);
  for (int i = 0; i < half; i++) {
    const float ex = (float)(2 * i) / (float)D;                       // float32 exponent, as torch
    pos_freq[i] = (float)std::pow(c.rope_theta, (double)ex);          // power rounded once to float32
    inv[i] = 1.0f / pos_freq[i];
    if (c.rope_scaling_type == (int32_t)contract::kRopeLinear && c.rope_scaling_factor > 0.f) inv[i] /= c.rope_scaling_factor;
  }
  float attention = 1.f;
  if (c.rope_scaling_type == (int32_t)contract::kRopeYarn) {
    const double factor = c.rope_scaling_factor, orig = c.rope_original_max_positions, theta = c.rope_theta;
    const double kBetaFast = 32.0, kBetaSlow = 1.0, kPi = 3.14159265358979323846;
    auto correction_dim = [&](double rot) { return (D * std::log(orig / (rot * 2 * kPi))) / (2 * std::log(theta)); };
    const double low = std::max(std::floor(correction_dim(kBetaFast)), 0.0);
    double high = std::min(std::ceil(correction_dim(kBetaSlow)), (double)(D - 1));
    if (low == high) high += 0.001;                                    // transformers: prevent a singularity
    for (int i = 0; i < half; i++) {
      float ramp = ((float)i - (float)low) / (float)(high - low);
      ramp = std::min(std::max(ramp, 0.f), 1.f);
      const float extrap = 1.f - ramp;
      const float inv_extrap = 1.0f / pos_freq[i], inv_interp = 1.0f / ((float)factor * pos_freq[i]);
      inv[i] = inv_interp * (1.f - extrap) + inv_extrap * extrap;
    }
    attention = factor <= 1.0 ? 1.f : (float)(0.1 * std::log(factor) + 1.0);
  }
  std::vector<float2> t((size_t)max_ctx * half);
  for (int p = 0; p < max_ctx; p++)
    for (int i = 0; i < half; i++) {
      const float ang = (float)p * inv[i];
      t[(size_t)p * half + i] = make_float2((float)std::cos((double)ang) * attention,
                                            (float)std::sin((double)ang) * attention);
    }
  return t;
}

}  // namespace

size_t kv_page_bytes(const nq_config& c) {
  return (size_t)2 * c.n_layers * c.n_kv_heads * kPage * c.head_dim * sizeof(__half);
}

namespace {

// Page ids of one poison launch, passed by value as a kernel argument (no copy, no device list).
constexpr int kPoisonPagesPerLaunch = 64;
struct PoisonPages {
  int32_t n;
  int32_t ids[kPoisonPagesPerLaunch];
};

// Every element of the listed pages, keys and values of every layer, to f16 NaN (0xFFFF). grid (pages.n, layers * 2).
__global__ void poison_pages_kernel(__half* base, PoisonPages pages, size_t page_elems, size_t pool_elems) {
  if ((int)blockIdx.x >= pages.n) return;
  const size_t page = (size_t)pages.ids[blockIdx.x];
  uint4* p = reinterpret_cast<uint4*>(base + (size_t)blockIdx.y * pool_elems + page * page_elems);
  const uint4 nan8 = make_uint4(0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu);
  for (size_t i = threadIdx.x; i < page_elems / 8; i += blockDim.x) p[i] = nan8;
}

// Elements of one page in one layer's K (or V): [n_kv][kPage][D].
size_t page_elems(const nq_config& c) { return (size_t)c.n_kv_heads * kPage * c.head_dim; }

}  // namespace

int kv_pool_create(Model* m, int n_pages, KvPool** out) {
  const nq_config& c = m->cfg;
  KvPool* p = new KvPool();
  auto bail = [&](int rc) { delete p; return rc; };
  p->m = m;
  p->n_pages = n_pages;
  p->prefill_chunk = std::min(NQ_PREFILL_CHUNK_TOKENS, c.max_positions);
  const int D = c.head_dim;
  const size_t layer_elems = (size_t)n_pages * page_elems(c);   // per layer, per K or V
  cudaError_t e = cudaStreamCreateWithFlags(&p->st, cudaStreamNonBlocking);
  if (e != cudaSuccess) return bail(fail(cuda_status(e), "cudaStreamCreate: %s", cudaGetErrorString(e)));
  if ((e = cudaEventCreateWithFlags(&p->poisoned, cudaEventDisableTiming)) != cudaSuccess)
    return bail(fail(cuda_status(e), "cudaEventCreate (KV pool): %s", cudaGetErrorString(e)));
  int rc = NQ_OK;
  if ((rc = dalloc(&p->base, layer_elems * 2 * c.n_layers, "KV page pool")) ||
      (rc = dalloc(&p->d_rope, (size_t)c.max_positions * (D / 2), "rope table")) ||
      (rc = p->pre.alloc(*m, p->prefill_chunk)))
    return bail(rc);
  p->kv.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; l++) {
    p->kv[l].k = p->base + (size_t)l * 2 * layer_elems;
    p->kv[l].v = p->kv[l].k + layer_elems;
  }
  const std::vector<float2> rope = rope_table(c, c.max_positions);
  if ((e = cudaMemcpy(p->d_rope, rope.data(), rope.size() * sizeof(float2), cudaMemcpyHostToDevice)) ||
      (e = cudaMemset(p->base, 0xFF, layer_elems * 2 * c.n_layers * sizeof(__half))) ||   // every page poisoned
      (e = cudaDeviceSynchronize()))
    return bail(fail(cuda_status(e), "KV pool init: %s", cudaGetErrorString(e)));
  *out = p;
  return NQ_OK;
}

// No host synchronisation and no copy: the ids go by value, kPoisonPagesPerLaunch a launch, and the fill is ordered
// before the pages' later users on the device (p->poisoned, kv_pool_wait_poison). bench/NOTES.md "Session 15": the
// per-sequence pageable copy + cudaStreamSynchronize here held the host ~0.75 ms when 32 streams took pages at once.
int kv_pool_poison(KvPool* p, const int32_t* pages, int n) {
  if (n == 0) return NQ_OK;
  const nq_config& c = p->m->cfg;
  const size_t pe = page_elems(c);
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < n && e == cudaSuccess; i += kPoisonPagesPerLaunch) {
    PoisonPages list{};
    list.n = std::min(kPoisonPagesPerLaunch, n - i);
    std::memcpy(list.ids, pages + i, (size_t)list.n * sizeof(int32_t));
    poison_pages_kernel<<<dim3((unsigned)list.n, (unsigned)(2 * c.n_layers)), 256, 0, p->st>>>(
        p->base, list, pe, (size_t)p->n_pages * pe);
    e = cudaGetLastError();
  }
  const cudaError_t r = cudaEventRecord(p->poisoned, p->st);   // after what was launched, also when a launch failed
  if (e == cudaSuccess) e = r;
  if (e != cudaSuccess) return fail(cuda_status(e), "kv_pool_poison: %s", cudaGetErrorString(e));
  return NQ_OK;
}

int kv_pool_wait_poison(KvPool* p, cudaStream_t st) {
  NQ_CUDA(cudaStreamWaitEvent(st, p->poisoned, 0));
  return NQ_OK;
}

namespace {

int create(Model* m, KvPool* pool, int max_ctx, const nq_sampling* sp, Session** out) {
  const nq_config& c = m->cfg;
  static std::atomic<uint64_t> next_serial{1};
  Session* s = new Session();
  s->m = m;
  s->serial = next_serial++;
  s->max_ctx = max_ctx;
  if (sp) s->samp = *sp;
  auto bail = [&](int rc) { delete s; return rc; };
  const int H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, V = c.vocab_rows;
  const int Nq = c.n_heads * D, Nkv = c.n_kv_heads * D, Nqkv = Nq + 2 * Nkv;
  s->max_pages = (max_ctx + kPage - 1) / kPage;
  s->prefill_chunk = pool ? pool->prefill_chunk : std::min(NQ_PREFILL_CHUNK_TOKENS, max_ctx);
  if (pool) {   // the pool's rows, rope table and prefill buffers; its reference is dropped by ~Session
    pool->refs.fetch_add(1);
    s->pool = pool;
    s->kv = pool->kv;
    s->d_rope = pool->d_rope;
    s->pre = pool->pre;
  }
  const int C = s->prefill_chunk;
  // decode attention: up to SMs / n_kv splits of at least kDecodeKeysPerSplit keys, so that the launch is one wave of
  // attention.cu's one-block-an-SM build (8 warps; bench/NOTES.md "Session 21" §2: 64 splits of 4-warp blocks took
  // 14.4 / 29.8 us a 7B layer at 8K / 32K keys, 33 of 8 warps 10.4 / 22.4)
  s->nsplit_decode = std::max(1, std::min(std::min(kAttnMaxSplits, device_sms() / c.n_kv_heads),
                                          (max_ctx + kDecodeKeysPerSplit - 1) / kDecodeKeysPerSplit));
  // Short contexts: a second pair of decode graphs whose attention runs one cluster of C splits (C: the largest the
  // GPU holds of the power of two <= min(kAttnMaxCluster, nsplit_decode)) merging in distributed shared memory, for
  // the steps with at most C x attn_cluster_keys_per_block(head_dim) keys (H200, 7B: C = 8, 6.3 -> 5.0 us a layer at
  // 577 keys, bench/NOTES.md "Session 22" §1-3; the bound: kernels.h)
  {
    int ns = 1;
    while (2 * ns <= std::min(kAttnMaxCluster, s->nsplit_decode)) ns *= 2;
    const int C = attn_decode_cluster(c.n_kv_heads, ns, c.head_dim);
    s->nsplit_short = C > 1 ? C : 0;
    s->short_keys = C > 1 ? C * attn_cluster_keys_per_block(c.head_dim) : 0;
  }
  int rc = NQ_OK;
  {
    cudaError_t e = cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking);
    if (e != cudaSuccess) return bail(fail(cuda_status(e), "cudaStreamCreate: %s", cudaGetErrorString(e)));
  }
  const size_t kv_elems = (size_t)s->max_pages * c.n_kv_heads * kPage * D;  // per layer, per K or V
  // decode attention partials: [n_heads][nsplit_decode][D] (M = 1)
  const size_t part_rows = (size_t)s->nsplit_decode;
  if ((rc = dalloc(&s->d_pos, 1, "pos")) || (rc = dalloc(&s->d_token, 1, "token")) ||
      (rc = dalloc(&s->d_counter, 1, "counter")) || (rc = dalloc(&s->d_samp, 1, "sampling")) || (rc = dalloc(&s->d_page_table, s->max_pages, "page table")) ||
      (!pool && (rc = dalloc(&s->d_rope, (size_t)max_ctx * (D / 2), "rope table"))) ||
      (!pool && (rc = dalloc(&s->kv_base, kv_elems * 2 * c.n_layers, "KV cache"))) || (rc = dalloc(&s->x, H, "x")) ||
      (rc = dalloc(&s->qkv, Nqkv, "qkv")) || (rc = dalloc(&s->att, Nq, "att")) || (rc = dalloc(&s->hmlp, I, "hmlp")) ||
      (rc = dalloc(&s->logits, V, "logits")) ||
      (rc = dalloc(&s->part_o, part_rows * c.n_heads * D, "attention partials")) ||
      (rc = dalloc(&s->part_ml, part_rows * c.n_heads * 2, "attention partials")) ||
      (!pool && (rc = s->pre.alloc(*m, C))) ||
      (rc = dalloc(&s->d_steer, V, "steered logits")) ||
      (rc = dalloc(&s->d_counts, V, "token counts")) || (rc = dalloc(&s->d_mask, (V + 31) / 32, "token mask")) ||
      (rc = dalloc(&s->d_bias_ids, kMaxLogitBias, "logit bias")) ||
      (rc = dalloc(&s->d_bias_vals, kMaxLogitBias, "logit bias")) ||
      (rc = dalloc(&s->d_lp_part_f, (size_t)logprob_blocks(V) * (2 + kMaxTopLogprobs), "logprob partials")) ||
      (rc = dalloc(&s->d_lp_part_i, (size_t)logprob_blocks(V) * kMaxTopLogprobs, "logprob partials")) ||
      (rc = dalloc(&s->d_lp_out, 2 + kMaxTopLogprobs, "logprobs")) ||
      (rc = dalloc(&s->d_lp_ids, kMaxTopLogprobs, "logprob ids")))
    return bail(rc);
  {
    cudaError_t e = cudaHostAlloc(&s->h_tokens, C * sizeof(int32_t), cudaHostAllocDefault);
    if (e == cudaSuccess) e = cudaHostAlloc(&s->h_ring, s->ring * sizeof(int32_t), cudaHostAllocMapped);
    if (e == cudaSuccess) e = cudaHostGetDevicePointer(&s->d_ring, s->h_ring, 0);
    if (e == cudaSuccess) e = cudaHostAlloc(&s->h_steer_out, (3 + 2 * kMaxTopLogprobs) * sizeof(float), cudaHostAllocDefault);
    if (e == cudaSuccess && pool)
      e = cudaHostAlloc(&s->h_table, ((size_t)s->max_pages + 1) * sizeof(int32_t), cudaHostAllocDefault);
    if (e != cudaSuccess) return bail(fail(cuda_status(e), "pinned host buffers: %s", cudaGetErrorString(e)));
  }
  if (!pool) {
    s->kv.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; l++) {
      s->kv[l].k = s->kv_base + (size_t)l * 2 * kv_elems;
      s->kv[l].v = s->kv[l].k + kv_elems;
    }
  }
  // a cache of its own: the identity table; a pooled session: page 0 everywhere until session_set_pages (never
  // read: nothing runs before its pages hold the positions)
  std::vector<int> pt(s->max_pages, 0);
  if (!pool)
    for (int i = 0; i < s->max_pages; i++) pt[i] = i;
  auto fail_cuda = [&](cudaError_t e, const char* what) { return bail(fail(cuda_status(e), "%s: %s", what, cudaGetErrorString(e))); };
  cudaError_t e;
  if ((e = cudaMemcpy(s->d_page_table, pt.data(), pt.size() * 4, cudaMemcpyHostToDevice))) return fail_cuda(e, "page table upload");
  if (!pool) {
    const std::vector<float2> rope = rope_table(c, max_ctx);
    if ((e = cudaMemcpy(s->d_rope, rope.data(), rope.size() * sizeof(float2), cudaMemcpyHostToDevice)))
      return fail_cuda(e, "rope upload");
  }
  if ((e = cudaMemset(s->d_pos, 0, 4)) || (e = cudaMemset(s->d_token, 0, 4)) || (e = cudaMemset(s->d_counter, 0, 8)) ||
      (e = cudaMemset(s->d_counts, 0, (size_t)V * sizeof(int))))
    return fail_cuda(e, "state init");
  if ((e = cudaMemcpy(s->d_samp, &s->samp, sizeof(nq_sampling), cudaMemcpyHostToDevice))) return fail_cuda(e, "sampling upload");
  // capture decode_only (which == 0) and decode_sample (which == 1), for any context (cls 0) and, where the GPU runs
  // the cluster merge, for short ones (cls 1)
  for (int cls = 0; cls < (s->short_keys > 0 ? 2 : 1); cls++)
    for (int which = 0; which < 2; which++) {
      if ((e = cudaStreamBeginCapture(s->st, cudaStreamCaptureModeThreadLocal))) return fail_cuda(e, "begin capture");
      int r2 = enqueue_decode(s, cls == 1);
      if (r2 == NQ_OK && which == 1) r2 = enqueue_sample(s);
      cudaGraph_t g = nullptr;
      e = cudaStreamEndCapture(s->st, &g);
      if (r2 != NQ_OK) { if (g) cudaGraphDestroy(g); return bail(r2); }
      if (e) return fail_cuda(e, "end capture");
      cudaGraphExec_t ex = nullptr;
      if ((e = cudaGraphInstantiate(&ex, g, 0))) { cudaGraphDestroy(g); return fail_cuda(e, "graph instantiate"); }
      Session::DecodeGraph& dg = which == 0 ? s->decode_only[cls] : s->decode_sample[cls];
      dg.graph = g;
      dg.exec = ex;
    }
  if ((e = cudaStreamSynchronize(s->st))) return fail_cuda(e, "session init");
  *out = s;
  return NQ_OK;
}

}  // namespace

int session_create(Model* m, int max_ctx, const nq_sampling* sp, Session** out) {
  return create(m, nullptr, max_ctx, sp, out);
}

int session_create_pooled(Model* m, KvPool* pool, int max_ctx, const nq_sampling* sp, Session** out) {
  return create(m, pool, max_ctx, sp, out);
}

// The caller (the C ABI) checked the list with check_session_pages. Uploads the entries from the first one that
// changed, and the position when it is not the session's, on the session's stream from its pinned staging row
// (h_table): after its enqueued steps, before its next one; a batched step synchronizes the session's stream before
// it starts. Returns without waiting for the copies. It first synchronizes the session's stream, so that the
// previous call's copies have read the staging row before it is overwritten (normally long done; it also waits for
// an enqueued nq_decode of the session, as the synchronisation after the copies did before).
int session_set_pages(Session* s, const int32_t* pages, int n, int position) {
  NQ_CUDA(cudaStreamSynchronize(s->st));
  int first = 0;
  while (first < n && first < (int)s->pages.size() && s->pages[first] == pages[first]) first++;
  int32_t* row = s->h_table;   // [max_pages] entries, then the position
  if (first < n) {
    std::memcpy(row + first, pages + first, (size_t)(n - first) * sizeof(int32_t));
    NQ_CUDA(cudaMemcpyAsync(s->d_page_table + first, row + first, (size_t)(n - first) * sizeof(int32_t),
                            cudaMemcpyHostToDevice, s->st));
  }
  if (position != s->pos) {
    row[s->max_pages] = position;
    NQ_CUDA(cudaMemcpyAsync(s->d_pos, row + s->max_pages, sizeof(int32_t), cudaMemcpyHostToDevice, s->st));
  }
  s->pages.assign(pages, pages + n);
  if (position != s->pos) {
    s->pos = position;
    s->have_logits = false;
  }
  return NQ_OK;
}

namespace {
// One token's layer after its attention: x += o(att); x += down(swiglu(gate, up)(rmsnorm(x))), the decode GEMVs
// (the decode step's, and session_prefill's last-token tail).
int decode_o_mlp(Session* s, const Layer& L, cudaStream_t st) {
  GemvArgs oa;
  oa.seg[0] = L.o; oa.x_f16 = s->att; oa.out_f32 = s->x; oa.mode = GEMV_ADD;
  NQ_TRY(gemv(oa, st));
  GemvArgs ga;
  ga.seg[0] = L.gate; ga.up = L.up; ga.x_f32 = s->x; ga.norm_w = L.ln2; ga.eps = s->m->cfg.rms_norm_eps;
  ga.out_f16 = s->hmlp; ga.mode = GEMV_SWIGLU;
  NQ_TRY(gemv(ga, st));
  GemvArgs da;
  da.seg[0] = L.down; da.x_f16 = s->hmlp; da.out_f32 = s->x; da.mode = GEMV_ADD;
  return gemv(da, st);
}
}  // namespace

int enqueue_decode(Session* s, bool short_ctx) {
  const Model& m = *s->m;
  const nq_config& c = m.cfg;
  const int H = c.hidden_size, D = c.head_dim, Nq = c.n_heads * D;
  cudaStream_t st = s->st;
  NQ_TRY(embed_token(m.embed, m.embed_dtype, s->d_token, H, s->x, st));
  for (int l = 0; l < c.n_layers; l++) {
    const Layer& L = m.layers[l];
    GemvArgs qa;
    qa.seg[0] = L.q; qa.seg[1] = L.k; qa.seg[2] = L.v; qa.nseg = 3;
    qa.bias[0] = L.bq; qa.bias[1] = L.bk; qa.bias[2] = L.bv;
    qa.x_f32 = s->x; qa.norm_w = L.ln1; qa.eps = c.rms_norm_eps;
    qa.out_f32 = s->qkv; qa.mode = GEMV_STORE;
    NQ_TRY(gemv(qa, st));
    AttnArgs aa;
    aa.qkv = s->qkv; aa.qkv_stride = Nq + 2 * c.n_kv_heads * D; aa.M = 1; aa.pos0 = s->d_pos;
    aa.kv = s->kv[l]; aa.page_table = s->d_page_table; aa.rope = s->d_rope;
    aa.n_heads = c.n_heads; aa.n_kv = c.n_kv_heads; aa.D = D;
    aa.keys_per_split = kDecodeKeysPerSplit; aa.write_kv = true;
    aa.n_split = short_ctx ? s->nsplit_short : s->nsplit_decode;
    aa.cluster_keys = short_ctx ? s->short_keys : 0;
    aa.part_o = s->part_o; aa.part_ml = s->part_ml; aa.out = s->att;
    NQ_TRY(attention(aa, st));
    NQ_TRY(decode_o_mlp(s, L, st));
  }
  GemvArgs la;
  la.seg[0] = m.lm_head; la.x_f32 = s->x; la.norm_w = m.final_norm; la.eps = c.rms_norm_eps;
  la.out_f32 = s->logits; la.mode = GEMV_STORE;
  NQ_TRY(gemv(la, st));
  return advance_pos(s->d_pos, 1, st);
}

int enqueue_sample(Session* s) {
  SampleArgs a;
  a.logits = s->logits; a.V = s->m->cfg.vocab_rows;
  a.params = s->d_samp;
  a.counter = s->d_counter; a.token_out = s->d_token; a.host_ring = s->d_ring; a.ring_size = s->ring;
  return sample(a, s->st);
}

int session_set_sampling(Session* s, const nq_sampling* sp) {
  s->samp = sp ? *sp : nq_sampling{0.f, 0, 1.f, 0};
  NQ_CUDA(cudaStreamSynchronize(s->st));
  NQ_CUDA(cudaMemcpy(s->d_samp, &s->samp, sizeof(nq_sampling), cudaMemcpyHostToDevice));
  // a new seed starts a new random stream
  NQ_CUDA(cudaMemset(s->d_counter, 0, 8));
  return NQ_OK;
}

int session_reset(Session* s) {
  s->pos = 0;
  s->have_logits = false;
  NQ_CUDA(cudaMemsetAsync(s->d_pos, 0, 4, s->st));
  NQ_CUDA(cudaMemsetAsync(s->d_counts, 0, (size_t)s->m->cfg.vocab_rows * sizeof(int), s->st));
  NQ_CUDA(cudaStreamSynchronize(s->st));
  return NQ_OK;
}

int session_sample_steered(Session* s, const int32_t* bias_ids, const float* bias_vals, int n_bias,
                           const int32_t* mask, float presence, float frequency, int top_n, int32_t* out_token,
                           float* out_logprob, int32_t* out_top_ids, float* out_top_logprobs, int32_t* out_n_top) {
  const int V = s->m->cfg.vocab_rows;
  cudaStream_t st = s->st;
  NQ_CUDA(cudaStreamSynchronize(st));
  if (mask) NQ_CUDA(cudaMemcpyAsync(s->d_mask, mask, (size_t)((V + 31) / 32) * 4, cudaMemcpyHostToDevice, st));
  if (n_bias > 0) {
    NQ_CUDA(cudaMemcpyAsync(s->d_bias_ids, bias_ids, (size_t)n_bias * 4, cudaMemcpyHostToDevice, st));
    NQ_CUDA(cudaMemcpyAsync(s->d_bias_vals, bias_vals, (size_t)n_bias * 4, cudaMemcpyHostToDevice, st));
  }
  SteerArgs a;
  a.logits = s->logits; a.out = s->d_steer; a.V = V;
  a.mask = mask ? s->d_mask : nullptr;
  a.counts = (presence != 0.f || frequency != 0.f) ? s->d_counts : nullptr;
  a.presence = presence; a.frequency = frequency;
  a.bias_ids = s->d_bias_ids; a.bias_vals = s->d_bias_vals; a.n_bias = n_bias;
  NQ_TRY(steer_logits(a, st));
  SampleArgs sa;
  sa.logits = s->d_steer; sa.V = V; sa.params = s->d_samp; sa.counter = s->d_counter;
  sa.token_out = s->d_token; sa.host_ring = nullptr; sa.ring_size = 0;
  NQ_TRY(sample(sa, st));
  NQ_TRY(count_token(s->d_counts, s->d_token, st));
  float* h = s->h_steer_out;
  NQ_CUDA(cudaMemcpyAsync(h, s->d_token, 4, cudaMemcpyDeviceToHost, st));
  if (top_n >= 0) {
    NQ_TRY(token_logprobs(s->d_steer, V, s->d_token, top_n, s->d_lp_part_f, s->d_lp_part_i, s->d_lp_out,
                          s->d_lp_ids, st));
    NQ_CUDA(cudaMemcpyAsync(h + 1, s->d_lp_out, (2 + kMaxTopLogprobs) * sizeof(float), cudaMemcpyDeviceToHost, st));
    NQ_CUDA(cudaMemcpyAsync(h + 3 + kMaxTopLogprobs, s->d_lp_ids, kMaxTopLogprobs * sizeof(int),
                            cudaMemcpyDeviceToHost, st));
  }
  NQ_CUDA(cudaStreamSynchronize(st));
  std::memcpy(out_token, h, 4);
  if (top_n >= 0) {
    *out_logprob = h[1];
    int n_fin;
    std::memcpy(&n_fin, h + 2, 4);
    n_fin = std::max(0, std::min(n_fin, top_n));
    for (int r = 0; r < n_fin; r++) {
      out_top_logprobs[r] = h[3 + r];
      std::memcpy(&out_top_ids[r], h + 3 + kMaxTopLogprobs + r, 4);
    }
    *out_n_top = n_fin;
  }
  return NQ_OK;
}

// The attention split count of a prefill chunk of M tokens whose last token sees n_keys keys: kSplitPrefillRows / M
// splits (at most kAttnMaxSplits) of the decode kernel where that gives at least kSplitPrefillMinSplits splits with keys, else 1 (the
// prefill kernel). attn_bench --few-tokens (bench/NOTES.md "Session 10" §6): the split path takes ~5 + 0.12 x
// keys-per-split us a layer, the prefill kernel ~9 + 0.033 x keys whatever M <= 32; 2 used splits lost (577 keys,
// M = 8: 37.5 against 28.3 us), 4 or more won everywhere measured.
namespace {
constexpr int kSplitPrefillMinSplits = 4;
int split_prefill_count(int M, int n_keys) {
  if (M > kSplitPrefillMaxTokens) return 1;
  const int ns = std::max(1, std::min(kAttnMaxSplits, kSplitPrefillRows / M));
  const int kps = std::max(32, ((n_keys + ns - 1) / ns + 31) / 32 * 32);   // as attn_decode_kernel derives it
  return (n_keys + kps - 1) / kps >= kSplitPrefillMinSplits ? ns : 1;
}
}  // namespace

// Batched pass over n tokens in chunks of prefill_chunk. logits_all: n*V floats (host) or null.
// Without logits_all, two results of a chunk outlive it: the K/V rows each layer writes, and (the call's last chunk)
// the logits of its last token. So the last layer stops after writing its K/V rows in every chunk but the last, and
// in the last one runs attention, o, the MLP and the logits for the last token alone (M = 1: the decode attention
// kernel over the keys, the few-token GEMMs), which saves ~1/n_layers of a chunk's GEMM work (bench/NOTES.md
// "Session 14"). logits_all runs every row of every layer, its lm_head kLogitsAllRows rows at a time.
namespace {
constexpr int kLogitsAllRows = 512;   // 512 x 152,064 f32 logits: 311 MB for Qwen2.5's vocabulary
}  // namespace

int session_prefill(Session* s, const int32_t* tokens, int n, float* logits_all) {
  const Model& m = *s->m;
  const nq_config& c = m.cfg;
  const int H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, V = c.vocab_rows;
  const int Nq = c.n_heads * D, Nkv = c.n_kv_heads * D, Nqkv = Nq + 2 * Nkv;
  const float eps = c.rms_norm_eps;
  cudaStream_t st = s->st;
  std::unique_lock<std::mutex> shared_buffers;   // a pooled session's prefill buffers are the pool's
  if (s->pool) shared_buffers = std::unique_lock<std::mutex>(s->pool->prefill_mu);
  float* logits_dev = nullptr;
  const int LR = std::min(s->prefill_chunk, kLogitsAllRows);
  if (logits_all) NQ_TRY(dalloc(&logits_dev, (size_t)LR * V, "logits_all"));
  int rc = NQ_OK;
  for (int done = 0; done < n && rc == NQ_OK; ) {
    const int M = std::min(s->prefill_chunk, n - done);
    const bool last_chunk = done + M == n;
    NQ_CUDA(cudaStreamSynchronize(st));  // h_tokens is reused
    std::memcpy(s->h_tokens, tokens + done, M * sizeof(int32_t));
    auto run = [&]() -> int {
      // pages a pool just handed out are poisoned first (after the host synchronisation above: it does not wait)
      if (s->pool) NQ_TRY(kv_pool_wait_poison(s->pool, st));
      NQ_CUDA(cudaMemcpyAsync(s->pre.d_tokens, s->h_tokens, M * sizeof(int32_t), cudaMemcpyHostToDevice, st));
      NQ_TRY(embed_rows(m.embed, m.embed_dtype, s->pre.d_tokens, M, H, s->pre.X, st));
      for (int l = 0; l < c.n_layers; l++) {
        const Layer& L = m.layers[l];
        const bool tail = logits_all == nullptr && l == c.n_layers - 1;   // only its K/V rows and last token matter
        NQ_TRY(rmsnorm_rows(s->pre.X, L.ln1, M, H, eps, s->pre.Xn, st));
        {  // q, k, v in one launch
          const LinW W3[3] = {L.q, L.k, L.v};
          float* const C3[3] = {s->pre.QKV, s->pre.QKV + Nq, s->pre.QKV + Nq + Nkv};
          const float* const B3[3] = {L.bq, L.bk, L.bv};
          NQ_TRY(gemm_multi(W3, C3, B3, 3, s->pre.Xn, H, M, Nqkv, false, st));
        }
        NQ_TRY(rope_kv_write(s->pre.QKV, Nqkv, M, s->d_pos, s->kv[l], s->d_page_table, s->d_rope, c.n_heads,
                             c.n_kv_heads, D, st));
        if (tail && !last_chunk) break;
        // the tail's last token (row M - 1, its query at *d_pos + M - 1) goes on alone through the decode step's
        // kernels in s->x / s->att; otherwise all rows in the prefill buffers
        const int r0 = tail ? M - 1 : 0, Mr = M - r0;
        if (tail)
          NQ_CUDA(cudaMemcpyAsync(s->x, s->pre.X + (size_t)r0 * H, H * sizeof(float), cudaMemcpyDeviceToDevice, st));
        AttnArgs aa;
        aa.qkv = s->pre.QKV + (size_t)r0 * Nqkv; aa.qkv_stride = Nqkv; aa.M = Mr; aa.pos0 = s->d_pos;
        aa.pos_offset = r0;
        aa.kv = s->kv[l]; aa.page_table = s->d_page_table; aa.rope = s->d_rope;
        aa.n_heads = c.n_heads; aa.n_kv = c.n_kv_heads; aa.D = D;
        // up to kSplitPrefillMaxTokens tokens (a prefix-cache hit's suffix, a short prompt, a long prompt's last
        // chunk, the tail's last token): the decode kernel, keys split over kSplitPrefillRows / Mr blocks per (token,
        // KV head), partials in the prefill buffers' (Mr x n_split <= kSplitPrefillRows rows); more: the prefill
        // kernel (tensor cores, no splits)
        aa.keys_per_split = 32; aa.write_kv = false;
        aa.n_split = split_prefill_count(Mr, s->pos + M);
        aa.max_keys = s->pos + M;
        aa.part_o = s->pre.part_o; aa.part_ml = s->pre.part_ml;
        aa.out = tail ? s->att : s->pre.ATT;
        NQ_TRY(attention(aa, st));
        if (tail) {
          NQ_TRY(decode_o_mlp(s, L, st));
          break;
        }
        NQ_TRY(gemm(L.o, s->pre.ATT, Nq, M, s->pre.X, H, nullptr, true, st));
        NQ_TRY(rmsnorm_rows(s->pre.X, L.ln2, M, H, eps, s->pre.Xn, st));
        NQ_TRY(gemm_swiglu(L.gate, L.up, s->pre.Xn, H, M, s->pre.G, s->pre.U, s->pre.HM, st));
        NQ_TRY(gemm(L.down, s->pre.HM, I, M, s->pre.X, H, nullptr, true, st));
      }
      for (int r = 0; logits_dev && r < M; r += LR) {
        const int R = std::min(LR, M - r);
        NQ_TRY(rmsnorm_rows(s->pre.X + (size_t)r * H, m.final_norm, R, H, eps, s->pre.Xn, st));
        NQ_TRY(gemm(m.lm_head, s->pre.Xn, H, R, logits_dev, V, nullptr, false, st));
        NQ_CUDA(cudaMemcpyAsync(logits_all + (size_t)(done + r) * V, logits_dev, (size_t)R * V * sizeof(float),
                                cudaMemcpyDeviceToHost, st));
      }
      if (last_chunk) {  // logits of the last token through the decode lm_head GEMV (the tail left it in s->x)
        if (logits_all)
          NQ_CUDA(cudaMemcpyAsync(s->x, s->pre.X + (size_t)(M - 1) * H, H * sizeof(float), cudaMemcpyDeviceToDevice,
                                  st));
        GemvArgs la;
        la.seg[0] = m.lm_head; la.x_f32 = s->x; la.norm_w = m.final_norm; la.eps = eps;
        la.out_f32 = s->logits; la.mode = GEMV_STORE;
        NQ_TRY(gemv(la, st));
      }
      NQ_TRY(advance_pos(s->d_pos, M, st));
      return NQ_OK;
    };
    rc = run();
    if (rc == NQ_OK) { s->pos += M; done += M; }
  }
  cudaError_t e = cudaStreamSynchronize(st);
  if (logits_dev) cudaFree(logits_dev);
  if (rc != NQ_OK) return rc;
  if (e != cudaSuccess) return fail(NQ_E_CUDA, "prefill: %s", cudaGetErrorString(e));
  s->have_logits = true;
  return NQ_OK;
}

// Enqueues the step and returns without waiting for it: every later call on the session starts by synchronizing
// its stream, so the host can work meanwhile (a steered generation computes the next grammar mask here).
int session_decode(Session* s, int32_t token) {
  NQ_CUDA(cudaStreamSynchronize(s->st));  // h_tokens is reused
  s->h_tokens[0] = token;
  NQ_CUDA(cudaMemcpyAsync(s->d_token, s->h_tokens, 4, cudaMemcpyHostToDevice, s->st));
  if (s->pool) NQ_TRY(kv_pool_wait_poison(s->pool, s->st));   // pages a pool just handed out are poisoned first
  NQ_CUDA(cudaGraphLaunch(s->decode_graph(s->decode_only, s->pos + 1), s->st));
  s->pos += 1;
  s->have_logits = true;
  return NQ_OK;
}

// Sample from the current logits, then (while more tokens are wanted) decode + sample in one graph per token.
// Graph launches run ahead of the host by up to `ring - 1` tokens; after a stop the device position is set
// back to the host's count (cache entries past it are ignored: they are overwritten by later tokens).
int session_generate(Session* s, int max_new, const int32_t* stop, int n_stop, nq_token_callback cb, void* user,
                     int32_t* out, int32_t* n_out) {
  *n_out = 0;
  if (max_new == 0) return NQ_OK;
  cudaStream_t st = s->st;
  NQ_CUDA(cudaStreamSynchronize(st));  // an enqueued nq_decode finishes first (counter0 below is read off-stream)
  const int start_pos = s->pos;
  // how many tokens can be produced: each produced token except the last is decoded (needs a free slot)
  // (Backend contract: generation ends when prompt + generated reaches max_context; the ABI checked
  // pos < capacity(): max_ctx, or a pooled session's pages)
  const int max_tokens = std::min(max_new, s->capacity() - start_pos);
  if (s->ring_ev.empty()) {   // once per session; every call ends with the stream drained, so the events are free
    std::vector<cudaEvent_t> made(s->ring, nullptr);
    for (auto& e : made) {
      const cudaError_t ce = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (ce != cudaSuccess) {
        for (cudaEvent_t x : made)
          if (x) cudaEventDestroy(x);
        return fail(cuda_status(ce), "generate: cudaEventCreate: %s", cudaGetErrorString(ce));
      }
    }
    s->ring_ev = std::move(made);
  }
  const std::vector<cudaEvent_t>& ev = s->ring_ev;
  unsigned long long counter0 = 0;
  NQ_CUDA(cudaMemcpy(&counter0, s->d_counter, 8, cudaMemcpyDeviceToHost));
  const int lookahead = std::min(8, s->ring - 1);
  if (s->pool) NQ_TRY(kv_pool_wait_poison(s->pool, st));   // pages a pool just handed out are poisoned first
  int launched = 0;  // tokens whose producing launch is enqueued
  auto launch_one = [&](int i) -> int {
    // launch i decodes the token at position start_pos + i - 1: start_pos + i keys
    cudaError_t e = i == 0 ? cudaSuccess : cudaGraphLaunch(s->decode_graph(s->decode_sample, start_pos + i), st);
    if (e == cudaSuccess && i == 0) { int r = enqueue_sample(s); if (r) return r; }
    if (e == cudaSuccess) e = cudaEventRecord(ev[(counter0 + i) % s->ring], st);
    if (e != cudaSuccess) return fail(cuda_status(e), "generate launch: %s", cudaGetErrorString(e));
    return NQ_OK;
  };
  int rc = NQ_OK, produced = 0;
  while (produced < max_tokens && rc == NQ_OK) {
    while (launched < max_tokens && launched < produced + lookahead && rc == NQ_OK) rc = launch_one(launched++);
    if (rc != NQ_OK) break;
    const int slot = (int)((counter0 + produced) % s->ring);
    cudaError_t e = cudaEventSynchronize(ev[slot]);
    if (e != cudaSuccess) { rc = fail(NQ_E_CUDA, "generate: %s", cudaGetErrorString(e)); break; }
    const int32_t tok = reinterpret_cast<volatile int32_t*>(s->h_ring)[slot];
    if (out) out[produced] = tok;
    produced++;
    bool stop_now = false;
    for (int j = 0; j < n_stop; j++) if (stop[j] == tok) stop_now = true;
    if (cb && cb(tok, user)) stop_now = true;
    if (stop_now) break;
  }
  cudaError_t e = cudaStreamSynchronize(st);
  if (rc != NQ_OK) return rc;
  if (e != cudaSuccess) return fail(NQ_E_CUDA, "generate: %s", cudaGetErrorString(e));
  // tokens produced: p; decoded: p - 1 (the last produced token is never decoded)
  const int decoded = produced - 1;
  s->pos = start_pos + decoded;
  // the device ran `launched - 1` decode steps and `launched` samples; put position and counter in step
  const unsigned long long counter_now = counter0 + produced;
  NQ_CUDA(cudaMemcpy(s->d_pos, &s->pos, 4, cudaMemcpyHostToDevice));
  NQ_CUDA(cudaMemcpy(s->d_counter, &counter_now, 8, cudaMemcpyHostToDevice));
  // logits now belong to a later step than pos when we over-ran; mark them stale unless exactly in step
  s->have_logits = launched == produced;
  *n_out = produced;
  return NQ_OK;
}

}  // namespace nq
