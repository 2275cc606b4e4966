// Batched decode step (batch.h). Per step: embed the n tokens; per layer RMSNorm -> q/k/v GEMM -> attention (rope,
// cache write and split-K attention of each token in its own session's cache) -> o GEMM (+= residual) -> RMSNorm
// -> gate/up GEMM -> SwiGLU -> down GEMM (+= residual); then the final RMSNorm, the lm_head GEMM, one device draw
// per sequence with its session's settings (one launch), and every session's position + 1. For n <= kGemvRowsMax the linear
// layers run the decode GEMVs per token row instead of the GEMMs (same order of operations, fused the decode way).
#include "batch.h"
#include "launch.h"
#include <algorithm>
#include <cstring>

namespace nq {

// Up to this many sequences, the linear layers run the decode GEMVs (RMSNorm, SwiGLU and the residual add fused),
// one launch per token row: n weight passes at ~1.4 ms each (7B) against one pass of the few-token GEMMs at ~3.5 ms
// for any n up to 16 (28 layers x 125 us, H200, bench/NOTES.md "Session 6"), so the GEMMs win from 3 rows on.
constexpr int kGemvRowsMax = 2;

// Attention blocks a batched step aims for, per SM: n_split = this x SMs / (KV heads x rows), at most b->n_split. One
// wave of one block an SM, which attention.cu runs as its 8-warp build, as the single-token decode: measured on the
// H200 (7B heads, bench/NOTES.md "Session 21" §3), at 577 / 2,048 keys, 1 row: 33 splits 6.7 / 7.0 us against
// 8.2 / 11.5 for the 64 of 3 blocks an SM; 8 rows: 4 splits 8.0 / 13.3 against ~11.7 / ~18.8 for 12; 32 rows:
// 1 split 13.0 / 33.9 against ~18 / ~44 for 3.
constexpr int kBatchAttentionBlocksPerSm = 1;

namespace {
int batch_attention_splits(const Batch* b, int n) {
  return std::max(1, std::min(b->n_split, kBatchAttentionBlocksPerSm * device_sms() / (b->m->cfg.n_kv_heads * n)));
}

void drop_graphs(Batch* b) {
  for (cudaGraphExec_t& g : b->graphs)
    if (g) cudaGraphExecDestroy(g), g = nullptr;
  std::fill(b->warm.begin(), b->warm.end(), 0);
}
}  // namespace

Batch::~Batch() {
  if (st) cudaStreamSynchronize(st);
  drop_graphs(this);
  gemm_scratch_free(&gemm_ws);
  void* dev[] = {d_tokens, d_pos, d_kv, d_pt, d_pos_of, d_next, d_samp, X, Xn, QKV, ATT, G, U, HM, logits, part_o,
                 part_ml, d_rope};
  for (void* p : dev)
    if (p) cudaFree(p);
  for (Flight& f : flight)
    for (Session* s : f.ss) s->in_flight--;
  for (cudaEvent_t e : done)
    if (e) cudaEventDestroy(e);
  if (h_in) cudaFreeHost(h_in);
  if (h_out) cudaFreeHost(h_out);
  if (st) cudaStreamDestroy(st);
}

int batch_create(Model* m, int max_batch, Batch** out) {
  const nq_config& c = m->cfg;
  Batch* b = new Batch();
  auto bail = [&](int rc) { delete b; return rc; };
  b->m = m;
  b->max_batch = max_batch;
  b->graphs.assign((size_t)Batch::kSlots * (max_batch + 1), nullptr);
  b->warm.assign((size_t)max_batch + 1, 0);
  b->n_split = std::max(1, std::min(kAttnMaxSplits, 256 / c.n_kv_heads));   // at most 256 blocks a row
  const int H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, V = c.vocab_rows;
  const int Nq = c.n_heads * D, Nqkv = Nq + 2 * c.n_kv_heads * D;
  const size_t B = (size_t)max_batch;
  cudaError_t e = cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking);
  if (e != cudaSuccess) return bail(fail(cuda_status(e), "cudaStreamCreate: %s", cudaGetErrorString(e)));
  int rc = NQ_OK;
  if ((rc = dalloc(&b->d_tokens, B, "batch tokens")) || (rc = dalloc(&b->d_pos, B, "batch positions")) ||
      (rc = dalloc(&b->d_kv, (size_t)c.n_layers * B, "batch caches")) || (rc = dalloc(&b->d_pt, B, "batch page tables")) ||
      (rc = dalloc(&b->d_pos_of, B, "batch position pointers")) || (rc = dalloc(&b->d_next, B, "batch samples")) ||
      (rc = dalloc(&b->d_samp, B, "batch sampler arguments")) ||
      (rc = dalloc(&b->X, B * H, "batch X")) || (rc = dalloc(&b->Xn, B * H, "batch Xn")) ||
      (rc = dalloc(&b->QKV, B * Nqkv, "batch QKV")) || (rc = dalloc(&b->ATT, B * Nq, "batch ATT")) ||
      (rc = dalloc(&b->G, B * I, "batch G")) || (rc = dalloc(&b->U, B * I, "batch U")) ||
      (rc = dalloc(&b->HM, B * I, "batch HM")) || (rc = dalloc(&b->logits, B * V, "batch logits")) ||
      (rc = dalloc(&b->part_o, B * c.n_heads * b->n_split * D, "batch attention partials")) ||
      (rc = dalloc(&b->part_ml, B * c.n_heads * b->n_split * 2, "batch attention (m, l)")))
    return bail(rc);
  if ((e = cudaMallocHost(&b->h_in, Batch::kSlots * 3 * B * sizeof(int32_t))) != cudaSuccess ||
      (e = cudaMallocHost(&b->h_out, Batch::kSlots * B * sizeof(int32_t))) != cudaSuccess)
    return bail(fail(cuda_status(e), "cudaMallocHost (batch staging): %s", cudaGetErrorString(e)));
  if ((e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&b->h_in_dev), b->h_in, 0)) != cudaSuccess ||
      (e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&b->h_out_dev), b->h_out, 0)) != cudaSuccess)
    return bail(fail(cuda_status(e), "batch staging: no device address for pinned memory: %s", cudaGetErrorString(e)));
  for (cudaEvent_t& ev : b->done)
    if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess)
      return bail(fail(cuda_status(e), "cudaEventCreate (batch): %s", cudaGetErrorString(e)));
  *out = b;
  return NQ_OK;
}

