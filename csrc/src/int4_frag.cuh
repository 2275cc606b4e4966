// The INT4 fragment order: the device order of layout-1 INT4 weights on Hopper (repacked at load, model.cu; the file
// and the spec keep layout 1). Design and measurements: bench/NOTES.md "Session 11" §7e-7g, "Session 13". The numpy
// reference of the same order: tests/fragment_order.py (to_fragment_order, interleave_pair); the pair of this file's
// repack (int4_frag.cu) and unpack_word below is checked bit for bit by tests/test_gpu_frag_repack.py.
//
// * Tile (nb, kb): W rows 64 nb .. 64 nb + 63, k 16 kb .. 16 kb + 15 (one 16-k "step"). n8-tile j of the tile = rows
//   64 nb + 8 j + g, g = 0..7. Lane l = 4 g + t (t = 0..3) owns 16 bytes (4 words) of the tile; word w carries
//   n8-tiles 2w and 2w + 1, i.e. rows 16 w + g and 16 w + 8 + g (codes u = q + 8, 0..15):
//     nibble 0 / 4: row 16w + g,     k 2t / 2t + 1
//     nibble 1 / 5: row 16w + g,     k 2t + 8 / 2t + 9
//     nibble 2 / 6: row 16w + 8 + g, k 2t / 2t + 1
//     nibble 3 / 7: row 16w + 8 + g, k 2t + 8 / 2t + 9
//   Read as mma.m16n8k16 B fragments (weights = B, 8 rows n): (b0, b1) of n8-tile 2w = pairs 0, 1 of unpack_word;
//   of n8-tile 2w + 1 = pairs 2, 3. Read as the wgmma register-A fragment of warp w of a warpgroup (rows 16 w ..
//   16 w + 15; a01 = (gid, 2tig), a23 = (gid + 8, 2tig), a45 = (gid, 2tig + 8), a67 = (gid + 8, 2tig + 8)):
//   {pair 0, pair 2, pair 1, pair 3}.
// * Memory: words [N/64][K/16][32 lanes][4] uint32 (uint4 index (nb * K/16 + kb) * 32 + lane): a 64-row tile's k
//   run is contiguous, 512 bytes per step. Scales [N/64][K/group][8 g][8 j] f16 (uint4 index (nb * K/group + gi) * 8
//   + g: the 8 scales of rows 64 nb + 8 j + g, j = 0..7). Words and scales take the bytes the file's qweight and
//   scales took (the same sizes, the scales at align128(N K / 2)), so a weight is repacked in place.
// * The gate/up pair (ORDER_FRAG_PAIR): gate and up (I x K each) are one matrix P of 2I rows interleaved in 8-row
//   blocks, P row 64 T + 16 q + 8 h + g = (h ? up : gate) row 32 T + 8 q + g, so each word holds a gate row and the
//   same up row (n8-tiles 2q, 2q + 1; for wgmma: thread rows gid and gid + 8). P has I/32 tiles: tiles 0 .. I/64 - 1
//   in the gate tensor's bytes, the rest in the up tensor's (pair_tile). P tile T gives outputs 32 T .. 32 T + 31.
// * Chunks: K runs in chunks of kChunkSteps steps (128 k) for the GEMV and the few-token GEMM; split s of S over KC
//   chunks is [chunk_begin(KC, s, S), chunk_begin(KC, s + 1, S)).
// Shapes: N % 64 == 0 (the pair: I % 64 == 0), K % 128 == 0, group a multiple of 16 dividing K (every Qwen2.5 size).
#pragma once
#include <cuda_fp16.h>
#include <cstdint>
#include "kernels.h"

