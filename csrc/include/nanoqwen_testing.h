/* libnanoqwen_testing: kernel test and benchmark entry points, built from the same kernel objects as libnanoqwen
 * (csrc/CMakeLists.txt) and loaded by tests/ and bench/ only; the product library carries none of these.
 * Same conventions as nanoqwen.h (NQ_OK or a negative NQ_E* code, the message in this library's own
 * nq_last_error(), thread-local). Test entry points take host arrays, allocate, poison the outputs (NaN), run one
 * kernel, copy back and free. Benchmarks time device-resident random data rotated over more than the 60 MB L2.
 */
#ifndef NANOQWEN_TESTING_H
#define NANOQWEN_TESTING_H
#include "nanoqwen.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The int4 entry points take W as qweight uint32 (N, K/8), scales f16 bits (N, K/g) and zeros: NULL for int4g layout
 * 1, or the layout-2 zero points uint8 (N, K/g), each 0..15 (placed after the scales as the file places them). */
/* y[N] = W[N,K] @ x[K], the decode GEMV (gemv_int4). If norm_w != NULL the input is rmsnorm(x)*norm_w (eps). */
NQ_API int nq_test_gemv_int4(const uint32_t* qweight, const uint16_t* scales, const uint8_t* zeros, int32_t N,
                             int32_t K, int32_t group, const float* x, const float* norm_w, float eps, float* y);
/* The fused GEMV modes: mode 1 (add): y[N] += W @ f16(x) (y read and written); mode 2 (swiglu): y[N] =
 * f16(silu(W @ x') * (W_up @ x')) returned as f32, x' = rmsnorm(x)*norm_w when norm_w != NULL. */
NQ_API int nq_test_gemv_int4_mode(const uint32_t* qweight, const uint16_t* scales, const uint8_t* zeros,
                                  const uint32_t* qweight_up, const uint16_t* scales_up, const uint8_t* zeros_up,
                                  int32_t N, int32_t K, int32_t group, const float* x, const float* norm_w, float eps,
                                  int32_t mode, float* y);
/* y[N] = W[N,K] @ x[K] with f16 (dtype 1) or bf16 (dtype 2) weights given as raw uint16 bits. */
NQ_API int nq_test_gemv_dense(const uint16_t* w, int32_t dtype, int32_t N, int32_t K, const float* x, float* y);
/* C[M,N] = A[M,K] @ W^T (+ C when add) through the product's gemm() with f16 (dtype 1) or bf16 (dtype 2) weights
 * given as raw uint16 bits (K % 64 == 0); A given as f32 (converted to f16 on the device); C in/out. */
NQ_API int nq_test_gemm_dense(const uint16_t* w, int32_t dtype, int32_t N, int32_t K, const float* A, int32_t M,
                              int32_t add, float* C);
/* C[M,N] = A[M,K] @ W^T for int4 W (tensor cores); A given as f32 (converted to f16 on the device). */
NQ_API int nq_test_gemm_int4(const uint32_t* qweight, const uint16_t* scales, const uint8_t* zeros, int32_t N,
                             int32_t K, int32_t group, const float* A, int32_t M, float* C);
/* nseg (1..3) int4 weights sharing A in one launch: qweights[i] uint32 (Ns[i], K/8), scales[i] f16 bits
 * (Ns[i], K/group), zeros NULL (all layout 1) or zeros[i] NULL (layout 1) or uint8 (Ns[i], K/group); A f32 (M, lda) (rounded to f16; columns >= K never read); bias[i] f32 (Ns[i]) or null (bias
 * itself may be null); C f32 (M, ldc) in/out: segment i writes columns off_i .. off_i + Ns[i] - 1 (C is copied to
 * the device first, so add = 1 adds to it and columns no segment owns must come back unchanged). */
NQ_API int nq_test_gemm_int4_multi(int32_t nseg, const uint32_t* const* qweights, const uint16_t* const* scales,
                                   const uint8_t* const* zeros, const int32_t* Ns, int32_t K, int32_t group,
                                   const float* A, int32_t M, int32_t lda, const float* const* bias, float* C,
                                   int32_t ldc, int32_t add);
/* The MLP's first half, gemm_swiglu: H = silu(A @ gate^T) * (A @ up^T) as f16 bits (M, N); gate/up uint32 (N, K/8),
 * f16-bit scales (N, K/group); z_gate/z_up uint8 zero points (N, K/group) or null (layout 1); A f32 (M, K) (rounded
 * to f16). unfused = 1 runs gemm_multi into f32 G, U and then swiglu_rows (the path gemm_swiglu takes where its fused
 * epilogue does not apply), for comparing the two. */
