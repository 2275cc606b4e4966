// Causal prefill attention on mma.sync, FlashAttention-2 style (csrc/dev/attn_prefill_fa.cu times and checks its
// variants against float64, a CPU emulation of its index math and the product kernel; bench/NOTES.md "Session 13:
// prefill attention (helper)").
//
// Contract: the product's (AttnArgs, M > 1 query tokens at *pos0 .. *pos0 + M - 1, causal over the paged f16 cache,
// q roped from the f32 qkv rows with the rope table and scaled by log2(e)/sqrt(D), output f16 [token][n_heads*D]).
//
// Kernel attn_prefill_fa<Cfg>: block (h, b, s) = KV head h, row block b (the heaviest first: b counts down), key
// split s. Rows pack (token, head) densely: row r = token * G + head (G = n_heads / n_kv query heads share the KV
// head), so a block of ROWS = 16 * MT * WARPS rows serves TQ = ROWS / G tokens (7B, 128 rows: 18 tokens x 7 heads +
// 2 pad rows; attn_prefill_kernel v1 had 8 tokens x 7 = 56 of 64). Warp w owns rows 16*MT*w .. +16*MT-1 (MT m16
// tiles; every B fragment of K and V feeds MT MMAs). Keys in tiles of KT, an ST-stage cp.async ring with ONE
// __syncthreads per tile:
//     wait(tile i) ; __syncthreads ; issue tile i+ST-1 into the stage tile i-1 used ; compute tile i
// The physical pages of a tile's copies are loaded one tile ahead (registers), so no dependent global load sits on the
// tile loop's path (v1 read page_table right before each cp.async: one L2 round trip per tile). Keys past the
// block's last position are zero-filled by the copy (src-size 0), never read.
// Per tile and warp: S = Q K^T (ldmatrix K, m16n8k16), the causal compare only where the tile crosses the warp's
// first position (full tiles skip it), a warp skips the tiles past its last position, online softmax per row in the
// log2 domain (row max: 2 quad shuffles; ex2.approx; a row with no key yet uses max 0 so that p = corr = 0), O
// rescaled only when some row's max moved (warp vote), then O += P V with the S fragments as the A operand:
//   A(Q)  : ldmatrix.x4 of Q rows (row-major [row][d]) -> a01 a23 a45 a67;
//   B(K)  : ldmatrix.x4 of K rows ([key][d] is B's "col" layout: B[k=d][n=key]) -> b01 b23 of two key tiles;
//   S     : c01 = (row g, keys 8n+2t, +1), c23 = (row g+8, same keys), g = lane/4, t = lane%4;
//   A(P)  : the S fragments of key tiles 2k, 2k+1 ARE the A fragment of k-step k (rounded to f16 pairs);
//   B(V)  : ldmatrix.x4.trans of V rows ([key][d]: B[k=key][n=d] needs the transpose) -> b01 b23 of two dim tiles.
// Q: QREG keeps the warp's A fragments of Q in registers (MT = 1; its staging then lies over the last ring stage),
// else ldmatrix from shared memory every k-step.
// Key split (gridDim.z = S > 1): the S blocks of a row block are one thread-block cluster over tile ranges of the row
// block's keys; each leaves (m, l, O unnormalised) in its shared memory, the cluster syncs, block rank s merges rows
// slice s over the S blocks' shared memory (distributed shared memory) and writes them. No global scratch, no
// counters, deterministic. It gives short grids (a 512-token chunk of the 7B: 29 row blocks x 4 KV heads = 116
// blocks on 132 SMs) more blocks in flight and halves the critical path of a short prompt's longest blocks.
#pragma once
#include <cooperative_groups.h>
#include <math_constants.h>
#include "kernels.h"
#include "device_util.cuh"
#include "cp_async.cuh"
#include "launch.h"

