// gemm_int4_frag: the few-token INT4 GEMM over weights in the fragment order (int4_frag.cuh), 1 to 64 tokens a
// launch (launcher: more in 64-token pieces). Contract of gemm_multi / gemm_swiglu (kernels.h): C[M, N] (+)= A[M, K]
// @ W[N, K]^T (+ bias) for 1-3 segments sharing A (GemmGroup: each its W in ORDER_FRAG, C, bias; ldc, add), or the
// SwiGLU pair (g.swiglu_out set; g.s[0].W = gate, g.s[1].W = up, both ORDER_FRAG_PAIR): H[M, I] f16 = silu(A gate^T)
// * (A up^T). Promoted from csrc/dev/gemm_int4_fragpack.cu's gemm_int4_fragpack<MT, 4, SPG, SACC = false, RING = 0,
// MODE = 0, CLUSTER = true>, the measured design (bench/NOTES.md "Session 11" §7b-7h, "Session 12" §1-4).
//
// * Block = 4 warps; warp w takes one 64-row tile (tile_of: nb = 4 (blockIdx.x - the segment's first block) + w;
//   SwiGLU: P tile T = 4 blockIdx.x + w, pair_tile). The block's tokens (16 MT rows, MT = 1 / 2 / 4 for M <= 16 / 32
//   / 64; rows >= M zero) of its split's k range are staged in shared memory once and read with ldmatrix.x4 as the
//   mma.m16n8k16 A operand (tokens); the weights are the B operand (8 rows n a n8-tile): word w of a lane's 16 bytes
//   is n8-tiles 2w and 2w + 1 (unpack_word: pairs 0, 1 and 2, 3). Accumulator acc[m][j][e] = (token 16 m + g + 8 (e
//   >> 1), tile row 8 j + 2 t + (e & 1)), lane = 4 g + t.
// * Weights: one chunk (kChunkSteps = 8 steps of 16 k, one 16-byte streaming load a step and lane) in registers,
//   each step's registers refilled with the next chunk's load as the step consumes them; the next chunk's scales one
//   chunk ahead (NSV scale vectors a chunk: group 32 -> 4, 64 -> 2, >= 128 -> 1). The first chunk's weights and scales
//   are issued before pdl_wait() and the staging of A (they do not depend on the previous kernel).
// * Dequantisation: the exact codes (unpack_word) times the row's f16 scale, one HMUL2 per pair: f16(q s), one
//   rounding, the same f16 weights as gemm_int4_mma / gemm_int4_wgmma (dq_pair) at every M. (The prototype's SACC,
//   the scale on f32 segment sums, rounds differently: a prefix-cache hit then differed from its cold run by 1.24e-3,
//   NOTES Session 12 §3; not used.)
// * Split-K over a thread-block cluster (1, S, 1) (grid (column blocks, S), S <= 16: Hopper's non-portable cluster
//   size; the launcher's rule below). Split s owns chunks [chunk_begin(KC, s, S), chunk_begin(KC, s + 1, S)). Each
//   block leaves its f32 partial [16 MT tokens][256 columns] in its own shared memory (over the staged A), the cluster
//   syncs, and block rank r (= split r) sums slice r of the M * 256 values over the S blocks' shared memory in split
//   order (distributed shared memory: deterministic, no global scratch), then applies the epilogue. S = 1: no
//   cluster, each lane stores its accumulators.
// * SwiGLU: P tile T's n8-tiles 2q and 2q + 1 are gate and up rows 32 T + 8 q + 0..7 (int4_frag.cuh), so acc[m][2q][e]
//   and acc[m][2q + 1][e] are g and u of output 32 T + 8 q + 2 t + (e & 1): H = swiglu_f16(g, u) (device_util.cuh,
//   every SwiGLU path's formula and rounding). The cluster partial puts g and u of one output side by side (column
//   64 w + 2 o + h of the block's partial, o = the tile's output 0..31, h = 0 gate / 1 up), so the reducer's float4
//   is (g, u) of outputs 128 blockIdx.x + col / 2 and + 1.
// sm_90 only (clusters, DSMEM, griddepcontrol): the sm_80 build compiles the kernel empty and the host takes this
// path only where the weights are in the fragment order (int4_fragment_order_available(): the loader repacks then).
#pragma once
#include <cooperative_groups.h>
#include <algorithm>
#include "gemm_kernels.cuh"
#include "int4_frag.cuh"
#include "launch.h"

