// Prefill GEMM kernels on tensor cores: C[M, N] (+)= A[M, K] @ W[N, K]^T (+ bias), A f16, f32 accumulate
// (launchers' entry points: gemm.cu).
// * gemm_int4_mma (INT4 weights): mma.sync m16n8k16 by inline PTX, block tile 128 (tokens) x 128 (weight rows) x
//   64 (k), 8 warps as 2 (tokens) x 4 (weight rows) with 64 x 32 warp tiles, a STAGES-deep cp.async pipeline for
//   A, the raw int4 words and (through registers) the scales, serial split-K (fixed order, deterministic) when the
//   grid would leave SMs idle; the int4 words are consumed without repacking (the k-permutation comment block
//   below says how). The library runs 3 stages at 2 blocks/SM (gemm.cu), in a layout-1 and a layout-2 (ZP) build.
// * gemm_kernel (wmma m16n16k16; f16/bf16 weights): block tile 64 x 128 x 64, 8 warps as 2 x 4, each warp
//   32 x 32; the next tile's global loads are issued before the current tile's MMAs. gemm_f16_kernel (f16 weights)
//   has the same tiles on a cp.async ring; the two share gemm_tile, wmma_tile and wmma_epilogue.
// Included by gemm.cu and by csrc/dev/ programs that time other instantiations; it holds no host state but the
// per-instantiation "shared memory raised" flags.
#pragma once
#include "kernels.h"
#include "device_util.cuh"
#include "cp_async.cuh"
#include "launch.h"
#include <mma.h>

namespace nq {
namespace {
using namespace nvcuda;

constexpr int BM = 64, BN = 128, BK = 64, LDS = BK + 8, kGemmThreads = 256;
constexpr int kSmemAB = (BM + BN) * LDS * 2;          // bytes of the A and W tiles (f16)
constexpr int kSmemC = BM * (BN + 4) * 4;             // bytes of the f32 output staging
constexpr int kGemmSmem = kSmemAB > kSmemC ? kSmemAB : kSmemC;

// Registers holding one W tile's global data for one thread (f16/bf16: 128 rows x 8 chunks of 8 values). WTile,
// load_w and store_w are the weight-type hooks of gemm_kernel: a csrc/dev program specialises them for INT4.
template <int WT>
struct WTile {
  uint4 r[4];
};

template <int WT>
__device__ __forceinline__ void load_w(const LinW& W, int n0, int k0, WTile<WT>& t) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int idx = tid + i * kGemmThreads;  // 128 rows x 8 chunks of 8 values
    const int row = idx >> 3, c = idx & 7;
    const int n = n0 + row;
    if (n < W.N) t.r[i] = ld_stream16(reinterpret_cast<const uint4*>(W.w) + ((size_t)n * W.K + k0) / 8 + c);
    else t.r[i] = make_uint4(0, 0, 0, 0);
  }
}

template <int WT>
__device__ __forceinline__ void store_w(const WTile<WT>& t, __half* Ws) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int idx = tid + i * kGemmThreads;
    const int row = idx >> 3, c = idx & 7;
    uint4 v = t.r[i];
    if (WT == WT_BF16) {  // bf16 -> f16
      uint32_t vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; e++)
        vv[e] = h2_as_u32(__floats2half2_rn(bf16_bits_to_float(vv[e] & 0xffffu), bf16_bits_to_float(vv[e] >> 16)));
      v = make_uint4(vv[0], vv[1], vv[2], vv[3]);
    }
    *reinterpret_cast<uint4*>(Ws + row * LDS + c * 8) = v;
  }
}

__device__ __forceinline__ void load_a(const __half* A, int lda, int M, int m0, int k0, uint4 (&r)[2]) {
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int idx = threadIdx.x + i * kGemmThreads;  // 64 rows x 8 chunks
    const int row = idx >> 3, c = idx & 7;
    const int m = m0 + row;
    r[i] = m < M ? *reinterpret_cast<const uint4*>(A + (size_t)m * lda + k0 + c * 8) : make_uint4(0, 0, 0, 0);
  }
}
__device__ __forceinline__ void store_a(const uint4 (&r)[2], __half* As) {
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int idx = threadIdx.x + i * kGemmThreads;
    const int row = idx >> 3, c = idx & 7;
    *reinterpret_cast<uint4*>(As + row * LDS + c * 8) = r[i];
  }
}