namespace nq {
namespace pf {

template <int D_, int WARPS_, int MT_, int KT_, int ST_, bool QREG_, int MINB_>
struct Cfg {
  static constexpr int D = D_, WARPS = WARPS_, MT = MT_, KT = KT_, ST = ST_, MINB = MINB_;
  static constexpr bool QREG = QREG_;
  static constexpr int THREADS = 32 * WARPS, ROWS = 16 * MT * WARPS, LD = D + 8;  // LD: ldmatrix rows 16 B apart mod 128
  static constexpr int KS = D / 16, NT = KT / 8, ND = D / 8;
  static constexpr int CPR = D / 8;              // 16-byte chunks per K/V row
  static constexpr int KPP = THREADS / CPR;      // keys per copy pass
  static constexpr int NPASS = KT / KPP;
  static constexpr int STAGE_H = 2 * KT * LD;    // halves per ring stage: K [KT][LD] then V [KT][LD]
  static constexpr int Q_H = ROWS * LD;
  static constexpr bool Q_ALIAS = QREG && Q_H <= STAGE_H;   // staged Q lies over the last stage (free until tile 1)
  static constexpr int LOOP_BYTES = (ST * STAGE_H + (Q_ALIAS ? 0 : Q_H)) * 2;
  static constexpr int OLD = D + 4;              // merge: f32 row stride of O (16-byte rows)
  static constexpr int kMaxSplit = 8;            // portable cluster size
  static constexpr int MERGE_BYTES = (ROWS * OLD + ROWS * 2 + ROWS * kMaxSplit) * 4;
  static constexpr int SMEM = LOOP_BYTES > MERGE_BYTES ? LOOP_BYTES : MERGE_BYTES;
  static_assert(KT % KPP == 0 && KT % 16 == 0 && ST >= 2 && (!QREG || MT == 1), "config");
  static_assert(ROWS * (D / 8) % THREADS == 0, "q staging: whole iterations per thread");
};

__device__ __forceinline__ float ex2(float x) {  // 2^x; ex2(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) { return h2_as_u32(__floats2half2_rn(lo, hi)); }

// ---- index math shared by the kernel and the CPU emulation (--case emulate) ------------------------------------
struct Geom {   // one block: its tokens and rows, its keys and its split's tile range
  int G, TQ, t0, nq, Rreal, n_keys, ntiles, ts, te, nt;
};
template <class C>
__host__ __device__ __forceinline__ Geom block_geom(int n_heads, int n_kv, int M, int pos0, int by, int nby, int split,
                                                    int nsplit) {
  Geom b;
  b.G = n_heads / n_kv;
  b.TQ = C::ROWS / b.G;
  b.t0 = (nby - 1 - by) * b.TQ;                   // heaviest row blocks first
  b.nq = b.TQ < M - b.t0 ? b.TQ : M - b.t0;
  b.Rreal = b.nq * b.G;                           // rows r = token * G + head; r >= Rreal: pad
  b.n_keys = pos0 + b.t0 + b.nq;                  // keys 0 .. the block's last position
  b.ntiles = (b.n_keys + C::KT - 1) / C::KT;
  b.ts = split * b.ntiles / nsplit;
  b.te = (split + 1) * b.ntiles / nsplit;
  b.nt = b.te - b.ts;
  return b;
}
// The warp's first real position (wmin), last (wmax; -1: no real row, the warp skips every tile) and the positions
// of this lane's rows r = wr0 + 16mt + g + 8hr (pad rows take wmax: they see keys, so no row is empty).
template <class C>
__host__ __device__ __forceinline__ void warp_rows(const Geom& b, int pos0, int warp, int g, int& wmin, int& wmax,
                                                   int (&rpos)[C::MT][2]) {
  const int wr0 = warp * 16 * C::MT;
  wmin = pos0 + b.t0 + wr0 / b.G;
  const int wr1 = wr0 + 16 * C::MT < b.Rreal ? wr0 + 16 * C::MT : b.Rreal;   // past the warp's last real row
  wmax = wr0 < b.Rreal ? pos0 + b.t0 + (wr1 - 1) / b.G : -1;
  for (int mt = 0; mt < C::MT; mt++)
    for (int hr = 0; hr < 2; hr++) {
      const int r = wr0 + 16 * mt + g + 8 * hr;
      rpos[mt][hr] = r < b.Rreal ? pos0 + b.t0 + r / b.G : wmax;
    }
}
// K/V copies: thread (crow, cpart) copies 16-byte chunk cpart of rows j = crow + p*KPP of a tile. Page slot of row
// j: crow % 16 + (p*KPP) % 16 (KPP and 16 powers of 2, tiles start on page bounds). Pages: KPP <= 16: pass p lies
// in page q = p*KPP/16 of the tile (KT/16 registers), else one register per pass.
template <class C>
struct Copy {
  static_assert(kPage == 16 && (C::KPP % 16 == 0 || 16 % C::KPP == 0), "copy passes vs pages");
  static constexpr bool kSlot = C::KPP <= 16;
  static constexpr int NPG = kSlot ? C::KT / 16 : C::NPASS;
  __host__ __device__ static int page_key(int tile, int q, int crow) {   // a key of the page register q
    return tile * C::KT + (kSlot ? q * 16 : crow + q * C::KPP);
  }
  __host__ __device__ static int page_reg(int p) { return kSlot ? p * C::KPP / 16 : p; }
  __host__ __device__ static uint32_t thr_off(int h, int crow, int cpart) {   // elements, within a physical page
    return ((uint32_t)h * 16 + crow % 16) * C::D + cpart * 8;
  }
  __host__ __device__ static size_t src_bytes(uint32_t page, uint32_t pstride, uint32_t thr, int p) {
    return 2ull * ((size_t)page * pstride + thr + ((p * C::KPP) % 16) * C::D);
  }
};

// Blocks per SM the registers are capped for: Cfg::MINB on sm_90; 1 on older GPUs (sm_80: two blocks' shared memory
// does not fit an SM, and a cap of 128 registers spilled there)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define NQ_PF_MINB(C) 1
#else
#define NQ_PF_MINB(C) (C::MINB)
#endif
template <class C>
__global__ void __launch_bounds__(C::THREADS, NQ_PF_MINB(C)) attn_prefill_fa(const AttnArgs a) {
  constexpr int D = C::D, KT = C::KT, ST = C::ST, MT = C::MT, NT = C::NT, ND = C::ND, KS = C::KS, LD = C::LD;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* const sm = reinterpret_cast<__half*>(smem);
  const uint32_t sm_u = smem_u32(sm);
  const uint32_t q_u = sm_u + 2u * (C::Q_ALIAS ? (ST - 1) * C::STAGE_H : ST * C::STAGE_H);
  __half* const Qs = sm + (C::Q_ALIAS ? (ST - 1) * C::STAGE_H : ST * C::STAGE_H);

  pdl_wait();   // qkv and the cache come from earlier kernels
  pdl_trigger();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int h = blockIdx.x, nsplit = gridDim.z, split = blockIdx.z;
  const int pos0 = *a.pos0 + a.pos_offset;
  const Geom b = block_geom<C>(a.n_heads, a.n_kv, a.M, pos0, blockIdx.y, gridDim.y, split, nsplit);
  const int G = b.G, t0 = b.t0, Rreal = b.Rreal, n_keys = b.n_keys, ts = b.ts, nt = b.nt;

  // ---- K/V copies (Copy<C>); the pages of a tile are loaded one tile ahead of its copies
  using CP = Copy<C>;
  const int cpart = tid % C::CPR, crow = tid / C::CPR;
  const uint32_t pstride = (uint32_t)a.n_kv * kPage * D;   // elements per physical page
  const uint32_t thr_off = CP::thr_off(h, crow, cpart);
  const uint32_t thr_dst = 2u * (crow * LD + cpart * 8);
  const char* const kbase = reinterpret_cast<const char*>(a.kv.k);
  const char* const vbase = reinterpret_cast<const char*>(a.kv.v);
  uint32_t pg[CP::NPG];
  auto load_pages = [&](int tile) {  // physical pages of tile `tile` (0 past the keys: never read)
#pragma unroll
    for (int q = 0; q < CP::NPG; q++) {
      const int key = CP::page_key(tile, q, crow);
      pg[q] = key < n_keys ? (uint32_t)__ldg(a.page_table + (key >> 4)) : 0u;
    }
  };
  auto issue = [&](int tile, int stage) {
    const uint32_t kb = sm_u + 2u * (stage * C::STAGE_H) + thr_dst, vb = kb + 2u * (KT * LD);
#pragma unroll
    for (int p = 0; p < C::NPASS; p++) {
      const bool ok = tile * KT + crow + p * C::KPP < n_keys;
      const size_t off = CP::src_bytes(pg[CP::page_reg(p)], pstride, thr_off, p);
      const uint32_t so = 2u * (p * C::KPP * LD);
      cp_async16(kb + so, kbase + off, ok ? 16 : 0);   // 0: 16 zero bytes, nothing read
      cp_async16(vb + so, vbase + off, ok ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    load_pages(ts + s);
    if (s < nt) issue(ts + s, s);
    cp_async_commit();
  }
  load_pages(ts + ST - 1);

  // ---- Q: roped, times log2(e)/sqrt(D), f16, rows past the block's tokens zero (4 dims per item)
  {
    const float qs = 1.4426950408889634f * rsqrtf((float)D);
    constexpr int QI = C::ROWS * (D / 8) / C::THREADS;
#pragma unroll 4
    for (int k = 0; k < QI; k++) {
      const int i = tid + k * C::THREADS, r = i / (D / 8), d = (i % (D / 8)) * 4;
      const bool valid = r < Rreal;
      const int tq = valid ? r / G : 0, hg = valid ? r % G : 0;
      const float* qin = a.qkv + (size_t)(t0 + tq) * a.qkv_stride + (h * G + hg) * D;
      const float4 x0 = *reinterpret_cast<const float4*>(qin + d);
      const float4 x1 = *reinterpret_cast<const float4*>(qin + d + D / 2);
      const float4* rp = reinterpret_cast<const float4*>(a.rope + (size_t)(pos0 + t0 + tq) * (D / 2) + d);
      const float4 c01 = rp[0], c23 = rp[1];   // (cos, sin) of dims d, d+1 ; d+2, d+3
      const float a0 = (x0.x * c01.x - x1.x * c01.y) * qs, b0 = (x1.x * c01.x + x0.x * c01.y) * qs;
      const float a1 = (x0.y * c01.z - x1.y * c01.w) * qs, b1 = (x1.y * c01.z + x0.y * c01.w) * qs;
      const float a2 = (x0.z * c23.x - x1.z * c23.y) * qs, b2 = (x1.z * c23.x + x0.z * c23.y) * qs;
      const float a3 = (x0.w * c23.z - x1.w * c23.w) * qs, b3 = (x1.w * c23.z + x0.w * c23.w) * qs;
      const uint2 lo = valid ? make_uint2(pack2(a0, a1), pack2(a2, a3)) : make_uint2(0u, 0u);
      const uint2 hi = valid ? make_uint2(pack2(b0, b1), pack2(b2, b3)) : make_uint2(0u, 0u);
      *reinterpret_cast<uint2*>(Qs + r * LD + d) = lo;
      *reinterpret_cast<uint2*>(Qs + r * LD + d + D / 2) = hi;
    }
  }
  __syncthreads();  // q staged
  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: this lane addresses row mr of matrix mi
  const int wr0 = warp * 16 * MT;           // the warp's first row
  // A fragment of Q (m-tile mt, k-step ks): rows wr0 + 16mt + (mi&1)*8 + mr, dims 16ks + (mi>>1)*8
  const uint32_t qa_u = q_u + 2u * ((wr0 + (mi & 1) * 8 + mr) * LD + (mi >> 1) * 8);
  uint32_t qreg[C::QREG ? KS : 1][4];
  if constexpr (C::QREG) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) ldmatrix_x4(qreg[ks], qa_u + 2u * (ks * 16));
  }

  int wmin, wmax, rpos[MT][2];
  warp_rows<C>(b, pos0, warp, g, wmin, wmax, rpos);
  float m[MT][2], l[MT][2], o[MT][ND][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    m[mt][0] = m[mt][1] = -CUDART_INF_F;
    l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int n = 0; n < ND; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }
  // ldmatrix lane offsets in a stage: K (B of S: keys np*16 + (mi>>1)*8 + mr, dims ks*16 + (mi&1)*8),
  // V (B of PV, transposed: keys kk*16 + (mi&1)*8 + mr, dims dp*16 + (mi>>1)*8)
  const uint32_t k_lane = 2u * (((mi >> 1) * 8 + mr) * LD + (mi & 1) * 8);
  const uint32_t v_lane = 2u * (KT * LD + ((mi & 1) * 8 + mr) * LD + (mi >> 1) * 8);

  int cstage = 0, istage = ST - 1;
  for (int i = 0; i < nt; i++) {
    cp_async_wait<ST - 2>();
    __syncthreads();  // tile i landed for every thread; every warp is done with tile i-1's stage (= istage)
    if (i + ST - 1 < nt) issue(ts + i + ST - 1, istage);
    cp_async_commit();
    load_pages(ts + i + ST);
    const int kt0 = (ts + i) * KT;
    if (kt0 <= wmax) {  // warp-uniform: some row of the warp sees a key of this tile
      const uint32_t st_u = sm_u + 2u * (cstage * C::STAGE_H);
      float sc[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++) sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ks++) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          if constexpr (C::QREG) {
#pragma unroll
            for (int e = 0; e < 4; e++) qa[mt][e] = qreg[ks][e];
          } else {
            ldmatrix_x4(qa[mt], qa_u + 2u * (mt * 16 * LD + ks * 16));
          }
        }
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
          uint32_t b[4];
          ldmatrix_x4(b, st_u + k_lane + 2u * (np * 16 * LD + ks * 16));
#pragma unroll
          for (int mt = 0; mt < MT; mt++) {
            mma16816(sc[mt][2 * np], qa[mt], b[0], b[1]);
            mma16816(sc[mt][2 * np + 1], qa[mt], b[2], b[3]);
          }
        }
      }
      if (kt0 + KT - 1 > wmin) {  // warp-uniform: the tile crosses the diagonal of some row of the warp
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
              if (kt0 + n * 8 + 2 * t + (e & 1) > rpos[mt][e >> 1]) sc[mt][n][e] = -CUDART_INF_F;
      }
      float corr[MT][2];
      bool moved = false;
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
          float mx = -CUDART_INF_F;
#pragma unroll
          for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(sc[mt][n][2 * hr], sc[mt][n][2 * hr + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[mt][hr], mx);
          const float m_use = m_new == -CUDART_INF_F ? 0.f : m_new;  // a row with no key yet: p = 0, corr = 0
          corr[mt][hr] = ex2(m[mt][hr] - m_use);
          moved |= m_new != m[mt][hr];
          float sum = 0.f;
#pragma unroll
          for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              const float p = ex2(sc[mt][n][2 * hr + e] - m_use);
              sc[mt][n][2 * hr + e] = p;
              sum += p;
            }
          l[mt][hr] = l[mt][hr] * corr[mt][hr] + sum;  // this lane's part of the row sum
          m[mt][hr] = m_new;
        }
      if (__any_sync(0xffffffffu, moved)) {  // corr == 1 exactly for rows whose max did not move
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int n = 0; n < ND; n++) {
            o[mt][n][0] *= corr[mt][0]; o[mt][n][1] *= corr[mt][0];
            o[mt][n][2] *= corr[mt][1]; o[mt][n][3] *= corr[mt][1];
          }
      }
