// Dev experiment (llm.c dev/cuda style, one standalone program): a streaming INT4 GEMV for batch-1 decode.
//
//   y[N] = W[N, K] @ x[K], W in INT4 layout 1 (spec/nanoqwen-format.md section 9), f16 scales per group of 128.
//
// Design under test ("stream" kernel): one persistent block per SM, 1 producer warp + W consumer warps.
//  * Each block owns a contiguous range of rows (STORE) or gate/up row pairs (SWIGLU), balanced to +-1 over the
//    grid (no cross-block reduction). Layout-1 rows are contiguous, so the R rows of a stage are ONE contiguous
//    byte range of qweight (and one of the scales): the producer moves a stage with one `cp.async.bulk` for the
//    weights and one for the scales (two of each for SWIGLU), completing on the stage's "full" mbarrier
//    (expect-tx). The ring has as many stages as fit in shared memory next to x (4-7 of ~30-40 KB): up to ~200 KB
//    in flight per SM without a register spent on it (the production kernel holds 32 KB per SM in registers).
//  * Consumers: a warp owns a row pair (2p, 2p+1) of a stage (SWIGLU: gate p, up p) and a K slice (KSW warps per
//    pair split K when a stage holds fewer than 2W rows); lane l unpacks unit m = lo + l + 32i (16 bytes = 32
//    values) from shared memory with production's one-LOP3-per-pair f16 trick (unit_dot_f16, reused from
//    csrc/src/gemv.cu), x staged once per block in shared memory in production's transposed layout. After its
//    last shared-memory read of a stage a warp arrives on the stage's "empty" mbarrier; the producer refills it.
//    Split pairs combine their slices in slice order after a named barrier of the KSW warps (deterministic).
//  * Same per-unit arithmetic and the same summation order as production v2 when KSW equals production's split
//    factor, so the outputs are expected bit-identical (checked and reported).
//
// Reference points measured in the same run over exactly the same bytes:
//  * ceiling: plain read-only stream, 16-byte ld.global.nc.L1::no_allocate, 8 loads in flight per thread.
//  * tma-only: the stream kernel with the consumers' arithmetic removed (how fast the ring itself streams).
//  * prod v2: csrc/src/gemv.cu as built into the product (variant 0), in the same mode (f16 x input).
//
// Second consumer ("mma", gemv_int4_stream_mma below): the unpacked nibbles feed mma.sync.m16n8k16 directly as
// A fragments (x as B, f32 accumulation, offsets removed once per 128-value chunk); more accurate, fewer
// instructions. Measurements, predictions and the reading of each run: csrc/dev/gemv_int4_stream.md.
//
// Build: make -C csrc/dev (-> build/dev/gemv_int4_stream; OpenMP runs the CPU reference on all host cores)
// Run on the device: bash csrc/dev/gemv_int4_stream_run.sh (writes its logs to $OUT).
#include "../src/gemv.cu"
#include "dev_common.cuh"
#include "bulk_ring.cuh"   // mbarrier, bulk copy, named barrier helpers
// nq::fail / pdl_enabled come from ../src/error.cpp, which the Makefile links into every dev program

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace nq;

#define CK(call)                                                                                       \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) {                                                                           \
      fprintf(stderr, "error: %s at %s:%d: %s\n", #call, __FILE__, __LINE__, cudaGetErrorString(e_));  \
      exit(1);                                                                                         \
    }                                                                                                  \
  } while (0)

namespace stream_dev {

// ---- the stream kernel ---------------------------------------------------------------------------------------
constexpr int kMaxStages = 16;
constexpr int kBarXStaged = 15;   // named barrier: all consumer warps after x staging (group barriers use 1..8)
constexpr int kSmemBars = 256;    // 2 * kMaxStages mbarriers (8 B each)
constexpr int kSmemPart = 256;    // partials: [2 stage parities][<= 16 warps][2] floats

struct StreamArgs {
  const uint8_t* w[2];      // qweight (N, K/8) of gate/only matrix, [1] = up (SWIGLU)
  const uint8_t* s[2];      // f16 scales (N, K/g); read in 16-byte aligned supersets (buffers padded by 16 B)
  const __half* x;          // K f16
  float* out_f32;           // STORE: N
  __half* out_f16;          // SWIGLU: N
  int n_items;              // rows (STORE) or gate/up pairs (SWIGLU)
  int K, gshift;            // gshift = log2(group / 32)
  int ksw_log2;             // consumer warps per row pair = 2^ksw_log2 (split K inside the block)
  int nst;                  // ring stages
  uint32_t stage_bytes;     // bytes per stage (multiple of 128)
  uint32_t w_area;          // bytes of the weight part of a stage (2P rows)
  uint32_t s_area;          // bytes of one scale area (STORE: one, SWIGLU: gate then up)
  int evict_first;          // bulk copies with an L2 evict-first policy
};

// MODE: GEMV_STORE (out_f32[r] = y) or GEMV_SWIGLU (out_f16[t] = silu(gate_t . x) * (up_t . x)).
// W consumer warps, U units per lane per inner iteration, COMPUTE = false: consumers only release stages.
template <int MODE, int W, int U, bool COMPUTE>
__global__ void __launch_bounds__((W + 1) * 32, 1) gemv_int4_stream(const StreamArgs a) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr bool SWIGLU = MODE == GEMV_SWIGLU;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int K = a.K, nunits = K >> 5;
  const uint32_t rowbytes = (uint32_t)K >> 1, sb = (uint32_t)(K >> (a.gshift + 5)) * 2;  // bytes per row
  const int KSW = 1 << a.ksw_log2, P = W >> a.ksw_log2;   // row pairs per stage
  const int IPS = SWIGLU ? P : 2 * P;                     // items per stage
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);     // full[0..nst), empty[kMaxStages..)
  float* part = reinterpret_cast<float*>(smem + kSmemBars);
  uint4* xs = reinterpret_cast<uint4*>(smem + kSmemBars + kSmemPart);
  uint8_t* ring = smem + ((kSmemBars + kSmemPart + (size_t)K * 2 + 127) & ~(size_t)127);
  const uint32_t full0 = smem_u32(bars), empty0 = smem_u32(bars + kMaxStages);

  // block's items [i_begin, i_end), balanced to +-1
  const int per = a.n_items / gridDim.x, rem = a.n_items % gridDim.x;
  const int i_begin = blockIdx.x * per + min((int)blockIdx.x, rem);
  const int i_end = i_begin + per + ((int)blockIdx.x < rem ? 1 : 0);
  const int nstages = (i_end - i_begin + IPS - 1) / IPS;

  if (threadIdx.x == 0) {
    for (int s = 0; s < a.nst; s++) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, W);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == W) {  // ---- producer: one thread; weights never depend on the previous kernel: no PDL wait
    if (lane != 0) return;
    uint64_t pol = 0;
    if (a.evict_first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    for (int i = 0; i < nstages; i++) {
      const int slot = i % a.nst;
      if (i >= a.nst) mbar_wait(empty0 + 8 * slot, ((i / a.nst) - 1) & 1);
      const int i0 = i_begin + i * IPS, n = min(IPS, i_end - i0);
      const uint32_t wbytes = (uint32_t)n * rowbytes;
      const uint32_t sa = (uint32_t)i0 * sb, se = (uint32_t)(i0 + n) * sb;
      const uint32_t s0 = sa & ~15u, sbytes = ((se + 15u) & ~15u) - s0;
      const uint32_t dst = smem_u32(ring + (size_t)slot * a.stage_bytes), bar = full0 + 8 * slot;
      mbar_arrive_expect_tx(bar, (SWIGLU ? 2u : 1u) * (wbytes + sbytes));
      const int nm = SWIGLU ? 2 : 1;
      for (int mtx = 0; mtx < nm; mtx++) {
        const uint32_t wdst = dst + (uint32_t)mtx * (uint32_t)P * rowbytes;
        const uint32_t sdst = dst + a.w_area + (uint32_t)mtx * a.s_area;
        const uint8_t* wsrc = a.w[mtx] + (size_t)i0 * rowbytes;
        const uint8_t* ssrc = a.s[mtx] + s0;
        if (a.evict_first) {
          bulk_g2s_hint(wdst, wsrc, wbytes, bar, pol);
          bulk_g2s_hint(sdst, ssrc, sbytes, bar, pol);
        } else {
          bulk_g2s(wdst, wsrc, wbytes, bar);
          bulk_g2s(sdst, ssrc, sbytes, bar);
        }
      }
    }
    return;
  }

  // ---- consumers
  pdl_wait();      // x / out belong to the previous kernel
  pdl_trigger();
  if (COMPUTE) {   // x -> shared memory, transposed: unit p = 4m + j at j*nunits + m (production's INT4 layout)
    const uint4* src = reinterpret_cast<const uint4*>(a.x);
    const int nx = K >> 3;
    constexpr int B = 4;
    for (int p0 = threadIdx.x; p0 < nx; p0 += B * W * 32) {
      uint4 u[B];
#pragma unroll
      for (int b = 0; b < B; b++)
        if (p0 + b * W * 32 < nx) u[b] = src[p0 + b * W * 32];
#pragma unroll
      for (int b = 0; b < B; b++) {
        const int p = p0 + b * W * 32;
        if (p < nx) xs[(p & 3) * nunits + (p >> 2)] = u[b];
      }
    }
    named_bar(kBarXStaged, W * 32);
  }
  const int pr = warp >> a.ksw_log2, sl = warp & (KSW - 1);
  const int chunk = (nunits + KSW - 1) >> a.ksw_log2;
  const int lo = min(nunits, sl * chunk), hi = min(nunits, lo + chunk);
  for (int i = 0; i < nstages; i++) {
    const int slot = i % a.nst;
    const int i0 = i_begin + i * IPS, n = min(IPS, i_end - i0);
    mbar_wait(full0 + 8 * slot, (i / a.nst) & 1);
    if (!COMPUTE) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * slot);
      continue;
    }
    const uint8_t* st = ring + (size_t)slot * a.stage_bytes;
    // local rows of this warp's pair; `valid1`: second result is stored
    int r0, r1;
    bool valid0, valid1;
    if (SWIGLU) {
      r0 = pr;
      r1 = P + pr;
      valid0 = valid1 = pr < n;
    } else {
      r0 = 2 * pr;
      valid0 = r0 < n;
      valid1 = r0 + 1 < n;
      r1 = valid1 ? r0 + 1 : r0;
    }
    const uint4* w0 = reinterpret_cast<const uint4*>(st + (size_t)r0 * rowbytes);
    const uint4* w1 = reinterpret_cast<const uint4*>(st + (size_t)r1 * rowbytes);
    const uint32_t soff = ((uint32_t)i0 * sb) & 15u;
    const uint8_t* sbase0 = st + a.w_area + soff;
    const __half* sc0 = reinterpret_cast<const __half*>(sbase0 + (SWIGLU ? (uint32_t)r0 : (uint32_t)r0) * sb);
    const __half* sc1 =
        reinterpret_cast<const __half*>(SWIGLU ? sbase0 + a.s_area + (uint32_t)r0 * sb : sbase0 + (uint32_t)r1 * sb);
    float acc0 = 0.f, acc1 = 0.f;
    if (valid0) {
      for (int m0 = lo + lane; m0 < hi; m0 += 32 * U) {
        uint4 wv0[U], wv1[U];
        __half s0[U], s1[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int m = m0 + 32 * u;
          if (m < hi) {
            wv0[u] = w0[m];
            wv1[u] = w1[m];
            s0[u] = sc0[m >> a.gshift];
            s1[u] = sc1[m >> a.gshift];
          }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int m = m0 + 32 * u;
          if (m < hi) {
            acc0 = fmaf(__half2float(s0[u]), unit_dot_f16(wv0[u], xs, nunits, m), acc0);
            acc1 = fmaf(__half2float(s1[u]), unit_dot_f16(wv1[u], xs, nunits, m), acc1);
          }
        }
      }
    }
    float y0 = warp_sum(acc0), y1 = warp_sum(acc1);   // data-dependent on every lane's shared-memory reads
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * slot);
    if (KSW > 1) {   // combine the slices of the pair in slice order (production v2's order)
      float* pp = part + (i & 1) * 2 * 16;
      if (lane == 0) {
        pp[2 * warp] = y0;
        pp[2 * warp + 1] = y1;
      }
      named_bar(1 + pr, KSW * 32);
      if (sl != 0) continue;
      y0 = 0.f;
      y1 = 0.f;
      for (int s = 0; s < KSW; s++) {
        y0 += pp[2 * (pr * KSW + s)];
        y1 += pp[2 * (pr * KSW + s) + 1];
      }
    }
    if (lane == 0 && valid0) {
      if (SWIGLU) {
        a.out_f16[i0 + pr] = __float2half_rn(y0 / (1.f + __expf(-y0)) * y1);
      } else {
        a.out_f32[i0 + r0] = y0;
        if (valid1) a.out_f32[i0 + r0 + 1] = y1;
      }
    }
  }
}