namespace nq {
namespace frag {

constexpr int kTileRows = 64;        // W rows of a tile
constexpr int kStepK = 16;           // k of a step
constexpr int kChunkSteps = 8;       // steps of a chunk (128 k)
constexpr int kTileStepBytes = 512;  // one (tile, step): 32 lanes x 16 bytes

// Whether an INT4 weight of this shape can take the order (layout 1 only; layout 2 keeps the file's order).
__host__ __device__ inline bool shape_ok(int N, int K, int group) {
  return N > 0 && N % kTileRows == 0 && K > 0 && K % (kStepK * kChunkSteps) == 0 && group > 0 && group % kStepK == 0 &&
         K % group == 0;
}
__host__ __device__ inline int chunk_begin(int KC, int s, int S) { return (int)((long long)KC * s / S); }

// (nibble i of word w of lane) -> (row within the 64-row tile, k within the step): the table above
__host__ __device__ inline int nibble_row(int lane, int w, int i) { return 16 * w + 8 * ((i >> 1) & 1) + (lane >> 2); }
__host__ __device__ inline int nibble_k(int lane, int i) { return 2 * (lane & 3) + (i >> 2) + 8 * (i & 1); }
// P row (within the pair's 2I rows) -> source row of gate (h = 0) or up (h = 1)
__host__ __device__ inline int pair_src_row(int prow, int* h) {
  *h = (prow >> 3) & 1;
  return 32 * (prow >> 6) + 8 * ((prow >> 4) & 3) + (prow & 7);
}

struct Tile {
  const uint4* w;   // (kb, lane) at w[kb * 32 + lane]
  const uint4* s;   // (gi, g) at s[gi * 8 + g]
};
// tile nb of a weight in ORDER_FRAG
__host__ __device__ inline Tile tile_of(const LinW& W, int nb) {
  const uint4* w = reinterpret_cast<const uint4*>(W.w);
  const uint4* s = reinterpret_cast<const uint4*>(W.scales);
  return {w + (size_t)nb * (W.K / kStepK) * 32, s + (size_t)nb * (W.K / W.group) * 8};
}
// tile T of the pair P (ORDER_FRAG_PAIR): the first I/64 tiles are in gate's bytes, the rest in up's
__host__ __device__ inline Tile pair_tile(const LinW& gate, const LinW& up, int T) {
  const int half = gate.N / kTileRows;
  return T < half ? tile_of(gate, T) : tile_of(up, T - half);
}

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t mask, uint32_t orv) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "r"(mask), "r"(orv));  // (a & b) | c
  return r;
}
__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// One word's exact codes q = u - 8 as four f16 pairs: (row 16w + g: k 2t, 2t + 1), (row 16w + g: k 2t + 8, 2t + 9),
// (row 16w + 8 + g: k 2t, 2t + 1), (row 16w + 8 + g: k 2t + 8, 2t + 9). (w & 0x000F000F) | 0x64006400 is the f16
// pair (1024 + u0, 1024 + u4), minus 1032; (w & 0x00F000F0) | 0x64006400 is (1024 + 16 u1, 1024 + 16 u5), / 16 - 72;
// w >> 8 gives nibbles 2/6 and 3/7 the same way. Exact small integers; the scale multiplies them afterwards (one f16
// rounding, the library's dequantisation).
__device__ __forceinline__ void unpack_word(uint32_t w, __half2 (&p)[4]) {
  const uint32_t k_lo = 0x64006400u, y = w >> 8;
  const __half2 q_sub = __float2half2_rn(1032.f), inv16 = __float2half2_rn(1.f / 16.f), q_off = __float2half2_rn(-72.f);
  p[0] = __hsub2(u2h(lop3_and_or(w, 0x000F000Fu, k_lo)), q_sub);
  p[1] = __hfma2(u2h(lop3_and_or(w, 0x00F000F0u, k_lo)), inv16, q_off);
  p[2] = __hsub2(u2h(lop3_and_or(y, 0x000F000Fu, k_lo)), q_sub);
  p[3] = __hfma2(u2h(lop3_and_or(y, 0x00F000F0u, k_lo)), inv16, q_off);
}

// The two scales of word w's rows (16 w + g, 16 w + 8 + g) from the lane's 16-byte scale vector (j = 2w, 2w + 1),
// each broadcast to both halves of an f16 pair.
__device__ __forceinline__ void word_scales(const uint4& sv, int w, __half2* s_lo, __half2* s_hi) {
  const uint32_t x = w == 0 ? sv.x : w == 1 ? sv.y : w == 2 ? sv.z : sv.w;
  *s_lo = u2h(__byte_perm(x, 0, 0x1010));
  *s_hi = u2h(__byte_perm(x, 0, 0x3232));
}

}  // namespace frag
}  // namespace nq