namespace nq {
namespace {

constexpr int kFragWarps = 4;                              // a block: 4 warps, one 64-row tile each
constexpr int kFragThreads = 32 * kFragWarps;
constexpr int kFragRB = frag::kTileRows * kFragWarps;      // W (or P) rows per block: 256
constexpr int kFragMaxTokens = 64;                         // tokens per launch (MT = 4)
constexpr int kFragMaxSplits = 16;                         // Hopper's largest (non-portable) cluster
constexpr int kFragChunkK = frag::kStepK * frag::kChunkSteps;   // 128

// row stride (halves) of the staged A for nk steps: 16 nk + 8, so rows are 16 bytes apart mod 128 (ldmatrix without
// bank conflicts)
__host__ __device__ inline int frag_a_stride(int nk) { return frag::kStepK * nk + 8; }
__host__ __device__ inline int frag_mt(int M) { return M <= 16 ? 1 : M <= 32 ? 2 : 4; }


// MT: 16-token m-tiles (M <= 16 MT); NSV: scale vectors a chunk (128 / group, at least 1). Grid (column blocks, S);
// launched as clusters (1, S, 1) where S > 1. Dynamic shared memory: frag_smem(MT, KC, S).
template <int MT, int NSV>
__global__ void __launch_bounds__(kFragThreads) gemm_int4_frag(const GemmGroup g, const __half* A, int lda, int M,
                                                               int ldc, int add) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(NSV == 1 || NSV == 2 || NSV == 4, "groups 32, 64, >= 128");
  constexpr int SEG = frag::kChunkSteps / NSV;   // steps sharing one scale vector within a chunk
  extern __shared__ __align__(16) unsigned char fsm[];
  __half* const As = reinterpret_cast<__half*>(fsm);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g8 = lane >> 2, t4 = lane & 3;
  const bool swiglu = g.swiglu_out != nullptr;
  const int cb = blockIdx.x;
  // segment of this column block (g.tiles0 / g.tiles1: column blocks of segments 0 and 1); SwiGLU: the pair, seg 0
  const int seg = swiglu ? 0 : (g.n > 2 && cb >= g.tiles0 + g.tiles1) ? 2 : (g.n > 1 && cb >= g.tiles0) ? 1 : 0;
  const int cbase = seg == 2 ? g.tiles0 + g.tiles1 : seg == 1 ? g.tiles0 : 0;
  const LinW W = seg == 2 ? g.s[2].W : seg == 1 ? g.s[1].W : g.s[0].W;
  const int ntiles = swiglu ? 2 * (W.N / frag::kTileRows) : W.N / frag::kTileRows;   // P has I / 32 tiles
  const int nb = (cb - cbase) * kFragWarps + warp;   // the warp's tile (of the segment, or of P)
  const bool active = nb < ntiles;                   // the tiles past N of a segment's (or P's) last block
  const frag::Tile tile = swiglu ? frag::pair_tile(g.s[0].W, g.s[1].W, active ? nb : 0)
                                 : frag::tile_of(W, active ? nb : 0);
  const int KC = W.K / kFragChunkK, S = gridDim.y, s = blockIdx.y;
  const int c0 = frag::chunk_begin(KC, s, S), nc = frag::chunk_begin(KC, s + 1, S) - c0;
  const int nk = frag::kChunkSteps * nc;            // 16-k steps of this split
  const int gshift = __ffs(W.group) - 1;            // groups are powers of two (format rule)
  // step kb (absolute) of this lane: tile.w[kb * 32 + lane]; scales of group gi, rows 8 j + g8: tile.s[gi * 8 + g8]
  const uint4* const wp = tile.w + (size_t)frag::kChunkSteps * c0 * 32 + lane;   // + (8 c + u) * 32: chunk c0 + c
  const uint4* const sp = tile.s + g8;