// ---- the stream kernel with a tensor-core consumer ("mma") -----------------------------------------------------
// Same ring and producer idea; a stage is 16 * RGS rows x a K slice of KSL = K / nkq values (one bulk copy per row
// and one per row's scales, issued by the producer warp's lanes in parallel). Group size 128 only (one scale per
// 128-value chunk). Consumers: warp w takes row group rg = w / KSW of the stage (SWIGLU: rg 0 = gate, 1 = up rows
// of the same 16 outputs) and a contiguous range of the slice's 128-value chunks.
// Per chunk, lane (gid = lane / 4, tig = lane % 4) loads 16 bytes (4 words, 32 values) of row gid and of row
// gid + 8: words 4 tig + j, j = 0..3; each word feeds two mma.m16n8k16 (f16 x f16 -> f32) as A fragments:
//   MMA 1: a0/a1 = nibbles (0,4) of rows gid/gid+8 = k (0,1) as 1024 + u; a2/a3 = nibbles (1,5) in place = k (2,3)
//          as 1024 + 16u;   MMA 2: the same on q >> 8 (k (4,5) and (6,7)).  One LOP3 per f16x2, no fix-up.
// B = x, the same in all 8 columns (columns are wasted: batch 1), k (2,3),(6,7) of every 8 pre-scaled by 1/16 in
// shared memory, so the products are (1024 + u) x and (1024 + 16u) x / 16 = 64 x + u x, exact in f32.
// The offsets are removed once per chunk: C starts at -corr[chunk], corr = 1032 sum_lo x + 72 sum_hi x (computed
// in double from the same f16 x), so the accumulator ends at sum (u - 8) x; y += scale * C in f32.
// The 8 columns of C are equal, so every lane holds its rows' results: no shuffles.
constexpr int kChunk = 128;

