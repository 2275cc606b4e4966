/* libnanoqwen: C ABI of the nanoqwen CUDA runtime (one sequence per session, batch 1).
 *
 * Every function returns NQ_OK (0) on success or a negative NQ_E* code; the message of the last failure on
 * the calling thread is nq_last_error() (thread-local; valid until the next failing call on that thread).
 * Nothing aborts the process. Handles are opaque; free them with the matching *_free (NULL is allowed).
 */
#ifndef NANOQWEN_H
#define NANOQWEN_H
#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NQ_ABI_VERSION 1
#if defined(__GNUC__)
#define NQ_API __attribute__((visibility("default")))
#else
#define NQ_API
#endif

enum nq_status {
  NQ_OK = 0,
  NQ_E_INVALID_ARG = -1,   /* a NULL handle, a size out of range, an id out of range */
  NQ_E_IO = -2,            /* open/mmap/read failed */
  NQ_E_FORMAT = -3,        /* the file breaks the NANOQWEN v1 spec (message names the rule and field) */
  NQ_E_UNSUPPORTED = -4,   /* valid file, but a feature this backend does not run (e.g. yarn rope, f32 weights) */
  NQ_E_CUDA = -5,          /* a CUDA call or kernel launch failed (message names it) */
  NQ_E_CONTEXT_FULL = -6,  /* the tokens would not fit in the session's max_context */
  NQ_E_NO_DEVICE = -7      /* no CUDA device */
};

typedef struct nq_model nq_model;
typedef struct nq_session nq_session;

/* Model dimensions as read from the header (ModelConfig). */
typedef struct nq_config {
  int32_t arch, n_layers, hidden_size, intermediate_size, n_heads, n_kv_heads, head_dim, vocab_rows;
  int32_t max_positions, tied_embeddings, qkv_bias, rope_scaling_type;
  double rope_theta;
  float rope_scaling_factor, rms_norm_eps;
  int32_t bos_token_id, eos_token_id, pad_token_id;
} nq_config;

typedef struct nq_sampling {
  float temperature;  /* 0 = greedy (argmax, lowest index on ties) */
  int32_t top_k;      /* 0 = off */
  float top_p;        /* 1 = off; (0, 1] */
  uint64_t seed;
} nq_sampling;

/* Called once per produced token, in order. Return nonzero to stop generation after this token. */
typedef int (*nq_token_callback)(int32_t token, void* user);

NQ_API const char* nq_last_error(void);
NQ_API int nq_abi_version(void);
/* Number of CUDA devices (0 when none or no driver); never fails. */
NQ_API int nq_device_count(void);

/* mmap + validate the header (spec rules), upload all tensor data to one device allocation.
 * verify_checksums != 0 also checks every tensor's CRC32C on the host before the upload. */
NQ_API int nq_model_open(const char* path, int verify_checksums, nq_model** out);
NQ_API int nq_model_config(const nq_model* m, nq_config* out);
/* seconds the open took (wall clock, header + upload); bytes uploaded to the device. */
NQ_API int nq_model_load_stats(const nq_model* m, double* seconds, uint64_t* device_bytes);
NQ_API void nq_model_free(nq_model* m);

/* max_context: KV cache capacity in tokens (1..max_positions). sampling may be NULL (greedy). */
NQ_API int nq_session_create(nq_model* m, int32_t max_context, const nq_sampling* sampling, nq_session** out);
NQ_API int nq_session_set_sampling(nq_session* s, const nq_sampling* sampling);
NQ_API int nq_session_reset(nq_session* s);
NQ_API int nq_session_position(const nq_session* s, int32_t* pos);
/* Append n tokens (batched tensor-core pass); afterwards the session's logits are those of the last one. */
NQ_API int nq_prefill(nq_session* s, const int32_t* tokens, int32_t n);
/* Append one token (one CUDA graph replay); afterwards the logits are those of this token. */
NQ_API int nq_decode(nq_session* s, int32_t token);
/* Copy the current logits (vocab_rows floats) to host memory. */
NQ_API int nq_get_logits(nq_session* s, float* out, int32_t n);
/* Batched pass over n tokens from position 0 (resets first); out: n * vocab_rows floats (row-major). */
NQ_API int nq_logits_all(nq_session* s, const int32_t* tokens, int32_t n, float* out);
/* Sample up to max_new tokens on the device from the current logits; each sampled token except the last
 * one produced is decoded (appended). Tokens in stop_ids end generation (the stop token is delivered).
 * Stops early, too, when the context is full. out_tokens (may be NULL) receives the tokens; *n_out their count. */
NQ_API int nq_generate(nq_session* s, int32_t max_new, const int32_t* stop_ids, int32_t n_stop,
                nq_token_callback cb, void* user, int32_t* out_tokens, int32_t* n_out);
NQ_API void nq_session_free(nq_session* s);