  uint4 wbuf[frag::kChunkSteps];   // the chunk being consumed; each step's register refilled with the next chunk's
  uint4 snext[NSV];                // the next chunk's scale vectors
  auto load_scales = [&](int c) {  // chunk c (absolute): vector v covers its steps v SEG .. v SEG + SEG - 1
#pragma unroll
    for (int v = 0; v < NSV; v++)
      snext[v] = __ldg(sp + (size_t)(((frag::kChunkSteps * c + v * SEG) * frag::kStepK) >> gshift) * 8);
  };
  if (active && nc > 0) {   // the weights do not depend on the previous kernel: out before the PDL wait
#pragma unroll
    for (int u = 0; u < frag::kChunkSteps; u++) wbuf[u] = ld_stream16(wp + u * 32);
    load_scales(c0);
  }
  pdl_wait();   // A (and C when adding) come from earlier kernels; nothing is written before this
  pdl_trigger();

  // A rows 0 .. 16 MT - 1 of k 128 c0 .. 128 (c0 + nc) - 1 into shared memory: row r at r * lds halves, rows >= M zero
  const int lds = frag_a_stride(nk), pieces = 2 * nk;   // 16-byte pieces (8 halves) a row
  const __half* const Ak = A + (size_t)kFragChunkK * c0;
  for (int i = threadIdx.x; i < 16 * MT * pieces; i += kFragThreads) {
    const int r = i / pieces, c = i - r * pieces;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < M) v = *reinterpret_cast<const uint4*>(Ak + (size_t)r * lda + 8 * c);
    *reinterpret_cast<uint4*>(As + (size_t)r * lds + 8 * c) = v;
  }
  __syncthreads();

  float acc[MT][8][4];
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[m][j][e] = 0.f;

  // ldmatrix row address of this lane: token (lane & 7) + 8 ((lane >> 3) & 1), k 8 (lane >> 4)
  const uint32_t a_base =
      smem_u32(As) + 2u * (uint32_t)(((lane & 7) + 8 * ((lane >> 3) & 1)) * lds + 8 * (lane >> 4));
  if (active) {
    for (int c = 0; c < nc; c++) {
      const bool more = c + 1 < nc;
      uint4 scur[NSV];
#pragma unroll
      for (int v = 0; v < NSV; v++) scur[v] = snext[v];
      if (more) load_scales(c0 + c + 1);   // one chunk ahead: no scale load in a step's critical path
      const uint4* const wn = wp + (size_t)(c + 1) * frag::kChunkSteps * 32;
      const uint32_t a_chunk = a_base + 2u * (uint32_t)(kFragChunkK * c);
#pragma unroll
      for (int u = 0; u < frag::kChunkSteps; u++) {
        const uint4 cur = wbuf[u];
        if (more) wbuf[u] = ld_stream16(wn + u * 32);
        const uint4 sv = scur[u / SEG];
        const uint32_t cw[4] = {cur.x, cur.y, cur.z, cur.w};
        uint32_t b[8][2];   // B fragments (b0, b1) of the tile's 8 n8-tiles
#pragma unroll
        for (int w = 0; w < 4; w++) {
          __half2 p[4], s_lo, s_hi;
          frag::unpack_word(cw[w], p);
          frag::word_scales(sv, w, &s_lo, &s_hi);   // rows 16 w + g8 (n8-tile 2w), 16 w + 8 + g8 (2w + 1)
          b[2 * w][0] = frag::h2u(__hmul2(p[0], s_lo));
          b[2 * w][1] = frag::h2u(__hmul2(p[1], s_lo));
          b[2 * w + 1][0] = frag::h2u(__hmul2(p[2], s_hi));
          b[2 * w + 1][1] = frag::h2u(__hmul2(p[3], s_hi));
        }
#pragma unroll
        for (int m = 0; m < MT; m++) {
          uint32_t af[4];
          ldmatrix_x4(af, a_chunk + 2u * (uint32_t)(16 * m * lds + frag::kStepK * u));
#pragma unroll
          for (int j = 0; j < 8; j++) mma16816(acc[m][j], af, b[j][0], b[j][1]);
        }
      }
    }
  }