struct MmaArgs {
  const uint8_t* w[2];
  const uint8_t* s[2];
  const __half* x;
  float* out_f32;
  __half* out_f16;
  int n_tasks;              // 16-row groups (STORE) or 16 gate/up output pairs (SWIGLU)
  int K, nkq;               // K slices per task (stages per task)
  int nst;
  uint32_t stage_bytes, w_area, srow;   // srow: smem bytes per row of scales
  int contig;               // nkq == 1 only: one bulk copy per matrix for the 16 rows and one for their scales
  int probe;                // consumers only release stages (ring speed with this kernel's copies)
  int compute_only;         // after the first ring fill the producer re-arms stages without copying (consumer speed)
};

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Non-volatile twin: lets the compiler interleave independent MMA chains (the volatile one keeps program order).
__device__ __forceinline__ void mma16816_nv(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The 8 MMAs of one chunk for rows (gid, gid + 8): MMA 1 of word j into d, MMA 2 into e (two chains of 4).
__device__ __forceinline__ void chunk_mma(float (&d)[4], float (&e)[4], const uint4 qa, const uint4 qb,
                                          const uint4* xv) {
  const uint32_t wa4[4] = {qa.x, qa.y, qa.z, qa.w}, wb4[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const uint4 x8 = xv[j];
    const uint32_t pa = wa4[j], pb = wb4[j], pa8 = pa >> 8, pb8 = pb >> 8;
    mma16816_nv(d, and_or(pa, 0x000F000Fu, 0x64006400u), and_or(pb, 0x000F000Fu, 0x64006400u),
                and_or(pa, 0x00F000F0u, 0x64006400u), and_or(pb, 0x00F000F0u, 0x64006400u), x8.x, x8.y);
    mma16816_nv(e, and_or(pa8, 0x000F000Fu, 0x64006400u), and_or(pb8, 0x000F000Fu, 0x64006400u),
                and_or(pa8, 0x00F000F0u, 0x64006400u), and_or(pb8, 0x00F000F0u, 0x64006400u), x8.z, x8.w);
  }
}

// ILP = true: two chunks per iteration, 2 accumulator chains per chunk (4 independent chains of 4 MMAs) and the
// corrections' prologue with independent partial sums; ILP = false: one chain of 8 dependent MMAs per chunk.
// XR > 0 (round 2, compiled, NOT yet run on the device): nkq == 1 only; each warp keeps the B fragments (x) and
// the corrections of its <= XR chunks in registers for the whole launch (its K range is the same in every stage),
// so per chunk only the 2 weight LDS.128 + 2 scale loads touch shared memory (was: + 4 x LDS.128 + 1 corr LDS;
// run 5's ncu: the x loads are 32 of the ~50 shared-memory wavefronts per chunk). Same summation order as ILP.
template <int MODE, int W, bool ILP, int MINB, int XR = 0>
__global__ void __launch_bounds__((W + 1) * 32, MINB) gemv_int4_stream_mma(const MmaArgs a) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr bool SWIGLU = MODE == GEMV_SWIGLU;
  constexpr int RGS = SWIGLU ? 2 : 1, KSW = W / RGS, ROWS = 16 * RGS;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int K = a.K, nchunks = K / kChunk;
  const int KSL = K / a.nkq, ncs = KSL / kChunk;       // values and chunks per slice
  const uint32_t rowbytes = (uint32_t)K >> 1, srowg = (uint32_t)nchunks * 2, slbytes = (uint32_t)KSL >> 1;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  float* part = reinterpret_cast<float*>(smem + kSmemBars);            // [2][W][16]
  float* corr = reinterpret_cast<float*>(smem + kSmemBars + 2 * W * 16 * 4);
  __half* xs = reinterpret_cast<__half*>(smem + kSmemBars + 2 * W * 16 * 4 + ((nchunks * 4 + 127) & ~127));
  uint8_t* ring = reinterpret_cast<uint8_t*>(xs) + (((size_t)K * 2 + 127) & ~(size_t)127);
  const uint32_t full0 = smem_u32(bars), empty0 = smem_u32(bars + kMaxStages);

  const int per = a.n_tasks / gridDim.x, rem = a.n_tasks % gridDim.x;
  const int t_begin = blockIdx.x * per + min((int)blockIdx.x, rem);
  const int t_end = t_begin + per + ((int)blockIdx.x < rem ? 1 : 0);
  const int nstages = (t_end - t_begin) * a.nkq;

  if (threadIdx.x == 0) {
    for (int s = 0; s < a.nst; s++) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, W);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == W) {  // ---- producer warp: lane r copies row r of the stage (weights slice + its scales)
    for (int i = 0; i < nstages; i++) {
      const int slot = i % a.nst;
      if (i >= a.nst) mbar_wait(empty0 + 8 * slot, ((i / a.nst) - 1) & 1);
      const int t = t_begin + i / a.nkq, kq = i % a.nkq;
      const uint32_t dst = smem_u32(ring + (size_t)slot * a.stage_bytes), bar = full0 + 8 * slot;
      if (a.compute_only && i >= a.nst) {   // stale data, no copy: the stage is "full" at once
        if (lane == 0) mbar_arrive(bar);
        __syncwarp();
        continue;
      }
      uint32_t bytes = 0, s0 = 0, sbytes = 0;
      const uint8_t* wsrc = nullptr;
      const uint8_t* ssrc = nullptr;
      if (a.contig) {   // rows t*16 .. t*16+15 of each matrix are one contiguous range (K slice = whole row)
        if (lane < RGS) {
          wsrc = (lane ? a.w[1] : a.w[0]) + (size_t)t * 16 * rowbytes;
          const uint32_t sa = (uint32_t)t * 16 * srowg;
          s0 = sa & ~15u;
          sbytes = ((sa + 16 * srowg + 15u) & ~15u) - s0;
          ssrc = (lane ? a.s[1] : a.s[0]) + s0;
          bytes = 16 * rowbytes + sbytes;
        }
        bytes = __reduce_add_sync(0xffffffffu, bytes);
        if (lane == 0) mbar_arrive_expect_tx(bar, bytes);
        __syncwarp();
        if (lane < RGS) {
          bulk_g2s(dst + (uint32_t)lane * 16 * rowbytes, wsrc, 16 * rowbytes, bar);
          bulk_g2s(dst + a.w_area + (uint32_t)lane * 16 * a.srow, ssrc, sbytes, bar);
        }
        continue;
      }
      if (lane < ROWS) {
        const int m = lane / 16, row = t * 16 + (lane & 15);
        wsrc = (m ? a.w[1] : a.w[0]) + (size_t)row * rowbytes + (size_t)kq * slbytes;   // no dynamic param index
        const uint32_t sa = (uint32_t)row * srowg + (uint32_t)kq * ncs * 2;
        s0 = sa & ~15u;
        sbytes = ((sa + (uint32_t)ncs * 2 + 15u) & ~15u) - s0;
        ssrc = (m ? a.s[1] : a.s[0]) + s0;
        bytes = slbytes + sbytes;
      }
      bytes = __reduce_add_sync(0xffffffffu, bytes);
      if (lane == 0) mbar_arrive_expect_tx(bar, bytes);
      __syncwarp();
      if (lane < ROWS) {
        bulk_g2s(dst + (uint32_t)lane * slbytes, wsrc, slbytes, bar);
        bulk_g2s(dst + a.w_area + (uint32_t)lane * a.srow, ssrc, sbytes, bar);
      }
    }
    return;
  }

  // ---- consumers: x (hi pairs / 16) and the per-chunk offset corrections into shared memory
  pdl_wait();
  pdl_trigger();
  // Round 2: 8 threads per 128-value chunk (16 values = 2 uint4 each), partial sums in double combined by
  // shuffles inside the aligned 8-lane group (was: one thread per chunk, 128 serial F2F.F64 on 28 threads: ~1 us).
  // Warp-uniform trip count so the full-mask shuffles always have all 32 lanes.
  for (int base = (threadIdx.x & ~31); base < nchunks * 8; base += W * 32) {
    const int idx = base + lane, c = idx >> 3, q8 = idx & 7;
    const bool act = idx < nchunks * 8;
    uint4 v[2];
    double slo = 0.0, shi = 0.0;
    const __half2 k16 = __float2half2_rn(0.0625f);
#pragma unroll
    for (int e = 0; e < 2; e++) {
      v[e] = act ? reinterpret_cast<const uint4*>(a.x + (size_t)c * kChunk + q8 * 16)[e] : make_uint4(0, 0, 0, 0);
      const float2 f0 = __half22float2(u32_as_h2(v[e].x)), f1 = __half22float2(u32_as_h2(v[e].y));
      const float2 f2 = __half22float2(u32_as_h2(v[e].z)), f3 = __half22float2(u32_as_h2(v[e].w));
      slo += ((double)f0.x + (double)f0.y) + ((double)f2.x + (double)f2.y);
      shi += ((double)f1.x + (double)f1.y) + ((double)f3.x + (double)f3.y);
      v[e].y = h2_as_u32(__hmul2(u32_as_h2(v[e].y), k16));   // exact: power of two
      v[e].w = h2_as_u32(__hmul2(u32_as_h2(v[e].w), k16));
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      slo += __shfl_xor_sync(0xffffffffu, slo, o);
      shi += __shfl_xor_sync(0xffffffffu, shi, o);
    }
    if (act) {
      reinterpret_cast<uint4*>(xs + (size_t)c * kChunk + q8 * 16)[0] = v[0];
      reinterpret_cast<uint4*>(xs + (size_t)c * kChunk + q8 * 16)[1] = v[1];
      if (q8 == 0) corr[c] = (float)(1032.0 * slo + 72.0 * shi);
    }
  }
  named_bar(kBarXStaged, W * 32);

  const int rg = warp / KSW, sl = warp % KSW;
  const int gid = lane >> 2, tig = lane & 3;
  const int c_lo = sl * ncs / KSW, c_hi = (sl + 1) * ncs / KSW;
  uint4 xr[XR > 0 ? XR : 1][4];
  float xc[XR > 0 ? XR : 1];
  if constexpr (XR > 0) {   // nkq == 1: chunk c of every stage is global chunk c
#pragma unroll
    for (int cc = 0; cc < XR; cc++) {
      const bool ok = c_lo + cc < c_hi;
      const uint4* xv = reinterpret_cast<const uint4*>(xs + (size_t)(ok ? c_lo + cc : 0) * kChunk + 32 * tig);
#pragma unroll
      for (int j = 0; j < 4; j++) xr[cc][j] = ok ? xv[j] : make_uint4(0, 0, 0, 0);
      xc[cc] = ok ? -corr[c_lo + cc] : 0.f;
    }
  }
  float ylo = 0.f, yhi = 0.f;
  int fin = 0;
  for (int i = 0; i < nstages; i++) {
    const int slot = i % a.nst;
    const int t = t_begin + i / a.nkq, kq = i % a.nkq;
    mbar_wait(full0 + 8 * slot, (i / a.nst) & 1);
    const uint8_t* st = ring + (size_t)slot * a.stage_bytes;
    const int ra = rg * 16 + gid, rb = ra + 8;                  // stage rows
    const uint8_t* wa = st + (size_t)ra * slbytes + 16 * tig;
    const uint8_t* wb = st + (size_t)rb * slbytes + 16 * tig;
    const uint32_t sbase = (uint32_t)kq * ncs * 2;
    const __half* sa = reinterpret_cast<const __half*>(st + a.w_area + (uint32_t)ra * a.srow +
                                                       (((uint32_t)(t * 16 + gid) * srowg + sbase) & 15u));
    const __half* sb = reinterpret_cast<const __half*>(st + a.w_area + (uint32_t)rb * a.srow +
                                                       (((uint32_t)(t * 16 + gid + 8) * srowg + sbase) & 15u));
    if (a.contig) {   // matrix rg's 16 rows of scales, contiguous from the 16-byte-aligned start of row t*16
      const uint8_t* s16 = st + a.w_area + (uint32_t)rg * 16 * a.srow + (((uint32_t)t * 16 * srowg) & 15u);
      sa = reinterpret_cast<const __half*>(s16 + (uint32_t)gid * srowg);
      sb = reinterpret_cast<const __half*>(s16 + (uint32_t)(gid + 8) * srowg);
    }
    if (a.probe) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * slot);
      continue;
    }
    const int cg0 = kq * ncs;
    if constexpr (XR > 0) {
#pragma unroll
      for (int cc = 0; cc < XR; cc++) {
        if (c_lo + cc < c_hi) {   // warp-uniform
          const int c = c_lo + cc;
          const uint4 qa = *reinterpret_cast<const uint4*>(wa + 64 * c);
          const uint4 qb = *reinterpret_cast<const uint4*>(wb + 64 * c);
          float d[4] = {xc[cc], xc[cc], xc[cc], xc[cc]}, e[4] = {0.f, 0.f, 0.f, 0.f};
          chunk_mma(d, e, qa, qb, xr[cc]);
          ylo = fmaf(__half2float(sa[c]), d[0] + e[0], ylo);
          yhi = fmaf(__half2float(sb[c]), d[2] + e[2], yhi);
        }
      }
    } else if (ILP) {
      int c = c_lo;
      for (; c + 1 < c_hi; c += 2) {
        const uint4 qa0 = *reinterpret_cast<const uint4*>(wa + 64 * c);
        const uint4 qb0 = *reinterpret_cast<const uint4*>(wb + 64 * c);
        const uint4 qa1 = *reinterpret_cast<const uint4*>(wa + 64 * c + 64);
        const uint4 qb1 = *reinterpret_cast<const uint4*>(wb + 64 * c + 64);
        const uint4* xv0 = reinterpret_cast<const uint4*>(xs + (size_t)(cg0 + c) * kChunk + 32 * tig);
        const uint4* xv1 = xv0 + kChunk / 8;
        const float cr0 = -corr[cg0 + c], cr1 = -corr[cg0 + c + 1];
        float d0[4] = {cr0, cr0, cr0, cr0}, e0[4] = {0.f, 0.f, 0.f, 0.f};
        float d1[4] = {cr1, cr1, cr1, cr1}, e1[4] = {0.f, 0.f, 0.f, 0.f};
        chunk_mma(d0, e0, qa0, qb0, xv0);
        chunk_mma(d1, e1, qa1, qb1, xv1);
        ylo = fmaf(__half2float(sa[c]), d0[0] + e0[0], ylo);
        yhi = fmaf(__half2float(sb[c]), d0[2] + e0[2], yhi);
        ylo = fmaf(__half2float(sa[c + 1]), d1[0] + e1[0], ylo);
        yhi = fmaf(__half2float(sb[c + 1]), d1[2] + e1[2], yhi);
      }
      if (c < c_hi) {
        const uint4 qa0 = *reinterpret_cast<const uint4*>(wa + 64 * c);
        const uint4 qb0 = *reinterpret_cast<const uint4*>(wb + 64 * c);
        const uint4* xv0 = reinterpret_cast<const uint4*>(xs + (size_t)(cg0 + c) * kChunk + 32 * tig);
        const float cr0 = -corr[cg0 + c];
        float d0[4] = {cr0, cr0, cr0, cr0}, e0[4] = {0.f, 0.f, 0.f, 0.f};
        chunk_mma(d0, e0, qa0, qb0, xv0);
        ylo = fmaf(__half2float(sa[c]), d0[0] + e0[0], ylo);
        yhi = fmaf(__half2float(sb[c]), d0[2] + e0[2], yhi);
      }
    }