// Up to 3 weights sharing A (q/k/v, gate/up) in one launch: blockIdx.x runs over the N tiles of segment 0, then 1,
// then 2; each block computes one tile of one segment exactly as a single-weight launch would (one launch instead of
// three: the k/v GEMMs alone had only 4 x 8 blocks and took 52 us each at M = 512, as long as q's 28 x 8).
struct GemmSeg {
  LinW W;
  float* C;                // output columns of this segment (row stride ldc)
  const float* bias;       // f32 (W.N) or null
};
struct GemmGroup {
  GemmSeg s[3];
  int n = 1;               // segments used
  int tiles0 = 0, tiles1 = 0;  // N tiles of segments 0 and 1
  // SwiGLU epilogue (gemm_int4_wgmma's 2-warpgroup builds only): segments 0 (gate) and 1 (up), each block the same
  // 64 rows of both, and silu(gate) * up stored as f16 [M][swiglu_ld] here instead of the segments' C
  __half* swiglu_out = nullptr;
  int swiglu_ld = 0;
};

// The block's tile in gemm_kernel / gemm_f16_kernel: its segment's weight, output and bias (segment by blockIdx.x),
// the tile's first W row n0 and token row m0, and the warp's 32 x 32 of it at (wm, wn) (2 x 4 warps).
struct GemmTile {
  LinW W;
  float* C;
  const float* bias;
  int n0, m0, wm, wn;
};
__device__ __forceinline__ GemmTile gemm_tile(const GemmGroup& g) {
  const int bx = blockIdx.x;
  const bool in1 = g.n > 1 && bx >= g.tiles0, in2 = g.n > 2 && bx >= g.tiles0 + g.tiles1;  // segment by tile
  const GemmSeg& s = in2 ? g.s[2] : in1 ? g.s[1] : g.s[0];
  const int n0 = (bx - (in2 ? g.tiles0 + g.tiles1 : in1 ? g.tiles0 : 0)) * BN, m0 = blockIdx.y * BM;
  const int warp = threadIdx.x >> 5;
  return GemmTile{s.W, s.C, s.bias, n0, m0, warp >> 2, warp & 3};
}

using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// The warp's MMAs over one staged k tile: As [BM][LDS] (token rows) and Ws [BN][LDS] (W rows), f16, into acc.
__device__ __forceinline__ void wmma_tile(const GemmTile& t, const __half* As, const __half* Ws, AccFrag (&acc)[2][2]) {
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
    for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], As + (t.wm * 32 + i * 16) * LDS + kk, LDS);
#pragma unroll
    for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], Ws + (t.wn * 32 + j * 16) * LDS + kk, LDS);
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
      for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
  }
}

// C (+)= acc (+ bias) through the f32 staging Cs [BM][BN + 4]. Cs lies over the A/W tiles: the caller's barrier
// must have every warp done with them.
__device__ __forceinline__ void wmma_epilogue(const GemmTile& t, const AccFrag (&acc)[2][2], float* Cs, int M, int ldc,
                                              int add) {
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 2; j++)
      wmma::store_matrix_sync(Cs + (t.wm * 32 + i * 16) * (BN + 4) + t.wn * 32 + j * 16, acc[i][j], BN + 4,
                              wmma::mem_row_major);
  __syncthreads();
  for (int idx = threadIdx.x; idx < BM * BN; idx += kGemmThreads) {
    const int r = idx / BN, c = idx % BN;
    const int m = t.m0 + r, n = t.n0 + c;
    if (m < M && n < t.W.N) {
      float v = Cs[r * (BN + 4) + c] + (t.bias ? t.bias[n] : 0.f);
      float* dst = t.C + (size_t)m * ldc + n;
      if (add) v += *dst;
      *dst = v;
    }
  }
}

template <int WT>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(const GemmGroup g, const __half* A, int lda, int M,
                                                            int ldc, int add) {
  pdl_wait();      // launched with PDL (launch.h)
  pdl_trigger();
  extern __shared__ __align__(16) unsigned char gsm[];
  __half* As = reinterpret_cast<__half*>(gsm);
  __half* Ws = As + BM * LDS;
  float* Cs = reinterpret_cast<float*>(gsm);
  const GemmTile t = gemm_tile(g);
  const LinW& W = t.W;
  const int n0 = t.n0, m0 = t.m0;
  AccFrag acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);

  uint4 ar[2];
  WTile<WT> wt;
  load_a(A, lda, M, m0, 0, ar);
  load_w<WT>(W, n0, 0, wt);
  for (int k0 = 0; k0 < W.K; k0 += BK) {
    __syncthreads();  // previous tile's MMAs are done with the shared tiles
    store_a(ar, As);
    store_w<WT>(wt, Ws);
    __syncthreads();
    if (k0 + BK < W.K) {  // prefetch the next tile while the tensor cores work
      load_a(A, lda, M, m0, k0 + BK, ar);
      load_w<WT>(W, n0, k0 + BK, wt);
    }
    wmma_tile(t, As, Ws, acc);
  }
  __syncthreads();  // every warp's MMAs are done: C staging lies over the tiles
  wmma_epilogue(t, acc, Cs, M, ldc, add);
}

