// Prefill GEMM entry points (kernels: gemm_kernels.cuh, gemm_wgmma.cuh, gemm_frag.cuh). The dispatch, by the INT4
// weights' device order (LinW.order, kernels.h):
// * File order (ORDER_FILE), as today: gemm_int4_wgmma (wgmma + TMA) on a Hopper GPU, the prefill builds from
//   kWgmmaMinM tokens on where their grid (choose_wgmma) has at least half as many blocks as the GPU has SMs, the
//   few-token builds below kWgmmaMinM tokens; otherwise gemm_int4_mma with 3 cp.async stages at 2 blocks/SM and
//   serial split-K where the grid leaves SMs idle. INT4 layout 2 (zero points set) runs the ZP builds of the same
//   kernels, chosen the same way. f16/bf16 weights run the wmma kernel.
// * Fragment order (Hopper with the sm_90a build: the loader repacks layout-1 INT4 weights, int4_frag.cuh): gemm_multi
//   with every segment ORDER_FRAG, and gemm_swiglu over the gate/up pair (both ORDER_FRAG_PAIR), run the FRAG
//   builds of gemm_int4_wgmma (launch_int4_wgmma_frag, SwiGLU epilogue for the pair) from kWgmmaMinM tokens on
//   under the same grid rule and build choice; otherwise gemm_int4_frag (gemm_frag.cuh: mma.sync, split-K over a
//   thread-block cluster), 1-64 tokens a launch, more in 64-token pieces, the pair with its SwiGLU epilogue (G and U
//   unused). A mix of orders in one gemm_multi call, or the pair given to gemm_multi, fails (NQ_E_UNSUPPORTED): no
//   kernel reads both. gemm_swiglu over gate and up each ORDER_FRAG (not the pair) takes the unfused path.
#include "gemm_kernels.cuh"
#include "gemm_wgmma.cuh"
#include "gemm_frag.cuh"
#include "format_contract.h"