#pragma unroll 2
    for (int c = (ILP || XR > 0) ? c_hi : c_lo; c < c_hi; c++) {
      const uint4 qa = *reinterpret_cast<const uint4*>(wa + 64 * c);
      const uint4 qb = *reinterpret_cast<const uint4*>(wb + 64 * c);
      const uint4* xv = reinterpret_cast<const uint4*>(xs + (size_t)(cg0 + c) * kChunk + 32 * tig);
      const float cr = -corr[cg0 + c];
      float d[4] = {cr, cr, cr, cr};
      const uint32_t wa4[4] = {qa.x, qa.y, qa.z, qa.w}, wb4[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint4 x8 = xv[j];
        const uint32_t pa = wa4[j], pb = wb4[j], pa8 = pa >> 8, pb8 = pb >> 8;
        mma16816(d, and_or(pa, 0x000F000Fu, 0x64006400u), and_or(pb, 0x000F000Fu, 0x64006400u),
                 and_or(pa, 0x00F000F0u, 0x64006400u), and_or(pb, 0x00F000F0u, 0x64006400u), x8.x, x8.y);
        mma16816(d, and_or(pa8, 0x000F000Fu, 0x64006400u), and_or(pb8, 0x000F000Fu, 0x64006400u),
                 and_or(pa8, 0x00F000F0u, 0x64006400u), and_or(pb8, 0x00F000F0u, 0x64006400u), x8.z, x8.w);
      }
      ylo = fmaf(__half2float(sa[c]), d[0], ylo);
      yhi = fmaf(__half2float(sb[c]), d[2], yhi);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * slot);
    if (kq != a.nkq - 1) continue;
    // task complete: combine the KSW slices of each row group in slice order
    float* pp = part + (fin & 1) * W * 16;
    if (tig == 0) {
      pp[warp * 16 + gid] = ylo;
      pp[warp * 16 + gid + 8] = yhi;
    }
    named_bar(1, W * 32);
    if (warp == 0 && lane < 16) {
      float y0 = 0.f, y1 = 0.f;
      for (int s = 0; s < KSW; s++) y0 += pp[s * 16 + lane];
      if (SWIGLU) {
        for (int s = 0; s < KSW; s++) y1 += pp[(KSW + s) * 16 + lane];
        a.out_f16[t * 16 + lane] = __float2half_rn(y0 / (1.f + __expf(-y0)) * y1);
      } else {
        a.out_f32[t * 16 + lane] = y0;
      }
    }
    ylo = yhi = 0.f;
    fin++;
  }
}

using dev::kCeilInFlight;   // the read-only ceiling (dev_common.cuh)
using dev::kCeilThreads;
using dev::read_ceiling;

// ---- random fill on the device (splitmix-style hash of (seed, index)) ----------------------------------------
__device__ __host__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__global__ void fill_random_u32(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)mix64(seed * 0x9E3779B97F4A7C15ull + i);
}
// scales: f16 in [0.5, 1.5) * 2^-6 (positive, like a quantizer's amax/7 for unit-scale weights)
__global__ void fill_scales(__half* p, size_t n, uint64_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float u = (float)(mix64(seed * 0xD1B54A32D192ED03ull + i) >> 40) * (1.f / 16777216.f);
    p[i] = __float2half_rn((0.5f + u) * (1.f / 64.f));
  }
}

// ---- host side -------------------------------------------------------------------------------------------------
int g_sms = 132;
size_t g_max_smem = 227 * 1024;
size_t g_smem_per_sm = 228 * 1024;

struct Plan {
  int ksw_log2, P, nst;
  uint32_t stage_bytes, w_area, s_area;
  size_t smem;
};

// Smallest split KSW (power of two, <= W) whose stage (2*W/KSW rows + scales) fits target_bytes; ring = as many
// stages as fit next to x.
Plan make_plan(int mode, int K, int group, int W, uint32_t target_bytes) {
  const uint32_t rowbytes = K / 2, sb = (K / group) * 2;
  const int nunits = K / 32;
  Plan p{};
  for (int ksl = 0; (1 << ksl) <= W; ksl++) {
    const int P = W >> ksl;
    const uint32_t w_area = 2u * P * rowbytes;
    const uint32_t srows = mode == GEMV_SWIGLU ? P : 2 * P;
    const uint32_t s_area = ((srows * sb + 15u) & ~15u) + 16u;
    const uint32_t stage = (w_area + (mode == GEMV_SWIGLU ? 2 : 1) * s_area + 127u) & ~127u;
    p = Plan{ksl, P, 0, stage, w_area, s_area, 0};
    if (stage <= target_bytes || (nunits >> (ksl + 1)) < 32 || (1 << (ksl + 1)) > W) break;
  }
  const size_t fixed = (kSmemBars + kSmemPart + (size_t)K * 2 + 127) & ~(size_t)127;
  const int nst = (int)std::min<size_t>(kMaxStages, (g_max_smem - fixed) / p.stage_bytes);
  p.nst = nst;
  p.smem = fixed + (size_t)nst * p.stage_bytes;
  return p;
}