namespace {
// Point the batch at these sessions' caches, page tables and positions (when the set or its order changed), and
// make its rope table cover the longest session's context.
int bind(Batch* b, Session* const* ss, int n) {
  const Session* longest = ss[0];
  for (int i = 1; i < n; i++)
    if (ss[i]->max_ctx > longest->max_ctx) longest = ss[i];
  if (longest->max_ctx > b->rope_ctx) {
    const size_t bytes = (size_t)longest->max_ctx * (b->m->cfg.head_dim / 2) * sizeof(float2);
    float2* t = nullptr;
    NQ_TRY(dalloc(&t, bytes / sizeof(float2), "batch rope table"));
    cudaError_t e = cudaMemcpyAsync(t, longest->d_rope, bytes, cudaMemcpyDeviceToDevice, b->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->st);
    if (e != cudaSuccess) {
      cudaFree(t);
      return fail(cuda_status(e), "batch rope table: %s", cudaGetErrorString(e));
    }
    drop_graphs(b);   // they captured the old table's address
    if (b->d_rope) cudaFree(b->d_rope);
    b->d_rope = t;
    b->rope_ctx = longest->max_ctx;
  }
  bool same = (int)b->bound.size() == n;
  for (int i = 0; same && i < n; i++) same = b->bound[i] == ss[i]->serial;
  if (same) return NQ_OK;
  const int L = b->m->cfg.n_layers;
  std::vector<KvLayer> kv((size_t)L * b->max_batch);
  std::vector<const int*> pt(n);
  std::vector<int*> pos_of(n);
  std::vector<SampleArgs> samp(n);
  const int V = b->m->cfg.vocab_rows;
  for (int i = 0; i < n; i++) {
    for (int l = 0; l < L; l++) kv[(size_t)l * b->max_batch + i] = ss[i]->kv[l];
    pt[i] = ss[i]->d_page_table;
    pos_of[i] = ss[i]->d_pos;
    SampleArgs& sa = samp[i];
    sa.logits = b->logits + (size_t)i * V; sa.V = V;
    sa.params = ss[i]->d_samp; sa.counter = ss[i]->d_counter;
    sa.token_out = b->d_next + i; sa.host_ring = nullptr; sa.ring_size = 0;
  }
  NQ_CUDA(cudaMemcpyAsync(b->d_kv, kv.data(), kv.size() * sizeof(KvLayer), cudaMemcpyHostToDevice, b->st));
  NQ_CUDA(cudaMemcpyAsync(b->d_pt, pt.data(), n * sizeof(const int*), cudaMemcpyHostToDevice, b->st));
  NQ_CUDA(cudaMemcpyAsync(b->d_pos_of, pos_of.data(), n * sizeof(int*), cudaMemcpyHostToDevice, b->st));
  NQ_CUDA(cudaMemcpyAsync(b->d_samp, samp.data(), n * sizeof(SampleArgs), cudaMemcpyHostToDevice, b->st));
  NQ_CUDA(cudaStreamSynchronize(b->st));   // the host vectors go out of scope
  b->bound.resize(n);
  for (int i = 0; i < n; i++) b->bound[i] = ss[i]->serial;
  return NQ_OK;
}
}  // namespace