  float* const C = seg == 2 ? g.s[2].C : seg == 1 ? g.s[1].C : g.s[0].C;
  const float* const bias = seg == 2 ? g.s[2].bias : seg == 1 ? g.s[1].bias : g.s[0].bias;
  auto store = [&](int m, int n, float v) {   // segment output (token m < M, column n < W.N): the final value
    float* const dst = C + (size_t)m * ldc + n;
    if (bias) v += bias[n];
    if (add) v += *dst;
    *dst = v;
  };
  if (S == 1) {   // no split: each lane stores its accumulators
    if (!active) return;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int tok = 16 * m + g8 + 8 * (e >> 1);
        if (tok >= M) continue;
        if (swiglu) {   // n8-tiles 2q (gate) and 2q + 1 (up): output 32 nb + 8 q + 2 t + (e & 1)
#pragma unroll
          for (int q = 0; q < 4; q++)
            g.swiglu_out[(size_t)tok * g.swiglu_ld + 32 * nb + 8 * q + 2 * t4 + (e & 1)] =
                swiglu_f16(acc[m][2 * q][e], acc[m][2 * q + 1][e]);
        } else {
#pragma unroll
          for (int j = 0; j < 8; j++) store(tok, frag::kTileRows * nb + 8 * j + 2 * t4 + (e & 1), acc[m][j][e]);
        }
      }
    return;
  }

  // split-K on chip: every block of the cluster reaches both cluster syncs (no early return below)
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  float* const P = reinterpret_cast<float*>(fsm);   // [16 MT][kFragRB]: this split's partial, over the staged A
  __syncthreads();                                  // every warp's last ldmatrix of A is done
  if (active) {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float* const row = P + (size_t)(16 * m + g8 + 8 * h) * kFragRB + frag::kTileRows * warp;
        if (swiglu) {   // outputs o = 8 q + 2 t, + 1 of the tile: (g, u) at columns 2 o, 2 o + 1, then o + 1's
#pragma unroll
          for (int q = 0; q < 4; q++)
            *reinterpret_cast<float4*>(row + 16 * q + 4 * t4) =
                make_float4(acc[m][2 * q][2 * h], acc[m][2 * q + 1][2 * h], acc[m][2 * q][2 * h + 1],
                            acc[m][2 * q + 1][2 * h + 1]);
        } else {        // tile rows 8 j + 2 t, + 1
#pragma unroll
          for (int j = 0; j < 8; j++)
            *reinterpret_cast<float2*>(row + 8 * j + 2 * t4) = make_float2(acc[m][j][2 * h], acc[m][j][2 * h + 1]);
        }
      }
  }
  cl.sync();   // every split's partial is in its shared memory
  {
    const int r = (int)cl.block_rank();   // = blockIdx.y: cluster (1, S, 1), grid (cols, S)
    const int tot4 = M * kFragRB / 4, per = (tot4 + S - 1) / S, i1 = min(tot4, (r + 1) * per);
    for (int i = r * per + (int)threadIdx.x; i < i1; i += kFragThreads) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int z = 0; z < S; z++) {   // split order
        const float4 p = cl.map_shared_rank(reinterpret_cast<float4*>(P), z)[i];
        v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w;
      }
      const int tok = (4 * i) / kFragRB, col = 4 * i - tok * kFragRB;
      if (swiglu) {   // (g, u) of outputs n, n + 1 (n even, I even: both < I when n is)
        const int n = (kFragRB / 2) * cb + col / 2;
        if (n < W.N) {
          __half* const h = g.swiglu_out + (size_t)tok * g.swiglu_ld + n;
          h[0] = swiglu_f16(v.x, v.y);
          h[1] = swiglu_f16(v.z, v.w);
        }
      } else {        // columns n .. n + 3 of the segment (N % 64 == 0: all four or none)
        const int n = kFragRB * (cb - cbase) + col;
        if (n < W.N) {
          store(tok, n, v.x);
          store(tok, n + 1, v.y);
          store(tok, n + 2, v.z);
          store(tok, n + 3, v.w);
        }
      }
    }
  }
  cl.sync();   // no block leaves while another still reads its shared memory