// gemm_f16_kernel: gemm_kernel's tiles, warps and wmma for f16 weights, fed by a kF16Stages-deep cp.async ring
// (4 stages: 111 KB, 2 blocks an SM)
// (A and W tiles straight into shared memory, one barrier a k-step) instead of one tile in registers. The f16
// lm_head of a batched step (M = 32 rows: 1.09 GB on the 7B) is a pure weight stream: gemm_kernel read it at
// ~3.1 TB/s, its loads for tile k + 1 in flight only during tile k's MMAs (bench/NOTES.md "Session 15").
// Rows past M or N and chunks past K are zero-filled by the copies (src-size 0), so K needs only K % 8 == 0.
constexpr int kF16Stages = 4;
constexpr int kF16StageH = (BM + BN) * LDS;                         // halves of one stage: A tile, then W tile
constexpr int kF16Smem = kF16Stages * kF16StageH * 2 > kSmemC ? kF16Stages * kF16StageH * 2 : kSmemC;

__global__ void __launch_bounds__(kGemmThreads) gemm_f16_kernel(const GemmGroup g, const __half* A, int lda, int M,
                                                                int ldc, int add) {
  extern __shared__ __align__(16) unsigned char gsm[];
  __half* const ring = reinterpret_cast<__half*>(gsm);
  float* Cs = reinterpret_cast<float*>(gsm);
  const GemmTile t = gemm_tile(g);
  const LinW& W = t.W;
  const int n0 = t.n0, m0 = t.m0;
  const __half* const Wh = reinterpret_cast<const __half*>(W.w);
  const int nk = (W.K + BK - 1) / BK;
  // tile kt into stage s: A 64 rows x 8 chunks (2 a thread), W 128 rows x 8 chunks (4 a thread); the caller commits
  auto issue_a = [&](int kt, int s) {
    if (kt >= nk) return;
    const int k0 = kt * BK;
    const uint32_t base = smem_u32(ring + s * kF16StageH);
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int idx = threadIdx.x + i * kGemmThreads, row = idx >> 3, c = idx & 7;
      const int m = m0 + row, k = k0 + c * 8;
      const bool ok = m < M && k < W.K;
      cp_async16(base + 2u * (row * LDS + c * 8), ok ? A + (size_t)m * lda + k : A, ok ? 16 : 0);
    }
  };
  auto issue_w = [&](int kt, int s) {
    if (kt >= nk) return;
    const int k0 = kt * BK;
    const uint32_t base = smem_u32(ring + s * kF16StageH);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int idx = threadIdx.x + i * kGemmThreads, row = idx >> 3, c = idx & 7;
      const int n = n0 + row, k = k0 + c * 8;
      const bool ok = n < W.N && k < W.K;
      cp_async16(base + 2u * ((BM + row) * LDS + c * 8), ok ? Wh + (size_t)n * W.K + k : Wh, ok ? 16 : 0);
    }
  };
  // the first stages' weights before the PDL wait (they do not depend on earlier kernels; A does). Commit groups:
  // {W 0 .. S-2, A 0}, {A 1}, ..., then one {A, W} group per k-step, so waiting for all but the newest S-2 groups
  // leaves tile kt complete.
#pragma unroll
  for (int s = 0; s < kF16Stages - 1; s++) issue_w(s, s);
  pdl_wait();      // launched with PDL (launch.h)
  pdl_trigger();
#pragma unroll
  for (int s = 0; s < kF16Stages - 1; s++) {
    issue_a(s, s);
    cp_async_commit();
  }
  AccFrag acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);
  for (int kt = 0; kt < nk; kt++) {
    cp_async_wait<kF16Stages - 2>();
    __syncthreads();   // tile kt landed for every thread; every warp is done with the stage refilled below
    issue_a(kt + kF16Stages - 1, (kt + kF16Stages - 1) % kF16Stages);
    issue_w(kt + kF16Stages - 1, (kt + kF16Stages - 1) % kF16Stages);
    cp_async_commit();
    const __half* As = ring + (kt % kF16Stages) * kF16StageH;
    const __half* Ws = As + BM * LDS;
    wmma_tile(t, As, Ws, acc);
  }
  cp_async_wait<0>();
  __syncthreads();   // the ring is free: C staging lies over it
  wmma_epilogue(t, acc, Cs, M, ldc, add);
}

