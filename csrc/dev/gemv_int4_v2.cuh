// The library's INT4 GEMV before its cursors were simplified (bench/NOTES.md "Session 5"), kept verbatim for the
// dev programs whose recorded results were measured against it (gemv_int4_async, gemv_int4_q8, gemv_int4_3blocks,
// gemv_int4_tc_vs_simt) and for gemv_int4_vs_v2, which times the library kernel against it. Its Units hook
// (stage, fma with the unit index m) lets those programs plug in other arithmetic.
#pragma once
#include "gemv_kernels.cuh"

namespace nq {
namespace {

// ---- gemv_int4: INT4 weights, split-K warp groups, one pipeline per warp across rows ----------------------------
// Work: a "task" is a row pair (2t, 2t+1) (STORE/ADD; an odd last row is paired with itself and its second result
// dropped) or the (gate t, up t) pair (SWIGLU). A group of KS = 2^ks_log2 warps of one block shares each task, warp
// s of the group taking units [s*chunk, min(nunits, (s+1)*chunk)) of both rows (split K), so that small-N shapes
// still give every resident warp work. Group gid takes tasks gid, gid + NG, ... (NG groups in the grid).
// Each warp runs ONE software pipeline over the flattened sequence (task i, step j) of all its tasks: the loads of
// the next step -- also when it belongs to the next task -- are in flight while the current step is computed, so a
// row boundary costs no exposed memory latency (a per-row pipeline drains and refills at every row: 2 steps per row
// on the 7B gate/up shapes). Ping-pong register buffers (no copies between stages). The first step's loads are issued
// before the PDL wait (weights never depend on the previous kernel).
// Results: each warp's per-task partial pair goes to shared memory part[warp][round][2]; after one __syncthreads
// the block sums the KS partials of each task in slice order (deterministic) and applies the epilogue.
// The unit arithmetic of gemv_int4: x staging, and acc + scale * (one 16-byte unit of a row . x). The library runs
// F16Units; csrc/dev/gemv_int4_q8.cu plugs in int8 activations.
struct F16UnitsV2 {
  static constexpr int kUnroll = nq::kUnroll;  // units per lane and row per pipeline stage
  __device__ static void stage(const GemvArgs& a, int K, uint4* smem, float* red) {
    stage_x_f16<WT_INT4>(a, K, smem, red);
  }
  __device__ static float fma(const uint4 w, __half s, const uint4* smem, int nunits, int m, float acc) {
    return fmaf(__half2float(s), unit_dot_f16(w, smem, nunits, m), acc);
  }
};

// MINB: resident blocks per SM the registers are budgeted for (the library runs 2: bench/NOTES.md).
template <int MODE, int MINB, class Units = F16UnitsV2>
__global__ void __launch_bounds__(kThreads, MINB)
gemv_int4_v2(const GemvArgs a, int total_rows, int ntasks, int ks_log2, int rounds) {
  extern __shared__ uint4 smem[];
  __shared__ float red[32];
  constexpr int U = Units::kUnroll;
  constexpr int kStepUnits = 32 * U;
  const int K = a.seg[0].K, nunits = K >> 5;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int KS = 1 << ks_log2, G = kWarps >> ks_log2;
  const int gid = blockIdx.x * G + (warp >> ks_log2), NG = gridDim.x * G;
  const int chunk = (nunits + KS - 1) >> ks_log2;
  const int lo = min(nunits, (warp & (KS - 1)) * chunk), hi = min(nunits, lo + chunk);
  const int my_tasks = gid < ntasks ? (ntasks - 1 - gid) / NG + 1 : 0;   // <= rounds
  const int nsteps = (hi - lo + kStepUnits - 1) / kStepUnits;   // steps per task; 0: empty slice
  const int total = my_tasks * nsteps;
  float* part = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + (size_t)K * 2);  // [kWarps][rounds][2]