#endif
}

// ---- host side ----------------------------------------------------------------------------------------------------
// The device's SM count (device_sms) and shared-memory limits, read once per device.
struct FragLimits {
  int sms = 0;
  size_t optin = 0;      // dynamic shared memory a block may opt in to
  size_t two = 0;        // the most a block may take so that two fit on an SM
  bool wide16 = false;   // a cluster of 16 blocks of one block an SM (more than `two`) can be co-resident
  size_t per_sm = 0;     // shared memory an SM holds, and what each block of it reserves
  size_t reserved = 0;
  int reg_blocks[3][3] = {};   // blocks an SM by registers and threads: [MT 1, 2, 4][NSV 1, 2, 4]
};
inline int frag_ix(int v) { return v == 1 ? 0 : v == 2 ? 1 : 2; }   // MT or NSV 1 / 2 / 4 -> 0 / 1 / 2
inline int frag_limits(FragLimits* out) {
  static FragLimits cache[16];
  int dev = 0;
  NQ_CUDA(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 16) return fail(NQ_E_UNSUPPORTED, "gemm: device %d", dev);
  if (!cache[dev].sms) {
    int optin = 0, per_sm = 0, reserved = 0;
    NQ_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    NQ_CUDA(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    NQ_CUDA(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    FragLimits L;
    L.optin = (size_t)optin;
    L.two = (size_t)std::max(0, per_sm / 2 - reserved);
    L.sms = device_sms();
    L.per_sm = (size_t)per_sm;
    L.reserved = (size_t)reserved;
    const void* builds[3][3] = {{(const void*)gemm_int4_frag<1, 1>, (const void*)gemm_int4_frag<1, 2>,
                                 (const void*)gemm_int4_frag<1, 4>},
                                {(const void*)gemm_int4_frag<2, 1>, (const void*)gemm_int4_frag<2, 2>,
                                 (const void*)gemm_int4_frag<2, 4>},
                                {(const void*)gemm_int4_frag<4, 1>, (const void*)gemm_int4_frag<4, 2>,
                                 (const void*)gemm_int4_frag<4, 4>}};
    for (int a = 0; a < 3; a++)
      for (int b = 0; b < 3; b++)
        NQ_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&L.reg_blocks[a][b], builds[a][b], kFragThreads, 0));
    // A cluster of 16 one-per-SM blocks needs 16 SMs of one GPC (H200: measured, NOTES Session 11 §7e; other Hopper
    // parts may have fewer): asked once of the occupancy calculator with the widest build (the answer is the same for
    // every build and size above `two`: one block an SM); where it says none, frag_splits avoids that case.
    auto kern = gemm_int4_frag<4, 1>;
    NQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    NQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, kFragMaxSplits, 1);
    cfg.blockDim = dim3(kFragThreads);
    cfg.dynamicSmemBytes = (size_t)optin;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = kFragMaxSplits;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      clusters = 0;
    }
    L.wide16 = clusters > 0;
    cache[dev] = L;
  }
  *out = cache[dev];
  return NQ_OK;
}

// Dynamic shared memory of a launch: the staged A of the longest split (16 MT rows of ceil(KC / S) chunks) and, split,
// the partial [16 MT][kFragRB] f32 laid over it.
inline size_t frag_smem(int mt, int KC, int S) {
  const int nk = frag::kChunkSteps * ((KC + S - 1) / S);
  const size_t a = (size_t)16 * mt * frag_a_stride(nk) * 2;
  const size_t p = S > 1 ? (size_t)16 * mt * kFragRB * 4 : 0;
  return std::max(a, p);
}

// The most dynamic shared memory a block of this build may take without making shared memory, rather than its
// registers, the limit on blocks an SM (MT 2 at group 128: 3 blocks on the H200).
inline size_t frag_smem_target(int mt, int nsv, const FragLimits& L) {
  const int blocks = std::max(1, L.reg_blocks[frag_ix(mt)][frag_ix(nsv)]);
  return L.per_sm / blocks > L.reserved ? L.per_sm / blocks - L.reserved : 0;
}

