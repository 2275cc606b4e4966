// INT4 few-token GEMM on mma.sync with the weights repacked into the B-fragment order (Marlin's idea, written here
// from the PTX fragment layout; no code taken from it): C[M, N] (+)= A[M, K] @ W[N, K]^T, M <= 16 * MT tokens.
// Experiment for issues 13 and 15 (bench/NOTES.md "Session 10" §7, "Session 11" §7b-7g): the library's few-token
// wgmma builds stream a 7B layer's 120 MB at ~0.9 TB/s because every thread of a quad re-reads and re-unpacks the
// same words (the register-A fragment layout of the file's rows). Measured on the H200 (Session 11), per 7B layer
// against the library in the same run: this GEMM -42 % at 1 token, -36 % at 16, -23 % at 32, -9 % at 64; the GEMV
// over the same order 43.7 against gemv_int4's 48.0 us. The numpy reference of the order: tests/fragment_order.py.
//
//   build/dev/gemm_int4_fragpack --case pack      # CPU only: the repack and the kernel's unpack are a pair
//   build/dev/gemm_int4_fragpack --case emulate   # CPU only: the kernel's index math and PTX layouts, emulated
//   build/dev/gemm_int4_fragpack --case check     # GPU: every M tile build against a float64 reference
//   build/dev/gemm_int4_fragpack --case time      # GPU: 7B shapes at M = 1, 8, 16, 32, 64 against the product
//   build/dev/gemm_int4_fragpack --case diag      # GPU: the best builds without MMAs, and the loads alone
//   build/dev/gemm_int4_fragpack --case gemv      # GPU: a batch-1 GEMV over the same order against gemv_int4
//
// The pair (repack on the host here; in a product, once at load or in the file through the spec):
// * mma.m16n8k16 (row.col, f16 in, f32 acc): A = activations (16 tokens x 16 k), B = weights (16 k x 8 rows n), C =
//   16 tokens x 8 rows. B fragment of lane l = 4g + t: b0 = (k 2t, 2t+1), b1 = (k 2t+8, 2t+9), both of row n = g.
// * Tile (kb, nb): k 16kb .. 16kb+15, rows 64nb .. 64nb+63 (8 n8-tiles j, row 64nb + 8j + g). Lane l owns 16 bytes
//   (4 words) of it; word w carries n8-tiles 2w and 2w+1 (codes u = q + 8 in 0..15):
//     nibble 0 / 4: tile 2w,   k 2t / 2t+1     (b0 of tile 2w)
//     nibble 1 / 5: tile 2w,   k 2t+8 / 2t+9   (b1 of tile 2w)
//     nibble 2 / 6: tile 2w+1, k 2t / 2t+1     (b0 of tile 2w+1)
//     nibble 3 / 7: tile 2w+1, k 2t+8 / 2t+9   (b1 of tile 2w+1)
//   so (w & 0x000F000F) | 0x64006400 is the f16 pair (1024 + u0, 1024 + u4) and (w & 0x00F000F0) | 0x64006400 the
//   pair (1024 + 16 u1, 1024 + 16 u5); w >> 8 gives nibbles 2/6 and 3/7 the same way (one LOP3 each). (q) = pair -
//   1032, or pair / 16 - 72: exact small integers; times the row's scale: one f16 rounding, the library's dq.
// * Memory order: [nb][kb][lane][16 bytes]: a warp streams its 64 rows' tiles as one contiguous run, 512 B per
//   16-k step (one 16-byte load per lane: the whole step's B fragments for 8 n8-tiles).
// * Scales: [nb][group][g][j] f16, 128 B per (nb, group): lane l reads the 16 bytes of its g (rows 64nb + 8j + g,
//   j = 0..7); the 4 lanes of a quad read the same address.
// Kernel (gemm_int4_fragpack<MT, WARPS, SPG, SACC, RING, MODE, CLUSTER>): block = WARPS warps, warp w = 64-row
// tile nb = blockIdx.x * WARPS + w; K runs in chunks of 8 16-k steps, split S ways over blockIdx.y on chunk bounds.
// The block's A rows (16 MT x its k range, f16) are staged in shared memory once (after the first chunk's weight
// loads are out: they do not depend on A), read with ldmatrix.x4. Weights: a ring of one chunk (8 x 16 B per lane)
// in registers, the next chunk's scales one chunk ahead (RING > 0: a shared-memory cp.async ring instead; lost).
// SACC: the scale applied to f32 segment sums instead of every weight pair. Split-K: CLUSTER = the S splits of a
// column block are one thread-block cluster and sum their partials through distributed shared memory in split
// order (won); otherwise every split stores its partial and the column block's last split sums them in split
// order. Both deterministic. The GEMV (gemv_int4_fragpack, _tile): see its comment.
#include "dev_common.cuh"
#include "gemm_dev.cuh"
#include "gemm_wgmma.cuh"
#include "gemm.cu"  // the product entry point gemm_multi, the timing baseline
#include "gemv_dev.cuh"  // the product's decode GEMV (gemv_int4), the --case gemv baseline
#include "cp_async.cuh"
#include <cooperative_groups.h>
#include <cstring>
#include <string>

namespace fp {
using namespace dev;


// ---- the pair: host repack and the device unpack ---------------------------------------------------------------
struct Packed {
  int N = 0, K = 0, group = 0;
  std::vector<uint32_t> words;    // [N/64][K/16][32 lanes][4]
  std::vector<__half> scales;     // [N/64][K/group][8 g][8 j]
  size_t word_bytes() const { return words.size() * 4; }
  size_t bytes() const { return align128(word_bytes()) + scales.size() * 2; }
};

// codes u[n][k] (0..15) of a layout-1 weight
inline std::vector<uint8_t> codes_of(const Int4Weight& W) {
  std::vector<uint8_t> u((size_t)W.N * W.K);
  const uint32_t* q = reinterpret_cast<const uint32_t*>(W.file_bytes.data());
  for (int n = 0; n < W.N; n++)
    for (int j = 0; j < W.K / 8; j++) {
      const uint32_t word = q[(size_t)n * (W.K / 8) + j];
      for (int i = 0; i < 8; i++) u[(size_t)n * W.K + 8 * j + nq::contract::kInt4Perm[i]] = (word >> (4 * i)) & 15u;
    }
  return u;
}

// (nibble i of word w of lane l) -> (row offset in the 64-row tile, k offset in the 16-k step); the file comment
inline void nibble_place(int lane, int w, int i, int* row, int* k) {
  const int g = lane >> 2, t = lane & 3;
  const int tile = 2 * w + ((i & 3) >> 1);      // nibbles 0,1,4,5: tile 2w; 2,3,6,7: tile 2w+1
  const int hi8 = i & 1;                        // nibbles 1,3,5,7: k + 8 (b1)
  const int odd = i >> 2;                       // nibbles 4..7: the second k of the pair
  *row = 8 * tile + g;
  *k = 2 * t + odd + 8 * hi8;
}

inline Packed repack(const Int4Weight& W) {
  Packed P;
  P.N = W.N; P.K = W.K; P.group = W.group;
  const int NB = W.N / 64, KB = W.K / 16, G = W.K / W.group;
  const std::vector<uint8_t> u = codes_of(W);
  P.words.assign((size_t)NB * KB * 32 * 4, 0);
  for (int nb = 0; nb < NB; nb++)
    for (int kb = 0; kb < KB; kb++)
      for (int lane = 0; lane < 32; lane++)
        for (int w = 0; w < 4; w++) {
          uint32_t word = 0;
          for (int i = 0; i < 8; i++) {
            int r, k;
            nibble_place(lane, w, i, &r, &k);
            word |= (uint32_t)u[(size_t)(64 * nb + r) * W.K + 16 * kb + k] << (4 * i);
          }
          P.words[(((size_t)nb * KB + kb) * 32 + lane) * 4 + w] = word;
        }
  const __half* sc = reinterpret_cast<const __half*>(W.file_bytes.data() + W.scales_offset());
  P.scales.resize((size_t)NB * G * 64);
  for (int nb = 0; nb < NB; nb++)
    for (int gi = 0; gi < G; gi++)
      for (int g = 0; g < 8; g++)
        for (int j = 0; j < 8; j++)
          P.scales[(((size_t)nb * G + gi) * 8 + g) * 8 + j] = sc[(size_t)(64 * nb + 8 * j + g) * G + gi];
  return P;
}

// The kernel's unpack of one word, emulated on the host: the 4 f16 pairs (b0, b1 of tile 2w; b0, b1 of tile 2w+1)
// as code pairs, through the same masks and shifts
inline void unpack_host(uint32_t w, int out[4][2]) {
  auto lo = [](uint32_t x, int* p) { p[0] = x & 15; p[1] = (x >> 16) & 15; };          // & 0x000F000F
  auto hi = [](uint32_t x, int* p) { p[0] = (x >> 4) & 15; p[1] = (x >> 20) & 15; };   // & 0x00F000F0, / 16
  lo(w, out[0]); hi(w, out[1]); lo(w >> 8, out[2]); hi(w >> 8, out[3]);
}

// --case pack: every code of a random weight comes back from the packed words at the place the kernel's MMAs put
// it (B fragment of lane l: tile, row g, k 2t / 2t+1 / 2t+8 / 2t+9); every scale at its (row, group). CPU only.
int case_pack() {
  int fails = 0;
  for (const int K : {64, 256}) {
    const Int4Weight W = random_int4(192, K, K == 64 ? 32 : 128, 99u + K);
    const std::vector<uint8_t> u = codes_of(W);
    const Packed P = repack(W);
    const int KB = K / 16;
    for (int nb = 0; nb < W.N / 64; nb++)
      for (int kb = 0; kb < KB; kb++)
        for (int lane = 0; lane < 32; lane++) {
          const int g = lane >> 2, t = lane & 3;
          for (int w = 0; w < 4; w++) {
            int pr[4][2];
            unpack_host(P.words[(((size_t)nb * KB + kb) * 32 + lane) * 4 + w], pr);
            for (int f = 0; f < 4; f++) {            // f: (tile 2w b0, tile 2w b1, tile 2w+1 b0, tile 2w+1 b1)
              const int tile = 2 * w + (f >> 1), n = 64 * nb + 8 * tile + g;
              const int k = 16 * kb + 2 * t + 8 * (f & 1);
              fails += pr[f][0] != u[(size_t)n * K + k];
              fails += pr[f][1] != u[(size_t)n * K + k + 1];
            }
          }
        }
    const __half* sc = reinterpret_cast<const __half*>(W.file_bytes.data() + W.scales_offset());
    const int G = K / W.group;
    for (int nb = 0; nb < W.N / 64; nb++)
      for (int gi = 0; gi < G; gi++)
        for (int lane = 0; lane < 32; lane++)
          for (int j = 0; j < 8; j++) {
            const int g = lane >> 2, n = 64 * nb + 8 * j + g;
            fails += __half_as_ushort(P.scales[(((size_t)nb * G + gi) * 8 + g) * 8 + j]) !=
                     __half_as_ushort(sc[(size_t)n * G + gi]);
          }
    std::printf("pack K=%d group %d: %s\n", K, W.group, fails ? "FAIL" : "PASS");
  }
  return fails ? 1 : 0;
}

// ---- the kernel's index math, shared with the host emulation (--case emulate) -----------------------------------
// K runs in chunks of kChunkSteps 16-k steps (128 k; every Qwen2.5 K is a multiple of 128): the unit of the weight
// ring (a warp holds one chunk's 8 loads in flight while it computes the previous one) and of the K split.
constexpr int kChunkSteps = 8;
// ldmatrix.x4: the row (token) and k (halves) of the shared-memory row whose address lane gives, within the m-tile
// and 16-k step: matrices (tokens 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) -> A fragment a0..a3
__host__ __device__ inline int lds_row(int lane) { return (lane & 7) + 8 * ((lane >> 3) & 1); }
__host__ __device__ inline int lds_k(int lane) { return 8 * (lane >> 4); }
// accumulator e of n8-tile j, m-tile m of lane: token and column within the warp's 64 rows
__host__ __device__ inline int acc_token(int m, int e, int lane) { return 16 * m + (lane >> 2) + 8 * (e >> 1); }
__host__ __device__ inline int acc_col(int j, int e, int lane) { return 8 * j + 2 * (lane & 3) + (e & 1); }
// split s of S over KC chunks: [chunk_begin(s), chunk_begin(s + 1))
__host__ __device__ inline int chunk_begin(int KC, int s, int S) { return (int)((long long)KC * s / S); }
// shared-memory row stride of the staged A (halves) for nk steps: rows 16 B apart mod 128 B
__host__ __device__ inline int a_stride(int nk) { return 16 * nk + 8; }

// ---- the kernel ---------------------------------------------------------------------------------------------------
// The unpack of one word and its helpers: the product's (csrc/src/int4_frag.cuh, promoted from this file), the device
// twin of unpack_host above.
using nq::frag::h2u;
using nq::frag::u2h;
using nq::frag::unpack_word;

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// the same with a zero accumulator in (the first step of a scale segment)
__device__ __forceinline__ void mma16816_zero(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&a)[4], uint32_t saddr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(saddr));
}

