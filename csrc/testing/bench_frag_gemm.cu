// Timing entries of the fragment-order few-token GEMM (nanoqwen_testing.h): the product's dispatch (gemm_multi,
// gemm_swiglu; gemm.cu) over random INT4 weights repacked into the fragment order on the device as the loader does
// (frag_repack / frag_repack_pair, int4_frag.cuh), with nq_bench_gemm_int4_multi's inputs and timing
// (bench_kernels.cu: the same LCG codes and 2^-7 scales, the same A, launches rotated over > 256 MB of weight copies,
// CUDA events), so that the two orders compare in one process.
#include "testing_util.h"
#include "int4_frag.cuh"
#include "gemm_frag.cuh"   // launch_int4_frag_plan: a plan other than the product rule

using namespace nq;
using namespace nq::testing;

namespace {

constexpr size_t kRotateBytes = 256ull << 20;   // nq_bench_gemm_int4_layout's rotation

// `sets` copies of n INT4 matrices (N[i] x K, group g) sharing K, each matrix's copies back to back as the file places
// one (put_random_int4), enough sets for > 256 MB in all; optionally repacked in place into the fragment order (each
// matrix ORDER_FRAG, or matrices 0 and 1 as the gate/up pair).
struct WeightSets {
  DBuf buf[3];
  size_t per[3] = {0, 0, 0};
  int n = 0, sets = 0, K = 0, g = 0, N[3] = {0, 0, 0}, order = ORDER_FILE;
  int make(int nmat, const int* Ns, int K_, int g_, uint64_t seed) {
    n = nmat, K = K_, g = g_;
    size_t set_bytes = 0;
    for (int i = 0; i < n; i++) N[i] = Ns[i], set_bytes += int4_copy_bytes(Ns[i], K, g);
    sets = (int)std::max<size_t>(2, kRotateBytes / set_bytes + 1);
    for (int i = 0; i < n; i++) NQ_TRY(put_random_int4(buf[i], N[i], K, g, sets, seed + 0x9E3779B9ull * i, &per[i]));
    return NQ_OK;
  }
  LinW at(int s, int i) const {
    LinW L = int4_copy(buf[i], per[i], s % sets, N[i], K, g);
    L.order = order;
    return L;
  }
  int repack(bool pair) {
    for (int i = 0; i < n; i++)
      if (!frag::shape_ok(N[i], K, g))
        return fail(NQ_E_UNSUPPORTED, "bench: %d x %d group %d has no fragment order", N[i], K, g);
    size_t need = 0;
    for (int i = 0; i < n; i++) need += frag_repack_scratch_bytes(at(0, i));
    DBuf scratch;
    NQ_TRY(scratch.alloc(need));
    for (int s = 0; s < sets; s++) {
      if (pair) {
        LinW G = at(s, 0), U = at(s, 1);
        NQ_TRY(frag_repack_pair(&G, &U, scratch.p, need, 0));
      } else {
        for (int i = 0; i < n; i++) {
          LinW W = at(s, i);
          NQ_TRY(frag_repack(&W, scratch.p, need, 0));
        }
      }
    }
    NQ_CUDA(cudaDeviceSynchronize());   // the scratch is reused by every repack on stream 0
    order = pair ? ORDER_FRAG_PAIR : ORDER_FRAG;
    return NQ_OK;
  }
};

// nq_bench_gemm_int4_layout's activations: f16 ((i * 37) % 17) / 8 - 1, M x K
int put_acts(DBuf& da, int M, int K) {
  std::vector<__half> ah((size_t)M * K);
  for (size_t i = 0; i < ah.size(); i++) ah[i] = __float2half((float)((i * 37) % 17) / 8.f - 1.f);
  return da.put(ah.data(), ah.size() * 2);
}

// One Qwen2.5-7B layer's GEMMs by index: 0 q/k/v (3 segments), 1 o, 2 the gate/up pair, 3 down
constexpr int k7bH = 3584, k7bI = 18944;
struct Shape7b {
  int n, K, N[3];
};
inline Shape7b shape_7b(int shape) {
  if (shape == 0) return {3, k7bH, {3584, 512, 512}};
  if (shape == 1) return {1, k7bH, {k7bH, 0, 0}};
  if (shape == 2) return {2, k7bH, {k7bI, k7bI, 0}};
  return {1, k7bI, {k7bH, 0, 0}};
}

// µs per gemm_multi call over the sets of W (n segments, outputs side by side in C, ldc = sum of N)
int time_multi(const WeightSets& W, const __half* A, int M, float* C, bool add, int iters, float* us) {
  float* Cs[3];
  const float* Bs[3] = {nullptr, nullptr, nullptr};
  int ldc = 0;
  for (int i = 0; i < W.n; i++) Cs[i] = C + ldc, ldc += W.N[i];
  float ms = 0.f;
  NQ_TRY(time_ms(2, iters, [&](int it) {
    LinW L[3];
    for (int i = 0; i < W.n; i++) L[i] = W.at(it, i);
    return gemm_multi(L, Cs, Bs, W.n, A, W.K, M, ldc, add, 0);
  }, &ms));
  *us = ms * 1e3f;
  return NQ_OK;
}

// µs per gemm_swiglu call over the sets of W (gate, up); G and U: the unfused path's f32 scratch (file order)
int time_swiglu(const WeightSets& W, const __half* A, int M, float* G, float* U, __half* H, int iters, float* us) {
  float ms = 0.f;
  GemmScratch ws;
  const int rc = time_ms(2, iters, [&](int it) {
    return gemm_swiglu(W.at(it, 0), W.at(it, 1), A, W.K, M, G, U, H, 0, &ws);
  }, &ms);
  gemm_scratch_free(&ws);
  NQ_TRY(rc);
  *us = ms * 1e3f;
  return NQ_OK;
}

}  // namespace