namespace nq {
namespace {
// gemm_int4_mma's build: 3 stages at 2 blocks/SM with split-K beat 4 stages at 1 block/SM and the unsplit build
// on the 7B prefill (csrc/dev/gemm_int4_mma_variants.cu, bench/NOTES.md).
constexpr int kMmaStages = 3, kMmaBlocksPerSm = 2;

// When gemm_int4_wgmma runs: from one full 128-token block on, and only if its grid has at least half as many blocks
// as the GPU has SMs (it does not split K; gemm_int4_mma splits K over idle SMs). At M = 512 every 7B projection
// has >= 96 blocks (measured: 1.8x faster per layer); at M = 128 the 7B q/k/v, o and down grids (19-36 blocks) stay
// on gemm_int4_mma. Below 128 tokens (batched decode, short prompts) the few-token builds below run instead.
constexpr int kWgmmaMinM = 128;

// Few-token builds of gemm_int4_wgmma (M < kWgmmaMinM: the batched decode step, short prompts): the token tile is 16
// tokens up to M = 16, 32 up to M = 64 (two 32-token tiles from 33 on), 64 above (two 64-token tiles), 64 kSmallWgs W
// rows per block, stages of kSmallSub 64-k sub-tiles (kSmallStages in flight; at 64 tokens 6 stages of 2, whose
// fragments fit the registers), and split-K filling the SMs (one block per SM, as every gemm_int4_wgmma build). At
// these M the work is the weight stream (the FLOPs are ~M/2 per weight byte). Per 7B layer at M = 64 (H200,
// csrc/dev/gemm_int4_wgmma timebatch, bench/NOTES.md "Session 9"): two 32-token tiles 190.6 us, one 64-token tile
// 226.3; at M = 5..16 the 16-token tile wins (128-131 against 145-149), at M = 32 the 32-token one (147 against 174).
constexpr int kSmallWgs = 3, kSmallSub = 4, kSmallStages = 4;
// split-K bounds of the few-token builds: at least kSmallMinStages 64-k stages per split (the pipeline fill is ~8),
// at most kSmallMaxSplits splits (each adds one read-modify-write of the C tile, small at these M)
constexpr int kSmallMinStages = 8, kSmallMaxSplits = 16;

// gemm_int4_wgmma's builds and their throughput per SM in full waves (TFLOP/s, 7B gate+up at M = 512 on the H200,
// csrc/dev/gemm_int4_wgmma.cu, bench/NOTES.md: 529 in 5 rounds of 4.48 waves, 516 in 6 full rounds, 452 in 9 rounds of
// 8.97 waves): 128 W rows x 256 tokens (2 consumer warpgroups, 4 stages), 128 x 128 (2, 5 stages), 192 x 128 (3, 5).
struct WgShape {
  int tn, wgs;
  double rate;
};
constexpr WgShape kWgShapes[3] = {{256, 2, 590.0}, {128, 2, 453.0}, {128, 3, 516.0}};

// The build with the least estimated time: (rounds of one block per SM) x (block FLOPs / rate). At M = 512 this
// picks 192 x 128 for qkv (96 blocks: one round), 128 x 128 for o and down (112 blocks), 128 x 256 for gate+up
// (592 blocks), as the measurements ranked them.
// Returns the build index and its block count in *blocks.
int choose_wgmma(const LinW* W, int n, int M, int sms, long long* blocks) {
  int best = 0;
  double best_cost = 0.0;
  for (int c = 0; c < 3; c++) {
    const int rows = 64 * kWgShapes[c].wgs;
    long long tiles = 0;
    for (int i = 0; i < n; i++) tiles += (W[i].N + rows - 1) / rows;
    const long long b = (long long)((M + kWgShapes[c].tn - 1) / kWgShapes[c].tn) * tiles;
    const double cost = (double)((b + sms - 1) / sms) * rows * kWgShapes[c].tn / kWgShapes[c].rate;
    if (c == 0 || cost < best_cost) best = c, best_cost = cost, *blocks = b;
  }
  return best;
}

// Whether gemm_int4_wgmma runs on the current device: compute capability 9.x, the library built for sm_90a (the
// kernel's binary and PTX are sm_90), and the driver's tensor-map encoder present. Cached per device.
bool wgmma_available() {
  static int state[16] = {0};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) {
    (void)cudaGetLastError();
    return false;
  }
  if (!state[dev]) {
    int major = 0;
    cudaFuncAttributes fa;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    major == 9 &&
                    cudaFuncGetAttributes(&fa, gemm_int4_wgmma<256, 2, 4, 1>) == cudaSuccess && fa.binaryVersion >= 90 &&
                    fa.ptxVersion >= 90 &&  // not an sm_80 build JIT-compiled for this GPU (its kernel is empty)
                    wg_encode_fn() != nullptr;
    if (!ok) (void)cudaGetLastError();
    state[dev] = ok ? 1 : 2;
  }
  return state[dev] == 1;
}

// The INT4 launch of gemm_multi for one layout (ZP: layout 2, every segment has zero points): the kernel and block
// shape as the file comment says. count_tiles(rows) sets g's tile marks for `rows` W rows per tile.
template <bool ZP, class CountTiles>
int gemm_int4_launch(GemmGroup& g, const LinW* W, int n, const __half* A, int lda, int M, int ldc, bool add,
                     cudaStream_t st, GemmScratch* ws, CountTiles count_tiles) {
  const int sms = device_sms();
  bool tma_ok = reinterpret_cast<uintptr_t>(A) % 16 == 0;  // TMA: 16-byte aligned bases (lda % 8 == 0 above)
  for (int i = 0; i < n; i++) tma_ok = tma_ok && reinterpret_cast<uintptr_t>(W[i].w) % 16 == 0;
  long long blocks = 0;
  const int c = M >= kWgmmaMinM && tma_ok && wgmma_available() ? choose_wgmma(W, n, M, sms, &blocks) : -1;
  if (c >= 0 && 2 * blocks >= sms) {
    const int wt = count_tiles(64 * kWgShapes[c].wgs);
    if (c == 0) return launch_int4_wgmma<256, 2, 4, 1, ZP>(g, wt, A, lda, M, ldc, add, 1, st);
    if (c == 1) return launch_int4_wgmma<128, 2, 5, 1, ZP>(g, wt, A, lda, M, ldc, add, 1, st);
    return launch_int4_wgmma<128, 3, 5, 1, ZP>(g, wt, A, lda, M, ldc, add, 1, st);
  }
  if (M < kWgmmaMinM && tma_ok && wgmma_available()) {  // few tokens: the weight stream, split over the SMs
    const int wt = count_tiles(64 * kSmallWgs);
    const int tn = M <= 16 ? 16 : M <= 64 ? 32 : 64;
    const int splits = choose_splits((long long)((M + tn - 1) / tn) * wt, W[0].K / WG_KB, /*blocks_per_sm=*/1,
                                     kSmallMaxSplits, kSmallMinStages, /*fill_rounds=*/true);
    if (tn == 16)
      return launch_int4_wgmma<16, kSmallWgs, kSmallStages, kSmallSub, ZP>(g, wt, A, lda, M, ldc, add, splits, st, ws);
    if (tn == 32)
      return launch_int4_wgmma<32, kSmallWgs, kSmallStages, kSmallSub, ZP>(g, wt, A, lda, M, ldc, add, splits, st, ws);
    return launch_int4_wgmma<64, kSmallWgs, 6, 2, ZP>(g, wt, A, lda, M, ldc, add, splits, st, ws);
  }
  return launch_int4_mma<kMmaStages, kMmaBlocksPerSm, ZP>(g, count_tiles(MM_BN), A, lda, M, ldc, add,
                                                          /*allow_split=*/true, st);
}

// What every fragment-order launch needs beyond what frag_repack (the only way a weight gets ORDER_FRAG /
// ORDER_FRAG_PAIR) checked of each weight's type and shape: the GPU and build that read the order, and A and the
// weights 16-byte aligned (TMA, 16-byte loads).
int frag_check(const LinW* W, int n, const __half* A, int lda) {
  if (!wgmma_available())
    return fail(NQ_E_UNSUPPORTED, "gemm: INT4 weights in the fragment order need a Hopper GPU and the sm_90a build");
  if (lda % 8 != 0 || reinterpret_cast<uintptr_t>(A) % 16 != 0)
    return fail(NQ_E_UNSUPPORTED, "gemm: the fragment-order GEMM needs A 16-byte aligned and lda %% 8 == 0 (lda=%d)",
                lda);
  for (int i = 0; i < n; i++)
    if (reinterpret_cast<uintptr_t>(W[i].w) % 16 != 0 || reinterpret_cast<uintptr_t>(W[i].scales) % 16 != 0)
      return fail(NQ_E_UNSUPPORTED, "gemm: weight %d of a fragment-order launch is not 16-byte aligned", i);
  return NQ_OK;
}

// The FRAG prefill build choose_wgmma picked (c: its kWgShapes index), over `tiles` blocks of W rows.
int launch_wgmma_frag_build(int c, GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add,
                            cudaStream_t st) {
  if (c == 0) return launch_int4_wgmma_frag<256, 2, 4>(g, tiles, A, lda, M, ldc, add, st);
  if (c == 1) return launch_int4_wgmma_frag<128, 2, 5>(g, tiles, A, lda, M, ldc, add, st);
  return launch_int4_wgmma_frag<128, 3, 5>(g, tiles, A, lda, M, ldc, add, st);
}

// The fragment-order launch of gemm_multi (every segment ORDER_FRAG, one K and group; count_tiles as in
// gemm_int4_launch): the FRAG prefill build that choose_wgmma picks, from kWgmmaMinM tokens on where its grid has at
// least half as many blocks as the GPU has SMs (the file order's rule); otherwise gemm_int4_frag.
template <class CountTiles>
int gemm_frag_launch(GemmGroup& g, const LinW* W, int n, const __half* A, int lda, int M, int ldc, bool add,
                     cudaStream_t st, CountTiles count_tiles) {
  NQ_TRY(frag_check(W, n, A, lda));
  const int sms = device_sms();
  long long blocks = 0;
  const int c = M >= kWgmmaMinM ? choose_wgmma(W, n, M, sms, &blocks) : -1;
  if (c >= 0 && 2 * blocks >= sms)
    return launch_wgmma_frag_build(c, g, count_tiles(64 * kWgShapes[c].wgs), A, lda, M, ldc, add, st);
  return launch_int4_frag(g, count_tiles(kFragRB), A, lda, M, ldc, add, st);
}

// gemm_swiglu over the gate/up pair (both ORDER_FRAG_PAIR): the FRAG prefill build with the SwiGLU epilogue under
// gemm_multi's rule, otherwise gemm_int4_frag with its SwiGLU epilogue. H [M][I], row stride I.
int gemm_swiglu_frag(const LinW& gate, const LinW& up, const __half* A, int lda, int M, __half* H, cudaStream_t st) {
  const int I = gate.N;
  if (gate.order != ORDER_FRAG_PAIR || up.order != ORDER_FRAG_PAIR)
    return fail(NQ_E_UNSUPPORTED, "gemm_swiglu: gate and up in different device orders (%d, %d)", gate.order,
                up.order);
  if (M <= 0 || up.N != I || up.K != gate.K || up.group != gate.group)
    return fail(NQ_E_UNSUPPORTED, "gemm_swiglu: the gate/up pair needs one shape and group (gate %d x %d g%d, up %d x "
                "%d g%d), M > 0 (M=%d)", I, gate.K, gate.group, up.N, up.K, up.group, M);
  const LinW W[2] = {gate, up};
  NQ_TRY(frag_check(W, 2, A, lda));
  const int sms = device_sms();
  GemmGroup g;
  g.n = 2;
  for (int i = 0; i < 2; i++) g.s[i].W = W[i], g.s[i].C = nullptr, g.s[i].bias = nullptr;
  g.swiglu_out = H;
  g.swiglu_ld = I;
  long long blocks = 0;
  const int c = M >= kWgmmaMinM ? choose_wgmma(W, 2, M, sms, &blocks) : -1;
  if (c >= 0 && 2 * blocks >= sms) {   // blocks of 32 WGS outputs: WGS tiles of the pair
    const int half = 32 * kWgShapes[c].wgs;
    return launch_wgmma_frag_build(c, g, (I + half - 1) / half, A, lda, M, 0, false, st);
  }
  // 4 tiles of the pair (I / 32 of them, 32 outputs each) a block
  return launch_int4_frag(g, (I / 32 + kFragWarps - 1) / kFragWarps, A, lda, M, 0, false, st);
}
}  // namespace