  RowRef l0, l1;                         // the rows of the task being loaded
  auto task_refs = [&](int i) {
    const int t = gid + i * NG;
    if (MODE == GEMV_SWIGLU) {
      l0 = row_ref_int4_fast(a.seg[0], t);
      l1 = row_ref_int4_fast(a.up, t);
    } else {
      l0 = locate_int4_fast(a, 2 * t);
      l1 = locate_int4_fast(a, min(2 * t + 1, total_rows - 1));
    }
  };
  int li = 0, lj = 0;                    // next step to load: task li, step lj
  auto load = [&](uint4 (&w0)[U], uint4 (&w1)[U], __half (&s0)[U], __half (&s1)[U]) {
    const int base = lo + lj * kStepUnits + lane;
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int m = base + u * 32;
      if (m < hi) {
        w0[u] = ld_stream16(l0.w + m);
        w1[u] = ld_stream16(l1.w + m);
        s0[u] = l0.s[m >> l0.gshift];
        s1[u] = l1.s[m >> l1.gshift];
      }
    }
    if (++lj == nsteps) {
      lj = 0;
      if (++li < my_tasks) task_refs(li);
    }
  };
  int ci = 0, cj = 0;                    // step being computed: task ci, step cj
  float acc0 = 0.f, acc1 = 0.f;
  auto compute = [&](const uint4 (&w0)[U], const uint4 (&w1)[U], const __half (&s0)[U], const __half (&s1)[U]) {
    const int base = lo + cj * kStepUnits + lane;
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int m = base + u * 32;
      if (m < hi) {
        acc0 = Units::fma(w0[u], s0[u], smem, nunits, m, acc0);
        acc1 = Units::fma(w1[u], s1[u], smem, nunits, m, acc1);
      }
    }
    if (++cj == nsteps) {              // task ci complete (uniform over the warp)
      cj = 0;
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

  uint4 wa0[U], wa1[U], wb0[U], wb1[U];
  __half sa0[U], sa1[U], sb0[U], sb1[U];
  if (total > 0) {
    task_refs(0);
    load(wa0, wa1, sa0, sa1);
  }
  pdl_wait();     // x / out were written by the previous kernel
  pdl_trigger();
  Units::stage(a, K, smem, red);
  if (nsteps == 0 && lane == 0)          // empty slice: its partials are zero
    for (int i = 0; i < my_tasks; i++) part[(warp * rounds + i) * 2] = part[(warp * rounds + i) * 2 + 1] = 0.f;
  for (int q = 0; q < total; q += 2) {
    if (q + 1 < total) load(wb0, wb1, sb0, sb1);
    compute(wa0, wa1, sa0, sa1);
    if (q + 1 >= total) break;
    if (q + 2 < total) load(wa0, wa1, sa0, sa1);
    compute(wb0, wb1, sb0, sb1);
  }
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


// gemv_int4_v2<MODE, MINB> on `rows` output rows with a grid for `sm_count` SMs; checks the shared-memory need.
template <int MODE, int MINB, class Units = F16UnitsV2>
int launch_gemv_int4_v2(const GemvArgs& a, int rows, int sm_count, cudaStream_t st) {
  const int K = a.seg[0].K, nunits = K >> 5;
  const int ntasks = MODE == GEMV_SWIGLU ? rows : (rows + 1) / 2;
  const size_t smem_x = (size_t)K * 2;  // f16 x (other Units must fit in as much)
  // occupancy with 2 KB for the partials (plans need 64 B x rounds; a larger need only costs residency, never
  // correctness: blocks do not wait on each other)
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_int4_v2<MODE, MINB, Units>, kThreads, smem_x + 2048) != cudaSuccess ||
      occ < 1)
    occ = 1;
  const SplitPlan p = plan_split(ntasks, nunits, sm_count * std::min(occ, kBlocksPerSm), 32 * Units::kUnroll);
  const size_t smem = smem_x + (size_t)kWarps * p.rounds * 2 * sizeof(float);
  if (smem > (size_t)kMaxDynSmem) return fail(NQ_E_UNSUPPORTED, "gemv: K=%d with %d tasks too large", K, ntasks);
  return launch_pdl("gemv_int4_v2", gemv_int4_v2<MODE, MINB, Units>, dim3(p.grid), dim3(kThreads), smem, st, a, rows, ntasks,
                    p.ks_log2, p.rounds);
}

}  // namespace
}  // namespace nq