NQ_API int nq_test_gemm_swiglu(const uint32_t* q_gate, const uint16_t* s_gate, const uint8_t* z_gate,
                               const uint32_t* q_up, const uint16_t* s_up, const uint8_t* z_up, int32_t N, int32_t K,
                               int32_t group, const float* A, int32_t M, int32_t unfused, uint16_t* H);
/* The same kernels over weights in the INT4 fragment order (csrc/src/int4_frag.cuh): each entry takes the
 * file-order (layout 1) weights like its twin above, repacks them on the device as the loader does on Hopper (a
 * SWIGLU GEMV's and gemm_swiglu's gate and up as the interleaved pair), then runs the product's dispatch. The
 * multi GEMV: nseg (1..3) segments sharing x in one STORE launch, f32 x with optional RMSNorm, optional f32 bias
 * per segment; y = the segments' outputs concatenated. */
NQ_API int nq_test_gemv_int4_frag(const uint32_t* qweight, const uint16_t* scales, int32_t N, int32_t K,
                                  int32_t group, const float* x, const float* norm_w, float eps, float* y);
NQ_API int nq_test_gemv_int4_mode_frag(const uint32_t* qweight, const uint16_t* scales, const uint32_t* qweight_up,
                                       const uint16_t* scales_up, int32_t N, int32_t K, int32_t group, const float* x,
                                       const float* norm_w, float eps, int32_t mode, float* y);
NQ_API int nq_test_gemv_int4_multi_frag(int32_t nseg, const uint32_t* const* qweights, const uint16_t* const* scales,
                                        const int32_t* Ns, int32_t K, int32_t group, const float* x,
                                        const float* norm_w, float eps, const float* const* bias, float* y);
NQ_API int nq_test_gemm_int4_multi_frag(int32_t nseg, const uint32_t* const* qweights, const uint16_t* const* scales,
                                        const int32_t* Ns, int32_t K, int32_t group, const float* A, int32_t M,
                                        int32_t lda, const float* const* bias, float* C, int32_t ldc, int32_t add);
NQ_API int nq_test_gemm_swiglu_frag(const uint32_t* q_gate, const uint16_t* s_gate, const uint32_t* q_up,
                                    const uint16_t* s_up, int32_t N, int32_t K, int32_t group, const float* A,
                                    int32_t M, uint16_t* H);
/* 1 where the loader repacks INT4 weights into the fragment order (Hopper with the sm_90a build), else 0: the
 * *_frag entries fail elsewhere. */
NQ_API int nq_test_fragment_order_available(void);
/* The repack alone: words (N K / 8 uint32, [N/64][K/16][32][4]) and scales (N K / group f16 bits, [N/64][K/g][8][8])
 * of the fragment order; with qweight_up/scales_up set, of the gate/up pair P (2N rows: gate's bytes then up's). */
NQ_API int nq_test_frag_repack(const uint32_t* qweight, const uint16_t* scales, const uint32_t* qweight_up,
                               const uint16_t* scales_up, int32_t N, int32_t K, int32_t group, uint32_t* words,
                               uint16_t* scales_out);
/* Decode attention for one query position: q[n_heads*D] f32 (already roped), K/V[(pos+1), n_kv, D] f32
 * (already roped); returns out[n_heads*D]. keys_per_split sets the split size (multiple of 32). */
NQ_API int nq_test_attention(const float* q, const float* k, const float* v, int32_t n_heads, int32_t n_kv,
                             int32_t head_dim, int32_t n_pos, int32_t keys_per_split, float* out);
/* Prefill attention of M >= 2 query tokens at positions n_pos-M .. n_pos-1 (causal): q[M][n_heads*D] f32 (already
 * roped), K/V[n_pos, n_kv, D] f32 (already roped) all in the cache; returns out[M][n_heads*D]. n_split 1: the
 * prefill kernel; more: the decode kernel with the keys split (session_prefill's choice for a few tokens). */
NQ_API int nq_test_attention_prefill(const float* q, const float* k, const float* v, int32_t n_heads, int32_t n_kv,
                                     int32_t head_dim, int32_t n_pos, int32_t M, int32_t n_split, float* out);