inline int launch_gemm_f16(const GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add,
                           cudaStream_t st) {
  static const cudaError_t raised =
      cudaFuncSetAttribute(gemm_f16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kF16Smem);
  if (raised != cudaSuccess) return fail(cuda_status(raised), "gemm: f16 kernel shared memory: %s", cudaGetErrorString(raised));
  dim3 grid(tiles, (M + BM - 1) / BM);
  return launch_pdl("gemm_f16_kernel", gemm_f16_kernel, grid, dim3(kGemmThreads), kF16Smem, st, g, A, lda, M, ldc,
                    add ? 1 : 0);
}

template <int WT>
int launch_gemm(const GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add, cudaStream_t st) {
  static bool raised = false;
  if (!raised) {
    NQ_CUDA(cudaFuncSetAttribute(gemm_kernel<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kGemmSmem));
    raised = true;
  }
  dim3 grid(tiles, (M + BM - 1) / BM);
  return launch_pdl("gemm_kernel", gemm_kernel<WT>, grid, dim3(kGemmThreads), kGemmSmem, st, g, A, lda, M, ldc,
                    add ? 1 : 0);
}

// ---------------------------------------------------------------------------------------------------------------
// gemm_int4_mma: INT4 (layout 1) x f16 on mma.sync.m16n8k16 (f32 accumulate), the int4 words used as stored.
//
// Layout 1 (spec 9): W.w is uint32 [N][K/8]; word j of row n holds k = 8j..8j+7, nibble i (bits 4i..4i+3) holds
// k = 8j + PERM[i], PERM = [0,2,4,6,1,3,5,7], code u = q + 8. Hence for s = 0..3, (w >> 4s) & 0x000F000F holds the
// codes of (k = 8j+2s, k = 8j+2s+1) in its (low, high) 16-bit halves; OR 0x64006400 makes the f16 pair
// (1024+u0, 1024+u1) (exact: 1024 has ulp 1), HSUB2 (1032, 1032) gives (u-8) exactly and HMUL2 by the f16 scale
// rounds once, which is the f16 dequantisation of the GEMV.
//
// mma.m16n8k16 fragments (PTX ISA), lane = 4*gid + tig:
//   A operand (16 m x 16 k, row):  a01 = (m=gid, k=2tig,2tig+1)    a23 = (m=gid+8, k=2tig,2tig+1)
//                                  a45 = (m=gid, k=2tig+8,+9)      a67 = (m=gid+8, k=2tig+8,+9)
//   B operand (16 k x 8 n, col):   b01 = (k=2tig,2tig+1; n=gid)    b23 = (k=2tig+8,+9; n=gid)
//   C (16 m x 8 n):                c01 = (m=gid; n=2tig,2tig+1)    c23 = (m=gid+8; n=2tig,2tig+1)
// The kernel computes C^T = W A^T: the mma's m is the W row (the dequantised weights are the A operand) and its n
// is the token (the activations are the B operand). Reason: the dequantisation writes any register it likes, so
// the W side can be laid out as a01..a67 for free, while an activation fragment must come from ONE 16-byte shared
// load without moves; with the activations as the A operand, a01/a23 (rows gid, gid+8) would come from two loads
// and ptxas needed ~3 register moves per HMMA to assemble them (168 IMAD.MOV + 58 MOV per 64 HMMA measured in SASS).
// The sum over k does not care which real k an mma k-slot stands for, as long as both operands agree. Over a 32-k
// chunk (two mma steps) thread tig takes the real k = 8tig..8tig+7, i.e. ONE int4 word per W row:
//   mma k-slot       step 0 (real k)   step 1 (real k)   W: pair s of the word (8tig..8tig+7)   activations
//   2tig, 2tig+1     8tig+0, 8tig+1    8tig+4, 8tig+5    a01/a23: s = 0 (step 0), s = 2 (step 1)  b01: x / z
//   2tig+8, +9       8tig+2, 8tig+3    8tig+6, 8tig+7    a45/a67: s = 1 (step 0), s = 3 (step 1)  b23: y / w
// where (x, y, z, w) are the four f16 pairs of ONE 16-byte shared load of A[token gid][8tig .. 8tig+7]: step 0
// uses {x, y}, step 1 {z, w}, consecutive registers as loaded. a01/a45 come from the word of W row gid, a23/a67
// from the word of row gid + 8. Neither side is repacked and no ldmatrix is needed. A 32-k chunk never straddles
// a scale group (group % 32 == 0), so one scale per (W row, chunk).
//
// Shared memory per stage: A tile [128 rows][64 k] f16 (128 B rows, the 16-byte slots XOR-swizzled by
// (row & 1) << 2, so the 8 lanes of a quarter-warp, rows 2r and 2r+1 x 4 slots, hit all 32 banks once), W tile
// [128 rows][8 words] (the two 16-byte halves of a row swapped when (row >> 2) & 1: lanes gid 0..7 x tig read 32
// distinct banks), scales [128 rows][2 chunks] as f16 pairs (s, s). The scales (2 bytes each, rows not always
// 4-byte aligned) cannot go through cp.async: they are loaded into a register with the stage's cp.async and stored
// to shared memory one iteration later (the stage is consumed STAGES-1 iterations after its issue).
// Layout 2 (ZP build): code u has zero point z per (row, group); the HSUB2 subtracts (1024 + z, 1024 + z) instead of
// 1032 (exact: u - z in -15..15), then the same HMUL2. The zero points take the scales' path: one byte per (row,
// chunk) into a register with the stage's cp.async, stored one iteration later as the f16 pair (1024+z, 1024+z) in a
// 1 KB region after the scales ([128 rows][2 chunks], the scales' indexing).
constexpr int MM_BM = 128, MM_BN = 128, MM_BK = 64, MM_THREADS = 256;
constexpr int MM_A_BYTES = MM_BM * MM_BK * 2;          // 16 KB
constexpr int MM_W_BYTES = MM_BN * (MM_BK / 8) * 4;    // 4 KB
constexpr int MM_S_BYTES = MM_BN * 2 * 4;              // 1 KB (and as much for the zero-point pairs, ZP)
constexpr int MM_STAGE_BYTES = MM_A_BYTES + MM_W_BYTES + MM_S_BYTES;
template <bool ZP>
constexpr int mm_stage_bytes() { return MM_STAGE_BYTES + (ZP ? MM_S_BYTES : 0); }