/* ---- kernel test entry points (host pointers in and out; each allocates, runs one kernel, frees) ---- */
/* y[N] = W[N,K] @ x[K], W int4g layout 1 (qweight uint32 (N, K/8), scales f16 (N, K/g)). variant: 0 = f16
 * unpack path (split-K, cross-row pipeline, 2 blocks/SM; the default), 1 = int8-activation dp4a path, 2 = f16
 * unpack on the first (per-row pipeline) kernel, 3 = variant 0 at 3 blocks/SM, 4 = variant 0's kernel with variant 1's
 * int8 activations (dp4a); 1-4 kept for A/B timing. If norm_w != NULL the input is rmsnorm(x)*norm_w (eps). */
NQ_API int nq_test_gemv_int4(const uint32_t* qweight, const uint16_t* scales, int32_t N, int32_t K, int32_t group,
                      const float* x, const float* norm_w, float eps, int32_t variant, float* y);
/* The fused GEMV modes: mode 1 (add): y[N] += W @ f16(x) (y read and written); mode 2 (swiglu): y[N] =
 * f16(silu(W @ x') * (W_up @ x')) returned as f32, x' = rmsnorm(x)*norm_w when norm_w != NULL. variant as above. */
NQ_API int nq_test_gemv_int4_mode(const uint32_t* qweight, const uint16_t* scales, const uint32_t* qweight_up,
                           const uint16_t* scales_up, int32_t N, int32_t K, int32_t group, const float* x,
                           const float* norm_w, float eps, int32_t mode, int32_t variant, float* y);
/* y[N] = W[N,K] @ x[K] with f16 (dtype 1) or bf16 (dtype 2) weights given as raw uint16 bits. */
NQ_API int nq_test_gemv_dense(const uint16_t* w, int32_t dtype, int32_t N, int32_t K, const float* x, float* y);
/* C[M,N] = A[M,K] @ W^T for int4 W (tensor cores); A given as f32 (converted to f16 on the device). */
NQ_API int nq_test_gemm_int4(const uint32_t* qweight, const uint16_t* scales, int32_t N, int32_t K, int32_t group,
                      const float* A, int32_t M, float* C);
/* Time `iters` launches of the int4 GEMV on device-resident random data (> 512 MB of weight copies rotated, so
 * never L2-resident): ms per launch into ms[v] for each of the nvar variants (0..4), run one after another on the
 * same data. mode 0: f32 input with the RMSNorm prologue (qkv-like; nq_bench_gemv_int4 is this mode, one variant),
 * 1: f16 input + residual add (o/down-like), 2: SwiGLU over two N x K matrices (gate/up-like). */
NQ_API int nq_bench_gemv_int4(int32_t N, int32_t K, int32_t group, int32_t variant, int32_t iters, float* ms);
NQ_API int nq_bench_gemv_int4_mode(int32_t N, int32_t K, int32_t group, int32_t mode, int32_t iters, int32_t nvar,
                                   const int32_t* variants, float* ms);
/* Time `iters` launches of the prefill GEMM (M tokens, int4 weights N x K) on random data: ms per launch. */
NQ_API int nq_bench_gemm_int4(int32_t M, int32_t N, int32_t K, int32_t group, int32_t iters, float* ms);
/* Prefill attention of M >= 2 query tokens at positions n_pos-M .. n_pos-1 (causal): q[M][n_heads*D] f32 (already
 * roped), K/V[n_pos, n_kv, D] f32 (already roped) all in the cache; returns out[M][n_heads*D]. */
NQ_API int nq_test_attention_prefill(const float* q, const float* k, const float* v, int32_t n_heads, int32_t n_kv,
                                     int32_t head_dim, int32_t n_pos, int32_t M, float* out);
/* Time the attention kernel alone: M = 1 is the decode step's attention (writes the new row) at position n_pos-1,
 * M > 1 the prefill attention of M query tokens ending at n_pos-1; random f16 K/V rotated over enough layers to
 * exceed L2; `iters` launches captured in one CUDA graph. Microseconds per launch into *us. */
NQ_API int nq_bench_attention(int32_t n_heads, int32_t n_kv, int32_t head_dim, int32_t n_pos, int32_t M,
                              int32_t keys_per_split, int32_t n_split, int32_t iters, float* us);
/* Sample from logits[V] with the device sampler; returns the token in *out. */
NQ_API int nq_test_sample(const float* logits, int32_t V, const nq_sampling* sp, uint64_t counter, int32_t* out);
/* Decode attention for one query position: q[n_heads*D] f32 (already roped), K/V[(pos+1), n_kv, D] f32
 * (already roped); returns out[n_heads*D]. keys_per_split sets the split size (multiple of 32). */
NQ_API int nq_test_attention(const float* q, const float* k, const float* v, int32_t n_heads, int32_t n_kv,
                      int32_t head_dim, int32_t n_pos, int32_t keys_per_split, float* out);

#ifdef __cplusplus
}
#endif
#endif
