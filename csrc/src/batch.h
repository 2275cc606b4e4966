// Batched decode: one token for each of up to max_batch sessions of one model in one forward pass. The linear
// layers run as one GEMM over the n tokens (every weight is read once per step for all the sequences); attention
// runs each token against its own session's cache at its own position (attn_kernel, grid z = n).
#pragma once
#include "session.h"

namespace nq {

struct Batch {
  Model* m = nullptr;
  int max_batch = 0;
  int n_split = 1;                 // decode attention splits per (token, KV head)
  cudaStream_t st = nullptr;
  // a step's inputs, and per sequence where its state lives
  int32_t* d_tokens = nullptr;     // [max_batch] the tokens fed
  int* d_pos = nullptr;            // [max_batch] their positions
  KvLayer* d_kv = nullptr;         // [n_layers][max_batch] each sequence's cache, per layer
  const int** d_pt = nullptr;      // [max_batch] each sequence's page table
  int** d_pos_of = nullptr;        // [max_batch] each session's device position (advanced after the step)
  int32_t* d_next = nullptr;       // [max_batch] sampled tokens
  SampleArgs* d_samp = nullptr;    // [max_batch] each sequence's sampler arguments (its logits row, its session's
                                   // settings and counter, its d_next slot)
  int32_t* h_io = nullptr;         // pinned [2 * max_batch]: tokens and positions in, sampled tokens out
  std::vector<uint64_t> bound;     // serials of the sessions d_kv, d_pt, d_pos_of and d_samp describe, in order
  // activations, [max_batch] rows
  float* X = nullptr;              // [H] residual stream
  __half* Xn = nullptr;            // [H] normed
  float* QKV = nullptr;            // [Nq + 2 Nkv]
  __half* ATT = nullptr;           // [Nq]
  float* G = nullptr;              // [I]
  float* U = nullptr;              // [I]
  __half* HM = nullptr;            // [I]
  float* logits = nullptr;         // [V]
  float* part_o = nullptr;         // attention partials [max_batch][n_heads][n_split][D]
  float* part_ml = nullptr;        // [max_batch][n_heads][n_split][2]
  int* counters = nullptr;         // [max_batch][n_kv], zero between launches
  GemmScratch gemm_ws;             // split-K scratch of the step's GEMMs (this batch's stream only)
  float2* d_rope = nullptr;        // [rope_ctx][D/2] the rope table (a function of the position only: every session's
  int rope_ctx = 0;                // table is a prefix of the longest one), grown when a longer session is bound
  // the step for n sequences captured as a graph: graphs[n] (null until n has run once uncaptured, which sets every
  // launch's one-time state, warm[n], then captured at its second step). The graph reads its per-step inputs from
  // the buffers above, so it does not depend on which sessions are bound; it is dropped when d_rope or the split-K
  // scratch moves.
  std::vector<cudaGraphExec_t> graphs;
  std::vector<char> warm;
  ~Batch();
};

int batch_create(Model* m, int max_batch, Batch** out);
// sessions[i] takes tokens[i] at its position; next[i] is then sampled with sessions[i]'s settings (its device
// sampler state); the logits of sessions 0 .. n_logits - 1 go to `logits` (n_logits x vocab_rows host floats; NULL
// when n_logits is 0). Every position advances by one. The C ABI (api.cpp) has checked the arguments: distinct idle
// sessions of b's model, tokens in range, room in every context, n_logits in [0, n].
int batch_decode(Batch* b, Session* const* sessions, const int32_t* tokens, int n, int32_t* next, float* logits,
                 int n_logits);

}  // namespace nq