// (1024 + z, 1024 + z) as f16 pair bits: the value dq_pair subtracts for zero point z (0..15; layout 1: z = 8)
__device__ __forceinline__ uint32_t zero_bias_pair(uint32_t z) { return 0x64006400u + z * 0x00010001u; }

// f16 pair (w_{8j+2s}, w_{8j+2s+1}) * scale from word w (see the block comment); s2 = (scale, scale), kz = (1024 + z,
// 1024 + z) for zero point z (layout 1 by default: 1032)
__device__ __forceinline__ uint32_t dq_pair(uint32_t w, int s, __half2 s2,
                                            __half2 kz = __half2half2(__ushort_as_half((unsigned short)0x6408))) {
  const uint32_t h = and_or(w >> (4 * s), 0x000F000Fu, 0x64006400u);
  return h2_as_u32(__hmul2(__hsub2(u32_as_h2(h), kz), s2));
}

// Serial split-K (here and in gemm_int4_wgmma): split z of a tile adds its partial into C after split z - 1 did.
// Thread 0 of split z's block waits for its turn (the tile's semaphore reaching z) ...
__device__ __forceinline__ void split_wait_turn(const int* tile_sem, int z) {
  int v;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(tile_sem) : "memory");
    if (v != z) __nanosleep(64);
  } while (v != z);
}
// ... and, once the block's stores are fenced, hands the tile to split `next`.
__device__ __forceinline__ void split_hand_over(int* tile_sem, int next) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(tile_sem), "r"(next) : "memory");
}