struct MmaPlan {
  int nkq, nst;
  uint32_t stage_bytes, w_area, srow;
  size_t smem;
};
// Fewest K slices per task whose stage (16 or 32 rows x K/nkq, plus scales) fits target_bytes.
MmaPlan make_mma_plan(int mode, int K, int W, uint32_t target_bytes, int bps) {
  const int rows = mode == GEMV_SWIGLU ? 32 : 16, nchunks = K / kChunk;
  MmaPlan p{};
  for (int nkq = 1; nkq <= std::min(nchunks, 8); nkq++) {
    if (nchunks % nkq) continue;
    const int ncs = nchunks / nkq;
    const uint32_t slbytes = (uint32_t)(K / nkq) / 2, srow = ((ncs * 2 + 15u) & ~15u) + 16u;
    const uint32_t w_area = rows * slbytes, stage = (w_area + rows * srow + 127u) & ~127u;
    p = MmaPlan{nkq, 0, stage, w_area, srow, 0};
    if (stage <= target_bytes) break;
  }
  const size_t fixed = kSmemBars + 2 * W * 16 * 4 + ((nchunks * 4 + 127) & ~127) + (((size_t)K * 2 + 127) & ~(size_t)127);
  const size_t budget = std::min(g_max_smem, g_smem_per_sm / bps - 1024);   // 1 KB per block reserved by the driver
  p.nst = (int)std::min<size_t>(kMaxStages, (budget - fixed) / p.stage_bytes);
  p.smem = fixed + (size_t)p.nst * p.stage_bytes;
  return p;
}

constexpr int kXregSwiglu = 7, kXregStore = 4;   // K = 3584: 28 chunks over 4 (SWIGLU) / 8 (STORE) warps
template <int MODE, int W, bool ILP, int MINB, int XR = 0>
int launch_mma(const MmaArgs& a, const MmaPlan& p, cudaStream_t st) {
  return launch_pdl("gemv_int4_stream_mma", gemv_int4_stream_mma<MODE, W, ILP, MINB, XR>, dim3(g_sms * MINB),
                    dim3((W + 1) * 32), p.smem, st, a);
}

struct Shape {
  const char* name;
  int N, K, mode;     // SWIGLU: two matrices (gate, up) of N x K
  double prod_us;     // production v2, bench/NOTES.md (decode modes: RMSNorm / residual / SwiGLU)
};

struct Bufs {           // ncopies copies of [w0 | s0 | (w1 | s1)], each part 128-aligned, scales padded by 16 B
  uint8_t* base = nullptr;
  size_t copy_bytes = 0, wbytes = 0, sbytes_pad = 0, part_bytes = 0;
  int ncopies = 0, nm = 1;
  const uint8_t* w(int c, int m) const { return base + c * copy_bytes + m * part_bytes; }
  const uint8_t* s(int c, int m) const { return w(c, m) + wbytes; }
};

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

template <int MODE, int W, int U, bool COMPUTE>
void setup_stream() {
  CK(cudaFuncSetAttribute(gemv_int4_stream<MODE, W, U, COMPUTE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)g_max_smem));
}

template <int MODE, int W, int U, bool COMPUTE>
int launch_stream(const StreamArgs& a, const Plan& p, cudaStream_t st) {
  return launch_pdl("gemv_int4_stream", gemv_int4_stream<MODE, W, U, COMPUTE>, dim3(g_sms), dim3((W + 1) * 32),
                    p.smem, st, a);
}

enum Kind { K_CEIL, K_TMA, K_PROD, K_STREAM, K_MMA };
struct Variant {
  const char* name;
  Kind kind;
  int W, U, evict;
  uint32_t target;
  int flags;   // K_MMA: 1 = one copy per matrix per stage where the K slice is the whole row, 2 = probe only
};

const Variant kVariants[] = {
    {"ceiling ld.nc", K_CEIL, 0, 0, 0, 0},
    {"tma-only W8", K_TMA, 8, 2, 0, 40 * 1024},
    {"prod v2", K_PROD, 0, 0, 0, 0},
    {"stream W8 U2", K_STREAM, 8, 2, 0, 40 * 1024},
    {"stream W8 U4", K_STREAM, 8, 4, 0, 40 * 1024},
    {"stream W8 U2 16K", K_STREAM, 8, 2, 0, 16 * 1024},
    {"stream W8 U2 ef", K_STREAM, 8, 2, 1, 40 * 1024},
    {"stream W16 U2", K_STREAM, 16, 2, 0, 40 * 1024},
    // K_MMA: U = blocks per SM, evict = ILP (two chunks in flight, split accumulator chains)
    {"mma W8", K_MMA, 8, 1, 0, 64 * 1024},
    {"mma W8 ilp", K_MMA, 8, 1, 1, 64 * 1024},
    {"mma W8 ilp 32K", K_MMA, 8, 1, 1, 32 * 1024},
    {"mma W8 ilp 2blk", K_MMA, 8, 2, 1, 32 * 1024},
    // added after run 3, not yet run on the device: (a) the mma consumer with one bulk copy per matrix per stage
    // (K = 3584 shapes; down keeps per-row copies), (b) the ring alone with the mma kernel's per-row copies
    {"mma W8 ilp 1copy", K_MMA, 8, 1, 1, 64 * 1024, 1},
    {"tma-only rowcopies", K_MMA, 8, 1, 1, 64 * 1024, 2},
    // round 2 (H5b): the mma kernel's ring with one copy per matrix per stage and no arithmetic (stage size and
    // ring depth of `mma W8 ilp 1copy`, copy count of tma-only W8)
    {"tma-only 1copy", K_MMA, 8, 1, 1, 64 * 1024, 3},
    // round 2, run 5: consumer speed alone (ring filled once, then re-armed without copies: outputs not checked),
    // and 16 consumer warps (one block per SM, 544 threads)
    {"mma W8 compute-only", K_MMA, 8, 1, 1, 64 * 1024, 5},
    {"mma W16 ilp 1copy", K_MMA, 16, 1, 1, 64 * 1024, 1},
    {"mma W16 compute-only", K_MMA, 16, 1, 1, 64 * 1024, 5},
    // round 2, added after run 5, NOT yet run: x fragments + corrections in registers (K = 3584 shapes, 1 copy)
    {"mma W8 xreg 1copy", K_MMA, 8, 1, 1, 64 * 1024, 9},
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

// Validation tolerance, per output element, relative to sum_k |w_k x_k| (the "magnitude" of the dot product):
// the 32-value units are summed as two f16x2 chains of 8 HFMA2 each (unit roundoff 2^-11), so each unit partial
// carries at most gamma_8 = 8u/(1-8u) ~ 3.9e-3 of its own sum|products| (Higham 3.1); the unpacked weights (u-8)
// and x are exact f16 inputs, the scale multiply and everything above the unit are f32 (<= K/32 roundings of
// 2^-24, ~1e-5 relative). So |err| <= 4e-3 * sum|w x| is a worst-case bound, not a fit; random signs give ~1e-4.
constexpr double kDotTol = 4e-3;
// SwiGLU output f16: silu(g)*u with g, u each within kDotTol*M of the truth: |d silu/dg| <= 1.1, plus the f32
// epilogue and one f16 rounding of the result (2^-11 relative; 2^-10 used for __expf's few-ulp error).
constexpr double kOutRound = 1.0 / 1024;

// The mma kernel's products are exact in f32 but carry the unpack offsets (1024 x and 64 x per value), removed once
// per 128-value chunk: per chunk, C starts at -corr (one f32 rounding) and 8 HMMAs round the running sum, whose
// magnitude is bounded by off_c = 1032 sum_lo |x| + 72 sum_hi |x| (+ the much smaller sum |u x|): 9 roundings of
// <= 1 ulp (2^-23, allowing truncation) ~ 2^-20 of off_c; doubled for the tensor core's internal alignment of the
// 16 products: 2^-19 * sum_c scale_c * off_c, on top of kDotTol (f32 above the chunk).
constexpr double kMmaTol = 1.0 / (1 << 19);

struct Ref {
  std::vector<double> y, mag, off;   // per output: reference (STORE) / gate, up magnitudes
  std::vector<double> g, u, gmag, umag, goff, uoff;
};

void cpu_dot_rows(const uint8_t* w, const __half* s, int N, int K, int group, const std::vector<float>& x,
                  std::vector<double>& y, std::vector<double>& mag, std::vector<double>& off) {
  static const int kPerm[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  y.assign(N, 0.0);
  mag.assign(N, 0.0);
  off.assign(N, 0.0);
  std::vector<double> xoff(K / kChunk, 0.0);   // per 128-chunk offset magnitude of the mma kernel
  for (int k = 0; k < K; k++) {
    const int r = k % 8;
    xoff[k / kChunk] += (r == 2 || r == 3 || r == 6 || r == 7 ? 72.0 : 1032.0) * std::fabs((double)x[k]);
  }
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    double o = 0;
    for (int c = 0; c < K / kChunk; c++)
      o += (double)__half2float(s[(size_t)n * (K / group) + (c * kChunk) / group]) * xoff[c];
    off[n] = o;
  }
  const int words = K / 8;
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(w) + (size_t)n * words;
    double acc = 0, m = 0;
    for (int j = 0; j < words; j++) {
      const uint32_t q = row[j];
      const double sc = (double)__half2float(s[(size_t)n * (K / group) + (8 * j) / group]);
      for (int i = 0; i < 8; i++) {
        const int k = 8 * j + kPerm[i];
        const double v = sc * (double)((int)((q >> (4 * i)) & 15u) - 8) * (double)x[k];
        acc += v;
        m += std::fabs(v);
      }
    }
    y[n] = acc;
    mag[n] = m;
  }
}