/* The batched decode step's attention (attn_decode_kernel): R sequences, sequence r's token at position
 * n_pos[r] - 1 (1 <= n_pos[r] <= P) with its own pages of one pool, the cache rows past it poisoned (f16 NaN):
 * q[R][n_heads*D] f32 (already roped), K/V[R][P][n_kv][D] f32 (already roped; row n_pos[r] - 1 is the step's new
 * k / v, written by the kernel); returns out[R][n_heads*D] and checks that the kernel wrote each new row. */
NQ_API int nq_test_attention_batch(const float* q, const float* k, const float* v, const int32_t* n_pos, int32_t R,
                                   int32_t P, int32_t n_heads, int32_t n_kv, int32_t head_dim, int32_t n_split,
                                   float* out);
/* Sample from logits[V] with the device sampler; returns the token in *out. */
NQ_API int nq_test_sample(const float* logits, int32_t V, const nq_sampling* sp, uint64_t counter, int32_t* out);

/* The argument rule of nq_session_set_pages (host only, no device needed): NQ_OK or NQ_E_INVALID_ARG with the
 * message nq_session_set_pages gives, for a session of max_context whose page table has max_pages entries on a pool
 * of pool_pages pages. */
NQ_API int nq_test_check_pages(int32_t pool_pages, int32_t max_pages, int32_t max_context, const int32_t* pages,
                               int32_t n_pages, int32_t position);

/* The launch plan the decode GEMV in the fragment order takes (gemv_frag.cuh: frag_plan of gemv_frag_tiles; host
 * only, no device needed) for N outputs (SwiGLU: gate's N) over K in `mode` (0 store, 1 residual add, 2 SwiGLU) at
 * `group` on sm_count SMs: plan[0] the splits of K, plan[1] the warps a block, plan[2] the blocks an SM that build is
 * budgeted for (frag_min_blocks). NQ_E_INVALID_ARG for arguments gemv() never passes (a shape without the fragment
 * order, a group other than 32-256, a mode past 2). */
NQ_API int nq_test_frag_plan(int32_t N, int32_t K, int32_t mode, int32_t group, int32_t sm_count, int32_t* plan);

/* ms per launch of `iters` int4 GEMV launches (> 512 MB of weight copies rotated, never L2-resident). mode 0: f32
 * input with the RMSNorm prologue (qkv-like), 1: f16 input + residual add (o/down-like), 2: SwiGLU over two N x K
 * matrices (gate/up-like). nq_bench_gemv_int4 is mode 0. */
NQ_API int nq_bench_gemv_int4(int32_t N, int32_t K, int32_t group, int32_t iters, float* ms);
NQ_API int nq_bench_gemv_int4_mode(int32_t N, int32_t K, int32_t group, int32_t mode, int32_t iters, float* ms);
/* nq_bench_gemv_int4_mode for int4g layout 1 or 2 (layout 2: random zero points after the scales, as in a file). */
NQ_API int nq_bench_gemv_int4_layout(int32_t N, int32_t K, int32_t group, int32_t mode, int32_t layout,
                                     int32_t iters, float* ms);
/* nq_bench_gemv_int4_mode (layout 1: the same random weights, x, modes and timing) with every weight copy repacked
 * into the INT4 fragment order on the device (SWIGLU: gate and up as the pair), as the loader does on Hopper, so the
 * product's gemv() runs its fragment-order kernel. MICROseconds per launch into *us. NQ_E_UNSUPPORTED where the
 * order is not available (not Hopper, or a library without sm_90a code) or has no such shape (N % 64, K % 128). */
NQ_API int nq_bench_gemv_int4_frag(int32_t N, int32_t K, int32_t group, int32_t mode, int32_t iters, float* us);
/* ms per launch of the prefill GEMM (M tokens, int4 weights N x K) on random data. */
NQ_API int nq_bench_gemm_int4(int32_t M, int32_t N, int32_t K, int32_t group, int32_t iters, float* ms);
/* us per launch of the prefill GEMM with nseg copies of an N x K int4 weight in one launch (like gate/up); the
 * launches rotate over > 256 MB of weight copies. */
NQ_API int nq_bench_gemm_int4_multi(int32_t M, int32_t N, int32_t K, int32_t group, int32_t nseg, int32_t iters,
                                    float* us);
/* nq_bench_gemm_int4_multi for int4g layout 1 or 2. */
NQ_API int nq_bench_gemm_int4_layout(int32_t M, int32_t N, int32_t K, int32_t group, int32_t nseg, int32_t layout,
                                     int32_t iters, float* us);