// Every INT4 consumer reads the fragment order where gemm_int4_wgmma runs: the GEMV and the few-token GEMM need
// thread-block clusters (sm_90), the prefill GEMM wgmma (sm_90a).
bool int4_fragment_order_available() {
  return wgmma_available();
}

void gemm_scratch_free(GemmScratch* ws) {
  if (ws->p) cudaFree(ws->p);
  *ws = GemmScratch{};
}

int gemm_multi(const LinW* W, float* const* C, const float* const* bias, int n, const __half* A, int lda, int M,
               int ldc, bool add, cudaStream_t st, GemmScratch* ws) {
  if (n < 1 || n > 3) return fail(NQ_E_INVALID_ARG, "gemm: %d segments (1..3)", n);
  for (int i = 0; i < n; i++) {
    if (M <= 0 || W[i].K % BK != 0 || lda % 8 != 0)
      return fail(NQ_E_UNSUPPORTED, "gemm: needs K %% 64 == 0 (K=%d), lda %% 8 == 0 (lda=%d), M > 0 (M=%d)", W[i].K,
                  lda, M);
    if (W[i].type == WT_INT4 && !contract::int4_group_ok(W[i].group, W[i].K))
      return fail(NQ_E_UNSUPPORTED, "gemm: int4 group %d is not an allowed group size dividing K=%d", W[i].group,
                  W[i].K);
  }
  int nfrag = 0;   // segments in the fragment order (ORDER_FRAG); the gate/up pair is gemm_swiglu's alone
  for (int i = 0; i < n; i++) {
    if (W[i].order == ORDER_FRAG_PAIR)
      return fail(NQ_E_UNSUPPORTED, "gemm: segment %d is half of a gate/up pair (ORDER_FRAG_PAIR): gemm_swiglu's", i);
    nfrag += W[i].order == ORDER_FRAG;
  }
  if (nfrag != 0 && nfrag != n)
    return fail(NQ_E_UNSUPPORTED, "gemm: %d of %d segments in the fragment order, the rest in the file's", nfrag, n);
  bool same = true;   // K, dtype and INT4 layout (zero points or none); the fragment order: one group too
  for (int i = 1; i < n; i++)
    same = same && W[i].K == W[0].K && W[i].type == W[0].type && (W[i].zeros != nullptr) == (W[0].zeros != nullptr) &&
           (nfrag == 0 || W[i].group == W[0].group);
  if (!same) {  // segments of different K, dtype or layout: one launch each
    for (int i = 0; i < n; i++) NQ_TRY(gemm_multi(W + i, C + i, bias + i, 1, A, lda, M, ldc, add, st, ws));
    return NQ_OK;
  }
  GemmGroup g;
  g.n = n;
  for (int i = 0; i < n; i++) {
    g.s[i].W = W[i];
    g.s[i].C = C[i];
    g.s[i].bias = bias[i];
  }
  // the kernels walk blockIdx.y over the segments' W-row tiles one after another: tiles0 and tiles1 mark where
  // segments 1 and 2 begin; returns all segments' tiles for `rows` W rows per tile
  auto count_tiles = [&](int rows) {
    int total = 0;
    for (int i = 0; i < n; i++) {
      const int t = (W[i].N + rows - 1) / rows;
      if (i == 0) g.tiles0 = t;
      if (i == 1) g.tiles1 = t;
      total += t;
    }
    return total;
  };
  if (nfrag) return gemm_frag_launch(g, W, n, A, lda, M, ldc, add, st, count_tiles);
  if (W[0].type == WT_INT4)
    return W[0].zeros ? gemm_int4_launch<true>(g, W, n, A, lda, M, ldc, add, st, ws, count_tiles)
                      : gemm_int4_launch<false>(g, W, n, A, lda, M, ldc, add, st, ws, count_tiles);
  const int tiles = count_tiles(BN);
  if (W[0].type == WT_F16) return launch_gemm_f16(g, tiles, A, lda, M, ldc, add, st);
  if (W[0].type == WT_BF16) return launch_gemm<WT_BF16>(g, tiles, A, lda, M, ldc, add, st);
  return fail(NQ_E_UNSUPPORTED, "gemm: weight type %d", W[0].type);
}

