// Batch-1 GEMV launchers (kernels: gemv_kernels.cuh, gemv_frag.cuh). INT4 weights in the file's order run gemv_int4
// at 2 blocks/SM with a split factor chosen per shape (layout 2, zero points set: its ZP build); INT4 weights the
// loader repacked into the fragment order (LinW.order, int4_frag.cuh; Hopper only) run gemv_frag_kernel, K split over
// a thread-block cluster; f16/bf16 weights run gemv_rowpair. All launch with PDL (launch.h).
#include "gemv_kernels.cuh"
#include "gemv_frag.cuh"
#include "launch.h"
#include "format_contract.h"

namespace nq {
namespace {

// gemv_int4's register budget: 2 resident blocks per SM (125-128 registers, no spills). At 3 blocks/SM (80
// registers) it spills and lost on every shape above 0.5B (csrc/dev/gemv_int4_3blocks.cu, bench/NOTES.md).
constexpr int kInt4BlocksPerSm = 2;

template <int WT, int MODE>
int launch_dense(const GemvArgs& a, int rows, size_t smem, cudaStream_t st) {
  const int per_block = kWarps * (MODE == GEMV_SWIGLU ? 1 : 2);   // rows one step of a block covers
  int occ = 0;  // resident blocks per SM for this kernel and shared-memory size
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_rowpair<DenseRows<WT>, MODE>, kThreads, smem) != cudaSuccess || occ < 1)
    occ = 1;
  const int grid = std::max(1, std::min((rows + per_block - 1) / per_block, device_sms() * std::min(occ, kBlocksPerSm)));
  return launch_pdl("gemv_rowpair", gemv_rowpair<DenseRows<WT>, MODE>, dim3(grid), dim3(kThreads), smem, st, a, rows);
}

// layout 1 (zeros null) or layout 2 (zeros set: the ZP build); the caller checked that every segment has the same
template <bool ZP>
int dispatch_int4_layout(const GemvArgs& a, int rows, cudaStream_t st) {
  switch (a.mode) {
    case GEMV_STORE: return launch_gemv_int4<GEMV_STORE, kInt4BlocksPerSm, F16Units, ZP>(a, rows, device_sms(), st);
    case GEMV_ADD: return launch_gemv_int4<GEMV_ADD, kInt4BlocksPerSm, F16Units, ZP>(a, rows, device_sms(), st);
    case GEMV_SWIGLU: return launch_gemv_int4<GEMV_SWIGLU, kInt4BlocksPerSm, F16Units, ZP>(a, rows, device_sms(), st);
  }
  return fail(NQ_E_INVALID_ARG, "gemv: unknown mode %d", a.mode);
}
int dispatch_int4(const GemvArgs& a, int rows, cudaStream_t st) {
  if (a.seg[0].order != ORDER_FILE) return gemv_frag(a, rows, device_sms(), st);   // check_int4_orders passed
  return a.seg[0].zeros ? dispatch_int4_layout<true>(a, rows, st) : dispatch_int4_layout<false>(a, rows, st);
}

// One INT4 order per launch: every weight in the file's order (gemv_int4), or every weight in the fragment order
// (STORE / ADD: ORDER_FRAG; SWIGLU: gate and up the pair, ORDER_FRAG_PAIR) on a GPU and build where
// int4_fragment_order_available() (the loader repacks only there; frag_repack, the only way a weight gets a fragment
// order, checked its layout and shape).
int check_int4_orders(const GemvArgs& a) {
  const bool swiglu = a.mode == GEMV_SWIGLU;
  const int n = a.nseg + (swiglu ? 1 : 0);
  auto weight = [&](int i) -> const LinW& { return i < a.nseg ? a.seg[i] : a.up; };
  bool any_frag = false, all_frag = true;
  for (int i = 0; i < n; i++) {
    any_frag = any_frag || weight(i).order != ORDER_FILE;
    all_frag = all_frag && weight(i).order == (swiglu ? ORDER_FRAG_PAIR : ORDER_FRAG);
  }
  if (!any_frag) return NQ_OK;
  if (!all_frag)
    return fail(NQ_E_UNSUPPORTED, "gemv: mixed INT4 weight orders in one launch (mode %d needs every weight in %s)",
                a.mode, swiglu ? "the gate/up pair order" : "the fragment order");
  if (!int4_fragment_order_available())
    return fail(NQ_E_UNSUPPORTED, "gemv: INT4 weights in the fragment order need a Hopper GPU and the sm_90a build");
  return NQ_OK;
}

template <int WT>
int dispatch_dense(const GemvArgs& a, int rows, size_t smem, cudaStream_t st) {
  switch (a.mode) {
    case GEMV_STORE: return launch_dense<WT, GEMV_STORE>(a, rows, smem, st);
    case GEMV_ADD: return launch_dense<WT, GEMV_ADD>(a, rows, smem, st);
    case GEMV_SWIGLU: return launch_dense<WT, GEMV_SWIGLU>(a, rows, smem, st);
  }
  return fail(NQ_E_INVALID_ARG, "gemv: unknown mode %d", a.mode);
}