struct Args {
  const uint4* w;          // packed words
  const uint4* s;          // packed scales
  const __half* A;         // [M][lda]
  const float* bias;       // [N] or null
  float* C;                // [M][ldc]
  float* part;             // split-K partials [S][gridDim.x][16 MT][64 WARPS]
  int* sem;                // [gridDim.x] zero
  int M, N, K, lda, ldc, add;
};

// MT: 16-token m-tiles (M <= 16 MT); WARPS: 64-row tiles per block (one per warp, sharing the block's staged A);
// SPG: 16-k steps per scale group (group 32..256 = 2..16); SACC: the scale is applied to the accumulators once per
// scale segment (min(SPG, 8) steps: the MMAs multiply the exact codes q - 8, f32 partial sums per segment, then
// acc += s * partial) instead of to every weight pair (4 HMUL2 per word). SACC needs a lane's scales for its
// accumulator rows 8j + 2t, +1 (two 16-byte vectors, g = 2t and 2t + 1), not for its B rows 8j + g.
// RING: 0 = the next chunk's weights in registers (8 x 16 B per lane) and its scales too; R > 0 = a warp-private
// ring of R chunks in shared memory filled by cp.async (each lane copies and later reads only its own 16-byte
// pieces, so no barrier but the lane's own cp.async.wait_group): R - 1 chunks in flight without registers. A stage
// is [step u][lane][16 B] weights then [scale vector][lane][16 B]: every LDS.128 of a step is 512 contiguous bytes.
template <int SPG, bool SACC>
struct ScaleShape {
  static constexpr int SEG = SPG < kChunkSteps ? SPG : kChunkSteps;   // steps sharing one scale within a chunk
  static constexpr int NSV = kChunkSteps / SEG;                         // scale groups a chunk touches
  static constexpr int SV = SACC ? 2 : 1;                               // 16-byte scale vectors per group and lane
  static constexpr int kStageBytes = 32 * 16 * (kChunkSteps + NSV * SV);   // one warp's chunk in the ring
};
// MODE (--case diag only): 0 the GEMM; 1 loads and unpacking without the MMAs; 2 the loads alone (results wrong)
// CLUSTER: the S splits of a column block run as one thread-block cluster (grid (cols, S), cluster (1, S, 1)) and
// reduce on chip: each block leaves its partial [16 MT][64 WARPS] f32 in its own shared memory (over the staged A),
// the cluster syncs, and block rank r sums slice r of the partials over the S blocks' shared memory in split order
// (distributed shared memory: deterministic, no global partials, no semaphore).
template <int MT, int WARPS, int SPG, bool SACC, int RING, int MODE = 0, bool CLUSTER = false>
__global__ void __launch_bounds__(32 * WARPS) gemm_int4_fragpack(const Args a) {
  using SS = ScaleShape<SPG, SACC>;
  constexpr int SEG = SS::SEG, NSV = SS::NSV, SV = SS::SV;
  constexpr int RB = 64 * WARPS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* As = reinterpret_cast<__half*>(smem_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int KB = a.K / 16, KC = a.K / (16 * kChunkSteps), S = gridDim.y, s = blockIdx.y;
  const int c0 = chunk_begin(KC, s, S), nc = chunk_begin(KC, s + 1, S) - c0, nk = kChunkSteps * nc;
  const int NB = a.N / 64, nb = blockIdx.x * WARPS + warp, G = a.K / (16 * SPG);
  const bool active = nb < NB;
  // this lane's weights: tile (nb, kb) at words[(nb KB + kb) 32 + lane]; scales [nb][gi][g][8]
  const uint4* wp = a.w + ((size_t)(active ? nb : 0) * KB + kChunkSteps * c0) * 32 + lane;
  const uint4* sp = a.s + (size_t)(active ? nb : 0) * G * 8 + (SACC ? 2 * t : g);

  uint4 wbuf[RING ? 1 : kChunkSteps];
  uint4 snext[NSV][SV];
  auto load_scales = [&](int c) {   // chunk c (absolute): its NSV groups
#pragma unroll
    for (int v = 0; v < NSV; v++)
#pragma unroll
      for (int q = 0; q < SV; q++) snext[v][q] = __ldg(sp + (size_t)((kChunkSteps * c + v * SEG) / SPG) * 8 + q);
  };
  // RING: the warp's ring after the staged A (16-byte aligned); chunk c (relative) into stage c % RING
  const int lds = a_stride(nk);
  const uint32_t ring = (uint32_t)__cvta_generic_to_shared(smem_raw) +
                        (uint32_t)((16 * MT * lds * 2 + 15) / 16 * 16) + (uint32_t)(warp * RING * SS::kStageBytes);
  auto ring_issue = [&](int c) {   // every lane copies its own pieces of chunk c
    const uint32_t st = ring + (uint32_t)((c % (RING ? RING : 1)) * SS::kStageBytes) + 16u * lane;
#pragma unroll
    for (int u = 0; u < kChunkSteps; u++) nq::cp_async16(st + 512u * u, wp + ((size_t)c * kChunkSteps + u) * 32, 16);
#pragma unroll
    for (int v = 0; v < NSV; v++)
#pragma unroll
      for (int q = 0; q < SV; q++)
        nq::cp_async16(st + 512u * (kChunkSteps + v * SV + q),
                       sp + (size_t)((kChunkSteps * (c0 + c) + v * SEG) / SPG) * 8 + q, 16);
  };
  if (active && nc > 0) {   // the first chunk's weights and scales go out before A is staged: they do not need it
    if constexpr (RING > 0) {
#pragma unroll
      for (int r = 0; r < RING - 1; r++) {
        if (r < nc) ring_issue(r);
        nq::cp_async_commit();
      }
    } else {
#pragma unroll
      for (int u = 0; u < kChunkSteps; u++) wbuf[u] = nq::ld_stream16(wp + u * 32);
      load_scales(c0);
    }
  }

  // A rows of this block's k range into shared memory: row r at r * lds halves; rows >= M are zero
  for (int i = threadIdx.x; i < 16 * MT * 2 * nk; i += 32 * WARPS) {   // 8-half (16-byte) chunks
    const int r = i / (2 * nk), c = i - r * (2 * nk);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < a.M) v = *reinterpret_cast<const uint4*>(a.A + (size_t)r * a.lda + 16 * kChunkSteps * c0 + 8 * c);
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

  const uint32_t a_base = (uint32_t)__cvta_generic_to_shared(As) +
                          2u * (uint32_t)(lds_row(lane) * lds + lds_k(lane));

  uint32_t sink = 0;   // MODE 1 / 2: what the skipped work would have consumed
  if (active) {
    for (int c = 0; c < nc; c++) {
      const bool more = c + 1 < nc;
      uint4 scur[NSV][SV];
      uint32_t st = 0;   // RING: this chunk's stage, this lane's first piece
      if constexpr (RING > 0) {
        nq::cp_async_wait<RING - 2>();   // chunk c landed (the lane's own copies)
        if (c + RING - 1 < nc) ring_issue(c + RING - 1);   // into the stage chunk c - 1 used
        nq::cp_async_commit();
        st = ring + (uint32_t)((c % RING) * SS::kStageBytes) + 16u * lane;
#pragma unroll
        for (int v = 0; v < NSV; v++)
#pragma unroll
          for (int q = 0; q < SV; q++)
            asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(scur[v][q].x), "=r"(scur[v][q].y), "=r"(scur[v][q].z), "=r"(scur[v][q].w)
                         : "r"(st + 512u * (kChunkSteps + v * SV + q)));
      } else {
#pragma unroll
        for (int v = 0; v < NSV; v++)
#pragma unroll
          for (int q = 0; q < SV; q++) scur[v][q] = snext[v][q];
        if (more) load_scales(c0 + c + 1);   // one chunk ahead: no scale load in a step's critical path
      }
      const uint4* wn = wp + (size_t)(c + 1) * kChunkSteps * 32;
      const uint32_t a_chunk = a_base + 2u * (uint32_t)(16 * kChunkSteps * c);
      float tmp[MT][8][4];
#pragma unroll
      for (int u = 0; u < kChunkSteps; u++) {
        const int v = u / SEG;
        uint4 cur;
        if constexpr (RING > 0) {
          asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                       : "=r"(cur.x), "=r"(cur.y), "=r"(cur.z), "=r"(cur.w)
                       : "r"(st + 512u * u));
        } else {
          cur = wbuf[u];
          if (more) wbuf[u] = nq::ld_stream16(wn + u * 32);
        }
        if (MODE == 2) {
          sink ^= cur.x ^ cur.y ^ cur.z ^ cur.w;
          continue;
        }
        uint32_t b[8][2];   // B fragments of the 8 n8-tiles
        const uint32_t cw[4] = {cur.x, cur.y, cur.z, cur.w};
        const uint32_t sw[4] = {scur[v][0].x, scur[v][0].y, scur[v][0].z, scur[v][0].w};
#pragma unroll
        for (int w = 0; w < 4; w++) {
          __half2 pq[4];
          unpack_word(cw[w], pq);
          const __half2 p0 = pq[0], p1 = pq[1], p2 = pq[2], p3 = pq[3];
          if (SACC) {
            b[2 * w][0] = h2u(p0); b[2 * w][1] = h2u(p1); b[2 * w + 1][0] = h2u(p2); b[2 * w + 1][1] = h2u(p3);
          } else {   // (s, s) of rows 8(2w) + g and 8(2w+1) + g: halves 2w and 2w+1 of the lane's scale vector
            const __half2 s0 = u2h(__byte_perm(sw[w], 0, 0x1010)), s1 = u2h(__byte_perm(sw[w], 0, 0x3232));
            b[2 * w][0] = h2u(__hmul2(p0, s0)); b[2 * w][1] = h2u(__hmul2(p1, s0));
            b[2 * w + 1][0] = h2u(__hmul2(p2, s1)); b[2 * w + 1][1] = h2u(__hmul2(p3, s1));
          }
        }
        if (MODE == 1) {
#pragma unroll
          for (int j = 0; j < 8; j++) sink ^= b[j][0] ^ b[j][1];
          continue;
        }
#pragma unroll
        for (int m = 0; m < MT; m++) {
          uint32_t af[4];
          ldmatrix_x4(af, a_chunk + 2u * (uint32_t)(16 * m * lds + 16 * u));
#pragma unroll
          for (int j = 0; j < 8; j++) {
            if (!SACC) mma16816(acc[m][j], af, b[j][0], b[j][1]);
            else if (u % SEG == 0) mma16816_zero(tmp[m][j], af, b[j][0], b[j][1]);
            else mma16816(tmp[m][j], af, b[j][0], b[j][1]);
          }
        }
        if (SACC && u % SEG == SEG - 1) {   // acc += s (row) * segment sum; rows 8j + 2t + (e & 1)
#pragma unroll
          for (int j = 0; j < 8; j++) {
            const uint32_t s0w = (&scur[v][0].x)[j >> 1], s1w = (&scur[v][1].x)[j >> 1];
            const float sr0 = __half2float(__ushort_as_half((unsigned short)(j & 1 ? s0w >> 16 : s0w & 0xFFFF)));
            const float sr1 = __half2float(__ushort_as_half((unsigned short)(j & 1 ? s1w >> 16 : s1w & 0xFFFF)));
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
              for (int e = 0; e < 4; e++) acc[m][j][e] = fmaf(e & 1 ? sr1 : sr0, tmp[m][j][e], acc[m][j][e]);
          }
        }
      }
    }
  }

  if (MODE != 0 && sink == 0x9E3779B9u) acc[0][0][0] = 1.f;   // keeps the skipped work's inputs live
  // acc[m][j]: (token 16m + g, rows n0 + 8j + 2t, +1) and (token 16m + g + 8, same rows), n0 = 64 nb
  const int cb = blockIdx.x, n_blk = 64 * warp;   // the warp's columns within the block's RB
  auto store = [&](int m, int col, float v) {    // token m, block column col: the final value
    const int n = cb * RB + col;
    if (m >= a.M || n >= a.N) return;
    float* dst = a.C + (size_t)m * a.ldc + n;
    v += a.bias ? a.bias[n] : 0.f;
    if (a.add) v += *dst;
    *dst = v;
  };
  if (S == 1) {
    if (!active) return;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) store(acc_token(m, e, lane), n_blk + acc_col(j, e, lane), acc[m][j][e]);
    return;
  }
  const int Mp = 16 * MT;
  if constexpr (CLUSTER) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    float* P = reinterpret_cast<float*>(smem_raw);   // [Mp][RB]: this split's partial, over the staged A
    __syncthreads();                                  // every warp's last ldmatrix of A is done
    if (active)
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
          for (int h = 0; h < 2; h++)
            *reinterpret_cast<float2*>(P + acc_token(m, 2 * h, lane) * RB + n_blk + acc_col(j, 0, lane)) =
                make_float2(acc[m][j][2 * h], acc[m][j][2 * h + 1]);
    cl.sync();                                        // every split's partial is in its shared memory
    const int r = (int)cl.block_rank(), tot4 = a.M * RB / 4, per = (tot4 + S - 1) / S;
    const int i1 = min(tot4, (r + 1) * per);
    for (int i = r * per + threadIdx.x; i < i1; i += 32 * WARPS) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int z = 0; z < S; z++) {                   // split order
        const float4 p = cl.map_shared_rank(reinterpret_cast<float4*>(P), z)[i];
        v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w;
      }
      const int m = (4 * i) / RB, col = 4 * i - m * RB;
      store(m, col, v.x); store(m, col + 1, v.y); store(m, col + 2, v.z); store(m, col + 3, v.w);
    }
    cl.sync();                                        // no block leaves while another reads its shared memory
    return;
  }
  // split-K: every split stores its partial (float2 per (token, row pair)), the column block's last split sums them
  // in split order (deterministic), float4 at a time over all the block's threads
  float* mine = a.part + ((size_t)s * gridDim.x + cb) * Mp * RB;
  if (active)
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
          __stcg(reinterpret_cast<float2*>(mine + (size_t)acc_token(m, 2 * h, lane) * RB + n_blk + acc_col(j, 0, lane)),
                 make_float2(acc[m][j][2 * h], acc[m][j][2 * h + 1]));
  __threadfence();
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) {
    last = atomicAdd(a.sem + cb, 1) == S - 1;
    if (last) a.sem[cb] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float4* part4 = reinterpret_cast<const float4*>(a.part + (size_t)cb * Mp * RB);
  const size_t zstride4 = (size_t)gridDim.x * Mp * RB / 4;
  for (int i = threadIdx.x; i < a.M * RB / 4; i += 32 * WARPS) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int z = 0; z < S; z++) {
      const float4 p = __ldcg(part4 + z * zstride4 + i);
      v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w;
    }
    const int m = (4 * i) / RB, col = 4 * i - m * RB;
    store(m, col, v.x); store(m, col + 1, v.y); store(m, col + 2, v.z); store(m, col + 3, v.w);
  }
}

