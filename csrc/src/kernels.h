// Device kernels' host-side launchers. Each returns NQ_OK or NQ_E_CUDA (launch checked), and enqueues on `st`.
#pragma once
#include <cuda_fp16.h>
#include <cstdint>
#include "common.h"
#include "format_contract.h"

namespace nq {

// The INT4 unpack arithmetic of the kernels (a mask of nibbles s and s + 4 of a word gives the pair of values
// (2s, 2s + 1); OR 0x6400 then minus 1032 = 1024 + zero code) holds for layout 1 as the contract states it. Layout 2
// subtracts 1024 + z with the group's zero point z (0..15: 1024 + z is exact in f16, bits 0x6400 + z).
static_assert(contract::kInt4ZeroCode == 8, "the kernels subtract 1024 + 8");
static_assert(contract::kInt4MaxCode == 15, "layout 2's 1024 + z and 64 + z are exact f16 values for z <= 15");
static_assert(contract::kInt4Perm[0] == 0 && contract::kInt4Perm[4] == 1 && contract::kInt4Perm[1] == 2 &&
                  contract::kInt4Perm[5] == 3 && contract::kInt4Perm[2] == 4 && contract::kInt4Perm[6] == 5 &&
                  contract::kInt4Perm[3] == 6 && contract::kInt4Perm[7] == 7,
              "the kernels take values (2s, 2s + 1) from nibbles (s, s + 4)");

// values equal the file's dtype ids
enum WeightType : int {
  WT_INT4 = (int)contract::kDTypeInt4g, WT_F16 = (int)contract::kDTypeF16, WT_BF16 = (int)contract::kDTypeBf16
};

// One linear layer's weight on the device, y = W @ x with W (N, K).
struct LinW {
  const uint8_t* w = nullptr;       // int4: qweight uint32 (N, K/8) (layouts 1 and 2); dense: (N, K) f16/bf16 bits
  const __half* scales = nullptr;   // int4 only: f16 (N, K/group)
  const uint8_t* zeros = nullptr;   // int4 layout 2 only: zero points uint8 (N, K/group), 0..15; null: layout 1 (z = 8)
  int N = 0, K = 0, group = 0, type = 0;
  int order = 0;                    // WeightOrder: how the int4 words and scales lie on the device
};

// The device order of an INT4 weight (int4_frag.cuh). ORDER_FILE: layout 1 or 2 as the file stores it. ORDER_FRAG:
// the fragment order (repacked at load on GPUs where every INT4 kernel reads it). ORDER_FRAG_PAIR: gate and up as one
// interleaved matrix P, P's first half in gate's bytes, its second in up's (both LinW carry this order).
enum WeightOrder : int { ORDER_FILE = 0, ORDER_FRAG = 1, ORDER_FRAG_PAIR = 2 };

// Whether this GPU and build run every INT4 kernel over the fragment order (Hopper, sm_90a code: gemm.cu).
bool int4_fragment_order_available();
// Bytes of scratch a repack of W (or of the pair gate + up) needs: the file-order copy it reads from.
size_t frag_repack_scratch_bytes(const LinW& W);
// In place: W (layout 1, ORDER_FILE, frag::shape_ok) into ORDER_FRAG, through `scratch` (>= the bytes above).
int frag_repack(LinW* W, void* scratch, size_t scratch_bytes, cudaStream_t st);
// In place: gate and up (same shape and group, I % 64 == 0) into the pair P, both ORDER_FRAG_PAIR; scratch >= the
// sum of their scratch bytes.
int frag_repack_pair(LinW* gate, LinW* up, void* scratch, size_t scratch_bytes, cudaStream_t st);

enum GemvMode : int {
  GEMV_STORE = 0,   // out_f32[r] = y + bias
  GEMV_ADD = 1,     // out_f32[r] += y + bias   (residual add)
  GEMV_SWIGLU = 2,  // out_f16[r] = silu(gate_r . x) * (up_r . x)   (seg[0] = gate, up = up)
};

struct GemvArgs {
  LinW seg[3];               // rows of the segments are concatenated: output row r of seg s = row_off[s] + i
  int nseg = 1;
  const float* bias[3] = {nullptr, nullptr, nullptr};  // f32 (seg N) each, or null
  LinW up;                   // SWIGLU only
  // input: x_f16 (K) as is, or x_f32 (K) optionally RMS-normalised with norm_w (K) f32 and eps
  const __half* x_f16 = nullptr;
  const float* x_f32 = nullptr;
  const float* norm_w = nullptr;
  float eps = 1e-6f;
  float* out_f32 = nullptr;
  __half* out_f16 = nullptr;
  int mode = GEMV_STORE;
};

int gemv(const GemvArgs& a, cudaStream_t st);
int gemv_prepare();  // raise dynamic shared-memory limits once per process

// Batched (prefill) pieces ---------------------------------------------------------------------------------
// C[M, N] (+)= A[M, K] (f16, row stride lda) @ W^T ; accumulate f32; epilogue: bias (f32 N) and/or residual
// add into C. C row stride ldc. Tensor cores: INT4 weights through gemm_int4_mma (mma.sync m16n8k16, layout 1
// unpacked in registers, serial split-K where the grid leaves SMs idle), f16/bf16 weights through the wmma
// m16n16k16 kernel.
// Split-K scratch that a caller keeps across launches on ONE stream (the batched decode step): tile counters, which
// the kernel leaves at zero, then the partial sums. A launch grows it (stream-ordered) when it needs more; under
// stream capture, where it cannot grow, such a launch allocates its own scratch as launches without one do.
struct GemmScratch {
  void* p = nullptr;
  size_t counter_bytes = 0, part_bytes = 0;
};
void gemm_scratch_free(GemmScratch* ws);
int gemm(const LinW& W, const __half* A, int lda, int M, float* C, int ldc, const float* bias, bool add,
         cudaStream_t st, GemmScratch* ws = nullptr);
// n (1..3) weights sharing A in one launch (q/k/v, gate/up): C[i][M, W[i].N] (+)= A @ W[i]^T + bias[i] (may be
// null), all C[i] with row stride ldc. Segments of different K or dtype fall back to one launch each.
int gemm_multi(const LinW* W, float* const* C, const float* const* bias, int n, const __half* A, int lda, int M,
               int ldc, bool add, cudaStream_t st, GemmScratch* ws = nullptr);
// The MLP's first half: H[M, I] f16 = silu(A @ gate^T) * (A @ up^T), I = gate.N = up.N, H row stride I. Gate and
// up in the fragment order's pair (ORDER_FRAG_PAIR): fused at every M (gemm_int4_wgmma's FRAG builds or
// gemm_int4_frag with the SwiGLU epilogue), G and U unused. File order: on a Hopper GPU from kWgmmaMinM tokens (INT4)
// one gemm_int4_wgmma launch with the SwiGLU epilogue; otherwise gemm_multi into G and U (f32 [M, I] scratch) and
// swiglu_rows.
int gemm_swiglu(const LinW& gate, const LinW& up, const __half* A, int lda, int M, float* G, float* U, __half* H,
                cudaStream_t st, GemmScratch* ws = nullptr);
// Y[M, K] f16 = rmsnorm(X[M, K] f32) * w
int rmsnorm_rows(const float* X, const float* w, int M, int K, float eps, __half* Y, cudaStream_t st);
// H[M, I] f16 = silu(G) * U
int swiglu_rows(const float* G, const float* U, int M, int I, __half* H, cudaStream_t st);
// X[M, H] f32 = embedding rows of tokens (embed dtype f32/f16/bf16)
int embed_rows(const void* table, int dtype, const int32_t* tokens, int M, int H, float* X, cudaStream_t st);

// KV cache geometry ------------------------------------------------------------------------------------------
constexpr int kPage = (int)contract::kKvPageTokens;  // tokens per KV page
struct KvLayer {
  __half* k;               // [n_phys_pages][n_kv][kPage][D]
  __half* v;
};

constexpr int kAttnMaxSplits = 128;   // attention splits per (token, KV head) a caller may ask for (attention() checks)
// Decode attention's least keys per split (a session's decode and the batched step; attn_decode_kernel grows it to
// cover the keys with n_split splits). attn_bench, H200, 7B heads, one token (bench/NOTES.md "Session 16" §1):
// 64 keys (4 one-page tiles, one a warp) took 6.2 / 7.1 / 8.7 us at 65 / 577 / 2,048 keys against 32's 6.9 / 9.0 / 13.0;
// 128 won at 65 and 2,048 keys (4.3, 7.4) and lost at 577 (8.3); from 8K keys the split count is the cap and kps
// does not matter.
constexpr int kDecodeKeysPerSplit = 64;
// Short contexts: the 8-warp decode build launched in clusters of up to kAttnMaxCluster blocks along the splits
// merges the splits in distributed shared memory instead of global memory (attention.cu). A launch takes it where
// the host bounds every token's keys by C x attn_cluster_keys_per_block(D) (AttnArgs::cluster_keys): a session's
// short-context decode graph (session.cu), with kAttnMaxCluster splits.
constexpr int kAttnMaxCluster = 8;            // portable cluster size
// The most keys x head dims one block of the cluster path streams (384 keys at D = 128, 768 at D = 64; a 16-key tile
// a warp at least). H200, 7B decode (bench/NOTES.md "Session 31" §1-2): after a 2K prompt the cluster path took
// 1.550-1.556 ms/token against 1.594-1.599 by session 30's global merge; after 4,000 tokens 1.603-1.609 against
// 1.586-1.594 by the global merge of f16 partials: the bound sits between, at 3,072 keys. 0.5B (D = 64) after 4,000
// tokens: 0.472 in clusters against 0.574 by session 30's global merge, so the same bytes a block (6,144 keys). With
// the merge in a kernel of its own (attn_merge_kernel, "Session 33" §2) the clusters still win after 2,048 tokens:
// 1.565 against 1.586 with the plain launch from 1,025 keys.
constexpr int kAttnClusterKeyDimsPerBlock = 384 * 128;
constexpr int attn_cluster_keys_per_block(int D) { return kAttnClusterKeyDimsPerBlock / D; }
struct AttnArgs {
  const float* qkv;        // [M][qkv_stride] f32: q (n_heads*D), k (n_kv*D), v (n_kv*D), bias already added
  int qkv_stride;
  int M;                   // query tokens (1 for decode)
  const int* pos0;         // device: position of query token 0 (token t is at *pos0 + pos_offset + t)
  int pos_offset = 0;      // host: session_prefill's last-token tail queries the chunk's row M - 1 alone
  KvLayer kv;
  const int* page_table;   // device [max_pages] logical page -> physical page
  const float2* rope;      // [max_ctx][D/2] (cos, sin)
  int n_heads, n_kv, D;
  int keys_per_split;      // minimum keys per split (multiple of 32); grown at run time to cover pos+1 keys
  int n_split;             // grid size along splits
  bool write_kv;           // decode: the block owning pos writes rope(k), v into the cache first
  __half* part_o;          // [M][n_heads][n_split][D]: each split's O / l (normalised, so f16 holds it)
  float* part_ml;          // [M][n_heads][n_split][2]: each split's running max m (log2 domain) and sum l
  __half* out;             // [M][n_heads*D]
  // Batched decode: M sequences, one query token each, every one at its own position in its own cache (grid z = M,
  // write_kv). Device arrays [M], all three or none; null for one sequence (then *pos0 + pos_offset + t, kv and
  // page_table).
  const int* pos_of = nullptr;
  const KvLayer* kv_of = nullptr;            // this layer's cache of each sequence
  const int* const* page_table_of = nullptr;
  // Prefill (M > 1, n_split 1): the keys the last query token sees (*pos0 + M) where the host knows it, else 0. It picks
  // the prefill kernel's build (attention.cu: kPrefillLongKeys); any value gives the same results.
  int max_keys = 0;
  // Decode (M = 1): the most keys the launch's token can have where the host bounds it (a session's short-context
  // graph), else 0. Where it is at most C x attn_cluster_keys_per_block(D) for the launch's cluster size C
  // (attn_decode_cluster), the blocks run in clusters and merge in distributed shared memory.
  int cluster_keys = 0;
};
int attention(const AttnArgs& a, cudaStream_t st);
// The cluster size a one-token decode launch of n_split splits gets (1: none: no sm_90 code, a split count with no
// power-of-two factor, a launch of more blocks than SMs, or clusters the GPU cannot hold in one wave)
int attn_decode_cluster(int n_kv, int n_split, int D);
// Prefill: rope(k) and v of M tokens into the cache at *pos0 .. *pos0+M-1.
int rope_kv_write(const float* qkv, int qkv_stride, int M, const int* pos0, KvLayer kv, const int* page_table,
                  const float2* rope, int n_heads, int n_kv, int D, cudaStream_t st);

// Decode step helpers -----------------------------------------------------------------------------------------
// x[H] f32 = embed[token] where token = *d_token
int embed_token(const void* table, int dtype, const int32_t* d_token, int H, float* x, cudaStream_t st);
// *pos += n
int advance_pos(int* pos, int n, cudaStream_t st);
// *pos_of[i] = pos[i] + 1 for i < n (a batched decode step's sessions)
int advance_positions(int* const* pos_of, const int* pos, int n, cudaStream_t st);
// A batched step's inputs from its staging row `in` (int32 [3][stride]: tokens, positions, chain; pinned host memory,
// read uncached): for i < n,
// tokens[i] = chain[i] >= 0 ? prev_next[chain[i]] (the token the previous step sampled for that row) : in tokens[i],
// pos[i] = in positions[i]
int take_batch_inputs(const int32_t* in, int stride, const int32_t* prev_next, int32_t* tokens, int* pos, int n,
                      cudaStream_t st);
// host_out[i] = next[i] for i < n: a batched step's samples into pinned host memory (the device's address of it),
// visible to the host once an event recorded after this launch has completed
int publish_samples(const int32_t* next, int32_t* host_out, int n, cudaStream_t st);

struct SampleArgs {
  const float* logits; int V;
  const nq_sampling* params;     // device: temperature, top_k, top_p, seed (read at run time, so one graph
                                 // serves any sampling settings)
  unsigned long long* counter;   // device: draws so far (incremented)
  int32_t* token_out;            // device: sampled token
  int32_t* host_ring; int ring_size;  // mapped host ring (may be null): ring[(*counter) % ring_size] = token
};
int sample(const SampleArgs& a, cudaStream_t st);
// n draws in one launch, block i with d_args[i] (device array; batched decode)
int sample_rows(const SampleArgs* d_args, int n, cudaStream_t st);

// Steered sampling (steer.cu; CPU reference: nanoqwen_rt/logits.py) ---------------------------------------------
struct SteerArgs {
  const float* logits; float* out; int V;
  const uint32_t* mask;          // device, ceil(V/32) words, or null: bit i of word i/32 = token i allowed
  const int* counts;             // device [V] tokens generated so far, or null (no penalties)
  float presence, frequency;
  const int32_t* bias_ids; const float* bias_vals; int n_bias;   // device, sparse logit_bias
};
// out = logits - penalties, masked to -inf, + bias
int steer_logits(const SteerArgs& a, cudaStream_t st);
// counts[*token] += 1
int count_token(int* counts, const int32_t* token, cudaStream_t st);
// Most alternatives one step reports and most logit_bias entries (nanoqwen.h); the logits each block of the
// first logprobs stage covers (152k rows -> ~150 blocks, about one per SM of an H200).
constexpr int kMaxTopLogprobs = NQ_MAX_TOP_LOGPROBS;
constexpr int kMaxLogitBias = NQ_MAX_LOGIT_BIAS;
constexpr int kLogprobSlice = 1024;
int logprob_blocks(int V);
// out[0] = log-softmax(L)[*token]; out[1] = n finite top entries (int bits); out[2..] their logprobs, out_ids
// their ids. part_f: logprob_blocks(V) * (2 + top_n) floats, part_i: logprob_blocks(V) * top_n ints.
int token_logprobs(const float* L, int V, const int32_t* token, int top_n, float* part_f, int* part_i, float* out,
                   int* out_ids, cudaStream_t st);

}  // namespace nq
