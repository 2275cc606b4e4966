// Timing entry of the decode GEMV over INT4 weights in the fragment order (csrc/src/gemv_frag.cuh), comparable in one
// process with nq_bench_gemv_int4_mode (bench_kernels.cu): the same random weights (put_random_int4: the same seed,
// the same number of copies rotated over > 512 MB so that none is L2-resident), the same x and norm weights, the same
// GemvArgs per mode, the same timing (time_ms: 3 untimed launches, then `iters` launches through the product's
// gemv() between two events). Only the order differs: every copy is repacked on the device as the loader does on
// Hopper (frag_repack; SWIGLU: gate copy 2c and up copy 2c + 1 as the pair, frag_repack_pair).
#include "testing_util.h"
#include "int4_frag.cuh"
#include "gemv_frag.cuh"   // gemv_frag_spg with a plan other than frag_plan

using namespace nq;
using namespace nq::testing;

namespace {

// The rotated copies of one GEMV's weights in the fragment order and their GemvArgs (nq_bench_gemv_int4_frag's setup);
// `run(args)` times launches over them: 3 untimed, then `iters` between two events.
template <class Run>
int frag_gemv_setup(int32_t N, int32_t K, int32_t group, int32_t mode, Run run) {
  NQ_TRY(check_int4(N, K, group));
  if (mode < GEMV_STORE || mode > GEMV_SWIGLU) return fail(NQ_E_INVALID_ARG, "mode %d", mode);
  if (!frag::shape_ok(N, K, group))
    return fail(NQ_E_UNSUPPORTED, "nq_bench_gemv_int4_frag: no fragment order for %d x %d group %d", N, K, group);
  NQ_TRY(gemv_prepare());
  if (!int4_fragment_order_available())
    return fail(NQ_E_UNSUPPORTED, "nq_bench_gemv_int4_frag: the fragment order needs a Hopper GPU, sm_90a build");
  // as nq_bench_gemv_int4_layout (layout 1)
  const int mats = mode == GEMV_SWIGLU ? 2 : 1;
  const size_t per_est = int4_copy_bytes(N, K, group);
  const int copies = (int)std::max<size_t>(2, (512ull << 20) / (per_est * mats) + 1);
  DBuf w, dx, dxh, dn, dy, scratch;
  size_t per = 0;
  NQ_TRY(put_random_int4(w, N, K, group, copies * mats, 0x1234567ull, &per));
  std::vector<float> xh(K), nh(K);
  std::vector<__half> x16(K);
  for (int i = 0; i < K; i++) {
    xh[i] = (float)((i * 37) % 17) / 8.f - 1.f;
    nh[i] = 1.f + (float)((i * 13) % 7) / 16.f;
    x16[i] = __float2half_rn(xh[i]);
  }
  NQ_TRY(dx.put(xh.data(), (size_t)K * 4));
  NQ_TRY(dn.put(nh.data(), (size_t)K * 4));
  NQ_TRY(dxh.put(x16.data(), (size_t)K * 2));
  NQ_TRY(dy.alloc((size_t)N * 4));
  NQ_CUDA(cudaMemset(dy.p, 0, (size_t)N * 4));
  // the repack of every copy, in place, through one scratch (stream-ordered reuse on stream 0)
  const LinW probe = int4_copy(w, per, 0, N, K, group);
  const size_t sbytes = (size_t)mats * frag_repack_scratch_bytes(probe);
  NQ_TRY(scratch.alloc(sbytes));
  std::vector<GemvArgs> args(copies);
  for (int c = 0; c < copies; c++) {
    GemvArgs& a = args[c];
    a.seg[0] = int4_copy(w, per, mats * c, N, K, group);
    a.mode = mode;
    if (mode == GEMV_STORE) {            // qkv-like: x f32 with the RMSNorm prologue
      NQ_TRY(frag_repack(&a.seg[0], scratch.p, sbytes, 0));
      a.x_f32 = dx.as<float>(); a.norm_w = dn.as<float>(); a.out_f32 = dy.as<float>();
    } else if (mode == GEMV_ADD) {       // o/down-like: x f16, residual add
      NQ_TRY(frag_repack(&a.seg[0], scratch.p, sbytes, 0));
      a.x_f16 = dxh.as<__half>(); a.out_f32 = dy.as<float>();
    } else {                             // gate/up: RMSNorm prologue, the pair, f16 out
      a.up = int4_copy(w, per, 2 * c + 1, N, K, group);
      NQ_TRY(frag_repack_pair(&a.seg[0], &a.up, scratch.p, sbytes, 0));
      a.x_f32 = dx.as<float>(); a.norm_w = dn.as<float>(); a.out_f16 = dy.as<__half>();
    }
  }
  NQ_CUDA(cudaDeviceSynchronize());
  return run(args);
}

}  // namespace

extern "C" {

int nq_test_frag_plan(int32_t N, int32_t K, int32_t mode, int32_t group, int32_t sm_count, int32_t* plan) {
  if (!plan || !frag::shape_ok(N, K, group) || (group != 32 && group != 64 && group != 128 && group != 256) ||
      mode < GEMV_STORE || mode > GEMV_SWIGLU || sm_count <= 0)
    return fail(NQ_E_INVALID_ARG, "nq_test_frag_plan: bad argument");
  const int spg = group / frag::kStepK;   // as gemv_frag
  const FragPlan p = frag_plan(gemv_frag_tiles(N, mode), K, mode, spg, sm_count);
  plan[0] = p.splits;
  plan[1] = p.warps;
  plan[2] = frag_min_blocks(spg, mode, p.warps);
  return NQ_OK;
}

int nq_bench_gemv_int4_frag(int32_t N, int32_t K, int32_t group, int32_t mode, int32_t iters, float* us) {
  if (!us || iters <= 0) return fail(NQ_E_INVALID_ARG, "nq_bench_gemv_int4_frag: bad argument");
  return frag_gemv_setup(N, K, group, mode, [&](const std::vector<GemvArgs>& args) -> int {
    float ms = 0.f;
    NQ_TRY(time_ms(3, iters, [&](int i) { return gemv(args[i % args.size()], 0); }, &ms));
    *us = ms * 1e3f;
    return NQ_OK;
  });
}

int nq_bench_gemv_int4_frag_plans(int32_t N, int32_t K, int32_t mode, int32_t iters, float* us) {
  if (!us || iters <= 0) return fail(NQ_E_INVALID_ARG, "nq_bench_gemv_int4_frag_plans: bad argument");
  return frag_gemv_setup(N, K, 128, mode, [&](const std::vector<GemvArgs>& args) -> int {
    NQ_CUDA(gemv_frag_attrs_spg<8>());   // this library's instantiations (gemv_prepare raised the product's)
    const int tiles = gemv_frag_tiles(N, mode);
    const int KC = K / kFragChunkK, warps[2] = {4, 8};
    for (int a = 0; a < 2; a++)
      for (int b = 0; b < 5; b++) {
        float* const out = us + 5 * a + b;
        *out = -1.f;
        const FragPlan p{1 << b, warps[a]};
        if (p.splits > KC || (mode == GEMV_SWIGLU && p.warps != 4)) continue;   // SWIGLU has 4-warp builds only
        float ms = 0.f;
        NQ_TRY(time_ms(3, iters, [&](int i) { return gemv_frag_spg<8>(args[i % args.size()], tiles, p, 0); }, &ms));
        *out = ms * 1e3f;
      }
    return NQ_OK;
  });
}

}  // extern "C"
