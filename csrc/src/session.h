// One sequence on the device: KV cache, activations, the captured decode graph, the device sampler state.
#pragma once
#include "model.h"
#include <algorithm>
#include <atomic>
#include <mutex>

namespace nq {

// The activations of a batched prefill pass over a chunk of up to C tokens. A session of its own allocates them; a
// pooled session uses its pool's (one set for all, under KvPool::prefill_mu).
struct PrefillBuffers {
  int32_t* d_tokens = nullptr;   // [C]
  float* X = nullptr;            // [C][H]
  __half* Xn = nullptr;          // [C][max(H, I, Nq)]
  float* QKV = nullptr;          // [C][Nq + 2 Nkv]
  __half* ATT = nullptr;         // [C][Nq]
  float* G = nullptr;            // [C][I] (null where every layer's gate / up pair is ORDER_FRAG_PAIR: unused there)
  float* U = nullptr;            // [C][I] (as G)
  __half* HM = nullptr;          // [C][I]
  // attention partials of a chunk of at most kSplitPrefillMaxTokens tokens with the keys split (session_prefill):
  // [kSplitPrefillRows][n_heads][D] and [kSplitPrefillRows][n_heads][2], M x n_split rows
  __half* part_o = nullptr;
  float* part_ml = nullptr;
  // NQ_OK, or the dalloc failure (what was allocated stays for free()); G and U only where m's SwiGLU needs them
  int alloc(const Model& m, int C);
  void free();
};

// A device KV page pool (nq_kv_pool_create): the pages of every layer, the rope table (max_positions rows) and the
// prefill buffers, shared by the sessions made on it. Freed when its handle and all its sessions are gone (refs).
struct KvPool {
  Model* m = nullptr;
  int n_pages = 0;
  std::atomic<int> refs{1};      // the handle + one per session
  cudaStream_t st = nullptr;     // poison fills
  cudaEvent_t poisoned = nullptr;  // recorded on st after each poison fill; every stream that then reads or writes
                                   // pages waits for it on the device first (kv_pool_wait_poison)
  __half* base = nullptr;        // [n_layers][K, V][n_pages][n_kv][kPage][D]
  std::vector<KvLayer> kv;       // per layer
  float2* d_rope = nullptr;      // [max_positions][D/2] (cos, sin)
  // prefill activations of a chunk of up to prefill_chunk tokens (sessions take prefill_mu while they use them)
  std::mutex prefill_mu;
  int prefill_chunk = NQ_PREFILL_CHUNK_TOKENS;
  PrefillBuffers pre;
  ~KvPool();
};

// Prefill chunks of at most this many tokens run their attention in the decode kernel with the keys split
// (session_prefill): the prefill kernel gives each KV head ceil(M / 8) blocks that walk all keys in series, so a
// prefix-cache hit's few new tokens after 2,000 cached ones ran 4 blocks per layer on a 132-SM GPU. 16: two such
// blocks per KV head, where the prefill kernel's tensor cores start to pay (bench/NOTES.md "Session 10").
constexpr int kSplitPrefillMaxTokens = 16;
// Rows of the prefill's attention partials (PrefillBuffers::part_o): M tokens take min(128, kSplitPrefillRows / M)
// splits, so a prefix-cache hit's 5 tokens after 2,000 cached ones read 64 keys a block, not the 192 the decode
// buffers' 64 rows allowed (bench/NOTES.md "Session 14" §3). 3.7 MB for the 7B.
constexpr int kSplitPrefillRows = 256;

struct Session {
  Model* m = nullptr;
  uint64_t serial = 0;           // unique per session of the process (a Batch recognises its bound sessions by it)
  int max_ctx = 0, max_pages = 0;
  int pos = 0;                   // host mirror of *d_pos
  KvPool* pool = nullptr;        // pooled session: KV rows, rope table and prefill buffers are the pool's
  std::vector<int32_t> pages;    // pooled session: host mirror of d_page_table's entries in use
  int32_t* h_table = nullptr;    // pooled session: pinned staging [max_pages + 1] of session_set_pages' uploads
                                 // (the table entries, then the position)
  // positions this session can hold: max_ctx, or for a pooled session what its pages hold
  int capacity() const { return pool ? std::min(max_ctx, (int)pages.size() * kPage) : max_ctx; }
  bool have_logits = false;
  int in_flight = 0;             // pipelined batched steps (batch_launch) holding this session, not yet waited
  nq_sampling samp{0.f, 0, 1.f, 0};
  cudaStream_t st = nullptr;
  // device state
  int* d_pos = nullptr;          // position of the next token
  int32_t* d_token = nullptr;    // token the decode graph embeds (written by the sampler or the host)
  unsigned long long* d_counter = nullptr;  // sampler draws
  nq_sampling* d_samp = nullptr;            // sampling settings the sampler reads
  int* d_page_table = nullptr;   // [max_pages] logical -> physical page (identity for a cache of its own)
  float2* d_rope = nullptr;      // [max_ctx][D/2] (cos, sin)
  std::vector<KvLayer> kv;       // per layer
  __half* kv_base = nullptr;
  // decode activations
  float* x = nullptr;            // [H] residual stream
  float* qkv = nullptr;          // [Nq + 2 Nkv]
  __half* att = nullptr;         // [n_heads * D]
  __half* hmlp = nullptr;        // [I]
  float* logits = nullptr;       // [V]
  __half* part_o = nullptr;      // decode attention partials [nsplit_decode][n_heads][D]
  float* part_ml = nullptr;
  int nsplit_decode = 1;         // decode attention splits (csrc/src/attention.cu)
  // prefill activations, chunk of up to prefill_chunk tokens
  int prefill_chunk = NQ_PREFILL_CHUNK_TOKENS;
  int32_t* h_tokens = nullptr;   // pinned staging [prefill_chunk]
  PrefillBuffers pre;            // its own, or a copy of its pool's pointers (freed by the pool)
  // host-mapped token ring for generation
  int32_t* h_ring = nullptr;
  int32_t* d_ring = nullptr;
  int ring = 64;
  std::vector<cudaEvent_t> ring_ev;   // [ring] generation's per-token events, made by the first generate (not per
                                     // call: 64 creations and destructions sat between the prefill and the first token)
  // steered sampling (nq_sample_steered): processed logits, token counts for the penalties, mask, sparse bias,
  // the logprob stages, and the pinned result (token, logprob, n_top as int bits, top logprobs | top ids)
  float* d_steer = nullptr;      // [V]
  int* d_counts = nullptr;       // [V] tokens sampled since the last reset
  uint32_t* d_mask = nullptr;    // [ceil(V/32)]
  int32_t* d_bias_ids = nullptr; // [kMaxLogitBias]
  float* d_bias_vals = nullptr;  // [kMaxLogitBias]
  float* d_lp_part_f = nullptr;  // [logprob_blocks(V) * (2 + kMaxTopLogprobs)]
  int* d_lp_part_i = nullptr;    // [logprob_blocks(V) * kMaxTopLogprobs]
  float* d_lp_out = nullptr;     // [2 + kMaxTopLogprobs]
  int* d_lp_ids = nullptr;       // [kMaxTopLogprobs]
  float* h_steer_out = nullptr;  // pinned [1 + 2 + 2 * kMaxTopLogprobs]: token (int bits), d_lp_out, d_lp_ids
  // the captured graphs: nq_decode replays decode_only, nq_generate replays decode_sample; [0] for any context,
  // [1] (where short_keys > 0) for a step of at most short_keys keys: its attention runs nsplit_short splits in one
  // cluster that merges in distributed shared memory (attention.cu, kernels.h)
  struct DecodeGraph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
  };
  DecodeGraph decode_only[2];     // decode step: embed(d_token) .. logits, pos++
  DecodeGraph decode_sample[2];   // decode step, then sample -> d_token (and the host ring)
  int nsplit_short = 0, short_keys = 0;   // 0: no short-context graphs
  // the graph of a step whose token has `keys` keys (its position + 1)
  cudaGraphExec_t decode_graph(const DecodeGraph* g, int keys) const {
    return short_keys > 0 && keys <= short_keys ? g[1].exec : g[0].exec;
  }
  ~Session();
};

