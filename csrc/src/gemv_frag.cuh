// Batch-1 decode GEMV over INT4 weights in the fragment order (int4_frag.cuh): gemv_int4's contract (gemv_kernels.cuh:
// 1-3 segments with their row offsets and biases, STORE / ADD / SWIGLU, f16 x or f32 x with the fused RMSNorm
// prologue, PDL) for weights the loader repacked (ORDER_FRAG; SWIGLU: the gate/up pair, ORDER_FRAG_PAIR). Promoted
// from the dev prototype's "tile" design (csrc/dev/gemm_int4_fragpack.cu gemv_int4_fragpack_tile, gemv_fp_warp,
// gemv_fp_prefetch; measured in bench/NOTES.md "Session 11" §7f, the product's lessons in "Session 12" §1-5).
//
// * Work: block (b, s) takes 64-row tile b of the concatenated segments (segments are multiples of 64 rows, so a
//   tile never straddles two; its outputs are rows 64 b .. 64 b + 63) or, for SWIGLU, tile b of the pair P (its
//   outputs are 32 b .. 32 b + 31), over split s of S of K's 128-k chunks (frag::chunk_begin). The block's WARPS
//   warps split the split's chunks among themselves (chunk_begin again) and add their tile sums in shared memory in
//   warp order. S > 1: the S blocks of a tile are one thread-block cluster (1, S, 1) (cluster rank = blockIdx.y = s)
//   and block rank r writes outputs slice r: every block pushes its sum of tile row i into slot [s][i] of the rank
//   that owns row i's output (st.async: a distributed-shared-memory store that signals complete-tx, 4 bytes, on that
//   rank's mbarrier); an owner's mbarrier expects 64 floats (S splits x 64 / S rows), and its writer threads wait on
//   it and sum the S slots in split order. Every output's sums run in a fixed order: the results do not depend on
//   scheduling.
// * Epilogue (bench/NOTES.md "Session 23" §2-5 and "Session 24" §2-3): no cluster-wide barrier after the dot and no
//   fence a push (a plain store and a release arrival compiled to MEMBAR.GPU a push: +1.5 %). The mbarriers are
//   initialised (and their 256 bytes expected) in the prologue, behind one cluster barrier waited for before the PDL
//   wait; no block leaves before the pushes into it have landed, as it waits for them. The output's other operands
//   are loaded early: the bias (a weight) before the PDL wait, the ADD's old value right after it. Pulling the
//   partials between two cluster barriers cost 2.3-3.6 µs a GEMV after the cluster's last dot.
// * A warp's chunk loop (frag_warp_dot): lane (g, t) streams its 16 bytes of the tile per 16-k step (rows 8 j + g,
//   j = 0..7; k 2t, 2t + 1, 2t + 8, 2t + 9: one 16-byte load), a ring of one chunk's 8 loads in registers (the next
//   chunk's step u is loaded as this chunk's step u is consumed), the next chunk's scales one chunk ahead. Groups
//   >= 128 (a chunk in one scale group) multiply on the tensor cores (frag_warp_dot_mma, bench/NOTES.md "Session 27"
//   §3: 296 instructions a chunk against 620, decode -2.8 %): word w of a lane's 16 bytes is the mma.m16n8k16 A
//   fragment of rows 16 w .. 16 w + 15, unpacked by LOP3 alone with the codes' offsets left in (1024 + u, 1024 +
//   16 u), x the B operand in every column (the staged x's high pairs divided by 16, frag_stage_x), one more mma a
//   step sums the offsets, and the chunk's f32 sums minus it, times the rows' scales, go into acc. Groups 32 and 64
//   multiply on the CUDA cores (frag_warp_dot_fma; the mma form's per-group accumulators and scale vectors spilled
//   there): frag::unpack_word's exact codes times the f16 x pairs, f16 products summed two steps deep (4 products
//   per f16 partial), then in f32 times the row's scale; the quad's 4 lanes hold 4 k subsets of the same 8 rows, two
//   shuffles at the end.
// * Prologue: the first chunk's weights and scales (frag_depth's first chunks: 2 in the 4-warp ADD builds) are issued
//   before pdl_wait() (they do not depend on the previous kernel; worth 8-9 % of a 7B decode step), then pdl_wait,
//   pdl_trigger, then x is staged: only the split's k range, as f16 in k order, rounded as gemv_int4 stages it
//   (stage_x_f16: f16 x as given; f32 x rounded once; with RMSNorm (x * inv) * norm_w rounded once, inv from
//   rms_inv's sum over ALL of x), in as few round trips as the split allows (frag_stage_x).
// * Plan (frag_plan): S = the largest power of two <= ceil(2 SMs / tiles), at most 16 (a non-portable cluster size:
//   gemv_frag_prepare allows it) and at most the chunk count; 8 warps where K >= 8192 (the down projection) if those
//   blocks fit one wave (2 an SM) and a warp keeps >= 2 chunks, else 4 (SWIGLU 4). Then S doubles while a warp has
//   more than 4 chunks and the blocks still fit one wave of the build's slots (frag_min_blocks x SMs; gate/up goes
//   on down to a chunk a warp), and gate/up tiles past one wave split in 2. Gate/up left at one block a tile takes 5
//   warps (groups >= 64) where those blocks still fit one wave and give a warp fewer chunks: the 14B's 432 tiles (8
//   chunks a warp, not 10). On the 7B that is the old rule's plans; the 14B / 32B q/k/v and down, the 3B down (decode
//   -9.5 / -9.8 / -6.7 %, bench/NOTES.md "Session 37" §2), the 1.5B gate/up (-6.4 %, "Session 38" §1-2) and the 14B
//   gate/up (-2.8 %, "Session 40" §2) changed. Registers:
//   __launch_bounds__ minimum per build (frag_min_blocks): a minimum of 1 let ptxas take 168 and cost the down
//   projection a second wave (NOTES "Session 12" §4).
// The kernels are sm_90 code (clusters, distributed shared memory, PDL): the sm_80 build's bodies trap; gemv.cu
// takes this path only where int4_fragment_order_available() (Hopper and the sm_90a build), the only GPUs on which
// the loader repacks.
#pragma once
#include "gemv_kernels.cuh"
#include "int4_frag.cuh"
#include "sm90_sync.cuh"