struct Check {
  double max_ratio = 0, rel_l2 = 0;   // max |err| / bound, ||err|| / ||ref||
  long bad = 0, nonfinite = 0, ident = 0;
};

Check check_store(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& mag,
                  const std::vector<double>& off, bool mma) {
  Check c;
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i])) { c.nonfinite++; c.bad++; continue; }
    const double err = std::fabs((double)got[i] - ref[i]);
    const double bound = kDotTol * mag[i] + (mma ? kMmaTol * off[i] : 0.0) + 1e-30;
    c.max_ratio = std::max(c.max_ratio, err / bound);
    if (err > bound) c.bad++;
    e2 += err * err;
    r2 += ref[i] * ref[i];
  }
  c.rel_l2 = std::sqrt(e2 / r2);
  return c;
}

Check check_swiglu(const std::vector<__half>& got, const Ref& r, bool mma) {
  Check c;
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double v = (double)__half2float(got[i]);
    const double g = r.g[i], u = r.u[i];
    const double ref = g / (1.0 + std::exp(-g)) * u;
    if (!std::isfinite(v)) { c.nonfinite++; c.bad++; continue; }
    const double eg = kDotTol * r.gmag[i] + (mma ? kMmaTol * r.goff[i] : 0.0);
    const double eu = kDotTol * r.umag[i] + (mma ? kMmaTol * r.uoff[i] : 0.0);
    const double bound = 1.1 * eg * (std::fabs(u) + eu) + std::fabs(g) * eu + kOutRound * std::fabs(ref) + 6e-8;
    const double err = std::fabs(v - ref);
    c.max_ratio = std::max(c.max_ratio, err / bound);
    if (err > bound) c.bad++;
    e2 += err * err;
    r2 += ref * ref;
  }
  c.rel_l2 = std::sqrt(e2 / r2);
  return c;
}

// GS_VARIANT: one variant name, or several separated by ';'
bool variant_selected(const char* list, const char* name) {
  const size_t n = strlen(name);
  for (const char* p = list; *p;) {
    const char* e = strchr(p, ';');
    const size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0) return true;
    if (!e) break;
    p = e + 1;
  }
  return false;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace stream_dev