int gemm_swiglu(const LinW& gate, const LinW& up, const __half* A, int lda, int M, float* G, float* U, __half* H,
                cudaStream_t st, GemmScratch* ws) {
  if (gate.order == ORDER_FRAG_PAIR || up.order == ORDER_FRAG_PAIR)   // the pair: G and U unused
    return gemm_swiglu_frag(gate, up, A, lda, M, H, st);
  const int I = gate.N;
  const LinW W[2] = {gate, up};
  const int sms = device_sms();
  long long blocks = 0;
  // (the file order only: ORDER_FRAG gate and up take the unfused path, gemm_multi reading the fragment order)
  const bool fused_ok = gate.order == ORDER_FILE && up.order == ORDER_FILE && gate.type == WT_INT4 &&
                        up.type == WT_INT4 && up.N == I && up.K == gate.K && up.group == gate.group &&
                        M >= kWgmmaMinM && gate.K % BK == 0 && lda % 8 == 0 &&
                        contract::int4_group_ok(gate.group, gate.K) && reinterpret_cast<uintptr_t>(A) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(gate.w) % 16 == 0 && reinterpret_cast<uintptr_t>(up.w) % 16 == 0 &&
                        (gate.zeros != nullptr) == (up.zeros != nullptr) && wgmma_available();
  // the build gemm_multi would take for gate and up; each block kRows/2 rows of gate and the same rows of up
  const int c = fused_ok ? choose_wgmma(W, 2, M, sms, &blocks) : -1;
  if (c >= 0 && 2 * blocks >= sms) {
    GemmGroup g;
    g.n = 2;
    for (int i = 0; i < 2; i++) g.s[i].W = W[i], g.s[i].C = nullptr, g.s[i].bias = nullptr;
    g.swiglu_out = H;
    g.swiglu_ld = I;
    const int half = 32 * kWgShapes[c].wgs, tiles = (I + half - 1) / half;
    if (gate.zeros) {   // layout 2: the ZP builds
      if (c == 0) return launch_int4_wgmma<256, 2, 4, 1, true>(g, tiles, A, lda, M, 0, false, 1, st);
      if (c == 1) return launch_int4_wgmma<128, 2, 5, 1, true>(g, tiles, A, lda, M, 0, false, 1, st);
      return launch_int4_wgmma<128, 3, 5, 1, true>(g, tiles, A, lda, M, 0, false, 1, st);
    }
    if (c == 0) return launch_int4_wgmma<256, 2, 4, 1>(g, tiles, A, lda, M, 0, false, 1, st);
    if (c == 1) return launch_int4_wgmma<128, 2, 5, 1>(g, tiles, A, lda, M, 0, false, 1, st);
    return launch_int4_wgmma<128, 3, 5, 1>(g, tiles, A, lda, M, 0, false, 1, st);
  }
  if (!G || !U)   // PrefillBuffers::alloc leaves them out only where every pair is ORDER_FRAG_PAIR
    return fail(NQ_E_INVALID_ARG, "gemm_swiglu: no G / U scratch for the unfused path (gate order %d)", gate.order);
  float* const C2[2] = {G, U};
  const float* const B2[2] = {nullptr, nullptr};
  NQ_TRY(gemm_multi(W, C2, B2, 2, A, lda, M, I, false, st, ws));
  return swiglu_rows(G, U, M, I, H, st);
}

int gemm(const LinW& W, const __half* A, int lda, int M, float* C, int ldc, const float* bias, bool add,
         cudaStream_t st, GemmScratch* ws) {
  return gemm_multi(&W, &C, &bias, 1, A, lda, M, ldc, add, st, ws);
}

}  // namespace nq
