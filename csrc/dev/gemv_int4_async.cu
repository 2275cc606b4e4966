// "The library kernel" below is the library's gemv_int4 of that time, kept as gemv_int4_v2 (gemv_int4_v2.cuh).
// INT4 GEMV with a per-thread cp.async ring: more weight bytes in flight without registers. It LOST (H200,
// bench/NOTES.md "Session 4"): 7B gate+up 25.7 us at S = 3, 26.4 at S = 4, 31.4 at S = 6 (deeper is slower) vs the
// library's 23.9; and the diagnostics below showed why: the library kernel's loads alone (its exact access pattern
// and work split, no arithmetic) already stream as fast as a plain read (gate+up 18.0 vs 17.8 us), so bytes in
// flight were never its limit.
//
// bench/NOTES.md ("INT8-activation GEMV", "Streaming INT4 GEMV") reads the library's gemv_int4 as bound by bytes in
// flight per SM: 2 blocks x 8 warps x 32 lanes x 64 B = 32 KB, against Little's law's ~33 KB for 4.4 TB/s at ~1 us
// loaded latency, with no slack. The block-wide cp.async.bulk ring fixed the bytes but its consumers lost on shared-
// memory bank conflicts and cross-warp waits. This kernel keeps the library's arithmetic and work split exactly and
// changes only where a step's weights wait: lane l copies its own 16-byte units with cp.async (LDGSTS) into its own
// ring slots, S - 1 steps ahead, and reads back exactly what it wrote. So:
//   * no barrier and no mbarrier: cp.async.wait_group is per thread, and no other thread reads the slot;
//   * no bank conflicts: slot (stage, k) of thread t sits at ((stage * 2U + k) * 256 + t) * 16 B, so a warp's 32
//     lanes write and read 512 contiguous bytes (4 wavefronts, the minimum);
//   * (S - 1) x 64 B per lane in flight, from shared memory instead of registers: S = 4 at 2 blocks/SM is 96 KB per
//     SM, 3x the library kernel.
// The scales (2 B per 128 values, 1.6 % of the bytes; cp.async needs 4-byte alignment that K / group odd rows do
// not have) stay in registers, loaded one step ahead.
//
//   make -C csrc/dev && build/dev/gemv_int4_async
#include "gemv_dev.cuh"
#include "gemv_int4_v2.cuh"
#include "cp_async.cuh"

// dynamic shared memory per block: the H200 opt-in maximum (227 KB) less room for the static part
constexpr int kMaxDyn = 227 * 1024 - 1024;