template <template <int> class Kernel>
cudaError_t raise_limits() {
  cudaError_t e;
  if ((e = cudaFuncSetAttribute(Kernel<GEMV_STORE>::get(), cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDynSmem))) return e;
  if ((e = cudaFuncSetAttribute(Kernel<GEMV_ADD>::get(), cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDynSmem))) return e;
  return cudaFuncSetAttribute(Kernel<GEMV_SWIGLU>::get(), cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDynSmem);
}
template <int MODE> struct Int4Kernel { static auto get() { return gemv_int4<MODE, kInt4BlocksPerSm>; } };
template <int MODE> struct Int4ZpKernel { static auto get() { return gemv_int4<MODE, kInt4BlocksPerSm, F16Units, true>; } };
template <int MODE> struct F16Kernel { static auto get() { return gemv_rowpair<DenseRows<WT_F16>, MODE>; } };
template <int MODE> struct Bf16Kernel { static auto get() { return gemv_rowpair<DenseRows<WT_BF16>, MODE>; } };

template <template <int> class Kernel>
void keep_driver_splits() {
  keep_driver_split(reinterpret_cast<const void*>(Kernel<GEMV_STORE>::get()));
  keep_driver_split(reinterpret_cast<const void*>(Kernel<GEMV_ADD>::get()));
  keep_driver_split(reinterpret_cast<const void*>(Kernel<GEMV_SWIGLU>::get()));
}

}  // namespace

int gemv_prepare() {
  keep_driver_splits<F16Kernel>();   // the dense lm_head streams through L1 (launch.h)
  keep_driver_splits<Bf16Kernel>();
  NQ_CUDA(raise_limits<Int4Kernel>());
  NQ_CUDA(raise_limits<Int4ZpKernel>());
  NQ_CUDA(raise_limits<F16Kernel>());
  NQ_CUDA(raise_limits<Bf16Kernel>());
  if (int4_fragment_order_available()) NQ_CUDA(gemv_frag_prepare());
  return NQ_OK;
}

int gemv(const GemvArgs& a, cudaStream_t st) {
  const LinW& w0 = a.seg[0];
  const int K = w0.K;
  if (a.nseg < 1 || a.nseg > 3) return fail(NQ_E_INVALID_ARG, "gemv: nseg %d", a.nseg);
  if (K <= 0 || K % 32 != 0) return fail(NQ_E_INVALID_ARG, "gemv: K=%d must be a positive multiple of 32", K);
  int rows = 0;
  for (int s = 0; s < a.nseg; s++) {
    if (a.seg[s].K != K || a.seg[s].type != w0.type)
      return fail(NQ_E_INVALID_ARG, "gemv: segments differ in K or weight type");
    rows += a.seg[s].N;
  }
  if (a.mode == GEMV_SWIGLU && (a.nseg != 1 || a.up.K != K || a.up.N != w0.N || a.up.type != w0.type))
    return fail(NQ_E_INVALID_ARG, "gemv: SWIGLU needs one gate segment and an up weight of the same shape");
  const size_t smem = (size_t)K * 2;
  if (smem > (size_t)kMaxDynSmem) return fail(NQ_E_UNSUPPORTED, "gemv: K=%d too large", K);
  if (w0.type == WT_INT4) {
    for (int s = 0; s < a.nseg; s++)
      if (!contract::int4_group_ok(a.seg[s].group, K))
        return fail(NQ_E_INVALID_ARG, "gemv: group %d with K=%d", a.seg[s].group, K);
    if (a.mode == GEMV_SWIGLU && a.up.group != w0.group)
      return fail(NQ_E_UNSUPPORTED, "gemv: gate and up have different group sizes (%d, %d)", w0.group, a.up.group);
    if (a.mode == GEMV_SWIGLU && (a.up.zeros != nullptr) != (w0.zeros != nullptr))
      return fail(NQ_E_UNSUPPORTED, "gemv: gate and up have different int4 layouts");
    NQ_TRY(check_int4_orders(a));
    bool one_group = true;   // and one layout (zero points in every segment or in none)
    for (int s = 1; s < a.nseg; s++)
      one_group = one_group && a.seg[s].group == w0.group && (a.seg[s].zeros != nullptr) == (w0.zeros != nullptr);
    if (!one_group) {  // one group size and layout per launch (both INT4 kernels): one launch per segment
      int off = 0;
      for (int s = 0; s < a.nseg; s++) {
        GemvArgs b = a;
        b.nseg = 1;
        b.seg[0] = a.seg[s];
        b.bias[0] = a.bias[s];
        b.out_f32 = a.out_f32 + off;
        NQ_TRY(dispatch_int4(b, a.seg[s].N, st));
        off += a.seg[s].N;
      }
      return NQ_OK;
    }
    return dispatch_int4(a, rows, st);
  }
  if (w0.type == WT_F16) return dispatch_dense<WT_F16>(a, rows, smem, st);
  if (w0.type == WT_BF16) return dispatch_dense<WT_BF16>(a, rows, smem, st);
  return fail(NQ_E_UNSUPPORTED, "gemv: weight type %d", w0.type);
}

}  // namespace nq
