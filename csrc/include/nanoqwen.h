/* libnanoqwen: C ABI of the nanoqwen CUDA runtime (one sequence per session; many sessions decode in one batched
 * step and may share one KV page pool). Production entry points
 * only; the kernel test and benchmark entry points are in libnanoqwen_testing (nanoqwen_testing.h).
 *
 * Every function returns NQ_OK (0) on success or a negative NQ_E* code. The message of the last failure is
 * nq_last_error(): it is THREAD-LOCAL, so a caller must read it on the same thread that made the failing call
 * (a binding that runs nq_generate on a worker thread reads it there); it stays valid until the next failing call
 * on that thread. Every argument is validated here, at the ABI; nothing aborts the process. Handles are opaque;
 * free them with the matching *_free (NULL is allowed).
 */
#ifndef NANOQWEN_H
#define NANOQWEN_H
#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NQ_ABI_VERSION 6
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
  NQ_E_UNSUPPORTED = -4,   /* valid file, but a feature this backend does not run (e.g. head_dim 96, f32 weights) */
  NQ_E_CUDA = -5,          /* a CUDA call or kernel launch failed (message names it) */
  NQ_E_CONTEXT_FULL = -6,  /* the tokens would not fit in the session's max_context */
  NQ_E_NO_DEVICE = -7,     /* no CUDA device */
  NQ_E_OUT_OF_MEMORY = -8  /* device or host memory exhausted (cudaMalloc / pinned or host allocation failed) */
};

typedef struct nq_model nq_model;
typedef struct nq_session nq_session;
typedef struct nq_batch nq_batch;
typedef struct nq_kv_pool nq_kv_pool;