// ZP: INT4 layout 2 (every segment has zero points; gemm_multi launches per segment where layouts differ).
template <int STAGES, int MINB, bool ZP = false>
__global__ void __launch_bounds__(MM_THREADS, MINB) gemm_int4_mma(const GemmGroup g, const __half* A, int lda, int M,
                                                               int ldc, int add, int* sem) {
  constexpr int kStage = mm_stage_bytes<ZP>();
  constexpr int kZOff = MM_A_BYTES + MM_W_BYTES + MM_S_BYTES;   // the zero-point pairs of a stage (ZP)
  extern __shared__ __align__(128) unsigned char msm[];
  const int by = blockIdx.y;  // N tile (all segments); blockIdx.x = M tile, fastest: a W tile's 4 readers are
                              // neighbours in launch order, so W comes from DRAM about once
  const int seg = (g.n > 2 && by >= g.tiles0 + g.tiles1) ? 2 : (g.n > 1 && by >= g.tiles0) ? 1 : 0;
  const LinW W = seg == 2 ? g.s[2].W : seg == 1 ? g.s[1].W : g.s[0].W;
  const int n0 = (by - (seg == 2 ? g.tiles0 + g.tiles1 : seg == 1 ? g.tiles0 : 0)) * MM_BN, m0 = blockIdx.x * MM_BM;
  const int tid = threadIdx.x;
  // serial split-K (gridDim.z splits; sem != null): split z owns k tiles [kt0, kt1) and adds its partial into C after
  // split z - 1 did (fixed order: deterministic)
  const int KTall = W.K / MM_BK, z = blockIdx.z, nz = gridDim.z;
  const int kt0 = (int)((long long)KTall * z / nz), KT = (int)((long long)KTall * (z + 1) / nz) - kt0;
  const uint32_t sbase = smem_u32(msm);

  // producer roles: A 4 x 16 B per thread (128 rows x 8 slots: rows tid/8 + 32i), W 1 x 16 B (128 rows x 2 halves),
  // one scale (128 rows x 2 chunks)
  const int w_row = tid >> 1, w_half = tid & 1;  // also the scale's (row, chunk)
  const bool w_ok = n0 + w_row < W.N;
  const uint32_t* w_src = reinterpret_cast<const uint32_t*>(W.w) + (size_t)(w_ok ? n0 + w_row : 0) * (W.K / 8) +
                          w_half * 4;
  const uint32_t w_dst = MM_A_BYTES + w_row * 32 + ((w_half ^ ((w_row >> 2) & 1)) * 16);
  const __half* s_src = W.scales + (size_t)(w_ok ? n0 + w_row : 0) * (W.K / W.group);
  const uint8_t* z_src = ZP ? W.zeros + (size_t)(w_ok ? n0 + w_row : 0) * (W.K / W.group) : nullptr;
  const uint32_t s_dst = MM_A_BYTES + MM_W_BYTES + tid * 4;  // (row * 2 + chunk) * 4
  const uint32_t z_dst = kZOff + tid * 4;                    // likewise
  const int a_row = tid >> 3, a_slot = tid & 7;
  const __half* a_src = A + (size_t)(m0 + a_row) * lda + a_slot * 8;  // row m0 + a_row + 32 i: + 32 i lda
  const uint32_t a_dst = a_row * 128 + ((a_slot ^ ((a_row & 1) << 2)) * 16);  // (a_row + 32 i) & 1 == a_row & 1

  // running producer state: the next stage to issue (buffer byte offset, k), so the loop carries no kt % STAGES
  uint32_t wr_off = 0;
  int wr_k = kt0 * MM_BK;
  const int k_end = (kt0 + KT) * MM_BK;
  auto issue = [&]() {  // cp.async of the stage at wr_k into buffer wr_off; returns nothing, advances nothing
    const uint32_t buf = sbase + wr_off;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const bool ok = m0 + a_row + 32 * i < M;  // rows >= M: 16 zero bytes, nothing read (A itself as address)
      cp_async16(buf + a_dst + i * 32 * 128, ok ? a_src + (size_t)i * 32 * lda + wr_k : A, ok ? 16 : 0);
    }
    cp_async16(buf + w_dst, w_src + wr_k / 8, w_ok ? 16 : 0);
  };
  auto load_scale = [&]() -> uint32_t {  // (s, s) of this thread's (row, chunk) in the stage at wr_k; 0 beyond N
    if (!w_ok) return 0u;
    const unsigned short b = __half_as_ushort(s_src[(wr_k + w_half * 32) / W.group]);
    return (uint32_t)b | ((uint32_t)b << 16);
  };
  auto load_zero = [&]() -> uint32_t {  // ZP: (1024 + z, 1024 + z) of this thread's (row, chunk); z = 8 beyond N
    if (!w_ok) return zero_bias_pair(8);
    return zero_bias_pair(z_src[(wr_k + w_half * 32) / W.group]);
  };
  auto advance = [&]() {
    wr_off = wr_off == (STAGES - 1) * kStage ? 0 : wr_off + kStage;
    wr_k += MM_BK;
  };

  float acc[2][8][4];  // [m16 tile = 16 W rows][n8 tile = 8 tokens][c0..c3]
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < KT) {
      issue();
      *reinterpret_cast<uint32_t*>(msm + wr_off + s_dst) = load_scale();
      if (ZP) *reinterpret_cast<uint32_t*>(msm + wr_off + z_dst) = load_zero();
      advance();
    }
    cp_async_commit();
  }
  uint32_t s_pending = 0, s_pending_off = 0;  // a scale loaded in the previous iteration, and its stage's buffer
  uint32_t z_pending = 0;                     // and its zero-point pair (ZP)
  bool pending = false;

  // consumer addresses (bytes within a stage)
  const int lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3, wm = warp >> 2, wn = warp & 3;
  const int a_row0 = wm * 64 + gid;  // token row of n8 tile nt: + nt * 8
  const int w_row0 = wn * 32 + gid;  // W row (m16 tile mt, half h): + (2 mt + h) * 8
  const int a_slot_c[2] = {((0 * 4 + tig) ^ ((gid & 1) << 2)) * 16, ((1 * 4 + tig) ^ ((gid & 1) << 2)) * 16};
  uint32_t rd_off = 0;

  for (int kt = 0; kt < KT; kt++) {
    if (pending) *reinterpret_cast<uint32_t*>(msm + s_pending_off + s_dst) = s_pending;  // consumed >= 1 barrier later
    if (ZP && pending) *reinterpret_cast<uint32_t*>(msm + s_pending_off + z_dst) = z_pending;
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt visible to all; every warp is done with stage kt - 1, whose buffer is refilled next
    pending = wr_k < k_end;
    if (pending) {
      issue();
      s_pending = load_scale();
      if (ZP) z_pending = load_zero();
      s_pending_off = wr_off;
      advance();
    }
    cp_async_commit();
    const unsigned char* st = msm + rd_off;
    rd_off = rd_off == (STAGES - 1) * kStage ? 0 : rd_off + kStage;
#pragma unroll
    for (int c = 0; c < 2; c++) {  // two 32-k chunks per stage
      uint32_t af[2][2][4];        // mma A operands (dequantised W): [m16 tile][mma step][a01, a23, a45, a67]
#pragma unroll
      for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {  // W rows gid (h = 0) and gid + 8 (h = 1) of m16 tile mt
          const int r = w_row0 + (2 * mt + h) * 8;
          const uint32_t w =
              *reinterpret_cast<const uint32_t*>(st + MM_A_BYTES + r * 32 + ((c ^ ((r >> 2) & 1)) * 16) + tig * 4);
          const __half2 s2 =
              u32_as_h2(*reinterpret_cast<const uint32_t*>(st + MM_A_BYTES + MM_W_BYTES + (r * 2 + c) * 4));
          if constexpr (ZP) {
            const __half2 kz = u32_as_h2(*reinterpret_cast<const uint32_t*>(st + kZOff + (r * 2 + c) * 4));
            af[mt][0][h] = dq_pair(w, 0, s2, kz);
            af[mt][0][2 + h] = dq_pair(w, 1, s2, kz);
            af[mt][1][h] = dq_pair(w, 2, s2, kz);
            af[mt][1][2 + h] = dq_pair(w, 3, s2, kz);
          } else {
            af[mt][0][h] = dq_pair(w, 0, s2);      // step 0, k-slots 2tig,+1   = real 8tig+0,1
            af[mt][0][2 + h] = dq_pair(w, 1, s2);  // step 0, k-slots 2tig+8,+9 = real 8tig+2,3
            af[mt][1][h] = dq_pair(w, 2, s2);      // step 1: real 8tig+4,5
            af[mt][1][2 + h] = dq_pair(w, 3, s2);  // step 1: real 8tig+6,7
          }
        }
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {  // token n8 tiles: one 16-byte load = both steps' B operands
        const int r = a_row0 + nt * 8;  // (r & 1) == (gid & 1): the swizzle of the row is known
        const uint4 v = *reinterpret_cast<const uint4*>(st + r * 128 + a_slot_c[c]);
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
          mma16816(acc[mt][nt], af[mt][0][0], af[mt][0][1], af[mt][0][2], af[mt][0][3], v.x, v.y);
          mma16816(acc[mt][nt], af[mt][1][0], af[mt][1][1], af[mt][1][2], af[mt][1][3], v.z, v.w);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing real is in flight (the tail groups are empty); leave no copy behind

  // epilogue from the accumulators: acc[mt][nt] = (W rows gid, gid + 8 of tile mt) x (tokens 2tig, 2tig+1 of nt);
  // C[token][n] (+)= acc (+ bias[n]); a warp's store covers 4 tokens x 8 consecutive n (32-byte sectors)
  float* const C = seg == 2 ? g.s[2].C : seg == 1 ? g.s[1].C : g.s[0].C;
  const float* const bias = seg == 2 ? g.s[2].bias : seg == 1 ? g.s[1].bias : g.s[0].bias;
  int* const tile_sem = sem ? sem + (blockIdx.y * gridDim.x + blockIdx.x) : nullptr;
  if (tile_sem && z > 0) {  // wait for split z - 1 of this tile (dispatched before this block: lower linear index)
    if (tid == 0) split_wait_turn(tile_sem, z);
    __syncthreads();
  }
  const bool first = z == 0, accumulate = add || !first;  // splits after the first add to what C holds
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int n = n0 + wn * 32 + mt * 16 + h * 8 + gid;
      if (n >= W.N) continue;
      const float bn = (bias && first) ? bias[n] : 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int m = m0 + wm * 64 + nt * 8 + 2 * tig + e;
          if (m >= M) continue;
          float* dst = C + (size_t)m * ldc + n;
          float v = acc[mt][nt][2 * h + e] + bn;
          if (accumulate) v += __ldcg(dst);  // L2: an earlier split's block on another SM wrote it
          __stcg(dst, v);
        }
    }
  if (tile_sem && z + 1 < nz) {  // hand the tile to split z + 1
    __threadfence();
    __syncthreads();
    if (tid == 0) split_hand_over(tile_sem, z + 1);
  }
}