/* us per gemm_multi launch over one N x K int4 weight (layout 1) repacked into the fragment order on the device (the
 * loader's repack; Hopper with the sm_90a build only: NQ_E_UNSUPPORTED elsewhere), M tokens: below 128 the
 * fragment-order few-token GEMM (gemm_frag.cuh), more in 64-token pieces. Inputs and timing as
 * nq_bench_gemm_int4_multi with nseg 1 (the same random weights, A and rotation), so the two compare in one process. */
NQ_API int nq_bench_gemm_int4_frag(int32_t N, int32_t K, int32_t group, int32_t M, int32_t iters, float* us);
/* One Qwen2.5-7B layer's GEMMs at M tokens, group `group`, in both INT4 orders on the same random weights: q/k/v (3
 * segments), o (+ residual), gate/up (gemm_swiglu: the fragment order's pair with its SwiGLU epilogue; the file order's
 * path, unfused below 128 tokens) and down (+ residual), each timed over > 256 MB of rotated copies; the sums in us into
 * *us_frag and *us_file. Hopper with the sm_90a build only. */
NQ_API int nq_bench_gemm_int4_frag_layer(int32_t M, int32_t group, int32_t iters, float* us_frag, float* us_file);
/* One Qwen2.5-7B shape of the fragment-order few-token GEMM (shape 0 q/k/v, 1 o (+ residual), 2 the gate/up pair with
 * its SwiGLU epilogue, 3 down (+ residual)) at M <= 64 tokens under every launch plan (launch_int4_frag_plan): {1, 2,
 * 4} m-tiles of 16 tokens x {1, 2, 4, 8, 16} splits; us[5 a + b] the us per launch of m-tile count a and split b over
 * > 256 MB of rotated copies, -1 where the plan does not fit, or has too few m-tiles for M or more than it needs. */
NQ_API int nq_bench_gemm_int4_frag_plans(int32_t shape, int32_t M, int32_t group, int32_t iters, float* us);
/* The fragment-order decode GEMV (nq_bench_gemv_int4_frag's weights, x and timing; group 128) under every launch
 * plan: {4, 8} warps a block x {1, 2, 4, 8, 16} splits; us[5 a + b] the us per launch of warps a and splits 2^b, -1
 * where the plan does not exist (more splits than K's 128-k chunks; SWIGLU has 4-warp builds only). */
NQ_API int nq_bench_gemv_int4_frag_plans(int32_t N, int32_t K, int32_t mode, int32_t iters, float* us);
/* The ceiling of mma.sync m16n8k16 (f16 x f16 -> f32): TFLOP/s over blocks x 8 warps x iters x 8 HMMA chains. */
NQ_API int nq_bench_mma_peak(int32_t blocks, int32_t iters, float* tflops);
/* The attention kernel alone: M = 1 is the decode step's attention (writes the new row) at position n_pos-1, M > 1
 * the prefill attention of M query tokens ending at n_pos-1; random f16 K/V rotated over enough layers to exceed
 * L2; `iters` launches captured in one CUDA graph. Microseconds per launch into *us. */
NQ_API int nq_bench_attention(int32_t n_heads, int32_t n_kv, int32_t head_dim, int32_t n_pos, int32_t M,
                              int32_t keys_per_split, int32_t n_split, int32_t iters, float* us);
/* The batched decode step's attention alone: `rows` sequences, one query token each at position n_pos-1 of its own
 * pages (write_kv, per-sequence positions, caches and page tables as batch.cu passes them), n_split splits per
 * (token, KV head); otherwise as nq_bench_attention. Microseconds per launch into *us. */
NQ_API int nq_bench_attention_batch(int32_t n_heads, int32_t n_kv, int32_t head_dim, int32_t n_pos, int32_t rows,
                                    int32_t keys_per_split, int32_t n_split, int32_t iters, float* us);
/* Device read bandwidth: a read-only stream over `bytes` (rounded to whole buffers; at least 2 x L2, rotated so
 * nothing is L2-resident) with 16-byte non-allocating loads, several in flight per thread, a grid that fills the
 * GPU; best of `iters` passes, GB/s (1e9 bytes/s) into *gb_per_s. The ceiling the GEMV's bytes/s is read against. */
NQ_API int nq_bench_read_bandwidth(uint64_t bytes, int32_t iters, float* gb_per_s);

#ifdef __cplusplus
}
#endif
#endif