namespace nq {
namespace {

constexpr int kFragChunkK = frag::kStepK * frag::kChunkSteps;   // k of one chunk (128)
constexpr int kFragMaxSplits = 16;                              // the largest (non-portable) cluster on Hopper

// Chunks a warp has in flight (its register ring's depth): 2 for the 4-warp ADD builds of the tensor-core dot, else 1.
// On the 7B that is o (7 chunks a block: a warp's at most 2 all issued before the PDL wait, while attention runs):
// decode -0.2 % at 512, -0.5 to -0.8 % at 8K and 32K. The same ring lost for q/k/v (STORE, +1 %: at 168 registers one
// block fits beside a retiring down block's, not two) and for gate/up (SWIGLU: 4 blocks an SM, spills, +17 %); the
// issue before the wait itself is worth 8-9 % (bench/NOTES.md "Session 28" §1-4).
constexpr int frag_depth(int spg, int mode, int warps) { return spg >= 8 && mode == GEMV_ADD && warps == 4 ? 2 : 1; }
// Resident blocks per SM each build's registers are budgeted for (__launch_bounds__' minimum): 8 warps 2 and 4 warps
// 4 (128 registers), SWIGLU 5 (96 registers: the 7B's 592 P tiles in one wave of 132 x 5 blocks, not two of 132 x 4),
// a ring 2 deep 3 (168 registers). SWIGLU at group 32 (four scale vectors a chunk, twice) spilled at 96 registers
// (ptxas, sm_90a): that build takes 4, and has no wider block. SWIGLU's 5-warp block (groups >= 64) keeps 96
// registers at 4 an SM (20 warps, as 4 warps' 5). frag_plan reads the same numbers as the build's slots an SM.
constexpr int frag_min_blocks(int spg, int mode, int warps) {
  return warps == 8                          ? 2
         : frag_depth(spg, mode, warps) > 1  ? 3
         : mode == GEMV_SWIGLU && spg >= 4   ? (warps == 5 ? 4 : 5)
                                             : 4;
}

// One warp's weights in flight: DEPTH chunks' 8 steps (16 bytes per lane each) and their scale vectors; chunk i of
// the warp's lives in slot i % DEPTH.
template <int SPG, int DEPTH = 1>
struct FragRing {
  static constexpr int SEG = SPG < frag::kChunkSteps ? SPG : frag::kChunkSteps;   // steps of a chunk sharing a scale
  static constexpr int NSV = frag::kChunkSteps / SEG;                             // scale vectors per chunk
  uint4 w[DEPTH][frag::kChunkSteps];
  uint4 s[DEPTH][NSV];
};

// The scale vectors of chunk c (absolute) of the tile: lane (g, t) reads the 16 bytes of its g (the scales of rows
// 8 j + g, j = 0..7) of each scale group the chunk touches; the 4 lanes of a quad read the same address.
template <int SPG>
__device__ __forceinline__ void frag_load_scales(const frag::Tile& tile, int c, uint4 (&sv)[FragRing<SPG>::NSV]) {
  using R = FragRing<SPG>;
  const uint4* sp = tile.s + ((threadIdx.x & 31) >> 2);
#pragma unroll
  for (int v = 0; v < R::NSV; v++) sv[v] = __ldg(sp + (size_t)((frag::kChunkSteps * c + v * R::SEG) / SPG) * 8);
}
// The first DEPTH chunks (from c0) of a warp's nc chunks: their 8 weight loads each and their scales (before the PDL
// wait)
template <int SPG, int DEPTH>
__device__ __forceinline__ void frag_prefetch(const frag::Tile& tile, int c0, int nc, FragRing<SPG, DEPTH>& r) {
#pragma unroll
  for (int i = 0; i < DEPTH; i++) {
    if (i >= nc) return;
    const uint4* wp = tile.w + (size_t)frag::kChunkSteps * (c0 + i) * 32 + (threadIdx.x & 31);
#pragma unroll
    for (int u = 0; u < frag::kChunkSteps; u++) r.w[i][u] = ld_stream16(wp + u * 32);
    frag_load_scales<SPG>(tile, c0 + i, r.s[i]);
  }
}

// Row 8 j + g's scale (f32) from lane (g, t)'s scale vector sv (frag_load_scales): half j & 1 of word j / 2
__device__ __forceinline__ float frag_row_scale(const uint4& sv, int j) {
  const uint32_t w = j >> 1 == 0 ? sv.x : j >> 1 == 1 ? sv.y : j >> 1 == 2 ? sv.z : sv.w;
  return __half2float(__ushort_as_half((unsigned short)(j & 1 ? w >> 16 : w & 0xFFFFu)));
}

// frag_warp_dot on the CUDA cores (groups 32 and 64)
template <int SPG>
__device__ __forceinline__ void frag_warp_dot_fma(const frag::Tile& tile, int c0, int nc, const __half* xw,
                                              FragRing<SPG, 1>& r, float (&acc)[8]) {
  constexpr int SEG = FragRing<SPG>::SEG, NSV = FragRing<SPG>::NSV;
  static_assert(SEG % 2 == 0, "the 2-step f16 partial sums lie inside one scale group");
  const int lane = threadIdx.x & 31, t = lane & 3;
  const uint4* wp = tile.w + (size_t)frag::kChunkSteps * c0 * 32 + lane;
#pragma unroll
  for (int j = 0; j < 8; j++) acc[j] = 0.f;
  for (int c = 0; c < nc; c++) {
    const bool more = c + 1 < nc;
    uint4 scur[NSV];
#pragma unroll
    for (int v = 0; v < NSV; v++) scur[v] = r.s[0][v];
    if (more) frag_load_scales<SPG>(tile, c0 + c + 1, r.s[0]);
    const uint4* wn = wp + (size_t)(c + 1) * frag::kChunkSteps * 32;
    const __half* xc = xw + kFragChunkK * c + 2 * t;
    __half2 h[8];   // h[j]: row 8 j + g, the f16 partial of two steps (k pairs (2t, 2t + 1) and (2t + 8, 2t + 9))
#pragma unroll
    for (int u = 0; u < frag::kChunkSteps; u++) {
      const uint4 cur = r.w[0][u];
      if (more) r.w[0][u] = ld_stream16(wn + u * 32);
      const __half2 xlo = *reinterpret_cast<const __half2*>(xc + frag::kStepK * u);
      const __half2 xhi = *reinterpret_cast<const __half2*>(xc + frag::kStepK * u + 8);
      const uint32_t cw[4] = {cur.x, cur.y, cur.z, cur.w};
#pragma unroll
      for (int w = 0; w < 4; w++) {   // word w: rows 16 w + g (pairs 0, 1) and 16 w + 8 + g (pairs 2, 3)
        __half2 p[4];
        frag::unpack_word(cw[w], p);
        if (u % 2 == 0) {
          h[2 * w] = __hfma2(p[1], xhi, __hmul2(p[0], xlo));
          h[2 * w + 1] = __hfma2(p[3], xhi, __hmul2(p[2], xlo));
        } else {
          h[2 * w] = __hfma2(p[1], xhi, __hfma2(p[0], xlo, h[2 * w]));
          h[2 * w + 1] = __hfma2(p[3], xhi, __hfma2(p[2], xlo, h[2 * w + 1]));
        }
      }
      if (u % 2 == 1) {   // steps u - 1 and u share a scale group (SEG even): f32, times the row's scale
        const uint4 sv = scur[u / SEG];
#pragma unroll
        for (int j = 0; j < 8; j++)
          acc[j] = fmaf(frag_row_scale(sv, j), __low2float(h[j]) + __high2float(h[j]), acc[j]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; j++) {   // the quad's 4 k subsets
    acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 1);
    acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 2);
  }
}

// D = A B (first: ptxas folds the zero D into the HMMA's RZ operand) or A B + D: one mma.m16n8k16 (mma16816)
__device__ __forceinline__ void frag_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1, bool first) {
  if (first) d[0] = d[1] = d[2] = d[3] = 0.f;
  mma16816(d, a0, a1, a2, a3, b0, b1);
}

// frag_warp_dot on the tensor cores (a chunk in one scale group). Per step and word w: A = the codes of rows 16 w ..
// 16 w + 15 as unpacked by LOP3 (k 2t, 2t + 1: 1024 + u; k 2t + 8, 2t + 9: 1024 + 16 u, exact f16), B = x (lane (g,
// t): the pairs (2t, 2t + 1) and (2t + 8, 2t + 9) / 16, whatever g: every column the same), so D's rows are
// sum_k u x + 1024 x (low pairs) + 64 x (high pairs), f32 over the chunk's 8 steps; the codes are u - 8, and one more
// mma a step with the constant A (1032 on the low pairs, 1152 on the high ones) gives the offsets' sum to subtract.
// d[w][0] / d[w][2] are rows 16 w + g / 16 w + 8 + g (= 8 j + g, j = 2 w, 2 w + 1) in every lane of the quad.
template <int SPG, int DEPTH>
__device__ __forceinline__ void frag_warp_dot_mma(const frag::Tile& tile, int c0, int nc, const __half* xw,
                                                  FragRing<SPG, DEPTH>& r, float (&acc)[8]) {
  static_assert(FragRing<SPG>::SEG == frag::kChunkSteps && FragRing<SPG>::NSV == 1, "one scale vector a chunk");
  const int lane = threadIdx.x & 31, t = lane & 3;
  const uint4* wp = tile.w + (size_t)frag::kChunkSteps * c0 * 32 + lane;
  constexpr uint32_t kLo = 0x64086408u, kHi = 0x64806480u;   // f16 pairs (1032, 1032) and (1152, 1152)
#pragma unroll
  for (int j = 0; j < 8; j++) acc[j] = 0.f;
  // chunk c from slot q (= c % DEPTH); its slot then takes chunk c + DEPTH
  auto chunk = [&](int c, int q) {
    const bool more = c + DEPTH < nc;
    const uint4 sv = r.s[q][0];
    if (more) frag_load_scales<SPG>(tile, c0 + c + DEPTH, r.s[q]);
    const uint4* wn = wp + (size_t)(c + DEPTH) * frag::kChunkSteps * 32;
    const __half* xc = xw + kFragChunkK * c + 2 * t;
    float d[4][4], dk[4];   // d[w]: m16 tile w's sums over the chunk; dk: the offsets' sum (all its elements equal)
#pragma unroll
    for (int u = 0; u < frag::kChunkSteps; u++) {
      const uint4 cur = r.w[q][u];
      if (more) r.w[q][u] = ld_stream16(wn + u * 32);
      const uint32_t xlo = *reinterpret_cast<const uint32_t*>(xc + frag::kStepK * u);
      const uint32_t xhi = *reinterpret_cast<const uint32_t*>(xc + frag::kStepK * u + 8);
      const uint32_t cw[4] = {cur.x, cur.y, cur.z, cur.w};
#pragma unroll
      for (int w = 0; w < 4; w++) {   // A = {row g: k lo, row g + 8: k lo, row g: k hi, row g + 8: k hi}
        const uint32_t y = cw[w] >> 8;
        frag_mma(d[w], frag::lop3_and_or(cw[w], 0x000F000Fu, 0x64006400u),
                 frag::lop3_and_or(y, 0x000F000Fu, 0x64006400u), frag::lop3_and_or(cw[w], 0x00F000F0u, 0x64006400u),
                 frag::lop3_and_or(y, 0x00F000F0u, 0x64006400u), xlo, xhi, u == 0);
      }
      frag_mma(dk, kLo, kLo, kHi, kHi, xlo, xhi, u == 0);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j] = fmaf(frag_row_scale(sv, j), d[j >> 1][2 * (j & 1)] - dk[0], acc[j]);
  };
  for (int c = 0; c < nc; c += DEPTH) {
#pragma unroll
    for (int q = 0; q < DEPTH; q++)
      if (q == 0 || c + q < nc) chunk(c + q, q);
  }
}

// Whether the SPG build's dot runs on the tensor cores (frag_warp_dot_mma; its staged x has the high pairs / 16)
template <int SPG>
constexpr bool kFragMmaDot = FragRing<SPG>::SEG == frag::kChunkSteps;

// The warp's sums of the tile's 64 rows over chunks [c0, c0 + nc) (absolute), x of those chunks at xw (f16, k order:
// xw[0] is k = 128 c0; kFragMmaDot: the high pairs / 16). Returns acc[j] = the sum of row 8 j + g (g = lane / 4) in
// every lane of the quad; zeros when nc == 0. frag_prefetch(tile, c0, nc, r) issued the first chunk.
template <int SPG, int DEPTH>
__device__ __forceinline__ void frag_warp_dot(const frag::Tile& tile, int c0, int nc, const __half* xw,
                                              FragRing<SPG, DEPTH>& r, float (&acc)[8]) {
  if constexpr (kFragMmaDot<SPG>)
    frag_warp_dot_mma<SPG, DEPTH>(tile, c0, nc, xw, r, acc);
  else
    frag_warp_dot_fma<SPG>(tile, c0, nc, xw, r, acc);
}

// a unit of 8 f16 times f (one f16 rounding each; exact for a power of two above f16's subnormals)
__device__ __forceinline__ uint4 h2x4_scale(uint4 u, float f) {
  const __half2 k = __float2half2_rn(f);
  return make_uint4(h2_as_u32(__hmul2(u32_as_h2(u.x), k)), h2_as_u32(__hmul2(u32_as_h2(u.y), k)),
                    h2_as_u32(__hmul2(u32_as_h2(u.z), k)), h2_as_u32(__hmul2(u32_as_h2(u.w), k)));
}

// 8 f32 -> one unit of 8 f16 (round to nearest), in order
__device__ __forceinline__ uint4 f16x8(const float (&y)[8]) {
  uint4 o;
  o.x = h2_as_u32(__floats2half2_rn(y[0], y[1]));
  o.y = h2_as_u32(__floats2half2_rn(y[2], y[3]));
  o.z = h2_as_u32(__floats2half2_rn(y[4], y[5]));
  o.w = h2_as_u32(__floats2half2_rn(y[6], y[7]));
  return o;
}

// x's k range [k0, k0 + 8 n) into xs as n f16 units in k order (xs[p] = x[k0 + 8 p .. + 7]), rounded as
// stage_x_f16 rounds x for gemv_int4: x_f16 as given; x_f32 once to f16; with norm_w ((x * inv) * norm_w) once, inv
// = rms_inv over all K of x (block-wide; every path sums the squares in rms_inv's order, so inv is the same). Loads
// batched B deep per thread. RMSNorm takes the fewest round trips its case allows (bench/NOTES.md "Session 24"): the
// whole of x (S = 1) with xf (shared memory for K / 4 float4s: SWIGLU's) in two, at most one unit a thread in one
// pass, else rms_inv then the units. HI16 (the tensor-core dot, frag_warp_dot_mma): the odd units (k % 16 >= 8: the
// high pairs) hold x / 16 instead, exact (a power of two) down to f16's subnormals: the f16 x / 16, or the f32 value
// / 16 rounded once. Ends with __syncthreads.
template <bool HI16>
__device__ __forceinline__ void frag_stage_x(const GemvArgs& a, int K, int k0, int n, uint4* xs, float* red,
                                             float4* xf) {
  const int bd = blockDim.x;
  // unit p's factor: 1 / 16 where HI16 and p is odd (k0 is a multiple of 16, so p's parity is k's unit parity)
  auto factor = [](int p) { return HI16 && (p & 1) ? 1.f / 16 : 1.f; };
  if (a.x_f16) {
    constexpr int B = 4;
    const uint4* src = reinterpret_cast<const uint4*>(a.x_f16 + k0);
    for (int p0 = threadIdx.x; p0 < n; p0 += B * bd) {
      uint4 u[B];
#pragma unroll
      for (int b = 0; b < B; b++)
        if (p0 + b * bd < n) u[b] = src[p0 + b * bd];
#pragma unroll
      for (int b = 0; b < B; b++)
        if (p0 + b * bd < n) xs[p0 + b * bd] = HI16 && ((p0 + b * bd) & 1) ? h2x4_scale(u[b], 1.f / 16) : u[b];
    }
  } else if (xf != nullptr && a.norm_w != nullptr && 8 * n == K && (K >> 2) <= kRmsBatch * bd) {
    // RMSNorm over the whole of x (S = 1: the SWIGLU gate/up pair) in one pass of rms_inv: thread i loads its
    // float4s of x (i + b bd, rms_inv's order), sums their squares and parks them in xf (shared memory, its own
    // slots); after the block sum it loads its norm weights, all at once, and stages from xf. Two round trips
    // instead of rms_inv's pass and two of x and the weights; x is not held in registers across the block sum
    // (that spilled at the build's 96 registers, or serialised the weight loads).
    constexpr int B = kRmsBatch;
    const int q4 = K >> 2;
    const float4* x4 = reinterpret_cast<const float4*>(a.x_f32);
    const float4* w4 = reinterpret_cast<const float4*>(a.norm_w);
    float ss = 0.f;
    {
      float4 v[B];
#pragma unroll
      for (int b = 0; b < B; b++) {
        const int i = threadIdx.x + b * bd;
        v[b] = i < q4 ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int b = 0; b < B; b++) {
        const int i = threadIdx.x + b * bd;
        ss += sumsq4(v[b]);
        if (i < q4) xf[i] = v[b];
      }
    }
    const float inv = rms_inv_of(block_sum(ss, red), K, a.eps);
    float4 w[B];   // an index past x reads x's last float4 (unused): the loads need no branch
#pragma unroll
    for (int b = 0; b < B; b++) w[b] = __ldg(w4 + min((int)threadIdx.x + b * bd, q4 - 1));
    uint2* xs2 = reinterpret_cast<uint2*>(xs);   // 4 f16 of x a float4: xs2[i] = x[4 i .. 4 i + 3]
#pragma unroll
    for (int b = 0; b < B; b++) {
      const int i = threadIdx.x + b * bd;
      if (i < q4) {
        const float4 x = xf[i];
        const float f = factor(i >> 1);   // xs2[i] is half of unit i / 2
        uint2 o;
        o.x = h2_as_u32(__floats2half2_rn(x.x * inv * w[b].x * f, x.y * inv * w[b].y * f));
        o.y = h2_as_u32(__floats2half2_rn(x.z * inv * w[b].z * f, x.w * inv * w[b].w * f));
        xs2[i] = o;
      }
    }
  } else if (a.norm_w != nullptr && n <= bd) {
    // RMSNorm with at most one unit a thread (the 7B's qkv: 4 splits, 112 units, 128 threads): the unit's x and norm
    // weights are loaded with rms_inv's pass, so staging costs one round trip instead of two
    const float4* x4 = reinterpret_cast<const float4*>(a.x_f32 + k0);
    const float4* w4 = reinterpret_cast<const float4*>(a.norm_w + k0);
    const int p = threadIdx.x;
    float4 v0{}, v1{}, n0{}, n1{};
    if (p < n) {
      v0 = x4[2 * p];
      v1 = x4[2 * p + 1];
      n0 = __ldg(w4 + 2 * p);
      n1 = __ldg(w4 + 2 * p + 1);
    }
    const float inv = rms_inv(a, K, red);
    if (p < n) {
      const float f[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
      const float w[8] = {n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w};
      float y[8];
#pragma unroll
      for (int e = 0; e < 8; e++) y[e] = f[e] * inv * w[e] * factor(p);
      xs[p] = f16x8(y);
    }
  } else {
    const float inv = rms_inv(a, K, red);
    constexpr int B = 2;
    const bool norm = a.norm_w != nullptr;
    const float4* x4 = reinterpret_cast<const float4*>(a.x_f32 + k0);
    const float4* w4 = reinterpret_cast<const float4*>(norm ? a.norm_w + k0 : a.x_f32 + k0);
    for (int p0 = threadIdx.x; p0 < n; p0 += B * bd) {
      float4 v0[B], v1[B], n0[B], n1[B];
#pragma unroll
      for (int b = 0; b < B; b++) {
        const int p = p0 + b * bd;
        if (p < n) {
          v0[b] = x4[2 * p];
          v1[b] = x4[2 * p + 1];
          if (norm) { n0[b] = w4[2 * p]; n1[b] = w4[2 * p + 1]; }
        }
      }
#pragma unroll
      for (int b = 0; b < B; b++) {
        const int p = p0 + b * bd;
        if (p < n) {
          float f[8] = {v0[b].x, v0[b].y, v0[b].z, v0[b].w, v1[b].x, v1[b].y, v1[b].z, v1[b].w};
          if (norm) {
            const float w[8] = {n0[b].x, n0[b].y, n0[b].z, n0[b].w, n1[b].x, n1[b].y, n1[b].z, n1[b].w};
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] = f[e] * inv * w[e];
          }
#pragma unroll
          for (int e = 0; e < 8; e++) f[e] *= factor(p);
          xs[p] = f16x8(f);
        }
      }
    }
  }
  __syncthreads();
}

// STORE / ADD: tile b of the concatenated segments -> its weights, its segment's bias and its first row in the segment
struct FragTileRef {
  frag::Tile tile;
  const float* bias;
  int row0;
};
__device__ __forceinline__ FragTileRef frag_locate(const GemvArgs& a, int b) {
  const int t0 = a.seg[0].N / frag::kTileRows, t1 = a.nseg > 1 ? a.seg[1].N / frag::kTileRows : 0;
  if (a.nseg > 2 && b >= t0 + t1)
    return {frag::tile_of(a.seg[2], b - t0 - t1), a.bias[2], frag::kTileRows * (b - t0 - t1)};
  if (a.nseg > 1 && b >= t0) return {frag::tile_of(a.seg[1], b - t0), a.bias[1], frag::kTileRows * (b - t0)};
  return {frag::tile_of(a.seg[0], b), a.bias[0], frag::kTileRows * b};
}

// The epilogue's operands that do not depend on the dot, loaded early so that their round trips overlap the stream:
// STORE / ADD output o (0..63) of tile b: its bias (a weight: before the PDL wait, load_bias) and, ADD, the value it
// adds to (written by an earlier kernel: after the wait, load_old). SWIGLU has neither.
struct FragOutPre {
  float bias = 0.f, old = 0.f;
};
template <int MODE>
__device__ __forceinline__ void frag_load_bias(const GemvArgs& a, int b, int o, FragOutPre& p) {
  if constexpr (MODE != GEMV_SWIGLU) {
    const FragTileRef t = frag_locate(a, b);
    if (t.bias) p.bias = __ldg(t.bias + t.row0 + o);
  }
}
template <int MODE>
__device__ __forceinline__ void frag_load_old(const GemvArgs& a, int b, int o, FragOutPre& p) {
  if constexpr (MODE == GEMV_ADD) p.old = a.out_f32[frag::kTileRows * b + o];
}
// Output o (0..63 of tile b; SWIGLU 0..31 of P tile b), sum(i) giving the tile's total of tile row i: as store_row
// (STORE y + bias, ADD old + (y + bias)) and swiglu_f16
template <int MODE, class Sum>
__device__ __forceinline__ void frag_output(const GemvArgs& a, int b, int o, const FragOutPre& p, Sum sum) {
  if constexpr (MODE == GEMV_SWIGLU) {   // output 32 b + 8 q + g: gate = P row 16 q + g (n8-tile 2q), up = 16 q + 8 + g
    const int q = o >> 3, g = o & 7;
    a.out_f16[32 * b + o] = swiglu_f16(sum(16 * q + g), sum(16 * q + 8 + g));
  } else {
    const float y = sum(o) + p.bias;
    a.out_f32[frag::kTileRows * b + o] = MODE == GEMV_ADD ? p.old + y : y;
  }
}

template <int SPG, int MODE, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, frag_min_blocks(SPG, MODE, WARPS))
gemv_frag_kernel(const GemvArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 xs_units[];   // the split's k range of x, f16 in k order
  __shared__ float red[32];
  __shared__ float warp_sums[WARPS][frag::kTileRows];
  __shared__ float tile_sums[frag::kTileRows];                // this split's sums of the tile's rows
  __shared__ float slots[kFragMaxSplits][frag::kTileRows];    // S > 1: split z's sum of tile row i at [z][i] (pushed)
  __shared__ __align__(8) unsigned long long slots_full;      // S > 1: full when 64 pushed slots (256 bytes) landed
  __shared__ float4 x_f32[MODE == GEMV_SWIGLU ? kRmsBatch * 32 * WARPS : 1];   // SWIGLU: x (f32) while rms sums
  constexpr int kOut = MODE == GEMV_SWIGLU ? frag::kTileRows / 2 : frag::kTileRows;   // outputs of a tile
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int K = a.seg[0].K, KC = K / kFragChunkK;
  const int S = gridDim.y, s = blockIdx.y, b = blockIdx.x;
  const int c0 = frag::chunk_begin(KC, s, S), nc = frag::chunk_begin(KC, s + 1, S) - c0;       // the split's chunks
  const int w0 = frag::chunk_begin(nc, warp, WARPS), nw = frag::chunk_begin(nc, warp + 1, WARPS) - w0;   // the warp's
  const frag::Tile tile = MODE == GEMV_SWIGLU ? frag::pair_tile(a.seg[0], a.up, b) : frag_locate(a, b).tile;
  FragRing<SPG, frag_depth(SPG, MODE, WARPS)> ring;
  frag_prefetch(tile, c0 + w0, nw, ring);   // weights never depend on the previous kernel
  // the output this thread writes, if any: output o of the tile (S > 1: cluster rank s writes slice s of kOut / S)
  const int per = kOut / S, o = s * per + (int)threadIdx.x;   // S: a power of two <= 16, which divides 32 and 64
  const bool writes = (int)threadIdx.x < per;
  FragOutPre pre;
  if (writes) frag_load_bias<MODE>(a, b, o, pre);
  if (S > 1) {   // the mbarrier the cluster pushes into, initialised before any rank can push into it
    if (threadIdx.x == 0) {
      mbarrier_init(smem_u32(&slots_full), 1);
      // S splits x 64 / S rows each
      mbarrier_arrive_expect_tx(smem_u32(&slots_full), frag::kTileRows * sizeof(float));
      fence_mbarrier_init_cluster();
    }
    cluster_arrive_relaxed();   // fence.mbarrier_init above orders the init before it (no MEMBAR.GPU)
    cluster_wait();   // here, not after the dot: the cluster's blocks start together, and this overlaps the PDL wait
  }
  pdl_wait();                                    // x / out were written by the previous kernel
  pdl_trigger();
  if (writes) frag_load_old<MODE>(a, b, o, pre);
  frag_stage_x<kFragMmaDot<SPG>>(a, K, kFragChunkK * c0, nc * kFragChunkK / 8, xs_units, red,
                                 MODE == GEMV_SWIGLU ? x_f32 : nullptr);
  float acc[8];
  frag_warp_dot(tile, c0 + w0, nw, reinterpret_cast<const __half*>(xs_units) + kFragChunkK * w0, ring, acc);
  if (t == 0)
#pragma unroll
    for (int j = 0; j < 8; j++) warp_sums[warp][8 * j + g] = acc[j];
  __syncthreads();
  float v = 0.f;   // thread i < 64: this split's sum of tile row i
  if (threadIdx.x < frag::kTileRows)
#pragma unroll
    for (int w = 0; w < WARPS; w++) v += warp_sums[w][threadIdx.x];   // warp order
  if (S == 1) {
    if (threadIdx.x < frag::kTileRows) tile_sums[threadIdx.x] = v;
    __syncthreads();
    if (writes) frag_output<MODE>(a, b, o, pre, [&](int i) { return tile_sums[i]; });
    return;
  }
  if (threadIdx.x < frag::kTileRows) {   // push tile row i's sum to the rank owning the output it feeds
    const int i = threadIdx.x;
    const int owner = (MODE == GEMV_SWIGLU ? 8 * (i >> 4) + (i & 7) : i) / per;
    st_async_f32(map_cluster(&slots[s][i], owner), v, map_cluster(&slots_full, owner));
  }
  if (writes) {
    mbarrier_wait_parity_cluster(smem_u32(&slots_full), 0);   // every split's slots of this rank's outputs
    frag_output<MODE>(a, b, o, pre, [&](int row) {
      float sum = 0.f;
      for (int z = 0; z < S; z++) sum += slots[z][row];   // split order
      return sum;
    });
  }
  // No exit barrier: every block of the cluster owns outputs (per >= 1), and its writer threads wait until all 64
  // floats pushed into it have landed, so no block leaves while another may still write into it; the pushes read
  // registers only (st.async), so a sender may leave once they are issued. racecheck and synccheck are clean
  // without it (bench/NOTES.md "Session 24" §3); it cost ~0.4 %.
#else
  __trap();    // sm_80 build: never launched (gemv.cu takes this path only where int4_fragment_order_available())
#endif
}

// ---- host ---------------------------------------------------------------------------------------------------------
struct FragPlan {
  int splits, warps;
};
inline FragPlan frag_plan(int tiles, int K, int mode, int spg, int sm_count) {
  const int KC = K / kFragChunkK;
  const int want = (2 * sm_count + tiles - 1) / tiles;   // ceil(2 SMs / tiles)
  int S = 1;
  while (2 * S <= want && 2 * S <= kFragMaxSplits && 2 * S <= KC) S *= 2;
  // 8 warps for the down projection only where its blocks fit one wave (2 an SM) and a warp keeps >= 2 chunks
  int W = 4;
  if (mode != GEMV_SWIGLU && K >= 8192 && tiles * S <= frag_min_blocks(spg, mode, 8) * sm_count && KC >= 16 * S)
    W = 8;
  const int slots = frag_min_blocks(spg, mode, W) * sm_count;   // blocks resident at once
  // Split further while the halves still fit one wave and a warp has chunks to spare: more than 4 (one round trip
  // after another once the first is spent); gate/up down to a chunk a warp after the halving (the 1.5B's 280 tiles
  // at 3 chunks a warp in 2: decode -6.4 %, bench/NOTES.md "Session 38" §1-2; the 0.5B's 304 blocks in 4, 0.4 a
  // warp, lost 3.2 %)
  while ((mode == GEMV_SWIGLU ? KC >= 2 * W * S : KC > 4 * W * S) && 2 * S <= kFragMaxSplits && 2 * tiles * S <= slots)
    S *= 2;
  // Gate/up tiles alone past one wave (the 32B's: 864 for 660): halves, so the second wave is half as long
  // (measured there, bench/NOTES.md "Session 37" §2; at group 32, 4 blocks an SM, the 7B's 592 take it too: a tie
  // with one block a tile, "Session 38" §1; no other decode GEMV has more tiles than slots)
  if (mode == GEMV_SWIGLU && tiles > slots && 2 * S <= KC) S *= 2;
  // Gate/up at one block a tile: 5 warps where those blocks still fit one wave and give a warp fewer chunks than 4
  // warps do (the 14B's 432 tiles: 8 chunks a warp instead of 10, 16 warps an SM instead of 13, and its x fits the
  // one-pass RMSNorm staging; decode -2.8 %, bench/NOTES.md "Session 40" §2). 6 warps (the 3B's 344 tiles at 3
  // chunks, not 4) gained only 0.8 / 1.5 % there and are not built; 7 lost on the 0.5B.
  if (mode == GEMV_SWIGLU && S == 1 && spg >= 4 && tiles <= frag_min_blocks(spg, mode, 5) * sm_count &&
      (KC + 4) / 5 < (KC + W - 1) / W)
    W = 5;
  return FragPlan{S, W};
}

template <int SPG, int MODE, int WARPS>
int launch_gemv_frag(const GemvArgs& a, int tiles, int S, cudaStream_t st) {
  const int KC = a.seg[0].K / kFragChunkK;
  const size_t smem = (size_t)((KC + S - 1) / S) * kFragChunkK * sizeof(__half);   // the longest split's x
  if (smem > (size_t)kMaxDynSmem)
    return fail(NQ_E_UNSUPPORTED, "gemv: K=%d too large for the fragment order", a.seg[0].K);
  if (S == 1)
    return launch_pdl("gemv_frag", gemv_frag_kernel<SPG, MODE, WARPS>, dim3(tiles), dim3(32 * WARPS), smem, st, a);
  return launch_pdl_cluster("gemv_frag", gemv_frag_kernel<SPG, MODE, WARPS>, dim3(tiles, S), dim3(32 * WARPS),
                            dim3(1, S, 1), smem, st, a);
}

template <int SPG>
int gemv_frag_spg(const GemvArgs& a, int tiles, const FragPlan& p, cudaStream_t st) {
  switch (a.mode) {
    case GEMV_STORE:
      return p.warps == 8 ? launch_gemv_frag<SPG, GEMV_STORE, 8>(a, tiles, p.splits, st)
                          : launch_gemv_frag<SPG, GEMV_STORE, 4>(a, tiles, p.splits, st);
    case GEMV_ADD:
      return p.warps == 8 ? launch_gemv_frag<SPG, GEMV_ADD, 8>(a, tiles, p.splits, st)
                          : launch_gemv_frag<SPG, GEMV_ADD, 4>(a, tiles, p.splits, st);
    case GEMV_SWIGLU:
      if constexpr (SPG >= 4) {   // the wider block (frag_min_blocks)
        if (p.warps == 5) return launch_gemv_frag<SPG, GEMV_SWIGLU, 5>(a, tiles, p.splits, st);
      }
      return launch_gemv_frag<SPG, GEMV_SWIGLU, 4>(a, tiles, p.splits, st);
  }
  return fail(NQ_E_INVALID_ARG, "gemv: unknown mode %d", a.mode);
}

// The 64-row tiles (SWIGLU: tiles of the gate/up pair, 32 outputs each) of a GEMV of `rows` outputs
inline int gemv_frag_tiles(int rows, int mode) {
  return mode == GEMV_SWIGLU ? rows / (frag::kTileRows / 2) : rows / frag::kTileRows;
}

// The fragment-order GEMV of `rows` outputs (the segments' N summed; SWIGLU: gate.N). The caller (gemv.cu) checked
// the orders, shapes (frag::shape_ok) and the one group of every segment and of `up`.
int gemv_frag(const GemvArgs& a, int rows, int sm_count, cudaStream_t st) {
  const int tiles = gemv_frag_tiles(rows, a.mode);
  const FragPlan p = frag_plan(tiles, a.seg[0].K, a.mode, a.seg[0].group / frag::kStepK, sm_count);
  switch (a.seg[0].group) {
    case 32: return gemv_frag_spg<2>(a, tiles, p, st);
    case 64: return gemv_frag_spg<4>(a, tiles, p, st);
    case 128: return gemv_frag_spg<8>(a, tiles, p, st);
    case 256: return gemv_frag_spg<16>(a, tiles, p, st);
  }
  return fail(NQ_E_UNSUPPORTED, "gemv: no fragment-order build for group %d", a.seg[0].group);
}

// Every instantiation's limits: the dynamic shared memory (x's range) and clusters above 8 blocks.
template <int SPG, int MODE, int WARPS>
cudaError_t gemv_frag_attrs() {
  const cudaError_t e = cudaFuncSetAttribute(gemv_frag_kernel<SPG, MODE, WARPS>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDynSmem);
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(gemv_frag_kernel<SPG, MODE, WARPS>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}
template <int SPG>
cudaError_t gemv_frag_attrs_spg() {
  cudaError_t e;
  if ((e = gemv_frag_attrs<SPG, GEMV_STORE, 4>())) return e;
  if ((e = gemv_frag_attrs<SPG, GEMV_STORE, 8>())) return e;
  if ((e = gemv_frag_attrs<SPG, GEMV_ADD, 4>())) return e;
  if ((e = gemv_frag_attrs<SPG, GEMV_ADD, 8>())) return e;
  if constexpr (SPG >= 4)
    if ((e = gemv_frag_attrs<SPG, GEMV_SWIGLU, 5>())) return e;
  return gemv_frag_attrs<SPG, GEMV_SWIGLU, 4>();
}
// Only where the path runs (int4_fragment_order_available(): the cluster attribute needs sm_90).
cudaError_t gemv_frag_prepare() {
  cudaError_t e;
  if ((e = gemv_frag_attrs_spg<2>())) return e;
  if ((e = gemv_frag_attrs_spg<4>())) return e;
  if ((e = gemv_frag_attrs_spg<8>())) return e;
  return gemv_frag_attrs_spg<16>();
}

}  // namespace
}  // namespace nq
