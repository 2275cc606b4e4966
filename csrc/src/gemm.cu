// Prefill GEMM entry points (kernels: gemm_kernels.cuh). INT4 weights run gemm_int4_mma with 3 cp.async stages at
// 2 blocks/SM and serial split-K where the grid leaves SMs idle; f16/bf16 weights run the wmma kernel.
#include "gemm_kernels.cuh"
#include "format_contract.h"

namespace nq {
namespace {
// gemm_int4_mma's build: 3 stages at 2 blocks/SM with split-K beat 4 stages at 1 block/SM and the unsplit build
// on the 7B prefill (csrc/dev/gemm_int4_mma_variants.cu, bench/NOTES.md).
constexpr int kMmaStages = 3, kMmaBlocksPerSm = 2;
}  // namespace

int gemm_multi(const LinW* W, float* const* C, const float* const* bias, int n, const __half* A, int lda, int M,
               int ldc, bool add, cudaStream_t st) {
  if (n < 1 || n > 3) return fail(NQ_E_INVALID_ARG, "gemm: %d segments (1..3)", n);
  for (int i = 0; i < n; i++) {
    if (M <= 0 || W[i].K % BK != 0 || lda % 8 != 0)
      return fail(NQ_E_UNSUPPORTED, "gemm: needs K %% 64 == 0 (K=%d), lda %% 8 == 0 (lda=%d), M > 0 (M=%d)", W[i].K,
                  lda, M);
    if (W[i].type == WT_INT4 && !contract::int4_group_ok(W[i].group, W[i].K))
      return fail(NQ_E_UNSUPPORTED, "gemm: int4 group %d is not an allowed group size dividing K=%d", W[i].group,
                  W[i].K);
  }
  bool same = true;
  for (int i = 1; i < n; i++) same = same && W[i].K == W[0].K && W[i].type == W[0].type;
  if (!same) {  // segments of different K or dtype: one launch each
    for (int i = 0; i < n; i++) NQ_TRY(gemm_multi(W + i, C + i, bias + i, 1, A, lda, M, ldc, add, st));
    return NQ_OK;
  }
  const int bn = W[0].type == WT_INT4 ? MM_BN : BN;  // both 128 today; the tiles follow the kernel
  GemmGroup g;
  g.n = n;
  int tiles = 0;
  for (int i = 0; i < n; i++) {
    g.s[i].W = W[i];
    g.s[i].C = C[i];
    g.s[i].bias = bias[i];
    const int t = (W[i].N + bn - 1) / bn;
    if (i == 0) g.tiles0 = t;
    if (i == 1) g.tiles1 = t;
    tiles += t;
  }
  if (W[0].type == WT_INT4)
    return launch_int4_mma<kMmaStages, kMmaBlocksPerSm>(g, tiles, A, lda, M, ldc, add, /*allow_split=*/true, st);
  if (W[0].type == WT_F16) return launch_gemm<WT_F16>(g, tiles, A, lda, M, ldc, add, st);
  if (W[0].type == WT_BF16) return launch_gemm<WT_BF16>(g, tiles, A, lda, M, ldc, add, st);
  return fail(NQ_E_UNSUPPORTED, "gemm: weight type %d", W[0].type);
}

int gemm(const LinW& W, const __half* A, int lda, int M, float* C, int ldc, const float* bias, bool add,
         cudaStream_t st) {
  return gemm_multi(&W, &C, &bias, 1, A, lda, M, ldc, add, st);
}

}  // namespace nq