// Whether a launch of mt m-tiles and S splits fits the GPU: its shared memory, and a cluster of more than 8
// one-per-SM blocks only where the GPU can hold one (FragLimits::wide16).
inline bool frag_fits(int mt, int KC, int S, const FragLimits& L) {
  const size_t smem = frag_smem(mt, KC, S);
  return smem <= L.optin && !(S > 8 && smem > L.two && !L.wide16);
}

// Scale vectors a 128-k chunk of W holds (groups 32 -> 4, 64 -> 2, >= 128 -> 1).
inline int frag_nsv(const LinW& W) { return W.group >= kFragChunkK ? 1 : kFragChunkK / W.group; }

// The split count S of `cols` column blocks over KC chunks at MT m-tiles, 0 if no split fits shared memory. S = the
// largest power of two <= 2 SMs / cols, <= 16 and <= KC (at 2 m-tiles also <= KC / 2: every split at least two
// chunks of 128 k); then doubled (<= 16, <= KC) while its staged A is above a bound: at 2 m-tiles frag_smem_target
// (shared memory must not cut the blocks an SM below what the registers allow), at 1 and 4 m-tiles half an SM's.
// Measured (NOTES Session 17 §1-4, Session 18 §1): over every plan per 7B shape the 2-m-tile bounds took the layer's
// GEMMs at 32 tokens from 106.3 to 93.0 µs (the gate/up pair 4 splits, 3 blocks an SM: 43.9 µs against 54.5 at 2;
// o 8 splits: 10.4 against 12.7 at 16) and the 32-row step from 4.01 to 3.77 ms. Elsewhere the same bounds win
// alone but lose inside the batched step: at one m-tile 79.4 -> 70.0 µs at 16 tokens, yet the 16-row step 3.15 ->
// 3.50 ms (each half of the change loses there, the two-chunk cap 0.09 ms, the staged-A bound 0.12); at four the
// 64-row step 6.01 -> 6.18 ms (o's 8 splits where it had 16). Also 0 for a cluster of more than 8 one-per-SM blocks
// where the GPU cannot hold one (FragLimits::wide16; the 7B down at 33-64 tokens is such a cluster: 16 splits of
// 165 KB): the launcher then runs fewer tokens a launch.
inline int frag_splits(int cols, int KC, int mt, int nsv, const FragLimits& L) {
  const int smax = std::min(kFragMaxSplits, KC);
  const bool two_tiles = mt == 2;   // the two-chunk cap and the occupancy bound apply at 2 m-tiles only (above)
  const int first = two_tiles ? std::min(smax, std::max(1, KC / 2)) : smax;
  const size_t bound = two_tiles ? frag_smem_target(mt, nsv, L) : L.two;
  int S = 1;
  while (2 * S <= first && 2LL * S * cols <= 2LL * L.sms) S *= 2;
  while (2 * S <= smax && frag_smem(mt, KC, S) > bound) S *= 2;
  return frag_fits(mt, KC, S, L) ? S : 0;
}

template <int MT, int NSV>
int launch_int4_frag_build(const GemmGroup& g, int cols, int S, size_t smem, size_t optin, const __half* A, int lda,
                           int M, int ldc, bool add, cudaStream_t st) {
  auto kern = gemm_int4_frag<MT, NSV>;
  static bool raised = false;   // once per instantiation: the dynamic shared-memory limit and clusters of 16
  if (!raised) {
    NQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)optin));
    NQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    raised = true;
  }
  if (S == 1)
    return launch_pdl("gemm_int4_frag", kern, dim3(cols), dim3(kFragThreads), smem, st, g, A, lda, M, ldc,
                      add ? 1 : 0);
  return launch_pdl_cluster("gemm_int4_frag", kern, dim3(cols, S), dim3(kFragThreads), dim3(1, S, 1), smem, st, g, A,
                            lda, M, ldc, add ? 1 : 0);
}