// Serial split-K for grids that leave SMs idle (7B down/o/q at M = 512: 112 blocks on 132 SMs): the split count
// minimising (rounds of resident blocks) x (k tiles per split), at most max_splits splits of at least min_ktiles k
// tiles each (the pipeline prologue and the serial epilogue stay small against it). 1 = no split. Grids of one
// round or more are left unsplit unless fill_rounds (then a split may also fill a partial last round).
int choose_splits(long long blocks, int ktiles, int blocks_per_sm, int max_splits = 8, int min_ktiles = 16,
                  bool fill_rounds = false) {
  const long long slots = (long long)device_sms() * blocks_per_sm;
  if (blocks >= slots && !fill_rounds) return 1;
  int best = 1;
  long long best_cost = (blocks + slots - 1) / slots * ktiles;
  for (int s = 2; s <= max_splits && ktiles / s >= min_ktiles; s++) {
    const long long cost = (blocks * s + slots - 1) / slots * ((ktiles + s - 1) / s);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

template <int STAGES, int MINB, bool ZP = false>
int launch_int4_mma(const GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add, bool allow_split,
                    cudaStream_t st) {
  constexpr int smem = STAGES * mm_stage_bytes<ZP>();
  static bool raised = false;
  if (!raised) {
    NQ_CUDA(cudaFuncSetAttribute(gemm_int4_mma<STAGES, MINB, ZP>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    raised = true;
  }
  if (tiles > 65535) return fail(NQ_E_UNSUPPORTED, "gemm: %d N tiles (at most 65535)", tiles);
  const int mtiles = (M + MM_BM - 1) / MM_BM;
  int splits = allow_split ? choose_splits(mtiles * tiles, g.s[0].W.K / MM_BK, MINB) : 1;
  int* sem = nullptr;
  if (splits > 1) {  // per-launch tile semaphores, stream-ordered (no state shared between streams or launches)
    const size_t bytes = (size_t)mtiles * tiles * sizeof(int);
    if (cudaMallocAsync(reinterpret_cast<void**>(&sem), bytes, st) != cudaSuccess) {
      (void)cudaGetLastError();  // no stream-ordered allocator here: run unsplit
      sem = nullptr;
      splits = 1;
    } else {
      NQ_CUDA(cudaMemsetAsync(sem, 0, bytes, st));
    }
  }
  dim3 grid(mtiles, tiles, splits);
  gemm_int4_mma<STAGES, MINB, ZP><<<grid, MM_THREADS, smem, st>>>(g, A, lda, M, ldc, add ? 1 : 0, sem);
  NQ_LAUNCH_CHECK("gemm_int4_mma");
  if (sem) NQ_CUDA(cudaFreeAsync(sem, st));
  return NQ_OK;
}

}  // namespace
}  // namespace nq