namespace nq {
namespace {

// 4 bytes global -> shared (.ca: the 16-byte-only .cg does not take 4)
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
// the 4-byte-aligned word holding the f16 at p (inside the scales array: rounding down never leaves it)
__device__ __forceinline__ const void* word_of(const __half* p) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
}
// the f16 at p out of its word w, as f32
__device__ __forceinline__ float half_of(uint32_t w, const __half* p) {
  const uint32_t h = (reinterpret_cast<uintptr_t>(p) & 2) ? (w >> 16) : (w & 0xffffu);
  return __half2float(__ushort_as_half((unsigned short)h));
}

template <int MODE, int MINB, int S>
__global__ void __launch_bounds__(kThreads, MINB)
gemv_int4_async(const GemvArgs a, int total_rows, int ntasks, int ks_log2, int rounds) {
  extern __shared__ uint4 smem[];
  __shared__ float red[32];
  constexpr int U = kUnroll;                                // units per lane and row per step
  constexpr int kStepUnits = 32 * U;
  const int K = a.seg[0].K, nunits = K >> 5;
  uint4* xs = smem + S * 2 * U * kThreads * 5 / 4;          // weight ring, scale ring, then x (K f16)
  float* part = reinterpret_cast<float*>(reinterpret_cast<char*>(xs) + (size_t)K * 2);  // [kWarps][rounds][2]
  const uint32_t ring = smem_u32(smem) + threadIdx.x * 16;
  auto slot = [&](int stage, int k) { return ring + (uint32_t)((stage * 2 * U + k) * kThreads) * 16u; };
  // scale ring [S][2U][kThreads] uint32 after the weight ring: the aligned 4-byte word holding the unit's scale
  const uint32_t sring = smem_u32(smem) + (uint32_t)(S * 2 * U * kThreads) * 16u + threadIdx.x * 4;
  auto sslot = [&](int stage, int k) { return sring + (uint32_t)((stage * 2 * U + k) * kThreads) * 4u; };
  const uint32_t* sr = reinterpret_cast<const uint32_t*>(smem + S * 2 * U * kThreads) + threadIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int KS = 1 << ks_log2, G = kWarps >> ks_log2;
  const int gid = blockIdx.x * G + (warp >> ks_log2), NG = gridDim.x * G;
  const int chunk = (nunits + KS - 1) >> ks_log2;
  const int lo = min(nunits, (warp & (KS - 1)) * chunk), hi = min(nunits, lo + chunk);
  const int my_tasks = gid < ntasks ? (ntasks - 1 - gid) / NG + 1 : 0;
  const int nsteps = (hi - lo + kStepUnits - 1) / kStepUnits;
  const int total = my_tasks * nsteps;

  auto refs = [&](int i, RowRef& r0, RowRef& r1) {
    const int t = gid + i * NG;
    if (MODE == GEMV_SWIGLU) {
      r0 = row_ref_int4_fast(a.seg[0], t);
      r1 = row_ref_int4_fast(a.up, t);
    } else {
      r0 = locate_int4_fast(a, 2 * t);
      r1 = locate_int4_fast(a, min(2 * t + 1, total_rows - 1));
    }
  };
  // weight cursor: the next step whose units are copied into the ring
  RowRef w0, w1;
  int wi = 0, wj = 0, wq = 0;
  auto copy_step = [&]() {
    if (wq < total) {
      const int base = lo + wj * kStepUnits + lane, st = wq % S;
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int m = base + u * 32;
        if (m < hi) {
          cp_async16(slot(st, 2 * u), w0.w + m, 16);
          cp_async16(slot(st, 2 * u + 1), w1.w + m, 16);
          cp_async4(sslot(st, 2 * u), word_of(w0.s + (m >> w0.gshift)));
          cp_async4(sslot(st, 2 * u + 1), word_of(w1.s + (m >> w1.gshift)));
        }
      }
      if (++wj == nsteps) {
        wj = 0;
        if (++wi < my_tasks) refs(wi, w0, w1);
      }
    }
    wq++;
    cp_async_commit();       // always one group per call, so that wait_group counts steps
  };
  RowRef c0, c1;                                           // rows of the task being computed
  int ci = 0, cj = 0, cq = 0;
  float acc0 = 0.f, acc1 = 0.f;
  auto compute = [&]() {
    const int base = lo + cj * kStepUnits + lane, st = cq % S;
    const uint4* r = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(smem) + threadIdx.x * 16);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int m = base + u * 32;
      if (m < hi) {
        const uint4 q0 = r[(st * 2 * U + 2 * u) * kThreads];
        const uint4 q1 = r[(st * 2 * U + 2 * u + 1) * kThreads];
        const float s0 = half_of(sr[(st * 2 * U + 2 * u) * kThreads], c0.s + (m >> c0.gshift));
        const float s1 = half_of(sr[(st * 2 * U + 2 * u + 1) * kThreads], c1.s + (m >> c1.gshift));
        acc0 = fmaf(s0, unit_dot_f16(q0, xs, nunits, m), acc0);
        acc1 = fmaf(s1, unit_dot_f16(q1, xs, nunits, m), acc1);
      }
    }
    cq++;
    if (++cj == nsteps) {
      cj = 0;
      if (ci + 1 < my_tasks) refs(ci + 1, c0, c1);
      const float y0 = warp_sum(acc0), y1 = warp_sum(acc1);
      if (lane == 0) {
        part[(warp * rounds + ci) * 2] = y0;
        part[(warp * rounds + ci) * 2 + 1] = y1;
      }
      acc0 = 0.f;
      acc1 = 0.f;
      ci++;
    }
  };

  if (total > 0) {
    refs(0, w0, w1);
    refs(0, c0, c1);
  }
#pragma unroll
  for (int p = 0; p < S - 1; p++) copy_step();   // weights never depend on the previous kernel
  pdl_wait();
  pdl_trigger();
  stage_x_f16<WT_INT4>(a, K, xs, red);
  if (nsteps == 0 && lane == 0)
    for (int i = 0; i < my_tasks; i++) part[(warp * rounds + i) * 2] = part[(warp * rounds + i) * 2 + 1] = 0.f;
  for (int q = 0; q < total; q++) {
    copy_step();
    cp_async_wait<S - 1>();
    compute();
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * rounds; idx += kThreads) {
    const int g = idx / rounds, i = idx - g * rounds;
    const int t = blockIdx.x * G + g + i * NG;
    if (t >= ntasks) continue;
    float y0 = 0.f, y1 = 0.f;
    for (int s = 0; s < KS; s++) {
      const float* p = part + ((g * KS + s) * rounds + i) * 2;
      y0 += p[0];
      y1 += p[1];
    }
    if (MODE == GEMV_SWIGLU) {
      a.out_f16[t] = __float2half_rn(y0 / (1.f + __expf(-y0)) * y1);
    } else {
      const float* b;
      int row;
      locate<WT_INT4>(a, 2 * t, b, row);
      store_row<MODE>(a, 2 * t, y0, b, row);
      if (2 * t + 1 < total_rows) {
        locate<WT_INT4>(a, 2 * t + 1, b, row);
        store_row<MODE>(a, 2 * t + 1, y1, b, row);
      }
    }
  }
}