// ---- the batch-1 GEMV over the fragment order (--case gemv) -------------------------------------------------------
// Whether one INT4 order can serve decode too: lane (g, t) of warp w streams the same 16 bytes per 16-k step as the
// GEMM (rows 64 nb + 8 j + g, j = 0..7; k 2t, 2t+1, 2t+8, 2t+9) and multiplies them by x on the CUDA cores: per word
// 4 f16 products pairs (HMUL2 / HFMA2 with the x pairs (2t, 2t+1) and (2t+8, 2t+9)), 2-step f16 partial sums (4
// products deep, as gemv_int4's), then f32: acc_j += s_j (sum). The quad's 4 lanes hold 4 k subsets of the same 8
// rows: two shuffles. K split over a cluster of blocks as the GEMM's CLUSTER builds (S = 1: no cluster). x: f16.
// One warp's part of the GEMV: 64-row tile nb over chunks [cw0, cw0 + ncw) (absolute), x of those chunks at xw
// (shared memory, f16, k 16 kb order). gemv_fp_prefetch issues the first chunk's weights and scales (they do not
// depend on x: before the PDL wait and the staging of x); gemv_fp_warp returns, in lane (g, 0) of each quad, the
// sums of rows 64 nb + 8 j + g.
template <int SPG>
struct GemvFpRing {
  static constexpr int SEG = SPG < kChunkSteps ? SPG : kChunkSteps, NSV = kChunkSteps / SEG;
  uint4 wbuf[kChunkSteps];
  uint4 snext[NSV];
};
template <int SPG>
__device__ __forceinline__ void gemv_fp_load_scales(const Args& a, int nb, int c, GemvFpRing<SPG>& r) {
  using R = GemvFpRing<SPG>;
  const uint4* sp = a.s + (size_t)nb * (a.K / (16 * SPG)) * 8 + ((threadIdx.x & 31) >> 2);
#pragma unroll
  for (int v = 0; v < R::NSV; v++) r.snext[v] = __ldg(sp + (size_t)((kChunkSteps * c + v * R::SEG) / SPG) * 8);
}
template <int SPG>
__device__ __forceinline__ void gemv_fp_prefetch(const Args& a, int nb, int cw0, int ncw, GemvFpRing<SPG>& r) {
  if (ncw <= 0) return;
  const uint4* wp = a.w + ((size_t)nb * (a.K / 16) + kChunkSteps * cw0) * 32 + (threadIdx.x & 31);
#pragma unroll
  for (int u = 0; u < kChunkSteps; u++) r.wbuf[u] = nq::ld_stream16(wp + u * 32);
  gemv_fp_load_scales<SPG>(a, nb, cw0, r);
}
template <int SPG>
__device__ __forceinline__ void gemv_fp_warp(const Args& a, int nb, int cw0, int ncw, const __half* xw,
                                             GemvFpRing<SPG>& r, float (&acc)[8]) {
  constexpr int SEG = GemvFpRing<SPG>::SEG, NSV = GemvFpRing<SPG>::NSV;
  static_assert(SEG % 2 == 0, "2-step partial sums within a scale segment");
  const int lane = threadIdx.x & 31, t = lane & 3;
  const uint4* wp = a.w + ((size_t)nb * (a.K / 16) + kChunkSteps * cw0) * 32 + lane;
  uint4 (&wbuf)[kChunkSteps] = r.wbuf;
  uint4 (&snext)[NSV] = r.snext;
  auto load_scales = [&](int c) { gemv_fp_load_scales<SPG>(a, nb, c, r); };
#pragma unroll
  for (int j = 0; j < 8; j++) acc[j] = 0.f;
  for (int c = 0; c < ncw; c++) {
    const bool more = c + 1 < ncw;
    uint4 scur[NSV];
#pragma unroll
    for (int v = 0; v < NSV; v++) scur[v] = snext[v];
    if (more) load_scales(cw0 + c + 1);
    const uint4* wn = wp + (size_t)(c + 1) * kChunkSteps * 32;
    const __half* xc = xw + 16 * kChunkSteps * c + 2 * t;
    __half2 h[8];
#pragma unroll
    for (int u = 0; u < kChunkSteps; u++) {
      const uint4 cur = wbuf[u];
      if (more) wbuf[u] = nq::ld_stream16(wn + u * 32);
      const __half2 xlo = *reinterpret_cast<const __half2*>(xc + 16 * u);
      const __half2 xhi = *reinterpret_cast<const __half2*>(xc + 16 * u + 8);
      const uint32_t cw[4] = {cur.x, cur.y, cur.z, cur.w};
#pragma unroll
      for (int w = 0; w < 4; w++) {
        __half2 pq[4];
        unpack_word(cw[w], pq);
        const __half2 p0 = pq[0], p1 = pq[1], p2 = pq[2], p3 = pq[3];
        if (u % 2 == 0) {
          h[2 * w] = __hfma2(p1, xhi, __hmul2(p0, xlo));
          h[2 * w + 1] = __hfma2(p3, xhi, __hmul2(p2, xlo));
        } else {
          h[2 * w] = __hfma2(p1, xhi, __hfma2(p0, xlo, h[2 * w]));
          h[2 * w + 1] = __hfma2(p3, xhi, __hfma2(p2, xlo, h[2 * w + 1]));
        }
      }
      if (u % 2 == 1) {   // 4-deep f16 sums of rows 8j + g into f32, times the row's scale
        const uint4 sv = scur[u / SEG];
        const uint32_t sw[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
        for (int j = 0; j < 8; j++) {
          const float sj = __half2float(__ushort_as_half((unsigned short)(j & 1 ? sw[j >> 1] >> 16 : sw[j >> 1] & 0xFFFF)));
          acc[j] = fmaf(sj, __low2float(h[j]) + __high2float(h[j]), acc[j]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; j++) {   // the quad's 4 k subsets
    acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 1);
    acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 2);
  }
}

// the GEMV's output: row n = value (+ bias, + y if add)
__device__ __forceinline__ void gemv_fp_store(const Args& a, int n, float v) {
  if (n >= a.N) return;
  v += a.bias ? a.bias[n] : 0.f;
  if (a.add) v += a.C[n];
  a.C[n] = v;
}

// Layout "rows": warp w of block x takes 64-row tile x WARPS + w over the split's chunks (the GEMM's grid).
template <int WARPS, int SPG>
__global__ void __launch_bounds__(32 * WARPS) gemv_int4_fragpack(const Args a) {
  constexpr int RB = 64 * WARPS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* xs = reinterpret_cast<__half*>(smem_raw);   // this split's k range of x
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int KC = a.K / (16 * kChunkSteps), S = gridDim.y, s = blockIdx.y;
  const int c0 = chunk_begin(KC, s, S), nc = chunk_begin(KC, s + 1, S) - c0;
  const int nb = blockIdx.x * WARPS + warp;
  const bool active = nb < a.N / 64;
  GemvFpRing<SPG> ring;
  gemv_fp_prefetch<SPG>(a, active ? nb : 0, c0, active ? nc : 0, ring);
  nq::pdl_wait();     // x was written by the previous kernel
  nq::pdl_trigger();
  for (int i = threadIdx.x; i < 2 * kChunkSteps * nc; i += 32 * WARPS)   // 16-byte pieces of x[128 c0 ..]
    reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(a.A + 16 * kChunkSteps * c0)[i];
  __syncthreads();
  float acc[8];
  gemv_fp_warp<SPG>(a, active ? nb : 0, c0, active ? nc : 0, xs, ring, acc);
  const int cb = blockIdx.x;
  if (S == 1) {
    if (active && t == 0)
#pragma unroll
      for (int j = 0; j < 8; j++) gemv_fp_store(a, cb * RB + 64 * warp + 8 * j + g, acc[j]);
    return;
  }
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  float* P = reinterpret_cast<float*>(smem_raw);   // [RB], over x
  __syncthreads();
  if (active && t == 0)
#pragma unroll
    for (int j = 0; j < 8; j++) P[64 * warp + 8 * j + g] = acc[j];
  cl.sync();
  const int r = (int)cl.block_rank(), per = (RB + S - 1) / S, i1 = min(RB, (r + 1) * per);
  for (int i = r * per + threadIdx.x; i < i1; i += 32 * WARPS) {
    float v = 0.f;
    for (int z = 0; z < S; z++) v += cl.map_shared_rank(P, z)[i];   // split order
    gemv_fp_store(a, cb * RB + i, v);
  }
  cl.sync();
}

// Layout "tile": block x takes one 64-row tile; its WARPS warps split the split's chunks among themselves and sum
// in shared memory (warp order), then the cluster sums the S splits (split order). More warps per tile: the small
// shapes (qkv, o: 72 and 56 tiles) get the GPU's warps without a cluster of 16.
template <int WARPS, int SPG>
__global__ void __launch_bounds__(32 * WARPS) gemv_int4_fragpack_tile(const Args a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* xs = reinterpret_cast<__half*>(smem_raw);
  __shared__ float Pw[WARPS][64];
  __shared__ float P[64];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int KC = a.K / (16 * kChunkSteps), S = gridDim.y, s = blockIdx.y;
  const int c0 = chunk_begin(KC, s, S), nc = chunk_begin(KC, s + 1, S) - c0;
  const int nb = blockIdx.x;
  const int w0 = chunk_begin(nc, warp, WARPS), nw = chunk_begin(nc, warp + 1, WARPS) - w0;
  GemvFpRing<SPG> ring;
  gemv_fp_prefetch<SPG>(a, nb, c0 + w0, nw, ring);
  nq::pdl_wait();     // x was written by the previous kernel
  nq::pdl_trigger();
  for (int i = threadIdx.x; i < 2 * kChunkSteps * nc; i += 32 * WARPS)
    reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(a.A + 16 * kChunkSteps * c0)[i];
  __syncthreads();
  float acc[8];
  gemv_fp_warp<SPG>(a, nb, c0 + w0, nw, xs + 16 * kChunkSteps * w0, ring, acc);
  if (t == 0)
#pragma unroll
    for (int j = 0; j < 8; j++) Pw[warp][8 * j + g] = acc[j];
  __syncthreads();
  if (threadIdx.x < 64) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) v += Pw[w][threadIdx.x];   // warp order
    if (S == 1) gemv_fp_store(a, 64 * nb + threadIdx.x, v);
    else P[threadIdx.x] = v;
  }
  if (S == 1) return;
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();
  const int r = (int)cl.block_rank(), per = (64 + S - 1) / S, i1 = min(64, (r + 1) * per);
  for (int i = r * per + threadIdx.x; i < i1; i += 32 * WARPS) {
    float v = 0.f;
    for (int z = 0; z < S; z++) v += cl.map_shared_rank(P, z)[i];   // split order
    gemv_fp_store(a, 64 * nb + i, v);
  }
  cl.sync();
}

// One launch whose blocks form clusters of 1 x cluster_y x 1 (with PDL when pdl); false where it was refused (a cluster
// that cannot be co-resident): the callers skip that build
template <class Kern>
bool launch_cluster(Kern kern, dim3 grid, int threads, size_t smem, cudaStream_t st, int cluster_y, bool pdl,
                    const Args& a) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 1; at[0].val.clusterDim.y = cluster_y; at[0].val.clusterDim.z = 1;
  at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 2 : 1;
  if (cudaLaunchKernelEx(&cfg, kern, a) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

template <int WARPS, int SPG, bool TILE = false>
bool launch_gemv_fp(const uint4* w, const uint4* s, const __half* x, int N, int K, const float* bias, float* y,
                    bool add, int splits, cudaStream_t st) {
  constexpr int RB = 64 * WARPS;
  const int KC = K / (16 * kChunkSteps), cols = TILE ? N / 64 : (N + RB - 1) / RB;
  const size_t smem = std::max((size_t)32 * kChunkSteps * ((KC + splits - 1) / splits), (size_t)RB * 4);
  auto kern = TILE ? gemv_int4_fragpack_tile<WARPS, SPG> : gemv_int4_fragpack<WARPS, SPG>;
  static bool raised = false;
  if (!raised) {
    DEV_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    DEV_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    raised = true;
  }
  if (splits > 16 || smem > 200 * 1024) return false;
  Args a;
  a.w = w; a.s = s; a.A = x; a.bias = bias; a.C = y;
  a.M = 1; a.N = N; a.K = K; a.lda = K; a.ldc = N; a.add = add ? 1 : 0;
  return launch_cluster(kern, dim3(cols, splits), 32 * WARPS, smem, st, splits, /*pdl=*/true, a);   // as launch.h
}

// scratch of the split-K launches (grown when needed), one per program
struct Scratch {
  float* part = nullptr;
  int* sem = nullptr;
  size_t part_bytes = 0, sem_bytes = 0;
  void need(size_t pb, size_t sb) {
    if (pb > part_bytes) { cudaFree(part); DEV_CHECK(cudaMalloc(&part, pb)); part_bytes = pb; }
    if (sb > sem_bytes) {
      cudaFree(sem); DEV_CHECK(cudaMalloc(&sem, sb)); DEV_CHECK(cudaMemset(sem, 0, sb)); sem_bytes = sb;
    }
  }
};
Scratch g_scratch;

constexpr size_t kMaxSmem = 200 * 1024;
constexpr size_t kMaxRingSmem = 220 * 1024;   // the staged A and the rings (the opt-in limit, 227 KB, less the static smem)
// shared memory of a launch (the staged A of the longest split), 0 if it does not fit
inline size_t smem_of(int MT, int K, int splits) {
  const int KC = K / (16 * kChunkSteps), nk = kChunkSteps * ((KC + splits - 1) / splits);
  const size_t b = (size_t)16 * MT * a_stride(nk) * 2;
  return b <= kMaxSmem ? b : 0;
}

struct Variant { int mt, warps, spg; bool sacc; int ring; int mode = 0; bool cluster = false; };
constexpr int kMaxClusterSplits = 16;   // the non-portable cluster size of Hopper (8 portable)
// returns false where a cluster launch was refused (a cluster that cannot be co-resident): the caller skips it
template <int MT, int WARPS, int SPG, bool SACC, int RING, int MODE = 0, bool CLUSTER = false>
bool launch_t(const uint4* w, const uint4* s, const __half* A, int lda, int M, int N, int K, const float* bias,
              float* C, int ldc, bool add, int splits, cudaStream_t st) {
  constexpr int RB = 64 * WARPS;
  const int cols = (N + RB - 1) / RB;
  size_t a_smem = smem_of(MT, K, splits);
  if (CLUSTER && a_smem) a_smem = std::max(a_smem, (size_t)16 * MT * RB * 4);   // the partial lies over A
  const size_t smem = (a_smem + 15) / 16 * 16 + (size_t)WARPS * RING * ScaleShape<SPG, SACC>::kStageBytes;
  auto kern = gemm_int4_fragpack<MT, WARPS, SPG, SACC, RING, MODE, CLUSTER>;
  static bool raised = false;
  if (!raised) {
    DEV_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMaxRingSmem));
    if (CLUSTER) DEV_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    raised = true;
  }
  if (!a_smem || smem > kMaxRingSmem) { std::printf("fragpack: K=%d in %d splits does not fit shared memory\n", K, splits); std::exit(2); }
  Args a;
  a.w = w; a.s = s; a.A = A; a.bias = bias; a.C = C;
  a.M = M; a.N = N; a.K = K; a.lda = lda; a.ldc = ldc; a.add = add ? 1 : 0;
  if (!CLUSTER && splits > 1) g_scratch.need((size_t)splits * cols * 16 * MT * RB * 4, (size_t)cols * 4);
  a.part = g_scratch.part; a.sem = g_scratch.sem;
  if (CLUSTER) {
    if (splits > kMaxClusterSplits) return false;
    return launch_cluster(kern, dim3(cols, splits), 32 * WARPS, smem, st, splits, /*pdl=*/false, a);
  }
  kern<<<dim3(cols, splits), 32 * WARPS, smem, st>>>(a);
  DEV_CHECK(cudaGetLastError());
  return true;
}