/* Model dimensions as read from the header (ModelConfig). */
typedef struct nq_config {
  int32_t arch, n_layers, hidden_size, intermediate_size, n_heads, n_kv_heads, head_dim, vocab_rows;
  int32_t max_positions, tied_embeddings, qkv_bias, rope_scaling_type;
  double rope_theta;
  float rope_scaling_factor, rms_norm_eps;
  int32_t bos_token_id, eos_token_id, pad_token_id;
  int32_t rope_original_max_positions;   /* yarn: the context the model was trained at; else 0 */
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
/* A static one-line JSON description of this ABI, built from the real structs (sizeof/offsetof) and the format
 * facts compiled in (csrc/src/format_contract.h): {"abi_version": N, "status": {"NQ_OK": 0, ...}, "structs":
 * {"nq_config": {"size": S, "fields": {"arch": [offset, "i32"], ...}}, "nq_sampling": {...}}, "format": {...}}.
 * Bindings check their own struct layouts and constants against it. Never fails. */
NQ_API const char* nq_abi_describe(void);
/* Number of CUDA devices (0 when none or no driver); never fails. */
NQ_API int nq_device_count(void);
/* Free and total bytes of the current device's memory now (cudaMemGetInfo), e.g. to size a KV pool. */
NQ_API int nq_device_memory(uint64_t* free_bytes, uint64_t* total_bytes);

/* Validate the file as nq_model_open does (the spec's rules, without the tensor checksums) and check that this
 * library runs it (head_dim, GQA ratio, RoPE scaling, weight dtypes, ...); no upload, no device needed.
 * NQ_OK, or NQ_E_IO / NQ_E_FORMAT / NQ_E_UNSUPPORTED with the one-line reason in nq_last_error(). */
NQ_API int nq_model_check(const char* path);
/* mmap + validate the header (spec rules) + the nq_model_check rules, upload all tensor data to one device
 * allocation. verify_checksums != 0 also checks every tensor's CRC32C on the host before the upload. */
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
/* Append n tokens (batched tensor-core pass); afterwards the session's logits are those of the last one. The pass
 * runs in chunks of at most NQ_PREFILL_CHUNK_TOKENS tokens (or max_context / the model's max_positions when smaller):
 * the prefill activations a session (or a KV pool, for its sessions) allocates are sized by the chunk, never by the
 * prompt. */
#define NQ_PREFILL_CHUNK_TOKENS 2048
NQ_API int nq_prefill(nq_session* s, const int32_t* tokens, int32_t n);
/* Append one token (one CUDA graph replay); afterwards the logits are those of this token. Returns once the step
 * is enqueued: every later call on the session waits for it first (so the host may work while the device runs
 * the step), and a device error of the step is reported by that later call. */
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
/* One steered sampling step from the current logits, on the device (structured output, logit_bias, penalties,
 * logprobs): x = logits - (frequency_penalty * count + presence_penalty * (count > 0)) over the tokens sampled since
 * the last nq_session_reset; tokens whose bit in token_mask is 0 get -inf (token_mask: NULL, or ceil(vocab_rows/32)
 * words, bit i of word i/32 = token i allowed; n_mask_words must say so); x[bias_ids[j]] += bias_values[j]
 * (n_bias in [0, NQ_MAX_LOGIT_BIAS], ids in range, unique, values finite); then the device sampler with the
 * session's sampling settings draws *out_token from x, and the token is counted. With top_n >= 0 (at most
 * NQ_MAX_TOP_LOGPROBS): *out_logprob = log-softmax(x)[token], and the top_n largest entries of log-softmax(x)
 * (descending, lower id first on ties, finite ones only: *out_n_top of them) in out_top_ids / out_top_logprobs.
 * The token is not decoded: call nq_decode(token) for the next step. The mask must allow at least one token. */
#define NQ_MAX_TOP_LOGPROBS 20   /* OpenAI's top_logprobs limit */
#define NQ_MAX_LOGIT_BIAS 1024   /* OpenAI documents no limit; clients send a few hundred entries at most */
NQ_API int nq_sample_steered(nq_session* s, const int32_t* bias_ids, const float* bias_values, int32_t n_bias,
                             const int32_t* token_mask, int32_t n_mask_words, float presence_penalty,
                             float frequency_penalty, int32_t top_n, int32_t* out_token, float* out_logprob,
                             int32_t* out_top_ids, float* out_top_logprobs, int32_t* out_n_top);
NQ_API void nq_session_free(nq_session* s);

/* A device KV page pool shared by many sessions of one model (the batched API's KV store). A page holds the keys and
 * values (f16, every layer) of NQ_KV_PAGE_TOKENS consecutive positions of one sequence; page ids are 0..n_pages-1.
 * The library does no page bookkeeping: the caller owns it (which pages are free, which are shared by a cached
 * prefix) and tells each session its page table with nq_session_set_pages. A page that two sessions list must
 * hold rows both only read (a shared prefix): a session writes the rows of every position >= its position. */
#define NQ_KV_PAGE_TOKENS 16
#define NQ_MAX_KV_POOL_PAGES (1 << 24)   /* 2^28 positions: far beyond any device's memory at 7B shapes */
/* Bytes one page of this model's KV takes on the device. */
NQ_API int nq_kv_page_bytes(const nq_model* m, uint64_t* bytes);
/* n_pages in [1, NQ_MAX_KV_POOL_PAGES]; every page starts poisoned (NaN). NQ_E_OUT_OF_MEMORY when the device cannot
 * hold it. */
NQ_API int nq_kv_pool_create(nq_model* m, int32_t n_pages, nq_kv_pool** out);
/* Fill these pages (ids in range; n in [0, the pool's n_pages]) with NaN in every layer: a page handed to a new
 * owner, so a read of a row nobody wrote since shows in the logits. Returns without waiting for the fill: on the
 * device it is ordered before every later step of a session of this pool (nq_prefill, nq_decode, nq_generate,
 * nq_logits_all) and every later batched step with a session of this pool (nq_decode_batch, nq_decode_batch_launch),
 * "later" meaning called after this returns. Work enqueued before the call is not ordered before or after the fill:
 * the pages must not be in use by such work. */
NQ_API int nq_kv_pool_poison(nq_kv_pool* p, const int32_t* pages, int32_t n);
/* Release the caller's handle; the device memory goes when the last session made on the pool is freed too. */
NQ_API void nq_kv_pool_free(nq_kv_pool* p);
/* A session whose KV rows live in `pool`'s pages (pool of model m) instead of a cache of its own, through a page
 * table of up to ceil(max_context / NQ_KV_PAGE_TOKENS) entries. It starts with no pages: nothing runs on it
 * until nq_session_set_pages gives it some, and its tokens must fit in them (NQ_E_CONTEXT_FULL otherwise; also
 * for nq_generate, which stops early at the last position its pages hold). Everything else as nq_session_create;
 * the sessions of one pool share the pool's prefill buffers, so their prefills run one at a time. */
NQ_API int nq_session_create_pooled(nq_model* m, nq_kv_pool* pool, int32_t max_context, const nq_sampling* sampling,
                                    nq_session** out);
/* Set the page table of a pooled session: logical page i -> pool page pages[i] (n_pages in [0, ceil(max_context /
 * NQ_KV_PAGE_TOKENS)], ids in range and distinct), and its position (in [0, min(n_pages * NQ_KV_PAGE_TOKENS,
 * max_context)]): the rows of positions before it are already in those pages (a cached prefix, or the session's
 * own earlier tokens). Growing the table at the same position keeps the session's logits; any other position
 * drops them (prefill or decode first). Uploads only the entries that changed, and returns without waiting for the
 * upload (the session's later steps and batched steps come after it). */
NQ_API int nq_session_set_pages(nq_session* s, const int32_t* pages, int32_t n_pages, int32_t position);

/* Batched decode: one token for each of n sessions of one model in one forward pass (the weights are read once per
 * step for all of them). max_batch in [1, NQ_MAX_BATCH]. */
#define NQ_MAX_BATCH 256
NQ_API int nq_batch_create(nq_model* m, int32_t max_batch, nq_batch** out);
/* sessions[i] (n in [1, max_batch] distinct sessions of the batch's model, not in use by another call) takes
 * tokens[i] at its position; next_tokens[i] is then sampled with that session's sampling settings (its own device
 * sampler state, as nq_generate); logits: NULL (n_logits 0), or n_logits * vocab_rows floats that receive the logits
 * of sessions 0 .. n_logits - 1 (n_logits in [0, n]: a caller that samples some sequences itself puts them first and
 * copies only their rows). Every position advances by one; afterwards nq_get_logits of these sessions fails until
 * their next nq_decode or nq_prefill. A session at its max_context (a pooled one: at the end of its pages):
 * NQ_E_CONTEXT_FULL, and nothing is done. */
NQ_API int nq_decode_batch(nq_batch* b, nq_session* const* sessions, const int32_t* tokens, int32_t n,
                           int32_t* next_tokens, float* logits, int32_t n_logits);
/* The same step in two halves, so that the caller prepares the next step while one runs on the device (pipelined
 * decoding): nq_decode_batch_launch enqueues a step and returns at once; nq_decode_batch_wait waits for the oldest
 * launched step and writes its n sampled tokens. At most 2 steps are in flight (a third launch fails); nq_decode_batch
 * fails while any is. chain: NULL, or n ints: chain[i] >= 0 feeds sessions[i] the token that the batch's most recent
 * step (launched or run, waited or not) sampled for its row chain[i], which stays on the device (each row at most
 * once), and tokens[i] is then ignored; -1 takes tokens[i]. A session's position advances at the launch. No logits:
 * every row is sampled on the device. Until its step is waited a session takes no other call (they fail with
 * NQ_E_INVALID_ARG) except nq_session_set_pages at its position (growing its page table) and another launch that
 * continues it; it must not be freed. */
NQ_API int nq_decode_batch_launch(nq_batch* b, nq_session* const* sessions, const int32_t* tokens, const int32_t* chain,
                                  int32_t n);
NQ_API int nq_decode_batch_wait(nq_batch* b, int32_t* next_tokens, int32_t n);
NQ_API void nq_batch_free(nq_batch* b);

#ifdef __cplusplus
}
#endif
#endif