int batch_launch(Batch* b, Session* const* ss, const int32_t* tokens, const int32_t* chain, int n, float* logits_host,
                 int n_logits) {
  const Model& m = *b->m;
  const nq_config& c = m.cfg;
  const int H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, V = c.vocab_rows;
  const int Nq = c.n_heads * D, Nkv = c.n_kv_heads * D, Nqkv = Nq + 2 * Nkv;
  const float eps = c.rms_norm_eps;
  cudaStream_t st = b->st;
  // a session's own step (nq_decode returns once it is enqueued) finishes before this one reads its cache
  for (int i = 0; i < n; i++) NQ_CUDA(cudaStreamSynchronize(ss[i]->st));
  NQ_TRY(bind(b, ss, n));   // a changed set waits for the steps in flight (its uploads are from pageable memory)
  // pages a pool just handed out are poisoned (kv_pool_poison, on the pool's stream) before this step writes them:
  // a wait on the device, issued after the host synchronisations above and before the step's graph or its capture
  for (int i = 0; i < n; i++)
    if (ss[i]->pool && (i == 0 || ss[i]->pool != ss[i - 1]->pool)) NQ_TRY(kv_pool_wait_poison(ss[i]->pool, st));
  // stage the inputs in this step's slot (the slot's previous step has been waited: at most kSlots in flight)
  const int slot = b->next_slot, mb = b->max_batch;
  int32_t* in = b->h_in + (size_t)slot * 3 * mb;
  for (int i = 0; i < n; i++) {
    const bool chained = chain && chain[i] >= 0;
    in[i] = chained ? 0 : tokens[i];
    in[mb + i] = ss[i]->pos;
    in[2 * mb + i] = chained ? chain[i] : -1;
  }
  // the step, from this slot's staged inputs to its samples (all of it stream-capturable, so one graph a slot and
  // size): take_batch_inputs reads the step's tokens and positions from the pinned slot itself (a copy engine's HtoD
  // ahead of the graph cost ~60 us of idle device a step: NOTES s15 §5; a kernel launched outside the graph, ~27 us
  // of idle before the graph's first kernel: NOTES s16 §4), and publish_samples writes its draws into the pinned
  // output slot
  auto run = [&]() -> int {
    NQ_TRY(take_batch_inputs(b->h_in_dev + (size_t)slot * 3 * mb, mb, b->d_next, b->d_tokens, b->d_pos, n, st));
    NQ_TRY(embed_rows(m.embed, m.embed_dtype, b->d_tokens, n, H, b->X, st));
    const bool rows = n <= kGemvRowsMax;   // the decode GEMVs, one launch per token row (module comment)
    for (int l = 0; l < c.n_layers; l++) {
      const Layer& L = m.layers[l];
      if (rows) {
        for (int i = 0; i < n; i++) {
          GemvArgs qa;
          qa.seg[0] = L.q; qa.seg[1] = L.k; qa.seg[2] = L.v; qa.nseg = 3;
          qa.bias[0] = L.bq; qa.bias[1] = L.bk; qa.bias[2] = L.bv;
          qa.x_f32 = b->X + (size_t)i * H; qa.norm_w = L.ln1; qa.eps = eps;
          qa.out_f32 = b->QKV + (size_t)i * Nqkv; qa.mode = GEMV_STORE;
          NQ_TRY(gemv(qa, st));
        }
      } else {
        NQ_TRY(rmsnorm_rows(b->X, L.ln1, n, H, eps, b->Xn, st));
        const LinW W3[3] = {L.q, L.k, L.v};
        float* const C3[3] = {b->QKV, b->QKV + Nq, b->QKV + Nq + Nkv};
        const float* const B3[3] = {L.bq, L.bk, L.bv};
        NQ_TRY(gemm_multi(W3, C3, B3, 3, b->Xn, H, n, Nqkv, false, st, &b->gemm_ws));
      }
      AttnArgs aa;
      aa.qkv = b->QKV; aa.qkv_stride = Nqkv; aa.M = n; aa.pos0 = b->d_pos;
      aa.rope = b->d_rope;   // every sequence's cache and page table come from kv_of / page_table_of
      aa.n_heads = c.n_heads; aa.n_kv = c.n_kv_heads; aa.D = D;
      aa.keys_per_split = kDecodeKeysPerSplit; aa.n_split = batch_attention_splits(b, n); aa.write_kv = true;
      aa.part_o = b->part_o; aa.part_ml = b->part_ml; aa.out = b->ATT;
      aa.pos_of = b->d_pos; aa.kv_of = b->d_kv + (size_t)l * b->max_batch; aa.page_table_of = b->d_pt;
      NQ_TRY(attention(aa, st));
      if (rows) {
        for (int i = 0; i < n; i++) {
          GemvArgs oa;
          oa.seg[0] = L.o; oa.x_f16 = b->ATT + (size_t)i * Nq; oa.out_f32 = b->X + (size_t)i * H; oa.mode = GEMV_ADD;
          NQ_TRY(gemv(oa, st));
          GemvArgs ga;
          ga.seg[0] = L.gate; ga.up = L.up; ga.x_f32 = b->X + (size_t)i * H; ga.norm_w = L.ln2; ga.eps = eps;
          ga.out_f16 = b->HM + (size_t)i * I; ga.mode = GEMV_SWIGLU;
          NQ_TRY(gemv(ga, st));
          GemvArgs da;
          da.seg[0] = L.down; da.x_f16 = b->HM + (size_t)i * I; da.out_f32 = b->X + (size_t)i * H; da.mode = GEMV_ADD;
          NQ_TRY(gemv(da, st));
        }
        continue;
      }
      NQ_TRY(gemm(L.o, b->ATT, Nq, n, b->X, H, nullptr, true, st, &b->gemm_ws));
      NQ_TRY(rmsnorm_rows(b->X, L.ln2, n, H, eps, b->Xn, st));
      NQ_TRY(gemm_swiglu(L.gate, L.up, b->Xn, H, n, b->G, b->U, b->HM, st, &b->gemm_ws));
      NQ_TRY(gemm(L.down, b->HM, I, n, b->X, H, nullptr, true, st, &b->gemm_ws));
    }
    if (rows) {
      for (int i = 0; i < n; i++) {
        GemvArgs la;
        la.seg[0] = m.lm_head; la.x_f32 = b->X + (size_t)i * H; la.norm_w = m.final_norm; la.eps = eps;
        la.out_f32 = b->logits + (size_t)i * V; la.mode = GEMV_STORE;
        NQ_TRY(gemv(la, st));
      }
    } else {
      NQ_TRY(rmsnorm_rows(b->X, m.final_norm, n, H, eps, b->Xn, st));
      NQ_TRY(gemm(m.lm_head, b->Xn, H, n, b->logits, V, nullptr, false, st, &b->gemm_ws));
    }
    NQ_TRY(sample_rows(b->d_samp, n, st));   // one block per sequence, its session's settings (bound above)
    NQ_TRY(advance_positions(b->d_pos_of, b->d_pos, n, st));
    return publish_samples(b->d_next, b->h_out_dev + (size_t)slot * mb, n, st);
  };
  // first step for this n: run it as is; its next step in each slot: capture it; then replay (its ~260 launches at
  // 32 rows, ungraphed, cost ~0.3 ms of host time a step: bench/NOTES.md "Session 7")
  int rc = NQ_OK;
  cudaGraphExec_t& graph = b->graphs[(size_t)slot * (b->max_batch + 1) + n];
  if (graph) {
    const cudaError_t e = cudaGraphLaunch(graph, st);
    if (e != cudaSuccess) rc = fail(cuda_status(e), "batched decode graph launch: %s", cudaGetErrorString(e));
  } else if (!b->warm[n]) {
    const void* scratch = b->gemm_ws.p;
    rc = run();
    // a GEMM that needed more split-K scratch moved it: the graphs of other sizes captured the old address
    if (b->gemm_ws.p != scratch) drop_graphs(b);
    b->warm[n] = rc == NQ_OK;
  } else {
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return fail(cuda_status(e), "batched decode capture: %s", cudaGetErrorString(e));
    rc = run();
    e = cudaStreamEndCapture(st, &g);
    if (rc == NQ_OK && e != cudaSuccess) rc = fail(cuda_status(e), "batched decode capture: %s", cudaGetErrorString(e));
    if (rc == NQ_OK) {
      e = cudaGraphInstantiate(&graph, g, 0);
      if (e != cudaSuccess) graph = nullptr, rc = fail(cuda_status(e), "batched decode graph: %s", cudaGetErrorString(e));
    }
    if (g) cudaGraphDestroy(g);
    if (rc == NQ_OK && (e = cudaGraphLaunch(graph, st)) != cudaSuccess)
      rc = fail(cuda_status(e), "batched decode graph launch: %s", cudaGetErrorString(e));
  }
  if (rc == NQ_OK && n_logits > 0) {   // the first n_logits rows only (the caller's host-sampled sequences)
    const cudaError_t e = cudaMemcpyAsync(logits_host, b->logits, (size_t)n_logits * V * sizeof(float),
                                          cudaMemcpyDeviceToHost, st);
    if (e != cudaSuccess) rc = fail(cuda_status(e), "batched decode logits: %s", cudaGetErrorString(e));
  }
  if (rc == NQ_OK) {
    const cudaError_t e = cudaEventRecord(b->done[slot], st);
    if (e != cudaSuccess) rc = fail(cuda_status(e), "batched decode samples: %s", cudaGetErrorString(e));
  }
  if (rc != NQ_OK) {   // nothing is in flight for the caller: let what was enqueued finish
    cudaStreamSynchronize(st);
    return rc;
  }
  b->flight.push_back(Batch::Flight{slot, n, std::vector<Session*>(ss, ss + n)});
  b->next_slot = (slot + 1) % Batch::kSlots;
  b->last_n = n;
  for (int i = 0; i < n; i++) {
    ss[i]->pos += 1;
    ss[i]->have_logits = false;   // this step's logits are the batch's, not in the session
    ss[i]->in_flight++;
  }
  return NQ_OK;
}

int batch_wait(Batch* b, int32_t* next, int n) {
  const Batch::Flight f = b->flight.front();
  b->flight.erase(b->flight.begin());
  for (Session* s : f.ss) s->in_flight--;
  const cudaError_t e = cudaEventSynchronize(b->done[f.slot]);
  if (e != cudaSuccess) return fail(cuda_status(e), "batched decode: %s", cudaGetErrorString(e));
  std::memcpy(next, b->h_out + (size_t)f.slot * b->max_batch, (size_t)std::min(n, f.n) * sizeof(int32_t));
  return NQ_OK;
}

int batch_decode(Batch* b, Session* const* ss, const int32_t* tokens, int n, int32_t* next, float* logits, int n_logits) {
  NQ_TRY(batch_launch(b, ss, tokens, nullptr, n, logits, n_logits));
  return batch_wait(b, next, n);
}

}  // namespace nq
