// The INT4 GEMV on tensor cores (mma.sync m16n8k16), batch 1: correct (f32 sums, ~3e-5 relative error against
// float64 vs gemv_int4's ~5e-4) but slower than the library's CUDA-core gemv_int4 on every 7B shape on the H200
// (bench/NOTES.md, "Session 4"). DIAG (time only): 1 = its loads and work split without the unpack and MMAs,
// 2 = its unpack and MMAs on register-resident words without the weight loads.
#pragma once
#include "gemv_kernels.cuh"

namespace nq {
namespace {

// ---- gemv_int4_tc: INT4 weights on the tensor cores (mma.sync m16n8k16) -------------------------------------
// Why: gemv_int4's loads alone (its exact access pattern, no arithmetic) stream gate/up as fast as a plain read
// (csrc/dev/gemv_int4_async.cu's diagnostics), so its ~99 CUDA-core instructions per 16-byte unit and row are what
// make it slower than the read. Here the products go to the tensor cores: ~30 instructions per unit and row.
// Work: a task is a tile of 16 weight rows (STORE/ADD: rows 16T..16T+15; SWIGLU: gate rows 8T..8T+7 as tile rows
// 0-7 and the same up rows as tile rows 8-15). Lane 4g+t of a warp owns tile rows g and g+8. One step is one
// "quad" of both rows: lane t loads unit base+t (4 consecutive units, 128 values, per quad). Loads run two steps
// ahead (a 3-stage register ring), so 4 x 16 B per lane are in flight as in gemv_int4, while a task's K slice can
// be cut at any quad (split K balances 16-row tiles over the warps). Split K, the flattened (task, step) pipeline,
// the PDL prologue and the deterministic partial sums are gemv_int4's.
// The mma: A = the 16 rows' int4 values, B = x in every column that holds a group (below), 8 mma per quad (two per
// 8-value word: pairs (h01, h23) and (h45, h67), A's k slots 2t, 2t+1 | 2t+8, 2t+9 being the lane's own pairs, and
// B's the same x pairs). Unpack without subtraction: a low pair is (q & 0x000F000F) | 0x6400 = 1024 + u, a high pair
// taken in place (q & 0x00F000F0) | 0x6400 = 1024 + 16u with its x staged /16 (stage_x_f16<.., true>); so the mma
// sums (1024 + u) x + (1024 + 16u) x/16, and corr[b] = 1032 * (sum of low x) + 1152 * (sum of high x/16) over the
// block's values turns that into sum (u - 8) x (gemv_int4_corrections). f32 accumulation throughout.
// Groups: the mma sums over the 4 lanes of a quad, so the 128 values of a quad must share a scale. For group < 128
// the quad spans ncols = 128 / group groups; column n of B then carries x only for the units of group n % ncols
// (lane (g, t) loads x iff g % ncols == t / (units per group), else 0), so C column n = that group's sum, and lane t
// reads its columns 2t, 2t+1. Group >= 128: one column block per quad, every column the same.
// Accuracy: every product (1024 + u) x is exact in f32 and the sums are f32, then the block's correction (f32) and
// scale are applied; the 1024 offset costs ~2^10 x f32 rounding of sum |x| per block, ~1e-4 relative (tests: 3e-3).
constexpr int kTcStepUnits = 4;    // units per row and warp step (one quad)
constexpr int kTcTaskOverheadUnits = 4;   // per-task fixed cost (4 shuffles, 2 stores) in unit slots: half a step

// corr[b] for every block of cb_units units (cb_units * 32 = min(group, 128) values), from the staged x.
__device__ void gemv_int4_corrections(const uint4* xs, int K, int cb_units, float* corr) {
  const int n8 = K >> 3, seg = cb_units * 4;        // 8-value units per block: 4, 8 or 16 (a power of two <= 32)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int p0 = warp * 32; p0 < n8; p0 += kWarps * 32) {
    const int p = p0 + lane;
    float v = 0.f;
    if (p < n8) {
      const uint4 u = xs[(p & 3) * (K >> 5) + (p >> 2)];
      const float2 a = __half22float2(u32_as_h2(u.x)), b = __half22float2(u32_as_h2(u.y));
      const float2 c = __half22float2(u32_as_h2(u.z)), d = __half22float2(u32_as_h2(u.w));
      v = 1032.f * ((a.x + a.y) + (c.x + c.y)) + 1152.f * ((b.x + b.y) + (d.x + d.y));
    }
    for (int o = 1; o < seg; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);   // fixed order: deterministic
    if ((lane & (seg - 1)) == 0 && p < n8) corr[p / seg] = v;
  }
  __syncthreads();
}

template <int MODE, int MINB, int DIAG = 0>
__global__ void __launch_bounds__(kThreads, MINB)
gemv_int4_tc(const GemvArgs a, int total_rows, int ntasks, int ks_log2, int rounds) {
  extern __shared__ uint4 smem[];
  __shared__ float red[32];
  const int K = a.seg[0].K, nunits = K >> 5;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int KS = 1 << ks_log2, G = kWarps >> ks_log2;
  const int gid = blockIdx.x * G + (warp >> ks_log2), NG = gridDim.x * G;
  const int chunk = (((nunits + KS - 1) >> ks_log2) + 3) & ~3;           // slices start on quads
  const int lo = min(nunits, (warp & (KS - 1)) * chunk), hi = min(nunits, lo + chunk);
  const int my_tasks = gid < ntasks ? (ntasks - 1 - gid) / NG + 1 : 0;   // <= rounds
  const int nsteps = (hi - lo + kTcStepUnits - 1) / kTcStepUnits;
  const int total = my_tasks * nsteps;
  // group geometry (all segments share the group: gemv() checks)
  const int gshift = __ffs(a.seg[0].group) - 6;                          // log2(units per group)
  const int ncols = 4 >> min(gshift, 2), cbu = 4 / ncols;                // column blocks per quad, units per block
  const bool xmatch = (g & (ncols - 1)) == t / cbu;
  const bool adds = t < max(ncols >> 1, 1);                              // lanes whose C columns are summed
  const int col0 = (2 * t) & (ncols - 1), col1 = (2 * t + 1) & (ncols - 1);
  float* corr = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + (size_t)K * 2);   // [K / (32 cbu)]
  float* part = corr + nunits / cbu + 1;                                                  // [kWarps][rounds][16]