#pragma unroll
      for (int kk = 0; kk < KT / 16; kk++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          pa[mt][0] = pack2(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
          pa[mt][1] = pack2(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
          pa[mt][2] = pack2(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
          pa[mt][3] = pack2(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < ND / 2; dp++) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, st_u + v_lane + 2u * (kk * 16 * LD + dp * 16));
#pragma unroll
          for (int mt = 0; mt < MT; mt++) {
            mma16816(o[mt][2 * dp], pa[mt], b[0], b[1]);
            mma16816(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
          }
        }
      }
    }
    cstage = cstage + 1 == ST ? 0 : cstage + 1;
    istage = istage + 1 == ST ? 0 : istage + 1;
  }

  // ---- epilogue: row sums over the quad
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      l[mt][hr] += __shfl_xor_sync(0xffffffffu, l[mt][hr], 1);
      l[mt][hr] += __shfl_xor_sync(0xffffffffu, l[mt][hr], 2);
    }
  if (nsplit == 1) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int hr = 0; hr < 2; hr++) {
        const int r = wr0 + 16 * mt + g + 8 * hr;
        if (r >= Rreal) continue;
        const int tq = r / G, hg = r % G;
        const float inv = 1.f / l[mt][hr];  // >= 1: the row's maximum contributes 2^0
        __half* dst = a.out + (size_t)(t0 + tq) * a.n_heads * D + (h * G + hg) * D + 2 * t;
#pragma unroll
        for (int n = 0; n < ND; n++)
          *reinterpret_cast<__half2*>(dst + n * 8) = __floats2half2_rn(o[mt][n][2 * hr] * inv, o[mt][n][2 * hr + 1] * inv);
      }
    return;
  }
  // ---- key split: (m, l, O) of every row into this block's shared memory, merged over the cluster (sm_90+: the
  // launcher gives older GPUs nsplit = 1)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  float* const Ob = reinterpret_cast<float*>(smem);  // [ROWS][OLD], over the ring (and Q)
  float* const ML = Ob + C::ROWS * C::OLD;           // [ROWS][2]: m, l
  float* const Wt = ML + C::ROWS * 2;                // [ROWS][kMaxSplit]: split weights / L (this block's rows)
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring and Q
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int r = wr0 + 16 * mt + g + 8 * hr;
#pragma unroll
      for (int n = 0; n < ND; n++)
        *reinterpret_cast<float2*>(Ob + r * C::OLD + n * 8 + 2 * t) = make_float2(o[mt][n][2 * hr], o[mt][n][2 * hr + 1]);
      if (t == 0) { ML[2 * r] = m[mt][hr]; ML[2 * r + 1] = l[mt][hr]; }
    }
  cl.sync();  // every split's partial is in its shared memory
  const int r0 = split * Rreal / nsplit, r1 = (split + 1) * Rreal / nsplit;   // this block's slice of the rows
  for (int r = r0 + tid; r < r1; r += C::THREADS) {
    float mj[C::kMaxSplit], lj[C::kMaxSplit], M = -CUDART_INF_F;
#pragma unroll
    for (int j = 0; j < C::kMaxSplit; j++)
      if (j < nsplit) {
        const float* rml = cl.map_shared_rank(ML, j);
        mj[j] = rml[2 * r];
        lj[j] = rml[2 * r + 1];
        M = fmaxf(M, mj[j]);   // finite: the split holding key 0 saw it
      }
    float L = 0.f;
#pragma unroll
    for (int j = 0; j < C::kMaxSplit; j++)
      if (j < nsplit) {
        mj[j] = ex2(mj[j] - M);  // 0 for a split that saw no key of this row
        L += lj[j] * mj[j];
      }
    const float inv = 1.f / L;
#pragma unroll
    for (int j = 0; j < C::kMaxSplit; j++)
      if (j < nsplit) Wt[r * C::kMaxSplit + j] = mj[j] * inv;
  }
  __syncthreads();
  for (int i = tid; i < (r1 - r0) * (D / 4); i += C::THREADS) {
    const int r = r0 + i / (D / 4), d = (i % (D / 4)) * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < nsplit; j++) {  // split order
      const float w = Wt[r * C::kMaxSplit + j];
      const float4 v = *reinterpret_cast<const float4*>(cl.map_shared_rank(Ob, j) + r * C::OLD + d);
      acc.x = fmaf(w, v.x, acc.x); acc.y = fmaf(w, v.y, acc.y); acc.z = fmaf(w, v.z, acc.z); acc.w = fmaf(w, v.w, acc.w);
    }
    const int tq = r / G, hg = r % G;
    __half2* dst = reinterpret_cast<__half2*>(a.out + (size_t)(t0 + tq) * a.n_heads * D + (h * G + hg) * D + d);
    dst[0] = __floats2half2_rn(acc.x, acc.y);
    dst[1] = __floats2half2_rn(acc.z, acc.w);
  }
  cl.sync();  // no block leaves while another reads its shared memory