// the instantiated builds: every (MT, WARPS, SACC) at group 128; group 32 / 64 / 256 at MT 1 and 2, 8 warps
// a build's whole shared memory at K in `splits` splits (the staged A and the rings), 0 if it does not fit
inline size_t total_smem(const Variant& v, int K, int splits) {
  size_t a = smem_of(v.mt, K, splits);
  if (v.cluster && a) a = std::max(a, (size_t)16 * v.mt * 64 * v.warps * 4);   // the partial lies over A
  if (v.cluster && splits > kMaxClusterSplits) return 0;
  const int nsv = v.spg < kChunkSteps ? kChunkSteps / v.spg : 1;
  const size_t b = (a + 15) / 16 * 16 + (size_t)v.warps * v.ring * 32 * 16 * (kChunkSteps + nsv * (v.sacc ? 2 : 1));
  return a && b <= kMaxRingSmem ? b : 0;
}
using LaunchFn = bool (*)(const uint4*, const uint4*, const __half*, int, int, int, int, const float*, float*, int,
                          bool, int, cudaStream_t);
LaunchFn build(const Variant& v) {
#define FP_CASE(MT, W, SPG, SA, R) \
  if (v.mt == MT && v.warps == W && v.spg == SPG && v.sacc == SA && v.ring == R && v.mode == 0 && !v.cluster) \
    return launch_t<MT, W, SPG, SA, R>;
#define FP_CLUSTER(MT, W, SPG, SA) \
  if (v.mt == MT && v.warps == W && v.spg == SPG && v.sacc == SA && v.ring == 0 && v.mode == 0 && v.cluster) \
    return launch_t<MT, W, SPG, SA, 0, 0, true>;
  // the on-chip split-K (clusters)
  FP_CLUSTER(1, 4, 8, true) FP_CLUSTER(1, 8, 8, true) FP_CLUSTER(1, 4, 8, false) FP_CLUSTER(2, 4, 8, false)
  FP_CLUSTER(2, 8, 8, false) FP_CLUSTER(2, 4, 8, true) FP_CLUSTER(4, 4, 8, false) FP_CLUSTER(4, 8, 8, false)
  FP_CLUSTER(1, 4, 2, true) FP_CLUSTER(1, 4, 4, true) FP_CLUSTER(1, 4, 16, true) FP_CLUSTER(2, 4, 16, false)
#undef FP_CLUSTER
  FP_CASE(1, 4, 8, false, 0) FP_CASE(1, 8, 8, false, 0) FP_CASE(1, 4, 8, true, 0) FP_CASE(1, 8, 8, true, 0)
  FP_CASE(2, 4, 8, false, 0) FP_CASE(2, 8, 8, false, 0) FP_CASE(2, 4, 8, true, 0) FP_CASE(2, 8, 8, true, 0)
  FP_CASE(4, 4, 8, false, 0) FP_CASE(4, 8, 8, false, 0)
  FP_CASE(1, 8, 2, false, 0) FP_CASE(1, 8, 4, false, 0) FP_CASE(1, 8, 16, false, 0)
  FP_CASE(1, 8, 2, true, 0) FP_CASE(1, 8, 4, true, 0) FP_CASE(1, 8, 16, true, 0)
  FP_CASE(2, 8, 2, true, 0) FP_CASE(2, 8, 16, true, 0)
  // the shared-memory ring: 3 and 4 stages
  FP_CASE(1, 4, 8, false, 3) FP_CASE(1, 4, 8, true, 3) FP_CASE(1, 4, 8, true, 4) FP_CASE(1, 8, 8, true, 3)
  FP_CASE(2, 4, 8, false, 3) FP_CASE(2, 4, 8, true, 3) FP_CASE(2, 4, 8, false, 4) FP_CASE(2, 8, 8, false, 3)
  FP_CASE(4, 4, 8, false, 3)
  FP_CASE(1, 4, 2, true, 3) FP_CASE(1, 4, 16, true, 3) FP_CASE(2, 4, 4, false, 3)
#undef FP_CASE
  // --case diag: the best builds at 16 and 32 tokens without their MMAs (1) and without unpacking either (2)
  if (v.mt == 1 && v.warps == 4 && v.spg == 8 && v.sacc && v.ring == 0 && v.mode == 1) return launch_t<1, 4, 8, true, 0, 1>;
  if (v.mt == 1 && v.warps == 4 && v.spg == 8 && v.sacc && v.ring == 0 && v.mode == 2) return launch_t<1, 4, 8, true, 0, 2>;
  if (v.mt == 2 && v.warps == 4 && v.spg == 8 && !v.sacc && v.ring == 0 && v.mode == 1) return launch_t<2, 4, 8, false, 0, 1>;
  if (v.mt == 2 && v.warps == 4 && v.spg == 8 && !v.sacc && v.ring == 0 && v.mode == 2) return launch_t<2, 4, 8, false, 0, 2>;
  return nullptr;   // not instantiated
}
inline int mt_of(int M) { return M <= 16 ? 1 : M <= 32 ? 2 : 4; }