  RowRef l0, l1;                         // the tile rows g, g + 8 of the task being loaded
  auto task_refs = [&](int i) {
    const int T = gid + i * NG;
    if (MODE == GEMV_SWIGLU) {
      const int r = min(8 * T + g, total_rows - 1);
      l0 = row_ref_int4_fast(a.seg[0], r);
      l1 = row_ref_int4_fast(a.up, r);
    } else {
      l0 = locate_int4_fast(a, min(16 * T + g, total_rows - 1));
      l1 = locate_int4_fast(a, min(16 * T + 8 + g, total_rows - 1));
    }
  };
  // one stage: the quad's unit of both rows, and the scales of the lane's two columns per row
  struct Stage { uint4 w0[1], w1[1]; __half s0[1][2], s1[1][2]; };
  int li = 0, lj = 0;
  auto load = [&](Stage& S) {
    const int base = lo + lj * kTcStepUnits;
#pragma unroll
    for (int u = 0; u < 1; u++) {
      const int q = base + 4 * u, m = q + t;
      if (DIAG == 2) {          // compute only: words from the row addresses, no memory traffic
        const uint32_t v0 = (uint32_t)(uintptr_t)(l0.w + m), v1 = (uint32_t)(uintptr_t)(l1.w + m);
        S.w0[u] = make_uint4(v0, v0 ^ 0x5a5a5a5au, v0 * 3u, v0 + 7u);
        S.w1[u] = make_uint4(v1, v1 ^ 0xa5a5a5a5u, v1 * 5u, v1 + 9u);
      } else {
        S.w0[u] = m < hi ? ld_stream16(l0.w + m) : make_uint4(0, 0, 0, 0);
        S.w1[u] = m < hi ? ld_stream16(l1.w + m) : make_uint4(0, 0, 0, 0);
      }
      const int m0 = q + col0 * cbu, m1 = q + col1 * cbu;     // first unit of each column's block
      S.s0[u][0] = m0 < hi ? l0.s[m0 >> gshift] : __ushort_as_half(0);
      S.s1[u][0] = m0 < hi ? l1.s[m0 >> gshift] : __ushort_as_half(0);
      S.s0[u][1] = m1 < hi ? l0.s[m1 >> gshift] : __ushort_as_half(0);
      S.s1[u][1] = m1 < hi ? l1.s[m1 >> gshift] : __ushort_as_half(0);
    }
    if (++lj == nsteps) {
      lj = 0;
      if (++li < my_tasks) task_refs(li);
    }
  };
  int ci = 0, cj = 0;
  float acc0 = 0.f, acc1 = 0.f;
  auto compute = [&](const Stage& S) {
    const int base = lo + cj * kTcStepUnits;
#pragma unroll
    for (int u = 0; u < 1; u++) {
      const int q = base + 4 * u, m = q + t;
      uint4 xw[4];
#pragma unroll
      for (int j = 0; j < 4; j++) xw[j] = (xmatch && m < hi) ? smem[j * nunits + m] : make_uint4(0, 0, 0, 0);
      const uint32_t w0[4] = {S.w0[u].x, S.w0[u].y, S.w0[u].z, S.w0[u].w};
      const uint32_t w1[4] = {S.w1[u].x, S.w1[u].y, S.w1[u].z, S.w1[u].w};
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      if (DIAG == 1) {          // loads only: fold the words in cheaply
        c[0] = __uint_as_float((S.w0[u].x ^ S.w0[u].y ^ S.w1[u].z ^ S.w1[u].w) & 0x3f7fffffu);
        c[2] = c[0];
      } else
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint32_t p0 = w0[j], p1 = w1[j], p08 = p0 >> 8, p18 = p1 >> 8;
        mma16816(c, and_or(p0, 0x000F000Fu, 0x64006400u), and_or(p1, 0x000F000Fu, 0x64006400u),
                 and_or(p0, 0x00F000F0u, 0x64006400u), and_or(p1, 0x00F000F0u, 0x64006400u), xw[j].x, xw[j].y);
        mma16816(c, and_or(p08, 0x000F000Fu, 0x64006400u), and_or(p18, 0x000F000Fu, 0x64006400u),
                 and_or(p08, 0x00F000F0u, 0x64006400u), and_or(p18, 0x00F000F0u, 0x64006400u), xw[j].z, xw[j].w);
      }
      if (adds) {
        const int m0 = q + col0 * cbu, m1 = q + col1 * cbu;
        if (m0 < hi) {
          const float k0 = corr[m0 / cbu];
          acc0 = fmaf(__half2float(S.s0[u][0]), c[0] - k0, acc0);
          acc1 = fmaf(__half2float(S.s1[u][0]), c[2] - k0, acc1);
        }
        if (ncols > 1 && m1 < hi) {
          const float k1 = corr[m1 / cbu];
          acc0 = fmaf(__half2float(S.s0[u][1]), c[1] - k1, acc0);
          acc1 = fmaf(__half2float(S.s1[u][1]), c[3] - k1, acc1);
        }
      }
    }
    if (++cj == nsteps) {              // task ci complete (uniform over the warp)
      cj = 0;
      acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
      acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
      acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
      acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
      if (t == 0) {
        part[(warp * rounds + ci) * 16 + g] = acc0;
        part[(warp * rounds + ci) * 16 + 8 + g] = acc1;
      }
      acc0 = 0.f;
      acc1 = 0.f;
      ci++;
    }
  };

  Stage sa, sb, sc;                      // register ring: step q in stage q % 3, loaded two steps ahead
  if (total > 0) {
    task_refs(0);
    load(sa);
    if (total > 1) load(sb);
  }
  pdl_wait();     // x / out were written by the previous kernel
  pdl_trigger();
  stage_x_f16<WT_INT4, true>(a, K, smem, red);
  gemv_int4_corrections(smem, K, cbu, corr);
  if (nsteps == 0 && t == 0)             // empty slice: its partials are zero
    for (int i = 0; i < my_tasks; i++) part[(warp * rounds + i) * 16 + g] = part[(warp * rounds + i) * 16 + 8 + g] = 0.f;
  for (int q = 0; q < total; q += 3) {
    if (q + 2 < total) load(sc);
    compute(sa);
    if (q + 1 >= total) break;
    if (q + 3 < total) load(sa);
    compute(sb);
    if (q + 2 >= total) break;
    if (q + 4 < total) load(sb);
    compute(sc);
  }
  __syncthreads();
  constexpr int kOut = MODE == GEMV_SWIGLU ? 8 : 16;    // output rows per task
  for (int idx = threadIdx.x; idx < G * rounds * kOut; idx += kThreads) {
    const int r = idx % kOut, gi = idx / kOut;
    const int gg = gi / rounds, i = gi - gg * rounds;
    const int T = blockIdx.x * G + gg + i * NG;
    if (T >= ntasks) continue;
    float y0 = 0.f, y1 = 0.f;
    for (int s = 0; s < KS; s++) {
      const float* p = part + ((gg * KS + s) * rounds + i) * 16;
      y0 += p[r];
      if (MODE == GEMV_SWIGLU) y1 += p[8 + r];
    }
    if (MODE == GEMV_SWIGLU) {
      const int row = 8 * T + r;
      if (row < total_rows) a.out_f16[row] = __float2half_rn(y0 / (1.f + __expf(-y0)) * y1);
    } else {
      const int row = 16 * T + r;
      if (row < total_rows) {
        const float* b;
        int rr;
        locate<WT_INT4>(a, row, b, rr);
        store_row<MODE>(a, row, y0, b, rr);
      }
    }
  }
}