#endif
}

// Whether this GPU runs the kernel's sm_90 code (clusters and distributed shared memory: key splits > 1).
template <class C>
bool prefill_clusters_ok() {
  static const bool ok = [] {
    cudaFuncAttributes fa{};
    return cudaFuncGetAttributes(&fa, attn_prefill_fa<C>) == cudaSuccess && fa.binaryVersion >= 90;
  }();
  return ok;
}

template <class C>
int launch_attn_prefill(const AttnArgs& a, int nsplit, cudaStream_t st) {
  static const cudaError_t raised =
      cudaFuncSetAttribute(attn_prefill_fa<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
  if (raised != cudaSuccess) return fail(NQ_E_CUDA, "attention: shared memory opt-in: %s", cudaGetErrorString(raised));
  const int G = a.n_heads / a.n_kv, TQ = C::ROWS / G;
  if (TQ < 1 || nsplit < 1 || nsplit > C::kMaxSplit)
    return fail(NQ_E_INVALID_ARG, "attention: prefill with G %d, %d key splits", G, nsplit);
  if (nsplit > 1 && !prefill_clusters_ok<C>())
    return fail(NQ_E_UNSUPPORTED, "attention: prefill key splits need the kernel's sm_90 code (clusters)");
  const dim3 grid(a.n_kv, (a.M + TQ - 1) / TQ, nsplit);
  if (nsplit == 1) return launch_pdl("attn_prefill_fa", attn_prefill_fa<C>, grid, dim3(C::THREADS), C::SMEM, st, a);
  return launch_pdl_cluster("attn_prefill_fa", attn_prefill_fa<C>, grid, dim3(C::THREADS), dim3(1, 1, nsplit), C::SMEM,
                            st, a);
}

// Key splits for a grid of `blocks` row blocks (n_kv x ceil(M / TQ)) on `sm_count` SMs (the long build): 2 while the
// grid is under one block per SM (a 512-token chunk of the 7B: 116 blocks on 132 SMs), else 1. Measured (call 6): at
// 8K-32K keys a layer's chunks take 2,074 / 27,205 us with 2 splits, 2,616 / 36,702 with 1, 2,274 / 28,139 with 4;
// one launch of 8K tokens (456 blocks) is fastest with 1.
inline int prefill_splits(int blocks, int sm_count) { return blocks <= sm_count ? 2 : 1; }

}  // namespace pf
}  // namespace nq