// The C ABI (api.cpp) validates every argument once (token ids, context limits, sampling parameters, sizes);
// these functions trust what it checked.
int session_create(Model* m, int max_ctx, const nq_sampling* sp, Session** out);
// pool != null: a pooled session (no cache of its own; no pages until session_set_pages)
int session_create_pooled(Model* m, KvPool* pool, int max_ctx, const nq_sampling* sp, Session** out);
int kv_pool_create(Model* m, int n_pages, KvPool** out);
void kv_pool_release(KvPool* p);   // drop one reference; the last one frees it
size_t kv_page_bytes(const nq_config& c);
// Enqueues the NaN fill of the listed pages on the pool's stream and records p->poisoned after it; returns without
// waiting. The pages' later users are ordered after it by kv_pool_wait_poison.
int kv_pool_poison(KvPool* p, const int32_t* pages, int n);
// Makes st's later work wait (on the device) for every poison fill enqueued on p so far. Issued by each entry point
// that enqueues work reading or writing p's pages (a pooled session's prefill, decode and generation; the batched
// step), before any graph launch and never while st is being captured.
int kv_pool_wait_poison(KvPool* p, cudaStream_t st);
// the rule of nq_session_set_pages' arguments, host only (the testing library runs it without a device)
int check_session_pages(int pool_pages, int max_pages, int max_ctx, const int32_t* pages, int n, int position);
int session_set_pages(Session* s, const int32_t* pages, int n, int position);
int session_prefill(Session* s, const int32_t* tokens, int n, float* logits_all /* n*V or null */);
int session_decode(Session* s, int32_t token);
int session_generate(Session* s, int max_new, const int32_t* stop, int n_stop, nq_token_callback cb, void* user,
                     int32_t* out, int32_t* n_out);
int session_reset(Session* s);
int session_set_sampling(Session* s, const nq_sampling* sp);
// One steered sampling step from the current logits (steer.cu's kernels, then the device sampler); see
// nq_sample_steered in nanoqwen.h. top_n -1: no logprobs.
int session_sample_steered(Session* s, const int32_t* bias_ids, const float* bias_vals, int n_bias,
                           const int32_t* mask, float presence, float frequency, int top_n, int32_t* out_token,
                           float* out_logprob, int32_t* out_top_ids, float* out_top_logprobs, int32_t* out_n_top);

// enqueue the decode forward pass (used for graph capture)
int enqueue_decode(Session* s, bool short_ctx);   // short_ctx: the short-context graphs' attention
int enqueue_sample(Session* s);

}  // namespace nq