template <int MT>
int launch_int4_frag_mt(int nsv, const GemmGroup& g, int cols, int S, size_t smem, size_t optin, const __half* A,
                        int lda, int M, int ldc, bool add, cudaStream_t st) {
  if (nsv == 4) return launch_int4_frag_build<MT, 4>(g, cols, S, smem, optin, A, lda, M, ldc, add, st);
  if (nsv == 2) return launch_int4_frag_build<MT, 2>(g, cols, S, smem, optin, A, lda, M, ldc, add, st);
  return launch_int4_frag_build<MT, 1>(g, cols, S, smem, optin, A, lda, M, ldc, add, st);
}

// One launch of gemm_int4_frag over M <= 16 mt tokens with a given plan: mt m-tiles (1, 2 or 4) and S splits that
// frag_fits. The product's plan is launch_int4_frag's (frag_mt, frag_splits); the testing library times every other
// that fits (nq_bench_gemm_int4_frag_plans), which is how frag_splits' rule was chosen.
inline int launch_int4_frag_plan(const GemmGroup& g, int cols, const __half* A, int lda, int M, int ldc, bool add,
                                 int mt, int S, const FragLimits& L, cudaStream_t st) {
  const LinW& W = g.s[0].W;
  const int KC = W.K / kFragChunkK, nsv = frag_nsv(W);
  const size_t smem = frag_smem(mt, KC, S);
  if (mt == 1) return launch_int4_frag_mt<1>(nsv, g, cols, S, smem, L.optin, A, lda, M, ldc, add, st);
  if (mt == 2) return launch_int4_frag_mt<2>(nsv, g, cols, S, smem, L.optin, A, lda, M, ldc, add, st);
  return launch_int4_frag_mt<4>(nsv, g, cols, S, smem, L.optin, A, lda, M, ldc, add, st);
}

// gemm_int4_frag over M tokens (any M >= 1): launches of up to 64 tokens (fewer where 64 tokens' staged A fits no
// split: halved down to 16), each with its own MT and split count. `cols` = the grid's column blocks: segments, the
// sum over segments of ceil(N_i / 256) with g.tiles0 / g.tiles1 those of segments 0 and 1 (gemm.cu's
// count_tiles(kFragRB)); SwiGLU, ceil(I / 128) (4 P tiles of 32 outputs). The caller has checked the weights (every
// segment ORDER_FRAG, or the pair ORDER_FRAG_PAIR; frag::shape_ok; one K and group; layout 1) and the alignment of
// A and the weights (16 bytes; lda % 8 == 0).
inline int launch_int4_frag(const GemmGroup& g0, int cols, const __half* A, int lda, int M, int ldc, bool add,
                            cudaStream_t st) {
  if (M <= 0 || cols <= 0) return fail(NQ_E_INVALID_ARG, "gemm: M=%d, %d column blocks", M, cols);
  FragLimits L;
  NQ_TRY(frag_limits(&L));
  const LinW& W = g0.s[0].W;
  const int KC = W.K / kFragChunkK, nsv = frag_nsv(W);
  int piece = kFragMaxTokens;
  while (piece > 16 && !frag_splits(cols, KC, frag_mt(piece), nsv, L)) piece /= 2;
  if (!frag_splits(cols, KC, frag_mt(piece), nsv, L))
    return fail(NQ_E_UNSUPPORTED, "gemm: K=%d is too long for the fragment-order GEMM's shared memory", W.K);
  for (int m0 = 0; m0 < M; m0 += piece) {
    const int mp = std::min(piece, M - m0), mt = frag_mt(mp);
    const int S = frag_splits(cols, KC, mt, nsv, L);   // fits: fewer m-tiles than the piece's need no more memory
    if (!S) return fail(NQ_E_UNSUPPORTED, "gemm: K=%d, %d tokens: no split of the fragment-order GEMM fits", W.K, mp);
    GemmGroup g = g0;   // this piece's rows of every output
    for (int i = 0; i < g.n; i++)
      if (g.s[i].C) g.s[i].C += (size_t)m0 * ldc;
    if (g.swiglu_out) g.swiglu_out += (size_t)m0 * g.swiglu_ld;
    NQ_TRY(launch_int4_frag_plan(g, cols, A + (size_t)m0 * lda, lda, mp, ldc, add, mt, S, L, st));
  }
  return NQ_OK;
}

}  // namespace
}  // namespace nq
