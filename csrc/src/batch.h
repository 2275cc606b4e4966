// Batched decode: one token for each of up to max_batch sessions of one model in one forward pass. The linear
// layers run as one GEMM over the n tokens (every weight is read once per step for all the sequences); attention
// runs each token against its own session's cache at its own position (attn_decode_kernel, grid z = n).
#pragma once
#include "session.h"

namespace nq {

struct Batch {
  Model* m = nullptr;
  int max_batch = 0;
  int n_split = 1;                 // most attention splits per (token, KV head); a step of n rows uses batch.cu batch_attention_splits
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
  // a step's inputs and outputs, staged in pinned host memory that the kernels read and write in place (no copy
  // engine between steps): take_batch_inputs reads slot k of h_in before the step's graph, publish_samples writes
  // the step's samples from d_next into slot k of h_out after it; one slot per step in flight
  static constexpr int kSlots = 2;
  int32_t* h_in = nullptr;         // pinned [kSlots][3][max_batch] tokens, positions, chain
  int32_t* h_out = nullptr;        // pinned [kSlots][max_batch]
  int32_t* h_in_dev = nullptr;     // the device's addresses of h_in and h_out
  int32_t* h_out_dev = nullptr;
  cudaEvent_t done[kSlots] = {};   // recorded once a step's samples are in its h_out slot
  struct Flight {                  // a launched step not yet waited
    int slot, n;
    std::vector<Session*> ss;
  };
  std::vector<Flight> flight;      // oldest first, at most kSlots
  int next_slot = 0;
  int last_n = 0;                  // rows of the most recent step (a chain index names one of them); 0: none yet
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
  __half* part_o = nullptr;        // attention partials [max_batch][n_heads][n_split][D]
  float* part_ml = nullptr;        // [max_batch][n_heads][n_split][2]
  GemmScratch gemm_ws;             // split-K scratch of the step's GEMMs (this batch's stream only)
  float2* d_rope = nullptr;        // [rope_ctx][D/2] the rope table (a function of the position only: every session's
  int rope_ctx = 0;                // table is a prefix of the longest one), grown when a longer session is bound
  // the step for n sequences in slot k captured as a graph: graphs[k * (max_batch + 1) + n] (null until n has run
  // once uncaptured, which sets every launch's one-time state, warm[n], then captured at its next step in slot k).
  // The graph reads its per-step inputs from its slot and the buffers above, so it does not depend on which sessions
  // are bound; it is dropped when d_rope or the split-K scratch moves.
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
// The same step in two halves, so that the host prepares the next step while this one runs (pipelining):
// batch_launch enqueues it and returns (each session's position advances now, and it counts as in flight until the
// wait); chain: null, or n ints, chain[i] >= 0 feeding sessions[i] the token the most recent step sampled for its
// row chain[i] (still on the device) instead of tokens[i]; logits as batch_decode's (the copy to the caller's pageable
// memory waits for the step). batch_wait waits for the oldest launched step and writes its n sampled tokens to next.
// The C ABI checked the arguments (and that fewer than kSlots steps are in flight, and at most kSlots for the wait).
int batch_launch(Batch* b, Session* const* sessions, const int32_t* tokens, const int32_t* chain, int n, float* logits,
                 int n_logits);
int batch_wait(Batch* b, int32_t* next, int n);

}  // namespace nq