// device copy of a packed weight: words, pad to 128, scales
struct DevPacked {
  uint8_t* base = nullptr;
  size_t per = 0, scale_off = 0;
  int n = 1;
  DevPacked(const Packed& P, int copies) {
    scale_off = align128(P.word_bytes());
    per = align128(scale_off + P.scales.size() * 2);
    n = copies;
    DEV_CHECK(cudaMalloc(&base, per * n));
    for (int c = 0; c < n; c++) {
      DEV_CHECK(cudaMemcpy(base + per * c, P.words.data(), P.word_bytes(), cudaMemcpyHostToDevice));
      DEV_CHECK(cudaMemcpy(base + per * c + scale_off, P.scales.data(), P.scales.size() * 2, cudaMemcpyHostToDevice));
    }
  }
  ~DevPacked() { cudaFree(base); }
  const uint4* w(int c) const { return reinterpret_cast<const uint4*>(base + per * (c % n)); }
  const uint4* s(int c) const { return reinterpret_cast<const uint4*>(base + per * (c % n) + scale_off); }
};

// the read-only ceiling (dev_common.cuh's read_ceiling) over `bytes` of the rotated copies of D, µs (median of 20)
double ceiling_us(const DevPacked& D, size_t bytes, unsigned* sink, int sms) {
  const size_t n16 = bytes / 16;
  const int cgrid = (int)std::min<size_t>((size_t)sms * 8, (n16 + kCeilThreads * kCeilInFlight - 1) /
                                                               (kCeilThreads * kCeilInFlight));
  return median_us([&](int i) { read_ceiling<<<cgrid, kCeilThreads>>>(D.w(i), n16, sink); }, 20);
}