using namespace stream_dev;

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  g_sms = prop.multiProcessorCount;
  g_max_smem = prop.sharedMemPerBlockOptin;
  g_smem_per_sm = prop.sharedMemPerMultiprocessor;
  printf("device: %s, %d SMs, L2 %d MB, smem/block opt-in %zu B\n", prop.name, g_sms, prop.l2CacheSize >> 20,
         g_max_smem);
  // argv[1]: "probe" (print the device and exit), "check" (validation only, 2 copies: for compute-sanitizer),
  // or a seed offset (default 0) for a timed run
  const bool probe = argc > 1 && strcmp(argv[1], "probe") == 0;
  const bool check_only = argc > 1 && strcmp(argv[1], "check") == 0;
  if (probe) return 0;
  if (gemv_prepare() != NQ_OK) {
    fprintf(stderr, "error: %s\n", last_error());
    return 1;
  }
  setup_stream<GEMV_STORE, 8, 2, true>();
  setup_stream<GEMV_STORE, 8, 4, true>();
  setup_stream<GEMV_STORE, 16, 2, true>();
  setup_stream<GEMV_STORE, 8, 2, false>();
  setup_stream<GEMV_SWIGLU, 8, 2, true>();
  setup_stream<GEMV_SWIGLU, 8, 4, true>();
  setup_stream<GEMV_SWIGLU, 16, 2, true>();
  setup_stream<GEMV_SWIGLU, 8, 2, false>();
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_STORE, 8, false, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_SWIGLU, 8, false, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_STORE, 8, true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_SWIGLU, 8, true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_STORE, 8, true, 1, kXregStore>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_SWIGLU, 8, true, 1, kXregSwiglu>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_STORE, 16, true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_SWIGLU, 16, true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_STORE, 8, true, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));
  CK(cudaFuncSetAttribute(gemv_int4_stream_mma<GEMV_SWIGLU, 8, true, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g_max_smem));

  const int group = 128;
  const Shape shapes[] = {
      {"7B qkv 4608x3584", 4608, 3584, GEMV_STORE, 6.56},
      {"7B o 3584x3584", 3584, 3584, GEMV_STORE, 4.75},
      {"7B gate/up 2x18944x3584", 18944, 3584, GEMV_SWIGLU, 23.85},
      {"7B down 3584x18944", 3584, 18944, GEMV_STORE, 15.38},
  };
  const size_t kRotateBytes = check_only ? 1 : 640ull << 20;   // > 512 MB of copies: nothing stays in the 60 MB L2
  const int kReps = 41, kBatch = 20;          // median over kReps batches of kBatch back-to-back launches

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  unsigned* sink;
  CK(cudaMalloc(&sink, 65536 * sizeof(unsigned)));

  double table_us[8][kNumVariants];
  double table_gbs[8][kNumVariants];
  double table_us_launch[8][kNumVariants];
  int total_bad = 0;

  // GS_SHAPE=<index> / GS_VARIANT=<name>: run one shape / one kernel (for ncu; bit-identity then not counted)
  const char* only_shape = getenv("GS_SHAPE");
  const char* only_variant = getenv("GS_VARIANT");
  for (int si = 0; si < 4; si++)
    for (int vi = 0; vi < kNumVariants; vi++) table_us[si][vi] = table_us_launch[si][vi] = table_gbs[si][vi] = NAN;
  for (int si = 0; si < (int)(sizeof(shapes) / sizeof(shapes[0])); si++) {
    if (only_shape && atoi(only_shape) != si) continue;
    const Shape& sh = shapes[si];
    const int N = sh.N, K = sh.K, nm = sh.mode == GEMV_SWIGLU ? 2 : 1;
    Bufs b;
    b.nm = nm;
    b.wbytes = align_up((size_t)N * K / 2, 128);
    b.sbytes_pad = align_up((size_t)N * (K / group) * 2 + 16, 128);
    b.part_bytes = b.wbytes + b.sbytes_pad;
    b.copy_bytes = b.part_bytes * nm;
    b.ncopies = (int)std::max<size_t>(2, (kRotateBytes + b.copy_bytes - 1) / b.copy_bytes);
    const double counted = (double)nm * ((double)N * K / 2 + (double)N * (K / group) * 2);  // bytes per launch
    CK(cudaMalloc(&b.base, b.copy_bytes * b.ncopies));
    const uint64_t seed = 1000 + 17 * si + (argc > 1 && !check_only ? strtoull(argv[1], nullptr, 10) : 0);
    for (int c = 0; c < b.ncopies; c++)
      for (int m = 0; m < nm; m++) {
        fill_random_u32<<<1024, 256, 0, st>>>((uint32_t*)b.w(c, m), b.wbytes / 4, seed * 131 + c * 7 + m);
        CK(cudaMemsetAsync((void*)b.s(c, m), 0, b.sbytes_pad, st));
        fill_scales<<<1024, 256, 0, st>>>((__half*)b.s(c, m), (size_t)N * (K / group), seed * 137 + c * 7 + m);
      }
    CK(cudaGetLastError());
    // x: fresh random f16 in [-2, 2) (never zeros)
    std::vector<__half> xh(K);
    std::vector<float> xf(K);
    {
      uint64_t z = seed * 7919;
      for (int k = 0; k < K; k++) {
        const double u = (double)(mix64(z + k) >> 11) * (1.0 / 9007199254740992.0);
        xh[k] = __float2half_rn((float)(4.0 * u - 2.0));
        xf[k] = __half2float(xh[k]);
      }
    }
    __half* xd;
    float* out32;
    __half* out16;
    CK(cudaMalloc(&xd, K * 2));
    CK(cudaMalloc(&out32, N * 4));
    CK(cudaMalloc(&out16, N * 2));
    CK(cudaMemcpy(xd, xh.data(), K * 2, cudaMemcpyHostToDevice));
    CK(cudaStreamSynchronize(st));

    // references for copies 0 and the last one
    const int vcopies[2] = {0, b.ncopies - 1};
    Ref refs[2];
    for (int vc = 0; vc < 2; vc++) {
      std::vector<uint8_t> hw(b.copy_bytes);
      CK(cudaMemcpy(hw.data(), b.w(vcopies[vc], 0), b.copy_bytes, cudaMemcpyDeviceToHost));
      if (nm == 1) {
        cpu_dot_rows(hw.data(), (const __half*)(hw.data() + b.wbytes), N, K, group, xf, refs[vc].y, refs[vc].mag,
                     refs[vc].off);
      } else {
        cpu_dot_rows(hw.data(), (const __half*)(hw.data() + b.wbytes), N, K, group, xf, refs[vc].g, refs[vc].gmag,
                     refs[vc].goff);
        cpu_dot_rows(hw.data() + b.part_bytes, (const __half*)(hw.data() + b.part_bytes + b.wbytes), N, K, group, xf,
                     refs[vc].u, refs[vc].umag, refs[vc].uoff);
      }
    }

    printf("\n== %s: %.2f MB per launch, %d copies (%.0f MB rotated)\n", sh.name, counted / 1e6, b.ncopies,
           b.copy_bytes * (double)b.ncopies / 1e6);
    std::vector<float> prod_out32;
    std::vector<__half> prod_out16;

    for (int vi = 0; vi < kNumVariants; vi++) {
      const Variant& v = kVariants[vi];
      if (only_variant && !variant_selected(only_variant, v.name)) continue;
      Plan plan{};
      if (v.kind == K_TMA || v.kind == K_STREAM) plan = make_plan(sh.mode, K, group, v.W, v.target);
      MmaPlan mplan{};
      if (v.kind == K_MMA) {
        mplan = make_mma_plan(sh.mode, K, v.W, v.target, v.U > 1 ? v.U : 1);
        if (v.flags & 8) {   // xreg: whole-row stages and <= XR chunks per warp
          const int ksw = sh.mode == GEMV_SWIGLU ? v.W / 2 : v.W, xr = sh.mode == GEMV_SWIGLU ? kXregSwiglu : kXregStore;
          if (mplan.nkq != 1 || (K / kChunk + ksw - 1) / ksw > xr) mplan.nst = 0;
        }
        if (mplan.nst < 1) {
          printf("  %-18s skipped: no stage fits (xreg: needs whole-row stages)\n", v.name);
          table_us[si][vi] = table_us_launch[si][vi] = table_gbs[si][vi] = NAN;
          continue;
        }
      }
      bool capturing = false, capture_failed = false;
      auto launch = [&](int c) {
        if (v.kind == K_CEIL) {
          const size_t n16 = b.copy_bytes / 16;
          const int grid = (int)std::min<size_t>((size_t)g_sms * 8, (n16 + kCeilThreads * kCeilInFlight - 1) /
                                                                         (kCeilThreads * kCeilInFlight));
          read_ceiling<<<grid, kCeilThreads, 0, st>>>((const uint4*)b.w(c, 0), n16, sink);
          if (capturing) capture_failed |= cudaGetLastError() != cudaSuccess;
          else CK(cudaGetLastError());
          return;
        }
        if (v.kind == K_PROD) {
          GemvArgs ga;
          ga.seg[0] = LinW{b.w(c, 0), (const __half*)b.s(c, 0), nullptr, N, K, group, WT_INT4};
          ga.nseg = 1;
          ga.x_f16 = xd;
          ga.mode = sh.mode;
          if (sh.mode == GEMV_SWIGLU) {
            ga.up = LinW{b.w(c, 1), (const __half*)b.s(c, 1), nullptr, N, K, group, WT_INT4};
            ga.out_f16 = out16;
          } else {
            ga.out_f32 = out32;
          }
          if (gemv(ga, st) != NQ_OK) {
            if (capturing) { capture_failed = true; return; }
            fprintf(stderr, "error: prod gemv: %s\n", last_error());
            exit(1);
          }
          return;
        }
        if (v.kind == K_MMA) {
          MmaArgs ma{};
          ma.w[0] = b.w(c, 0);
          ma.s[0] = b.s(c, 0);
          ma.w[1] = nm > 1 ? b.w(c, 1) : b.w(c, 0);
          ma.s[1] = nm > 1 ? b.s(c, 1) : b.s(c, 0);
          ma.x = xd;
          ma.out_f32 = out32;
          ma.out_f16 = out16;
          ma.n_tasks = N / 16;
          ma.K = K;
          ma.nkq = mplan.nkq;
          ma.nst = mplan.nst;
          ma.stage_bytes = mplan.stage_bytes;
          ma.w_area = mplan.w_area;
          ma.srow = mplan.srow;
          ma.contig = (v.flags & 1) && mplan.nkq == 1;
          ma.probe = (v.flags & 2) != 0;
          ma.compute_only = (v.flags & 4) != 0;
          const bool sw = sh.mode == GEMV_SWIGLU;
          int rc;   // mma variants: U = blocks per SM, evict = ILP
          if (v.flags & 8) rc = sw ? launch_mma<GEMV_SWIGLU, 8, true, 1, kXregSwiglu>(ma, mplan, st) : launch_mma<GEMV_STORE, 8, true, 1, kXregStore>(ma, mplan, st);
          else if (v.W == 16) rc = sw ? launch_mma<GEMV_SWIGLU, 16, true, 1>(ma, mplan, st) : launch_mma<GEMV_STORE, 16, true, 1>(ma, mplan, st);
          else if (v.U == 2) rc = sw ? launch_mma<GEMV_SWIGLU, 8, true, 2>(ma, mplan, st) : launch_mma<GEMV_STORE, 8, true, 2>(ma, mplan, st);
          else if (v.evict) rc = sw ? launch_mma<GEMV_SWIGLU, 8, true, 1>(ma, mplan, st) : launch_mma<GEMV_STORE, 8, true, 1>(ma, mplan, st);
          else rc = sw ? launch_mma<GEMV_SWIGLU, 8, false, 1>(ma, mplan, st) : launch_mma<GEMV_STORE, 8, false, 1>(ma, mplan, st);
          if (rc != NQ_OK) {
            if (capturing) { capture_failed = true; return; }
            fprintf(stderr, "error: %s\n", last_error());
            exit(1);
          }
          return;
        }
        StreamArgs a{};
        a.w[0] = b.w(c, 0);
        a.s[0] = b.s(c, 0);
        a.w[1] = nm > 1 ? b.w(c, 1) : b.w(c, 0);
        a.s[1] = nm > 1 ? b.s(c, 1) : b.s(c, 0);
        a.x = xd;
        a.out_f32 = out32;
        a.out_f16 = out16;
        a.n_items = N;
        a.K = K;
        a.gshift = __builtin_ctz(group) - 5;
        a.ksw_log2 = plan.ksw_log2;
        a.nst = plan.nst;
        a.stage_bytes = plan.stage_bytes;
        a.w_area = plan.w_area;
        a.s_area = plan.s_area;
        a.evict_first = v.evict;
        const bool sw = sh.mode == GEMV_SWIGLU;
        int rc;
        if (v.kind == K_TMA) {
          rc = sw ? launch_stream<GEMV_SWIGLU, 8, 2, false>(a, plan, st) : launch_stream<GEMV_STORE, 8, 2, false>(a, plan, st);
        } else if (v.W == 16) {
          rc = sw ? launch_stream<GEMV_SWIGLU, 16, 2, true>(a, plan, st) : launch_stream<GEMV_STORE, 16, 2, true>(a, plan, st);
        } else if (v.U == 4) {
          rc = sw ? launch_stream<GEMV_SWIGLU, 8, 4, true>(a, plan, st) : launch_stream<GEMV_STORE, 8, 4, true>(a, plan, st);
        } else {
          rc = sw ? launch_stream<GEMV_SWIGLU, 8, 2, true>(a, plan, st) : launch_stream<GEMV_STORE, 8, 2, true>(a, plan, st);
        }
        if (rc != NQ_OK) {
          if (capturing) { capture_failed = true; return; }
          fprintf(stderr, "error: %s\n", last_error());
          exit(1);
        }
      };

      // validation (not for the ceiling / tma-only probes): poison, run on copies 0 and last, compare
      char vmsg[256] = "";
      if (v.kind == K_PROD || v.kind == K_STREAM || (v.kind == K_MMA && !(v.flags & 6))) {
        const bool mma = v.kind == K_MMA;
        Check worst;
        long ident = 0;
        for (int vc = 0; vc < 2; vc++) {
          CK(cudaMemsetAsync(out32, 0xFF, N * 4, st));   // NaN poison
          CK(cudaMemsetAsync(out16, 0xFF, N * 2, st));
          launch(vcopies[vc]);
          CK(cudaStreamSynchronize(st));
          CK(cudaGetLastError());
          Check c;
          if (nm == 1) {
            std::vector<float> got(N);
            CK(cudaMemcpy(got.data(), out32, N * 4, cudaMemcpyDeviceToHost));
            c = check_store(got, refs[vc].y, refs[vc].mag, refs[vc].off, mma);
            if (vc == 0) {
              if (v.kind == K_PROD) prod_out32 = got;
              else if ((int)prod_out32.size() == N)
                for (int i = 0; i < N; i++) ident += memcmp(&got[i], &prod_out32[i], 4) == 0;
            }
          } else {
            std::vector<__half> got(N);
            CK(cudaMemcpy(got.data(), out16, N * 2, cudaMemcpyDeviceToHost));
            c = check_swiglu(got, refs[vc], mma);
            if (vc == 0) {
              if (v.kind == K_PROD) prod_out16 = got;
              else if ((int)prod_out16.size() == N)
                for (int i = 0; i < N; i++) ident += memcmp(&got[i], &prod_out16[i], 2) == 0;
            }
          }
          worst.max_ratio = std::max(worst.max_ratio, c.max_ratio);
          worst.rel_l2 = std::max(worst.rel_l2, c.rel_l2);
          worst.bad += c.bad;
          worst.nonfinite += c.nonfinite;
        }
        total_bad += worst.bad > 0;
        snprintf(vmsg, sizeof vmsg, "%s: max err/bound %.3f, rel L2 %.2e, %ld over bound, %ld non-finite%s",
                 worst.bad ? "FAIL" : "ok", worst.max_ratio, worst.rel_l2, worst.bad, worst.nonfinite,
                 v.kind == K_STREAM ? "" : "");
        if (v.kind == K_STREAM || v.kind == K_MMA) {
          char extra[96];
          snprintf(extra, sizeof extra, "; bit-identical to prod v2: %ld/%d", ident, N);
          strncat(vmsg, extra, sizeof vmsg - strlen(vmsg) - 1);
        }
      }
      if (check_only) {
        printf("  %-18s %s\n", v.name, vmsg);
        continue;
      }
      // timing 1 (as bench/gpu_kernels_bench.py): kReps batches of kBatch back-to-back stream launches rotating
      // over the copies; host launch cost can show on the small shapes
      for (int it = 0; it < 5; it++) launch(it % b.ncopies);
      CK(cudaStreamSynchronize(st));
      std::vector<double> per;
      int c = 0;
      for (int r = 0; r < kReps; r++) {
        CK(cudaEventRecord(e0, st));
        for (int it = 0; it < kBatch; it++) {
          launch(c);
          c = (c + 1) % b.ncopies;
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        per.push_back(ms * 1000.0 / kBatch);
      }
      CK(cudaGetLastError());
      const double us_stream = median(per);
      table_us_launch[si][vi] = us_stream;
      // timing 2 (the table): a CUDA graph of one launch per copy (one pass over all > 512 MB), replayed kReps
      // times; per-launch time = replay time / ncopies; median over replays
      double us = us_stream;
      {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        bool ok = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        if (ok) {
          capturing = true;
          for (int cc = 0; cc < b.ncopies; cc++) launch(cc);
          capturing = false;
          ok = cudaStreamEndCapture(st, &graph) == cudaSuccess && graph != nullptr && !capture_failed;
        }
        ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
        if (ok) {
          std::vector<double> pg;
          for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(exec, st));
          for (int r = 0; r < kReps; r++) {
            CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(exec, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            pg.push_back(ms * 1000.0 / b.ncopies);
          }
          per = pg;
          us = median(pg);
        } else {
          printf("  (graph capture failed: %s; stream timing used)\n", cudaGetErrorString(cudaGetLastError()));
        }
        if (exec) CK(cudaGraphExecDestroy(exec));
        if (graph) CK(cudaGraphDestroy(graph));
        CK(cudaGetLastError());
      }
      table_us[si][vi] = us;
      table_gbs[si][vi] = counted / (us * 1e-6) / 1e9;
      std::vector<double> sorted = per;
      std::sort(sorted.begin(), sorted.end());
      printf("  %-18s graph %8.2f us (min %.2f, max %.2f) %7.0f GB/s; launches %.2f us", v.name, us, sorted.front(),
             sorted.back(), table_gbs[si][vi], us_stream);
      if (v.kind == K_MMA)
        printf("  [%d K slices, %u B/stage, %d stages, smem %zu, %d bulk copies/stage]", mplan.nkq, mplan.stage_bytes,
               mplan.nst, mplan.smem,
               ((v.flags & 1) && mplan.nkq == 1 ? 2 : 32) * (sh.mode == GEMV_SWIGLU ? 2 : 1));
      if (v.kind == K_TMA || v.kind == K_STREAM)
        printf("  [KSW %d, %d rows/stage, %u B/stage, %d stages, smem %zu]", 1 << plan.ksw_log2,
               2 * plan.P, plan.stage_bytes, plan.nst, plan.smem);
      printf("%s%s\n", vmsg[0] ? "  " : "", vmsg);
    }
    // asymptotic ceiling: one launch over all copies
    if (si == 2 && !check_only) {
      const size_t n16 = b.copy_bytes * b.ncopies / 16;
      std::vector<double> per;
      for (int r = 0; r < 11; r++) {
        CK(cudaEventRecord(e0, st));
        read_ceiling<<<g_sms * 8, kCeilThreads, 0, st>>>((const uint4*)b.base, n16, sink);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        per.push_back(ms);
      }
      printf("  read-only stream over all %.0f MB in one launch: %.3f ms = %.0f GB/s\n",
             b.copy_bytes * (double)b.ncopies / 1e6, median(per), b.copy_bytes * (double)b.ncopies / median(per) / 1e6);
    }
    CK(cudaFree(b.base));
    CK(cudaFree(xd));
    CK(cudaFree(out32));
    CK(cudaFree(out16));
  }

  if (check_only) {
    printf("\nvalidation: %s\n", total_bad ? "FAILED" : "all kernels within bound on every shape");
    return total_bad ? 1 : 0;
  }
  printf("\n(graph timing; %%ceil = against the faster of 'ceiling ld.nc' and 'tma-only' in this run; 'launch us' = back-to-back stream launches; 'NOTES/us' = production's NOTES time over this)\n");
  printf("%-24s %-18s %8s %8s %8s %9s %10s %9s\n", "shape", "kernel", "us", "GB/s", "%ceil", "prod/us", "launch us",
         "NOTES/us");
  for (int si = 0; si < 4; si++) {
    for (int vi = 0; vi < kNumVariants; vi++) {
      if (std::isnan(table_us[si][vi])) continue;
      printf("%-24s %-18s %8.2f %8.0f %7.1f%% %8.2fx %10.2f %8.2fx\n", shapes[si].name, kVariants[vi].name,
             table_us[si][vi], table_gbs[si][vi],
             100.0 * std::min(table_us[si][0], table_us[si][1]) / table_us[si][vi], table_us[si][2] / table_us[si][vi],
             table_us_launch[si][vi], shapes[si].prod_us / table_us[si][vi]);
    }
  }
  printf("\nper layer (qkv + o + gate/up + down), us:");
  for (int vi = 0; vi < kNumVariants; vi++) {
    double t = 0;
    for (int si = 0; si < 4; si++) t += table_us[si][vi];
    if (!std::isnan(t)) printf("  %s %.1f;", kVariants[vi].name, t);
  }
  printf("\nvalidation: %s\n", total_bad ? "FAILED" : "all kernels within bound on every shape");
  return total_bad ? 1 : 0;
}