// gemv_int4_tc<MODE, MINB, DIAG> on `rows` output rows; the same split plan as gemv_int4 over 16-row tiles.
template <int MODE, int MINB, int DIAG = 0>
int launch_gemv_int4_tc(const GemvArgs& a, int rows, int sm_count, cudaStream_t st) {
  const int K = a.seg[0].K, nunits = K >> 5;
  const int ntasks = MODE == GEMV_SWIGLU ? (rows + 7) / 8 : (rows + 15) / 16;
  const int cbu = 4 / (4 >> std::min(__builtin_ctz((unsigned)a.seg[0].group) - 5, 2));
  const size_t smem_fixed = (size_t)K * 2 + ((size_t)nunits / cbu + 1) * sizeof(float);
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_int4_tc<MODE, MINB, DIAG>, kThreads, smem_fixed + 4096) !=
          cudaSuccess || occ < 1)
    occ = 1;
  const SplitPlan p = plan_split(ntasks, nunits, sm_count * std::min(occ, kBlocksPerSm), kTcStepUnits, kTcStepUnits,
                                 kTcTaskOverheadUnits);
  const size_t smem = smem_fixed + (size_t)kWarps * p.rounds * 16 * sizeof(float);
  if (smem > (size_t)kMaxDynSmem) return fail(NQ_E_UNSUPPORTED, "gemv: K=%d with %d tasks too large", K, ntasks);
  return launch_pdl("gemv_int4_tc", gemv_int4_tc<MODE, MINB, DIAG>, dim3(p.grid), dim3(kThreads), smem, st, a, rows, ntasks,
                    p.ks_log2, p.rounds);
}

}  // namespace
}  // namespace nq