extern "C" {

int nq_bench_gemm_int4_frag(int32_t N, int32_t K, int32_t group, int32_t M, int32_t iters, float* us) {
  if (!us || iters <= 0 || M <= 0) return fail(NQ_E_INVALID_ARG, "nq_bench_gemm_int4_frag: bad argument");
  NQ_TRY(check_int4(N, K, group));
  if (!int4_fragment_order_available())
    return fail(NQ_E_UNSUPPORTED, "nq_bench_gemm_int4_frag: no fragment order on this GPU or build");
  WeightSets W;
  NQ_TRY(W.make(1, &N, K, group, 0x7654321ull));
  NQ_TRY(W.repack(false));
  DBuf da, dc;
  NQ_TRY(put_acts(da, M, K));
  NQ_TRY(dc.alloc((size_t)M * N * 4));
  return time_multi(W, da.as<__half>(), M, dc.as<float>(), false, iters, us);
}

int nq_bench_gemm_int4_frag_plans(int32_t shape, int32_t M, int32_t group, int32_t iters, float* us) {
  if (!us || iters <= 0 || M <= 0 || M > kFragMaxTokens || shape < 0 || shape > 3)
    return fail(NQ_E_INVALID_ARG, "nq_bench_gemm_int4_frag_plans: bad argument");
  if (!int4_fragment_order_available())
    return fail(NQ_E_UNSUPPORTED, "nq_bench_gemm_int4_frag_plans: no fragment order on this GPU or build");
  constexpr int I = k7bI;
  NQ_TRY(check_int4(k7bH, I, group));
  const Shape7b sh = shape_7b(shape);
  const bool swiglu = shape == 2, add = shape == 1 || shape == 3;
  const int* const Ns = sh.N;
  const int n = sh.n, K = sh.K, KC = K / kFragChunkK;
  FragLimits L;
  NQ_TRY(frag_limits(&L));
  WeightSets W;
  NQ_TRY(W.make(n, Ns, K, group, 0x1234567ull + shape));
  NQ_TRY(W.repack(swiglu));
  DBuf da, dc, dh;
  NQ_TRY(put_acts(da, M, K));
  int ldc = 0;
  for (int i = 0; i < n; i++) ldc += Ns[i];
  NQ_TRY(dc.alloc((size_t)M * ldc * 4));
  NQ_CUDA(cudaMemset(dc.p, 0, (size_t)M * ldc * 4));
  NQ_TRY(dh.alloc((size_t)M * I * 2));
  // column blocks as gemm.cu counts them: 256 W rows a block; the pair 4 P tiles (128 outputs) a block
  int cols = 0, tiles[3] = {0, 0, 0};
  for (int i = 0; i < n; i++) tiles[i] = (Ns[i] + kFragRB - 1) / kFragRB, cols += tiles[i];
  if (swiglu) cols = (I / 32 + kFragWarps - 1) / kFragWarps;
  const int mts[3] = {1, 2, 4}, splits[5] = {1, 2, 4, 8, 16};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 5; b++) {
      float* const out = us + 5 * a + b;
      *out = -1.f;
      if (16 * mts[a] < M || (mts[a] > 1 && 16 * mts[a] / 2 >= M)) continue;   // too few m-tiles, or more than needed
      if (splits[b] > std::min(kFragMaxSplits, KC) || !frag_fits(mts[a], KC, splits[b], L)) continue;
      float ms = 0.f;
      const int rc = time_ms(2, iters, [&](int it) {
        GemmGroup g;
        g.n = n;
        g.tiles0 = tiles[0];
        g.tiles1 = tiles[1];
        for (int i = 0, off = 0; i < n; i++) {
          g.s[i].W = W.at(it, i);
          g.s[i].C = swiglu ? nullptr : dc.as<float>() + off;
          g.s[i].bias = nullptr;
          off += Ns[i];
        }
        if (swiglu) g.swiglu_out = dh.as<__half>(), g.swiglu_ld = I;
        return launch_int4_frag_plan(g, cols, da.as<__half>(), K, M, ldc, add, mts[a], splits[b], L, 0);
      }, &ms);
      NQ_TRY(rc);
      *out = ms * 1e3f;
    }
  return NQ_OK;
}