std::vector<float> acts(int M, int K, uint32_t seed) {
  std::vector<float> A = random_vector((size_t)M * K, seed);
  for (float& x : A) x = __half2float(__float2half_rn(x));   // what the kernel multiplies
  return A;
}
std::vector<float> gemm_ref(const Int4Weight& W, const std::vector<float>& A, int M) {
  std::vector<float> C((size_t)M * W.N);
#pragma omp parallel for
  for (int n = 0; n < W.N; n++)
    for (int m = 0; m < M; m++) {
      double s = 0.0;
      for (int k = 0; k < W.K; k++) s += (double)A[(size_t)m * W.K + k] * W.w[(size_t)n * W.K + k];
      C[(size_t)m * W.N + n] = (float)s;
    }
  return C;
}
double rel_err(const std::vector<float>& got, const std::vector<float>& ref, bool* finite) {
  double num = 0, den = 0;
  *finite = true;
  for (size_t i = 0; i < got.size(); i++) {
    *finite = *finite && std::isfinite(got[i]);
    num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// --case emulate (CPU only): the kernel's data path on the host for small GEMMs, with the kernel's own index helpers
// (lds_row / lds_k, acc_token / acc_col, chunk_begin, a_stride) and unpack masks, and the PTX semantics written apart
// from them: ldmatrix.x4 (thread l gets row l / 4, halves 2 (l % 4) + {0, 1} of matrix q, whose row r address comes
// from lane 8q + r) and mma.m16n8k16 (A: a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8); B: b0 (k 2t,
// col g), b1 (k 2t + 8, col g); C: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)), then split-K in split order.
// The B path is the non-SACC one (scale in the weights); SACC's scale rows are those of acc_col.
// Against the float64 reference at the check's tolerance: catches an index or layout slip without a GPU.
int case_emulate() {
  struct Case { int M, N, K, group, S; };
  const Case cs[] = {{5, 512, 128, 32, 1}, {17, 640, 384, 64, 3}, {40, 192, 256, 128, 2}, {16, 1088, 512, 256, 4}};
  constexpr int kWarps = 8, RB = 64 * kWarps;
  int fails = 0;
  for (const Case& c : cs) {
    const int MT = c.M <= 16 ? 1 : c.M <= 32 ? 2 : 4, Mp = 16 * MT;
    const Int4Weight W = random_int4(c.N, c.K, c.group, 3u + c.N + c.K);
    const Packed P = repack(W);
    const std::vector<float> A = acts(c.M, c.K, 17u + c.M);
    const std::vector<float> ref = gemm_ref(W, A, c.M);
    const int KB = c.K / 16, KC = KB / kChunkSteps, NB = c.N / 64, G = c.K / c.group, cols = (c.N + RB - 1) / RB;
    std::vector<float> C((size_t)c.M * c.N, NAN), part((size_t)c.S * cols * Mp * RB, 0.f);
    for (int cb = 0; cb < cols; cb++)
      for (int s = 0; s < c.S; s++) {
        const int cc0 = chunk_begin(KC, s, c.S), kb0 = kChunkSteps * cc0;
        const int nk = kChunkSteps * (chunk_begin(KC, s + 1, c.S) - cc0), lds = a_stride(nk);
        std::vector<float> As((size_t)Mp * lds, 0.f);     // the staged A (f16 values), rows >= M zero
        for (int r = 0; r < c.M; r++)
          for (int k = 0; k < 16 * nk; k++) As[(size_t)r * lds + k] = A[(size_t)r * c.K + 16 * kb0 + k];
        for (int warp = 0; warp < kWarps; warp++) {
          const int nb = cb * kWarps + warp;
          if (nb >= NB) continue;
          std::vector<float> acc((size_t)MT * 8 * 4 * 32, 0.f);   // [m][j][e][lane]
          for (int i = 0; i < nk; i++) {
            const int kb = kb0 + i, gi = kb * 16 / c.group;
            float b[32][8][2][2];                                   // [lane][tile][b0/b1][half]
            for (int lane = 0; lane < 32; lane++)
              for (int w = 0; w < 4; w++) {
                int pr[4][2];
                unpack_host(P.words[(((size_t)nb * KB + kb) * 32 + lane) * 4 + w], pr);
                for (int f = 0; f < 4; f++) {
                  const int tile = 2 * w + (f >> 1);
                  const float sc = __half2float(P.scales[(((size_t)nb * G + gi) * 8 + (lane >> 2)) * 8 + tile]);
                  for (int h = 0; h < 2; h++) b[lane][tile][f & 1][h] = __half2float(__float2half_rn((pr[f][h] - 8) * sc));
                }
              }
            for (int m = 0; m < MT; m++) {
              float a[32][4][2];                                    // ldmatrix.x4
              for (int l = 0; l < 32; l++)
                for (int q = 0; q < 4; q++) {
                  const int x = 8 * q + l / 4;                      // the lane that gave this row's address
                  const size_t addr = (size_t)(16 * m + lds_row(x)) * lds + lds_k(x) + 16 * i;
                  for (int h = 0; h < 2; h++) a[l][q][h] = As[addr + 2 * (l % 4) + h];
                }
              float Am[16][16], Bm[8][16][8];
              for (int l = 0; l < 32; l++) {
                const int g = l / 4, t = l % 4;
                for (int h = 0; h < 2; h++) {
                  Am[g][2 * t + h] = a[l][0][h];
                  Am[g + 8][2 * t + h] = a[l][1][h];
                  Am[g][2 * t + 8 + h] = a[l][2][h];
                  Am[g + 8][2 * t + 8 + h] = a[l][3][h];
                  for (int j = 0; j < 8; j++) {
                    Bm[j][2 * t + h][g] = b[l][j][0][h];
                    Bm[j][2 * t + 8 + h][g] = b[l][j][1][h];
                  }
                }
              }
              for (int j = 0; j < 8; j++)
                for (int l = 0; l < 32; l++) {
                  const int g = l / 4, t = l % 4;
                  const int rows[4] = {g, g, g + 8, g + 8}, colz[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
                  for (int e = 0; e < 4; e++) {
                    float d = 0.f;
                    for (int k = 0; k < 16; k++) d += Am[rows[e]][k] * Bm[j][k][colz[e]];
                    acc[(((size_t)m * 8 + j) * 4 + e) * 32 + l] += d;
                  }
                }
            }
          }
          for (int m = 0; m < MT; m++)
            for (int j = 0; j < 8; j++)
              for (int e = 0; e < 4; e++)
                for (int l = 0; l < 32; l++) {
                  const float v = acc[(((size_t)m * 8 + j) * 4 + e) * 32 + l];
                  const int tok = acc_token(m, e, l), col = 64 * warp + acc_col(j, e, l), n = cb * RB + col;
                  if (c.S > 1) part[(((size_t)s * cols + cb) * Mp + tok) * RB + col] = v;
                  else if (tok < c.M && n < c.N) C[(size_t)tok * c.N + n] = v;
                }
        }
      }
    if (c.S > 1)
      for (int cb = 0; cb < cols; cb++)
        for (int m = 0; m < c.M; m++)
          for (int col = 0; col < RB; col++) {
            const int n = cb * RB + col;
            if (n >= c.N) continue;
            float v = 0.f;
            for (int z = 0; z < c.S; z++) v += part[(((size_t)z * cols + cb) * Mp + m) * RB + col];
            C[(size_t)m * c.N + n] = v;
          }
    bool finite;
    const double err = rel_err(C, ref, &finite);
    const bool ok = finite && err < 1e-3;   // the check's tolerance (case_check)
    std::printf("emulate M=%d N=%d K=%d g%d split %d: %s rel %.2e%s\n", c.M, c.N, c.K, c.group, c.S,
                ok ? "PASS" : "FAIL", err, finite ? "" : " (unwritten outputs)");
    fails += !ok;
  }
  return fails ? 1 : 0;
}

// --case check: M in {1, 5, 16, 17, 32, 40, 64}, every build, shapes with N not a multiple of the block's rows,
// groups 32..256, split-K 1 and several, bias and residual add; poisoned C where the kernel stores
int case_check() {
  struct Case { int M, N, K, group, splits; bool bias, add; };
  const Case cs[] = {{1, 512, 256, 128, 1, false, false},  {5, 576, 512, 32, 1, true, false},
                     {16, 4608, 3584, 128, 7, true, false}, {17, 3584, 3584, 64, 4, false, true},
                     {32, 1024, 1024, 256, 2, false, false}, {40, 640, 768, 128, 3, true, true},
                     {64, 3584, 18944, 128, 19, false, true}, {8, 18944, 3584, 128, 1, false, false},
                     {3, 1152, 4864, 256, 5, true, true},    {24, 896, 896, 128, 7, false, true}};
  int fails = 0;
  for (const Case& c : cs) {
    const Int4Weight W = random_int4(c.N, c.K, c.group, 7u + c.N + c.K);
    const Packed P = repack(W);
    DevPacked D(P, 1);
    const std::vector<float> A = acts(c.M, c.K, 11u + c.M);
    std::vector<__half> Ah(A.size());
    for (size_t i = 0; i < A.size(); i++) Ah[i] = __float2half_rn(A[i]);
    std::vector<float> ref = gemm_ref(W, A, c.M);
    std::vector<float> bias(c.N), C0((size_t)c.M * c.N);
    for (int n = 0; n < c.N; n++) bias[n] = 0.01f * (float)((n * 37) % 23 - 11);
    for (size_t i = 0; i < C0.size(); i++) C0[i] = c.add ? 0.1f * (float)((int)((i * 13) % 17) - 8) : NAN;   // poison
    for (int m = 0; m < c.M; m++)
      for (int n = 0; n < c.N; n++)
        ref[(size_t)m * c.N + n] += (c.bias ? bias[n] : 0.f) + (c.add ? C0[(size_t)m * c.N + n] : 0.f);
    __half* dA; float *dC, *db;
    DEV_CHECK(cudaMalloc(&dA, Ah.size() * 2));
    DEV_CHECK(cudaMalloc(&dC, C0.size() * 4));
    DEV_CHECK(cudaMalloc(&db, bias.size() * 4));
    DEV_CHECK(cudaMemcpy(dA, Ah.data(), Ah.size() * 2, cudaMemcpyHostToDevice));
    DEV_CHECK(cudaMemcpy(db, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
    const int mt = mt_of(c.M), spg = c.group / 16;
    std::vector<Variant> vs;
    for (int warps : {4, 8})
      for (bool sacc : {false, true})
        for (int ring : {0, 3, 4, -1}) {   // -1: the cluster (on-chip split-K) build
          Variant v{mt, warps, spg, sacc, ring < 0 ? 0 : ring};
          v.cluster = ring < 0;
          if (build(v)) vs.push_back(v);
        }
    for (const Variant& v : vs) {
      if (!total_smem(v, c.K, c.splits)) continue;
      DEV_CHECK(cudaMemcpy(dC, C0.data(), C0.size() * 4, cudaMemcpyHostToDevice));
      if (!build(v)(D.w(0), D.s(0), dA, c.K, c.M, c.N, c.K, c.bias ? db : nullptr, dC, c.N, c.add, c.splits, 0)) {
        std::printf("fragpack mt%d w%d cluster of %d: launch refused (not co-resident), skipped\n", v.mt, v.warps,
                    c.splits);
        continue;
      }
      DEV_CHECK(cudaDeviceSynchronize());
      std::vector<float> got(C0.size());
      DEV_CHECK(cudaMemcpy(got.data(), dC, got.size() * 4, cudaMemcpyDeviceToHost));
      char what[200];
      std::snprintf(what, sizeof what, "fragpack mt%d w%d %s %s%d M=%d N=%d K=%d g%d split %d%s%s", v.mt, v.warps,
                    v.sacc ? "sacc" : "hmul", v.cluster ? "cluster" : "r", v.ring, c.M, c.N, c.K, c.group, c.splits, c.bias ? " bias" : "",
                    c.add ? " add" : "");
      // f16 weights ((q - 8) s rounded once, 2^-11 relative; exact codes with sacc) and f16 activations (rounded in
      // the reference too), f32 accumulation: ~5e-4 relative in all; the library's GEMM tests allow 1e-3
      // (tests/test_gpu_gemm.py TOL_REL)
      bool finite;
      const double err = rel_err(got, ref, &finite);
      const bool ok = finite && err < 1e-3;
      std::printf("%-72s %s rel %.2e%s\n", what, ok ? "PASS" : "FAIL", err, finite ? "" : " (non-finite)");
      fails += !ok;
    }
    cudaFree(dA); cudaFree(dC); cudaFree(db);
  }
  return fails ? 1 : 0;
}

// --case time: the 7B layer's four GEMMs at M = 1, 8, 16, 32, 64 (weights rotated over > 256 MB): every build and
// split count that fits, the best per (shape, M) against the product's gemm_multi (few-token wgmma builds from 3
// tokens; at 1-2 tokens gemm.cu's own choice) and the read ceiling of the same bytes
int case_time() {
  int sms = 0;
  DEV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct Sh { const char* name; int N, K; };
  const Sh shapes[] = {{"qkv", 4608, 3584}, {"o", 3584, 3584}, {"gate+up", 37888, 3584}, {"down", 3584, 18944}};
  const int Ms[] = {1, 8, 16, 32, 64};
  const int Ss[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48};
  double layer_fp[5] = {0}, layer_prod[5] = {0}, layer_ceil = 0;
  unsigned* sink = nullptr;
  DEV_CHECK(cudaMalloc(&sink, (size_t)sms * 8 * sizeof(unsigned)));
  for (const Sh& sh : shapes) {
    const Int4Weight W = random_int4(sh.N, sh.K, 128, 1234u + sh.N);
    const Packed P = repack(W);
    const int copies = (int)std::max<size_t>(2, kRotateBytes / P.bytes() + 1);
    DevPacked D(P, copies);
    DeviceCopies wc(W.file_bytes);
    const double t_ceil = ceiling_us(D, P.bytes(), sink, sms);
    layer_ceil += t_ceil;
    std::printf("  %-8s N=%5d K=%5d: read ceiling %7.1f us (%4.2f TB/s)\n", sh.name, sh.N, sh.K, t_ceil,
                (double)P.bytes() / (t_ceil * 1e-6) / 1e12);
    for (int mi = 0; mi < 5; mi++) {
      const int M = Ms[mi], mt = mt_of(M);
      const std::vector<float> A = acts(M, sh.K, 5u);
      std::vector<__half> Ah(A.size());
      for (size_t i = 0; i < A.size(); i++) Ah[i] = __float2half_rn(A[i]);
      __half* dA; float* dC;
      DEV_CHECK(cudaMalloc(&dA, Ah.size() * 2));
      DEV_CHECK(cudaMalloc(&dC, (size_t)M * sh.N * 4));
      DEV_CHECK(cudaMemcpy(dA, Ah.data(), Ah.size() * 2, cudaMemcpyHostToDevice));
      nq::GemmScratch ws;
      const double t_prod = median_us([&](int i) {
        nq::LinW L;
        L.w = wc.copy(i);
        L.scales = reinterpret_cast<const __half*>(wc.copy(i) + W.scales_offset());
        L.N = sh.N; L.K = sh.K; L.group = 128; L.type = nq::WT_INT4;
        float* Cs[1] = {dC};
        const float* bs[1] = {nullptr};
        dev::must(nq::gemm_multi(&L, Cs, bs, 1, dA, sh.K, M, sh.N, false, 0, &ws));
      }, 20);
      nq::gemm_scratch_free(&ws);
      double best = 1e30;
      char best_what[64] = "";
      for (int warps : {4, 8})
        for (bool sacc : {false, true})
        for (int ring : {0, -1}) {   // the register ring (the shared-memory ring lost, NOTES 7d) and the cluster build
          Variant v{mt, warps, 8, sacc, 0};
          v.cluster = ring < 0;
          const LaunchFn f = build(v);
          if (!f) continue;
          const char* kind = v.cluster ? "cluster" : "global";
          std::printf("  %-8s M=%2d w%d %s %s:", sh.name, M, warps, sacc ? "sacc" : "hmul", kind);
          for (const int S : Ss) {
            if (!total_smem(v, sh.K, S) || S > sh.K / 128) continue;
            if (!f(D.w(0), D.s(0), dA, sh.K, M, sh.N, sh.K, nullptr, dC, sh.N, false, S, 0)) {
              std::printf(" S%d refused", S);
              continue;
            }
            const double tf = median_us([&](int i) {
              f(D.w(i), D.s(i), dA, sh.K, M, sh.N, sh.K, nullptr, dC, sh.N, false, S, 0);
            }, 20);
            std::printf(" S%d %.1f", S, tf);
            if (tf < best) {
              best = tf;
              std::snprintf(best_what, sizeof best_what, "w%d %s %s S%d", warps, sacc ? "sacc" : "hmul", kind, S);
            }
          }
          std::printf("\n");
        }
      layer_fp[mi] += best;
      layer_prod[mi] += t_prod;
      std::printf("  %-8s N=%5d K=%5d M=%2d: fragpack best %7.1f us (%4.2f TB/s, %s)  product %7.1f us\n", sh.name,
                  sh.N, sh.K, M, best, (double)P.bytes() / (best * 1e-6) / 1e12, best_what, t_prod);
      cudaFree(dA); cudaFree(dC);
    }
  }
  for (int mi = 0; mi < 5; mi++)
    std::printf("  per 7B layer M=%2d: fragpack (best build per shape) %7.1f us (x28 = %.2f ms, %3.0f %% of the read "
                "ceiling)  product %7.1f us (x28 = %.2f ms)\n", Ms[mi], layer_fp[mi], 28 * layer_fp[mi] / 1e3,
                100.0 * layer_ceil / layer_fp[mi], layer_prod[mi], 28 * layer_prod[mi] / 1e3);
  std::printf("  per 7B layer: read ceiling %7.1f us\n", layer_ceil);
  cudaFree(sink);
  return 0;
}

// --case diag: where the time of the best builds goes. gate+up (split 4) and down (split 16 at 16 tokens, 8 at 32):
// the GEMM, the same launch without the MMAs (loads + unpacking), and the loads alone, against the read ceiling.
int case_diag() {
  int sms = 0;
  DEV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct Sh { const char* name; int N, K, s16, s32; };
  const Sh shapes[] = {{"gate+up", 37888, 3584, 4, 4}, {"down", 3584, 18944, 16, 8}, {"qkv", 4608, 3584, 4, 4}};
  unsigned* sink = nullptr;
  DEV_CHECK(cudaMalloc(&sink, (size_t)sms * 8 * sizeof(unsigned)));
  for (const Sh& sh : shapes) {
    const Int4Weight W = random_int4(sh.N, sh.K, 128, 1234u + sh.N);
    const Packed P = repack(W);
    DevPacked D(P, (int)std::max<size_t>(2, kRotateBytes / P.bytes() + 1));
    const double t_ceil = ceiling_us(D, P.bytes(), sink, sms);
    for (const int M : {16, 32}) {
      const int mt = mt_of(M), S = M == 16 ? sh.s16 : sh.s32;
      const bool sacc = M == 16;
      const std::vector<float> A = acts(M, sh.K, 5u);
      std::vector<__half> Ah(A.size());
      for (size_t i = 0; i < A.size(); i++) Ah[i] = __float2half_rn(A[i]);
      __half* dA; float* dC;
      DEV_CHECK(cudaMalloc(&dA, Ah.size() * 2));
      DEV_CHECK(cudaMalloc(&dC, (size_t)M * sh.N * 4));
      DEV_CHECK(cudaMemcpy(dA, Ah.data(), Ah.size() * 2, cudaMemcpyHostToDevice));
      double t[3];
      for (int mode = 0; mode < 3; mode++) {
        Variant v{mt, 4, 8, sacc, 0};
        v.mode = mode;
        const LaunchFn f = build(v);
        t[mode] = median_us([&](int i) { f(D.w(i), D.s(i), dA, sh.K, M, sh.N, sh.K, nullptr, dC, sh.N, false, S, 0); },
                            20);
      }
      std::printf("  %-8s M=%2d (w4 %s S%d): GEMM %6.1f us, without MMAs %6.1f, loads alone %6.1f; read ceiling %6.1f\n",
                  sh.name, M, sacc ? "sacc" : "hmul", S, t[0], t[1], t[2], t_ceil);
      cudaFree(dA); cudaFree(dC);
    }
  }
  cudaFree(sink);
  return 0;
}

// --case gemv: the fragment-order GEMV (4 and 8 warps, splits 1-16) against float64 and against the product's
// gemv_int4 (STORE mode, f16 x, the file's order) on the 7B decode shapes; per layer, the best of each
int case_gemv() {
  const int sms = dev::sm_count();
  dev::raise_smem(nq::gemv_int4<nq::GEMV_STORE, 2>);
  struct Sh { const char* name; int N, K; };
  const Sh shapes[] = {{"qkv", 4608, 3584}, {"o", 3584, 3584}, {"gate+up", 37888, 3584}, {"down", 3584, 18944}};
  double sum_fp = 0, sum_prod = 0, sum_ceil = 0;
  int fails = 0;
  unsigned* sink = nullptr;
  DEV_CHECK(cudaMalloc(&sink, (size_t)sms * 8 * sizeof(unsigned)));
  for (const Sh& sh : shapes) {
    const Int4Weight W = random_int4(sh.N, sh.K, 128, 1234u + sh.N);
    const Packed P = repack(W);
    DevPacked D(P, (int)std::max<size_t>(2, kRotateBytes / P.bytes() + 1));
    DeviceCopies wc(W.file_bytes);
    const std::vector<float> x = acts(1, sh.K, 77u);
    std::vector<__half> xh(sh.K);
    for (int k = 0; k < sh.K; k++) xh[k] = __float2half_rn(x[k]);
    const std::vector<float> ref = gemm_ref(W, x, 1);
    __half* dx; float* dy;
    DEV_CHECK(cudaMalloc(&dx, sh.K * 2));
    DEV_CHECK(cudaMalloc(&dy, sh.N * 4));
    DEV_CHECK(cudaMemcpy(dx, xh.data(), sh.K * 2, cudaMemcpyHostToDevice));
    const double t_ceil = ceiling_us(D, P.bytes(), sink, sms);
    // the product: gemv_int4, f16 x as given, STORE
    auto pargs = [&](int c) {
      nq::GemvArgs a = dev::store_args(W, wc.copy(c), nullptr, dy);
      a.x_f16 = dx;
      return a;
    };
    const double t_prod = median_us([&](int i) {
      dev::must(nq::launch_gemv_int4<nq::GEMV_STORE, 2>(pargs(i), sh.N, sms, 0));
    }, 20);
    double best = 1e30;
    char best_what[48] = "";
    for (int vi = 0; vi < 4; vi++) {   // rows w4, rows w8, tile w4, tile w8
      const int warps = vi & 1 ? 8 : 4;
      const bool tile = vi >= 2;
      std::printf("  %-8s %s w%d:", sh.name, tile ? "tile" : "rows", warps);
      for (const int S : {1, 2, 3, 4, 6, 8, 12, 16}) {
        auto f = vi == 0 ? launch_gemv_fp<4, 8> : vi == 1 ? launch_gemv_fp<8, 8> : vi == 2 ? launch_gemv_fp<4, 8, true>
                                                                                            : launch_gemv_fp<8, 8, true>;
        DEV_CHECK(cudaMemset(dy, 0xff, sh.N * 4));   // poison
        if (!f(D.w(0), D.s(0), dx, sh.N, sh.K, nullptr, dy, false, S, 0)) { std::printf(" S%d refused", S); continue; }
        DEV_CHECK(cudaDeviceSynchronize());
        std::vector<float> got(sh.N);
        DEV_CHECK(cudaMemcpy(got.data(), dy, sh.N * 4, cudaMemcpyDeviceToHost));
        bool finite;
        // f16 products, 4-deep f16 partial sums (gemv_int4's tolerance, csrc/dev/gemv_int4_3blocks.cu: 3e-3)
        const double err = rel_err(got, ref, &finite);
        const bool ok = finite && err < 3e-3;
        fails += !ok;
        const double tf = median_us([&](int i) { f(D.w(i), D.s(i), dx, sh.N, sh.K, nullptr, dy, false, S, 0); }, 20);
        std::printf(" S%d %.1f%s", S, tf, ok ? "" : " FAIL");
        if (ok && tf < best) {
          best = tf;
          std::snprintf(best_what, sizeof best_what, "%s w%d S%d", tile ? "tile" : "rows", warps, S);
        }
      }
      std::printf("\n");
    }
    std::printf("  %-8s N=%5d K=%5d: fragment-order GEMV best %6.1f us (%s), gemv_int4 %6.1f us, read ceiling %6.1f\n",
                sh.name, sh.N, sh.K, best, best_what, t_prod, t_ceil);
    sum_fp += best; sum_prod += t_prod; sum_ceil += t_ceil;
    cudaFree(dx); cudaFree(dy);
  }
  std::printf("  per 7B layer: fragment-order GEMV %6.1f us, gemv_int4 %6.1f us, read ceiling %6.1f us%s\n", sum_fp,
              sum_prod, sum_ceil, fails ? " (FAILURES)" : "");
  cudaFree(sink);
  return fails ? 1 : 0;
}

}  // namespace fp

int main(int argc, char** argv) {
  const std::string c = argc > 2 && std::strcmp(argv[1], "--case") == 0 ? argv[2] : "";
  if (c == "pack") return fp::case_pack();
  if (c == "emulate") return fp::case_emulate();
  if (c != "check" && c != "time" && c != "diag" && c != "gemv") {
    std::printf("usage: gemm_int4_fragpack --case pack|emulate|check|time|diag|gemv\n");
    return 2;
  }
  cudaDeviceProp prop;
  DEV_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("== case %s on %s\n", c.c_str(), prop.name);
  if (c == "gemv") return fp::case_gemv();
  return c == "check" ? fp::case_check() : c == "diag" ? fp::case_diag() : fp::case_time();
}