template <int MODE, int MINB, int S>
int launch_gemv_int4_async(const GemvArgs& a, int rows, int sm_count, cudaStream_t st) {
  const int K = a.seg[0].K, nunits = K >> 5;
  const int ntasks = MODE == GEMV_SWIGLU ? rows : (rows + 1) / 2;
  const size_t smem_fixed = (size_t)S * 2 * kUnroll * kThreads * 20 + (size_t)K * 2;
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_int4_async<MODE, MINB, S>, kThreads,
                                                    smem_fixed + 2048) != cudaSuccess || occ < 1)
    occ = 1;
  const SplitPlan p = plan_split(ntasks, nunits, sm_count * std::min(occ, kBlocksPerSm), 32 * kUnroll);
  const size_t smem = smem_fixed + (size_t)kWarps * p.rounds * 2 * sizeof(float);
  if (smem > kMaxDyn) return fail(NQ_E_UNSUPPORTED, "gemv async: K=%d needs %zu B of shared memory", K, smem);
  return launch_pdl("gemv_int4_async", gemv_int4_async<MODE, MINB, S>, dim3(p.grid), dim3(kThreads), smem, st, a,
                    rows, ntasks, p.ks_log2, p.rounds);
}

// Diagnostic arithmetic for gemv_int4 (time only, results are not a GEMV): the library's loads, x staging and
// work split with the dot product replaced by an XOR of the words, U units per lane and row per step.
template <int U_>
struct LoadsOnly {
  static constexpr int kUnroll = U_;
  __device__ static void stage(const GemvArgs& a, int K, uint4* smem, float* red) {
    stage_x_f16<WT_INT4>(a, K, smem, red);
  }
  __device__ static float fma(const uint4 w, __half s, const uint4*, int, int, float acc) {
    return acc + __uint_as_float((w.x ^ w.y ^ w.z ^ w.w) & 0x3f7fffffu) * __half2float(s);
  }
};


}  // namespace
}  // namespace nq

// Time-only diagnostics on each shape: the read-only stream over the weight bytes, and gemv_int4's loads alone.
void diagnostics(const std::vector<dev::Shape>& shapes, int sms) {
  dev::raise_smem(nq::gemv_int4_v2<nq::GEMV_STORE, 2, nq::LoadsOnly<2>>);
  dev::raise_smem(nq::gemv_int4_v2<nq::GEMV_STORE, 2, nq::LoadsOnly<4>>);
  dev::time_diagnostics("diagnostics", shapes, sms, {
      {"loads U=2", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_v2<nq::GEMV_STORE, 2, nq::LoadsOnly<2>>(a, r, sms, 0); }},
      {"loads U=4", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_v2<nq::GEMV_STORE, 2, nq::LoadsOnly<4>>(a, r, sms, 0); }},
  });
}

// Same arithmetic as the library kernel (tests/test_gpu_kernels.py uses the same bound): x in f16, f16 partial
// sums of 8 products, f32 above.
constexpr double kTolF16Unpack = 3e-3;

template <int MINB, int S>
void set_smem() {
  DEV_CHECK(cudaFuncSetAttribute(nq::gemv_int4_async<nq::GEMV_STORE, MINB, S>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDyn));
}

int main() {
  dev::raise_smem(nq::gemv_int4_v2<nq::GEMV_STORE, 2>);
  set_smem<2, 3>();
  set_smem<2, 4>();
  set_smem<2, 6>();
  set_smem<1, 8>();
  set_smem<3, 3>();
  set_smem<3, 4>();
  const int sms = dev::sm_count();
  struct V { const char* name; std::function<int(const nq::GemvArgs&, int)> f; };
  const std::vector<V> variants = {
      {"gemv_int4_v2 (the library kernel then; 2 blocks/SM)", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_v2<nq::GEMV_STORE, 2>(a, r, sms, 0); }},
      {"async ring S=3, 2 blocks/SM", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_async<nq::GEMV_STORE, 2, 3>(a, r, sms, 0); }},
      {"async ring S=4, 2 blocks/SM", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_async<nq::GEMV_STORE, 2, 4>(a, r, sms, 0); }},
      {"async ring S=6, 2 blocks/SM", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_async<nq::GEMV_STORE, 2, 6>(a, r, sms, 0); }},
      {"async ring S=3, 3 blocks/SM", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_async<nq::GEMV_STORE, 3, 3>(a, r, sms, 0); }},
      {"async ring S=4, 3 blocks/SM", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_async<nq::GEMV_STORE, 3, 4>(a, r, sms, 0); }},
      {"async ring S=8, 1 block/SM", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_async<nq::GEMV_STORE, 1, 8>(a, r, sms, 0); }},
  };
  // the layer's shapes, and gate and up as one matrix (the bytes of the SwiGLU launch) for the asymptotic rate
  std::vector<dev::Shape> shapes = dev::qwen7b_gemv_shapes();
  shapes.push_back({"7B gate+up", 2 * 18944, 3584});
  diagnostics(shapes, sms);
  for (const V& v : variants) {
    const int rc = dev::run_gemv_shapes(v.name, [&](const nq::GemvArgs& a, int rows) {
      const int st = v.f(a, rows);
      if (st != NQ_OK) std::printf("    (launch refused: %s)\n", nq::last_error());
    }, kTolF16Unpack, true, shapes);
    if (rc) return rc;
  }
  return 0;
}