int nq_bench_gemm_int4_frag_layer(int32_t M, int32_t group, int32_t iters, float* us_frag, float* us_file) {
  if (!us_frag || !us_file || iters <= 0 || M <= 0)
    return fail(NQ_E_INVALID_ARG, "nq_bench_gemm_int4_frag_layer: bad argument");
  if (!int4_fragment_order_available())
    return fail(NQ_E_UNSUPPORTED, "nq_bench_gemm_int4_frag_layer: no fragment order on this GPU or build");
  constexpr int H = k7bH, I = k7bI;
  NQ_TRY(check_int4(H, I, group));
  DBuf dah, dai, dc, dg, du, dh;
  NQ_TRY(put_acts(dah, M, H));
  NQ_TRY(put_acts(dai, M, I));
  NQ_TRY(dc.alloc((size_t)M * (3584 + 512 + 512) * 4));
  NQ_CUDA(cudaMemset(dc.p, 0, (size_t)M * (3584 + 512 + 512) * 4));   // o and down add into it
  NQ_TRY(dg.alloc((size_t)M * I * 4));
  NQ_TRY(du.alloc((size_t)M * I * 4));
  NQ_TRY(dh.alloc((size_t)M * I * 2));
  float* const C = dc.as<float>();
  *us_frag = *us_file = 0.f;
  // one shape at a time (its file-order copies, then the same bytes repacked): at most ~0.6 GB of weights at once
  for (int shape = 0; shape < 4; shape++) {
    WeightSets W;
    const bool swiglu = shape == 2;
    const Shape7b sh = shape_7b(shape);
    NQ_TRY(W.make(sh.n, sh.N, sh.K, group, 0x1234567ull + shape));
    const __half* A = shape == 3 ? dai.as<__half>() : dah.as<__half>();
    for (int frag_order = 0; frag_order < 2; frag_order++) {
      if (frag_order) NQ_TRY(W.repack(swiglu));
      float us = 0.f;
      if (swiglu) NQ_TRY(time_swiglu(W, A, M, dg.as<float>(), du.as<float>(), dh.as<__half>(), iters, &us));
      else NQ_TRY(time_multi(W, A, M, C, /*add=*/shape != 0, iters, &us));
      *(frag_order ? us_frag : us_file) += us;
    }
  }
  return NQ_OK;
}

}  // extern "C"
