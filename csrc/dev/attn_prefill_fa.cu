// Causal prefill attention on mma.sync, FlashAttention-2 style, against the product's attn_prefill_kernel
// (csrc/src/attention.cu, included below and launched through nq::attention, the timing baseline). Issue 12:
// the product runs ~52 TFLOP/s at a 512-token prompt and ~110-140 at 8K-32K (bench/NOTES.md "Session 13: prefill
// attention (helper)" has the design reasoning and the prediction).
//
//   build/dev/attn_prefill_fa --case emulate # CPU: the kernel's index math and data flow against float64
//   build/dev/attn_prefill_fa --case check   # GPU: every variant x split against float64, and the product
//   build/dev/attn_prefill_fa --case time    # GPU: 7B (28 / 4 heads, D 128) prompts 512..32768, µs per layer
//
// Contract: the product's (AttnArgs, M > 1 query tokens at *pos0 .. *pos0 + M - 1, causal over the paged f16 cache,
// q roped from the f32 qkv rows with the rope table and scaled by log2(e)/sqrt(D), output f16 [token][n_heads*D]).
//
// Kernel fa_prefill<Cfg>: block (h, b, s) = KV head h, row block b (the heaviest first: b counts down), key split s.
// Rows pack (token, head) densely: row r = token * G + head (G = n_heads / n_kv query heads share the KV head), so a
// block of ROWS = 16 * MT * WARPS rows serves TQ = ROWS / G tokens (7B, 128 rows: 18 tokens x 7 heads + 2 pad rows;
// the product's 8 tokens x 7 = 56 of 64). Warp w owns rows 16*MT*w .. +16*MT-1 (MT m16 tiles; every B fragment of
// K and V feeds MT MMAs). Keys in tiles of KT, ST-stage cp.async ring with ONE __syncthreads per tile:
//     wait(tile i) ; __syncthreads ; issue tile i+ST-1 into the stage tile i-1 used ; compute tile i
// The physical page of each copy pass is loaded one tile ahead (a register), so no dependent global load sits on the
// tile loop's path (the product reads page_table right before each cp.async: one L2 round trip per tile). Keys past
// the block's last position are zero-filled by the copy (src-size 0), never read.
// Per tile and warp: S = Q K^T (ldmatrix K, m16n8k16), the causal compare only where the tile crosses the warp's
// first position (full tiles skip it), a warp skips the tiles past its last position, online softmax per row in the
// log2 domain (row max: 2 quad shuffles; ex2.approx), O rescaled only when some row's max moved (warp vote), then
// O += P V with the S fragments as the A operand (the product's fragment use, its comment) and ldmatrix.trans of V.
// Q: QREG keeps the warp's A fragments of Q in registers (MT = 1; its staging then lies over the last ring stage),
// else ldmatrix from shared memory every k-step.
// Key split (gridDim.z = S > 1): the S blocks of a row block are one thread-block cluster over tile ranges of the row
// block's keys; each leaves (m, l, O unnormalised) in its shared memory, the cluster syncs, block rank s merges rows
// slice s over the S blocks' shared memory (distributed shared memory) and writes them. No global scratch, no
// counters, deterministic. It gives short grids (a 512-token chunk: 29 row blocks x 4 KV heads = 116 blocks) more
// blocks in flight and halves the critical path of a short prompt's longest blocks.
#include "dev_common.cuh"
#include "attention.cu"  // the product: nq::attention (attn_prefill_kernel), the baseline
#include "cp_async.cuh"
#include "launch.h"
#include <cooperative_groups.h>
#include <cstring>
#include <string>

namespace fa {
using namespace dev;
using nq::AttnArgs;
using nq::kPage;

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
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) { return nq::h2_as_u32(__floats2half2_rn(lo, hi)); }

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
  static_assert(nq::kPage == 16 && (C::KPP % 16 == 0 || 16 % C::KPP == 0), "copy passes vs pages");
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

template <class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB) fa_prefill(const AttnArgs a) {
  constexpr int D = C::D, KT = C::KT, ST = C::ST, MT = C::MT, NT = C::NT, ND = C::ND, KS = C::KS, LD = C::LD;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* const sm = reinterpret_cast<__half*>(smem);
  const uint32_t sm_u = nq::smem_u32(sm);
  const uint32_t q_u = sm_u + 2u * (C::Q_ALIAS ? (ST - 1) * C::STAGE_H : ST * C::STAGE_H);
  __half* const Qs = sm + (C::Q_ALIAS ? (ST - 1) * C::STAGE_H : ST * C::STAGE_H);

  nq::pdl_wait();   // qkv and the cache come from earlier kernels
  nq::pdl_trigger();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int h = blockIdx.x, nsplit = gridDim.z, split = blockIdx.z;
  const int pos0 = *a.pos0;
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
      nq::cp_async16(kb + so, kbase + off, ok ? 16 : 0);   // 0: 16 zero bytes, nothing read
      nq::cp_async16(vb + so, vbase + off, ok ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    load_pages(ts + s);
    if (s < nt) issue(ts + s, s);
    nq::cp_async_commit();
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
    for (int ks = 0; ks < KS; ks++) ldsm4(qreg[ks], qa_u + 2u * (ks * 16));
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
    nq::cp_async_wait<ST - 2>();
    __syncthreads();  // tile i landed for every thread; every warp is done with tile i-1's stage (= istage)
    if (i + ST - 1 < nt) issue(ts + i + ST - 1, istage);
    nq::cp_async_commit();
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
            ldsm4(qa[mt], qa_u + 2u * (mt * 16 * LD + ks * 16));
          }
        }
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
          uint32_t b[4];
          ldsm4(b, st_u + k_lane + 2u * (np * 16 * LD + ks * 16));
#pragma unroll
          for (int mt = 0; mt < MT; mt++) {
            mma(sc[mt][2 * np], qa[mt], b[0], b[1]);
            mma(sc[mt][2 * np + 1], qa[mt], b[2], b[3]);
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
          ldsm4t(b, st_u + v_lane + 2u * (kk * 16 * LD + dp * 16));
#pragma unroll
          for (int mt = 0; mt < MT; mt++) {
            mma(o[mt][2 * dp], pa[mt], b[0], b[1]);
            mma(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
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
  // ---- key split: (m, l, O) of every row into this block's shared memory, merged over the cluster
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  float* const Ob = reinterpret_cast<float*>(smem);  // [ROWS][OLD], over the ring (and Q)
  float* const ML = Ob + C::ROWS * C::OLD;           // [ROWS][2]: m, l
  float* const Wt = ML + C::ROWS * 2;                // [ROWS][kMaxSplit]: split weights / L (this block's rows)
  nq::cp_async_wait<0>();
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
}

// ---- variants -------------------------------------------------------------------------------------------------
struct Variant {
  const char* name;
  int rows;                                          // rows per block (16 * MT * WARPS)
  int (*launch)(const AttnArgs&, int nsplit, cudaStream_t);
  int regs = 0, spill = 0, smem = 0;
};

template <class C>
int launch_fa(const AttnArgs& a, int nsplit, cudaStream_t st) {
  static const cudaError_t raised =
      cudaFuncSetAttribute(fa_prefill<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
  if (raised != cudaSuccess) return nq::fail(NQ_E_CUDA, "smem opt-in: %s", cudaGetErrorString(raised));
  const int G = a.n_heads / a.n_kv, TQ = C::ROWS / G;
  if (TQ < 1 || nsplit < 1 || nsplit > C::kMaxSplit) return nq::fail(NQ_E_INVALID_ARG, "G %d / split %d", G, nsplit);
  const dim3 grid(a.n_kv, (a.M + TQ - 1) / TQ, nsplit);
  if (nsplit == 1) return nq::launch_pdl("fa_prefill", fa_prefill<C>, grid, dim3(C::THREADS), C::SMEM, st, a);
  return nq::launch_pdl_cluster("fa_prefill", fa_prefill<C>, grid, dim3(C::THREADS), dim3(1, 1, nsplit), C::SMEM, st, a);
}

//                      D   W  MT  KT ST QREG MINB
template <int D> using W8M1K64S2Q = Cfg<D, 8, 1, 64, 2, true, 1>;
template <int D> using W8M1K64S3Q = Cfg<D, 8, 1, 64, 3, true, 1>;
template <int D> using W4M2K64S2 = Cfg<D, 4, 2, 64, 2, false, 1>;
template <int D> using W4M2K32S3 = Cfg<D, 4, 2, 32, 3, false, 1>;
template <int D> using W4M1K64S2Q = Cfg<D, 4, 1, 64, 2, true, 2>;
template <int D> using W8M1K64S2B2 = Cfg<D, 8, 1, 64, 2, false, 2>;
template <int D> using W8M1K32S3B2 = Cfg<D, 8, 1, 32, 3, false, 2>;

template <class C>
Variant make_variant(const char* name) {
  Variant v{name, C::ROWS, &launch_fa<C>};
  cudaFuncAttributes fa;
  if (cudaFuncGetAttributes(&fa, fa_prefill<C>) == cudaSuccess) {
    v.regs = fa.numRegs;
    v.spill = (int)fa.localSizeBytes;
  }
  v.smem = C::SMEM;
  return v;
}
template <class C> struct Tag { using type = C; };
template <int D, class F>
void for_each_variant(F&& f) {   // f(Tag<Cfg>, name)
  f(Tag<W8M1K64S2Q<D>>{}, "w8m1k64s2q");
  f(Tag<W8M1K64S3Q<D>>{}, "w8m1k64s3q");
  f(Tag<W4M2K64S2<D>>{}, "w4m2k64s2");
  f(Tag<W4M2K32S3<D>>{}, "w4m2k32s3");
  f(Tag<W4M1K64S2Q<D>>{}, "w4m1k64s2q");
  f(Tag<W8M1K64S2B2<D>>{}, "w8m1k64s2b2");
  f(Tag<W8M1K32S3B2<D>>{}, "w8m1k32s3b2");
}
template <int D>
std::vector<Variant> variants() {
  std::vector<Variant> v;
  for_each_variant<D>([&](auto tag, const char* name) { v.push_back(make_variant<typename decltype(tag)::type>(name)); });
  return v;
}

// ---- inputs ----------------------------------------------------------------------------------------------------
struct Problem {
  int n_heads, n_kv, D, M, pos0;  // M query tokens at positions pos0 .. pos0 + M - 1
  int stride() const { return (n_heads + 2 * n_kv) * D; }
  int n_pos() const { return pos0 + M; }
};

// Device buffers of one problem (the cache holds all n_pos rows; pages in reversed physical order as the tests'
// fill_paged_cache; the rest of the last page NaN: never read)
struct DevProblem {
  Problem p{};
  float* qkv = nullptr;
  __half *k = nullptr, *v = nullptr, *out = nullptr;
  int *pt = nullptr, *pos = nullptr;
  float2* rope = nullptr;
  float *part_o = nullptr, *part_ml = nullptr;
  int* counters = nullptr;
  size_t out_elems = 0, guard_elems = 0;
  ~DevProblem() {
    for (void* x : {(void*)qkv, (void*)k, (void*)v, (void*)out, (void*)pt, (void*)pos, (void*)rope, (void*)part_o,
                    (void*)part_ml, (void*)counters})
      if (x) cudaFree(x);
  }
  AttnArgs args(int chunk = 0) const {  // chunk c of a chunked prompt: pos[c], qkv rows from c * M
    AttnArgs a;
    a.qkv = qkv + (size_t)chunk * p.M * p.stride(); a.qkv_stride = p.stride(); a.M = p.M; a.pos0 = pos + chunk;
    a.kv.k = k; a.kv.v = v; a.page_table = pt; a.rope = rope;
    a.n_heads = p.n_heads; a.n_kv = p.n_kv; a.D = p.D;
    a.keys_per_split = 32; a.n_split = 1; a.write_kv = false;
    a.part_o = part_o; a.part_ml = part_ml; a.counters = counters;
    a.out = out + (size_t)chunk * p.M * p.n_heads * p.D;
    return a;
  }
};

inline std::vector<float2> rope_table(int n_pos, int D) {
  std::vector<float2> r((size_t)n_pos * (D / 2));
  for (int pos = 0; pos < n_pos; pos++)
    for (int i = 0; i < D / 2; i++) {
      const double th = pos * std::pow(1e6, -2.0 * i / D);   // Qwen2.5's rope base
      r[(size_t)pos * (D / 2) + i] = make_float2((float)std::cos(th), (float)std::sin(th));
    }
  return r;
}

// Host copy of a check problem and its float64 reference.
struct HostProblem {
  Problem p;
  std::vector<float> q;       // [M][n_heads * D], before rope
  std::vector<__half> kc, vc;  // [n_pos][n_kv][D] (f16: the cache values)
  std::vector<float2> rope;
};

HostProblem make_host(const Problem& p, uint32_t seed) {
  HostProblem hp;
  hp.p = p;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  hp.q.resize((size_t)p.M * p.n_heads * p.D);
  for (float& x : hp.q) x = 2.f * nd(rng);  // the tests' scale: peaked softmax rows
  hp.kc.resize((size_t)p.n_pos() * p.n_kv * p.D);
  hp.vc.resize(hp.kc.size());
  for (auto& x : hp.kc) x = __float2half_rn(nd(rng));
  for (auto& x : hp.vc) x = __float2half_rn(nd(rng));
  hp.rope = rope_table(p.n_pos(), p.D);
  return hp;
}

std::vector<double> reference(const HostProblem& hp) {
  const Problem& p = hp.p;
  const int G = p.n_heads / p.n_kv, D = p.D;
  std::vector<double> out((size_t)p.M * p.n_heads * D);
#pragma omp parallel for schedule(dynamic)
  for (int th = 0; th < p.M * p.n_heads; th++) {
    const int tq = th / p.n_heads, hq = th % p.n_heads, hk = hq / G, pos = p.pos0 + tq;
    std::vector<double> q(D), s(pos + 1);
    const float* qi = hp.q.data() + (size_t)tq * p.n_heads * D + hq * D;
    for (int d = 0; d < D / 2; d++) {
      const float2 cs = hp.rope[(size_t)pos * (D / 2) + d];
      q[d] = (double)qi[d] * cs.x - (double)qi[d + D / 2] * cs.y;
      q[d + D / 2] = (double)qi[d + D / 2] * cs.x + (double)qi[d] * cs.y;
    }
    double mx = -1e300;
    for (int j = 0; j <= pos; j++) {
      const __half* kr = hp.kc.data() + ((size_t)j * p.n_kv + hk) * D;
      double acc = 0.0;
      for (int d = 0; d < D; d++) acc += q[d] * (double)__half2float(kr[d]);
      s[j] = acc / std::sqrt((double)D);
      mx = std::max(mx, s[j]);
    }
    double sum = 0.0;
    for (int j = 0; j <= pos; j++) sum += (s[j] = std::exp(s[j] - mx));
    double* o = out.data() + (size_t)th * D;
    for (int d = 0; d < D; d++) o[d] = 0.0;
    for (int j = 0; j <= pos; j++) {
      const __half* vr = hp.vc.data() + ((size_t)j * p.n_kv + hk) * D;
      const double w = s[j] / sum;
      for (int d = 0; d < D; d++) o[d] += w * (double)__half2float(vr[d]);
    }
  }
  return out;
}

// The paged cache of a check problem: pages in reversed physical order (the tests' fill_paged_cache), the rows past
// n_pos in the last page NaN (never read)
struct HostCache {
  std::vector<int> pt;
  std::vector<__half> k, v;
};
HostCache make_cache(const HostProblem& hp) {
  const Problem& p = hp.p;
  const int pages = (p.n_pos() + kPage - 1) / kPage, D = p.D;
  HostCache c;
  c.pt.resize(pages);
  for (int i = 0; i < pages; i++) c.pt[i] = pages - 1 - i;
  const size_t cache = (size_t)pages * p.n_kv * kPage * D;
  c.k.assign(cache, __ushort_as_half(0xffff));
  c.v.assign(cache, __ushort_as_half(0xffff));
  for (int j = 0; j < p.n_pos(); j++)
    for (int hh = 0; hh < p.n_kv; hh++)
      for (int d = 0; d < D; d++) {
        const size_t idx = (((size_t)c.pt[j / kPage] * p.n_kv + hh) * kPage + j % kPage) * D + d;
        c.k[idx] = hp.kc[((size_t)j * p.n_kv + hh) * D + d];
        c.v[idx] = hp.vc[((size_t)j * p.n_kv + hh) * D + d];
      }
  return c;
}

void upload(DevProblem& dp, const HostProblem& hp) {
  const Problem& p = hp.p;
  dp.p = p;
  const HostCache hc = make_cache(hp);
  const std::vector<int>& pt = hc.pt;
  const std::vector<__half>&k = hc.k, &v = hc.v;
  const int pages = (int)pt.size(), D = p.D;
  const size_t cache = k.size();
  std::vector<float> qkv((size_t)p.M * p.stride(), 1e30f);  // the k/v parts: not read by prefill attention
  for (int t = 0; t < p.M; t++)
    std::memcpy(qkv.data() + (size_t)t * p.stride(), hp.q.data() + (size_t)t * p.n_heads * D, (size_t)p.n_heads * D * 4);
  DEV_CHECK(cudaMalloc(&dp.qkv, qkv.size() * 4));
  DEV_CHECK(cudaMemcpy(dp.qkv, qkv.data(), qkv.size() * 4, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.k, cache * 2));
  DEV_CHECK(cudaMalloc(&dp.v, cache * 2));
  DEV_CHECK(cudaMemcpy(dp.k, k.data(), cache * 2, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMemcpy(dp.v, v.data(), cache * 2, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.pt, pages * 4));
  DEV_CHECK(cudaMemcpy(dp.pt, pt.data(), pages * 4, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.pos, 4));
  DEV_CHECK(cudaMemcpy(dp.pos, &p.pos0, 4, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.rope, hp.rope.size() * sizeof(float2)));
  DEV_CHECK(cudaMemcpy(dp.rope, hp.rope.data(), hp.rope.size() * sizeof(float2), cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.part_o, 4 * 64));
  DEV_CHECK(cudaMalloc(&dp.part_ml, 4 * 64));
  DEV_CHECK(cudaMalloc(&dp.counters, 4 * 64));
  dp.out_elems = (size_t)p.M * p.n_heads * D;
  dp.guard_elems = (size_t)4 * p.n_heads * D;  // 4 rows past M: must stay poisoned
  DEV_CHECK(cudaMalloc(&dp.out, (dp.out_elems + dp.guard_elems) * 2));
}

// Runs launch on dp (output poisoned 0xff first); relative Frobenius error against ref, or -1 if an output is not
// finite (unwritten: the poison is NaN) or a guard element past M was written, -2 if the launch failed.
double run_and_compare(DevProblem& dp, const std::vector<double>& ref, const std::function<int()>& launch,
                       std::vector<float>* got_out = nullptr) {
  DEV_CHECK(cudaMemset(dp.out, 0xff, (dp.out_elems + dp.guard_elems) * 2));
  if (launch() != NQ_OK) {
    std::printf("  launch: %s\n", nq::last_error());
    (void)cudaGetLastError();
    return -2;
  }
  DEV_CHECK(cudaDeviceSynchronize());
  std::vector<__half> h(dp.out_elems + dp.guard_elems);
  DEV_CHECK(cudaMemcpy(h.data(), dp.out, h.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = dp.out_elems; i < h.size(); i++)
    if (__half_as_ushort(h[i]) != 0xffff) return -1;
  double num = 0.0, den = 0.0;
  if (got_out) got_out->resize(dp.out_elems);
  for (size_t i = 0; i < dp.out_elems; i++) {
    const float x = __half2float(h[i]);
    if (!std::isfinite(x)) return -1;
    if (got_out) (*got_out)[i] = x;
    num += (x - ref[i]) * (x - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ---- --case emulate (CPU): the kernel's index math and data flow on the host ------------------------------------
// Runs fa_prefill<C>'s block geometry, key split, K/V copy addressing (against kv_row), Q staging, per-warp skip and
// causal-mask decisions, the online softmax with its lane ownership (lane 4g + t: rows g, g + 8 of each m-tile,
// keys / dims 8n + 2t + e), the f16 roundings of q and P, the output rows and the cluster merge, with the same
// shared helpers (block_geom, warp_rows, Copy). What it cannot see: ldmatrix / mma fragment addressing (the
// product's, unchanged), cp.async ordering and barriers (the GPU check's job).
template <class C>
std::vector<float> emulate(const HostProblem& hp, const HostCache& hc, int nsplit, long* addr_errors) {
  constexpr int D = C::D, KT = C::KT, MT = C::MT, ND = C::ND, ROWS = C::ROWS;
  using CP = Copy<C>;
  const Problem& p = hp.p;
  const int G = p.n_heads / p.n_kv, TQ = ROWS / G, nby = (p.M + TQ - 1) / TQ, pos0 = p.pos0;
  std::vector<float> out((size_t)p.M * p.n_heads * D, std::nanf(""));
  std::vector<int> written(out.size(), 0);
  const uint32_t pstride = (uint32_t)p.n_kv * kPage * D;
  long errs = 0;
#pragma omp parallel for schedule(dynamic) reduction(+ : errs)
  for (int hb = 0; hb < p.n_kv * nby; hb++) {
    const int h = hb % p.n_kv, by = hb / p.n_kv;
    std::vector<std::vector<float>> PO(nsplit, std::vector<float>((size_t)ROWS * D, 0.f));
    std::vector<std::vector<float>> PM(nsplit, std::vector<float>(ROWS)), PL(nsplit, std::vector<float>(ROWS));
    std::vector<float> Qs((size_t)ROWS * D), Ks((size_t)KT * D), Vs((size_t)KT * D);
    Geom b{};
    for (int split = 0; split < nsplit; split++) {
      b = block_geom<C>(p.n_heads, p.n_kv, p.M, pos0, by, nby, split, nsplit);
      // Q staging, as the kernel's items (r, d..d+3)
      const float qs = 1.4426950408889634f / std::sqrt((float)D);
      for (int i = 0; i < ROWS * (D / 8); i++) {
        const int r = i / (D / 8), d0 = (i % (D / 8)) * 4;
        const bool valid = r < b.Rreal;
        const int tq = valid ? r / G : 0, hg = valid ? r % G : 0;
        const float* qin = hp.q.data() + (size_t)(b.t0 + tq) * p.n_heads * D + (h * G + hg) * D;
        for (int e = 0; e < 4; e++) {
          const int d = d0 + e;
          const float2 cs = hp.rope[(size_t)(pos0 + b.t0 + tq) * (D / 2) + d];
          const float x0 = qin[d], x1 = qin[d + D / 2];
          Qs[(size_t)r * D + d] = valid ? __half2float(__float2half_rn((x0 * cs.x - x1 * cs.y) * qs)) : 0.f;
          Qs[(size_t)r * D + d + D / 2] = valid ? __half2float(__float2half_rn((x1 * cs.x + x0 * cs.y) * qs)) : 0.f;
        }
      }
      // per lane state: m per (warp, g, mt, hr) (equal over the quad), l per lane, O per (row, dim) (one owner each)
      std::vector<float> m((size_t)C::WARPS * 8 * MT * 2, -INFINITY), l((size_t)C::WARPS * 32 * MT * 2, 0.f);
      std::vector<float>& O = PO[split];
      std::fill(O.begin(), O.end(), 0.f);
      for (int i = 0; i < b.nt; i++) {
        const int tile = b.ts + i, kt0 = tile * KT;
        // copies
        for (int tid = 0; tid < C::THREADS; tid++) {
          const int cpart = tid % C::CPR, crow = tid / C::CPR;
          uint32_t pg[CP::NPG];
          for (int q = 0; q < CP::NPG; q++) {
            const int key = CP::page_key(tile, q, crow);
            pg[q] = key < b.n_keys ? (uint32_t)hc.pt[key >> 4] : 0u;
          }
          for (int pp = 0; pp < C::NPASS; pp++) {
            const int j = crow + pp * C::KPP, key = kt0 + j;
            const bool ok = key < b.n_keys;
            const size_t off = CP::src_bytes(pg[CP::page_reg(pp)], pstride, CP::thr_off(h, crow, cpart), pp) / 2;
            if (ok && off != (((size_t)hc.pt[key / kPage] * p.n_kv + h) * kPage + key % kPage) * D + cpart * 8) errs++;
            for (int e = 0; e < 8; e++) {
              Ks[(size_t)j * D + cpart * 8 + e] = ok ? __half2float(hc.k[off + e]) : 0.f;
              Vs[(size_t)j * D + cpart * 8 + e] = ok ? __half2float(hc.v[off + e]) : 0.f;
            }
          }
        }
        for (int w = 0; w < C::WARPS; w++) {
          const int wr0 = w * 16 * MT;
          for (int g = 0; g < 8; g++) {
            int wmin, wmax, rpos[MT][2];
            warp_rows<C>(b, pos0, w, g, wmin, wmax, rpos);
            if (kt0 > wmax) continue;
            const bool mask = kt0 + KT - 1 > wmin;
            for (int mt = 0; mt < MT; mt++)
              for (int hr = 0; hr < 2; hr++) {
                const int row = wr0 + 16 * mt + g + 8 * hr;
                float sc[KT];
                for (int kl = 0; kl < KT; kl++) {  // key kl = 8n + 2t + e lies in lane t's sc[mt][n][2hr + e]
                  float acc = 0.f;
                  for (int d = 0; d < D; d++) acc += Qs[(size_t)row * D + d] * Ks[(size_t)kl * D + d];
                  sc[kl] = mask && kt0 + kl > rpos[mt][hr] ? -INFINITY : acc;
                }
                float& mm = m[((size_t)(w * 8 + g) * MT + mt) * 2 + hr];
                float mx = -INFINITY;
                for (int kl = 0; kl < KT; kl++) mx = std::max(mx, sc[kl]);
                const float m_new = std::max(mm, mx), m_use = m_new == -INFINITY ? 0.f : m_new;
                const float corr = std::exp2(mm - m_use);
                for (int t = 0; t < 4; t++) {
                  float sum = 0.f;
                  for (int n = 0; n < KT / 8; n++)
                    for (int e = 0; e < 2; e++) {
                      float& v = sc[8 * n + 2 * t + e];
                      v = std::exp2(v - m_use);
                      sum += v;
                    }
                  float& ll = l[((size_t)(w * 32 + 4 * g + t) * MT + mt) * 2 + hr];
                  ll = ll * corr + sum;
                }
                mm = m_new;
                for (int dim = 0; dim < D; dim++) {  // owner: lane 4g + (dim % 8) / 2, o[mt][dim / 8][2hr + dim % 2]
                  float acc = O[(size_t)row * D + dim] * corr;
                  for (int kl = 0; kl < KT; kl++) acc += __half2float(__float2half_rn(sc[kl])) * Vs[(size_t)kl * D + dim];
                  O[(size_t)row * D + dim] = acc;
                }
              }
          }
        }
      }
      // row sums over the quad; partial or output
      for (int w = 0; w < C::WARPS; w++)
        for (int g = 0; g < 8; g++)
          for (int mt = 0; mt < MT; mt++)
            for (int hr = 0; hr < 2; hr++) {
              const int row = w * 16 * MT + 16 * mt + g + 8 * hr;
              float L = 0.f;
              for (int t = 0; t < 4; t++) L += l[((size_t)(w * 32 + 4 * g + t) * MT + mt) * 2 + hr];
              PM[split][row] = m[((size_t)(w * 8 + g) * MT + mt) * 2 + hr];
              PL[split][row] = L;
              if (nsplit == 1 && row < b.Rreal)
                for (int t = 0; t < 4; t++)
                  for (int n = 0; n < ND; n++)
                    for (int e = 0; e < 2; e++) {
                      const int dim = 8 * n + 2 * t + e;
                      const size_t oi = (size_t)(b.t0 + row / G) * p.n_heads * D + (h * G + row % G) * D + dim;
                      out[oi] = __half2float(__float2half_rn(O[(size_t)row * D + dim] * (1.f / L)));
                      written[oi]++;
                    }
            }
    }
    if (nsplit > 1)
      for (int rank = 0; rank < nsplit; rank++) {
        const int r0 = rank * b.Rreal / nsplit, r1 = (rank + 1) * b.Rreal / nsplit;
        for (int r = r0; r < r1; r++) {
          float M = -INFINITY, L = 0.f, wj[C::kMaxSplit];
          for (int j = 0; j < nsplit; j++) M = std::max(M, PM[j][r]);
          for (int j = 0; j < nsplit; j++) { wj[j] = std::exp2(PM[j][r] - M); L += PL[j][r] * wj[j]; }
          for (int dim = 0; dim < D; dim++) {
            float acc = 0.f;
            for (int j = 0; j < nsplit; j++) acc += wj[j] / L * PO[j][(size_t)r * D + dim];
            const size_t oi = (size_t)(b.t0 + r / G) * p.n_heads * D + (h * G + r % G) * D + dim;
            out[oi] = __half2float(__float2half_rn(acc));
            written[oi]++;
          }
        }
      }
  }
  for (int w : written)
    if (w != 1) errs++;   // every output exactly once
  *addr_errors = errs;
  return out;
}

template <class C>
int emulate_one(const char* name, const HostProblem& hp, const HostCache& hc, const std::vector<double>& ref, int nsplit) {
  long errs = 0;
  const std::vector<float> got = emulate<C>(hp, hc, nsplit, &errs);
  double num = 0.0, den = 0.0;
  bool finite = true;
  for (size_t i = 0; i < ref.size(); i++) {
    finite &= std::isfinite(got[i]);
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  const double e = std::sqrt(num / std::max(den, 1e-300));
  const bool ok = finite && errs == 0 && e < 2e-3;
  std::printf("  %-11s split %d: %.2e%s%s %s\n", name, nsplit, e, finite ? "" : " [non-finite]",
              errs ? " [address / coverage errors]" : "", ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

int case_emulate() {
  int fails = 0;
  uint32_t seed = 99;
  auto run = [&](const Problem& p, std::initializer_list<int> splits) {
    const HostProblem hp = make_host(p, seed++);
    const HostCache hc = make_cache(hp);
    const std::vector<double> ref = reference(hp);
    std::printf("-- heads %d/%d (G %d) D %d, M %d after %d keys\n", p.n_heads, p.n_kv, p.n_heads / p.n_kv, p.D, p.M,
                p.pos0);
    auto each = [&](auto tag, const char* name) {
      using C = typename decltype(tag)::type;
      if (p.n_heads / p.n_kv > C::ROWS) return;
      for (int s : splits) fails += emulate_one<C>(name, hp, hc, ref, s);
    };
    if (p.D == 128) for_each_variant<128>(each); else for_each_variant<64>(each);
    std::fflush(stdout);
  };
  for (int D : {128, 64})
    for (int G : {7, 2})
      for (int M : {2, 17, 100})
        for (int pos0 : {0, 37}) run(Problem{G == 7 ? 28 : 4, G == 7 ? 4 : 2, D, M, pos0}, {1, 2, 3, 8});
  run(Problem{28, 4, 128, 300, 140}, {1, 2, 3});
  for (const Problem& p : {Problem{16, 2, 128, 45, 32}, Problem{40, 8, 128, 100, 200}, Problem{12, 2, 128, 64, 236},
                           Problem{8, 8, 64, 100, 200}, Problem{14, 2, 64, 130, 3}})
    run(p, {1, 2, 5});
  std::printf("emulate: %d failure(s)\n", fails);
  return fails ? 1 : 0;
}

// ---- --case check -------------------------------------------------------------------------------------------
// Tolerance 2e-3, the product contract's (tests/test_gpu_kernels.py test_attention_prefill_vs_numpy): f16 K/V in
// the reference too; the tensor cores take q and P in f16 (2^-12 relative each), f32 accumulation and softmax, the
// output rounded to f16 (2^-12): ~1e-3 in all. The split merge adds f32 arithmetic only.
constexpr double kTol = 2e-3;

template <int D>
int check_one(const Problem& p, uint32_t seed, int* fails) {
  const HostProblem hp = make_host(p, seed);
  const std::vector<double> ref = reference(hp);
  DevProblem dp;
  upload(dp, hp);
  std::printf("-- heads %d/%d (G %d) D %d, M %d after %d keys\n", p.n_heads, p.n_kv, p.n_heads / p.n_kv, D, p.M, p.pos0);
  std::vector<float> prod;
  const double ep = run_and_compare(dp, ref, [&] { return nq::attention(dp.args(), 0); }, &prod);
  std::printf("  product attn_prefill_kernel: %.2e %s\n", ep, ep >= 0 && ep < kTol ? "ok" : "FAIL");
  if (!(ep >= 0 && ep < kTol)) ++*fails;
  for (const Variant& v : variants<D>()) {
    if (p.n_heads / p.n_kv > v.rows) continue;
    for (int s : {1, 2, 3, 4, 8}) {
      std::vector<float> got;
      const double e = run_and_compare(dp, ref, [&] { return v.launch(dp.args(), s, 0); }, &got);
      double dmax = 0.0;   // against the product, for the record
      for (size_t i = 0; i < got.size() && i < prod.size(); i++) dmax = std::max(dmax, (double)std::fabs(got[i] - prod[i]));
      const bool ok = e >= 0 && e < kTol;
      std::printf("  %-11s split %d: %.2e %s (max |fa - product| %.1e)%s\n", v.name, s, e, ok ? "ok" : "FAIL", dmax,
                  e == -1 ? " [unwritten/non-finite output or write past M]" : e == -2 ? " [launch failed]" : "");
      if (!ok) ++*fails;
    }
  }
  return 0;
}

int case_check() {
  int fails = 0;
  uint32_t seed = 1234;
  for (int D : {128, 64})
    for (int G : {7, 2})
      for (int M : {2, 17, 100, 512})
        for (int pos0 : {0, 37}) {
          const Problem p{G == 7 ? 28 : 4, G == 7 ? 4 : 2, D, M, pos0};
          if (D == 128) check_one<128>(p, seed++, &fails); else check_one<64>(p, seed++, &fails);
        }
  // the product tests' other head layouts: G 8, 5, 6, 1
  for (const Problem& p : {Problem{16, 2, 128, 45, 32}, Problem{40, 8, 128, 100, 600}, Problem{12, 2, 128, 64, 236},
                           Problem{8, 8, 64, 100, 600}, Problem{14, 2, 64, 130, 3}})
    if (p.D == 128) check_one<128>(p, seed++, &fails); else check_one<64>(p, seed++, &fails);
  std::printf("check: %d failure(s)\n", fails);
  return fails ? 1 : 0;
}

// ---- --case time ------------------------------------------------------------------------------------------------
__global__ void fill_f32(float* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    p[i] = scale * ((float)(x >> 8) * (1.f / 8388608.f) - 1.f);   // uniform [-scale, scale)
  }
}
__global__ void fill_f16(__half* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    p[i] = __float2half_rn(scale * ((float)(x >> 8) * (1.f / 8388608.f) - 1.f));
  }
}

// A prompt of N tokens on the 7B shapes, all of it in the cache (as after rope_kv_write), q for all N tokens.
// chunk: tokens per launch (the session's prefill_chunk, 512: launch c serves tokens 512c .. at pos0 = 512c);
// chunk = N: one launch.
struct TimeProblem {
  DevProblem dp;
  int N = 0;
  TimeProblem(int N_, int chunk) : N(N_) {
    Problem& p = dp.p;
    p = Problem{28, 4, 128, chunk, 0};
    const int pages = (N + kPage - 1) / kPage, D = p.D;
    const size_t qkv_n = (size_t)N * p.stride(), cache = (size_t)pages * p.n_kv * kPage * D;
    DEV_CHECK(cudaMalloc(&dp.qkv, qkv_n * 4));
    DEV_CHECK(cudaMalloc(&dp.k, cache * 2));
    DEV_CHECK(cudaMalloc(&dp.v, cache * 2));
    fill_f32<<<1024, 256>>>(dp.qkv, qkv_n, 11u, 3.f);
    fill_f16<<<1024, 256>>>(dp.k, cache, 12u, 1.7f);
    fill_f16<<<1024, 256>>>(dp.v, cache, 13u, 1.7f);
    std::vector<int> pt(pages);
    for (int i = 0; i < pages; i++) pt[i] = pages - 1 - i;
    DEV_CHECK(cudaMalloc(&dp.pt, pages * 4));
    DEV_CHECK(cudaMemcpy(dp.pt, pt.data(), pages * 4, cudaMemcpyHostToDevice));
    const int nchunks = N / chunk;
    std::vector<int> pos(nchunks);
    for (int c = 0; c < nchunks; c++) pos[c] = c * chunk;
    DEV_CHECK(cudaMalloc(&dp.pos, nchunks * 4));
    DEV_CHECK(cudaMemcpy(dp.pos, pos.data(), nchunks * 4, cudaMemcpyHostToDevice));
    const std::vector<float2> rope = rope_table(N, D);
    DEV_CHECK(cudaMalloc(&dp.rope, rope.size() * sizeof(float2)));
    DEV_CHECK(cudaMemcpy(dp.rope, rope.data(), rope.size() * sizeof(float2), cudaMemcpyHostToDevice));
    DEV_CHECK(cudaMalloc(&dp.part_o, 4 * 64));
    DEV_CHECK(cudaMalloc(&dp.part_ml, 4 * 64));
    DEV_CHECK(cudaMalloc(&dp.counters, 4 * 64));
    dp.out_elems = (size_t)N * p.n_heads * D;
    DEV_CHECK(cudaMalloc(&dp.out, dp.out_elems * 2));
    DEV_CHECK(cudaDeviceSynchronize());
  }
  int nchunks() const { return N / dp.p.M; }
  double flops() const { return 4.0 * dp.p.n_heads * dp.p.D * ((double)N * (N + 1) / 2); }
};

int case_time() {
  cudaDeviceProp prop;
  DEV_CHECK(cudaGetDeviceProperties(&prop, 0));
  const std::vector<Variant> vs = variants<128>();
  for (const Variant& v : vs)
    std::printf("%-11s rows %3d: %d registers, %d bytes local (spill), %d B dynamic shared memory\n", v.name, v.rows,
                v.regs, v.spill, v.smem);
  struct Best { double us = 1e30; std::string what; double prod = 0; };
  std::vector<std::pair<std::string, Best>> bests;
  for (int chunked : {1, 0})
    for (int N : {512, 2048, 8192, 32768}) {
      if (!chunked && N == 512) continue;   // the same launch as chunked
      const int chunk = chunked ? std::min(N, 512) : N;
      TimeProblem tp(N, chunk);
      const int nc = tp.nchunks();
      const int iters = N <= 512 ? 50 : N <= 2048 ? 10 : N <= 8192 ? 3 : 1, reps = N <= 8192 ? 11 : 5;
      auto per_layer = [&](const std::function<int(const AttnArgs&)>& one) {
        return median_us([&](int) {
          for (int c = 0; c < nc; c++) must(one(tp.dp.args(c)));
        }, iters, reps);
      };
      const std::string mode = chunked ? "chunks of 512" : "one launch";
      const double fl = tp.flops();
      const double up = per_layer([](const AttnArgs& a) { return nq::attention(a, 0); });
      std::printf("N %5d (%s, %d launch%s): product attn_prefill_kernel %9.1f us/layer %6.1f TFLOP/s\n", N,
                  mode.c_str(), nc, nc > 1 ? "es" : "", up, fl / up * 1e-6);
      Best b;
      b.prod = up;
      for (const Variant& v : vs)
        for (int s : {1, 2, 4}) {
          const double us = per_layer([&](const AttnArgs& a) { return v.launch(a, s, 0); });
          std::printf("N %5d (%s): %-11s split %d %9.1f us/layer %6.1f TFLOP/s  x%.2f vs product\n", N, mode.c_str(),
                      v.name, s, us, fl / us * 1e-6, up / us);
          if (us < b.us) { b.us = us; b.what = std::string(v.name) + " split " + std::to_string(s); }
        }
      bests.push_back({"N " + std::to_string(N) + " (" + mode + ")", b});
      std::fflush(stdout);
    }
  for (auto& [k, b] : bests)
    std::printf("best per prompt: %-26s %-20s %9.1f us/layer (product %9.1f: x%.2f)\n", k.c_str(), b.what.c_str(),
                b.us, b.prod, b.prod / b.us);
  (void)prop;
  return 0;
}

}  // namespace fa

int main(int argc, char** argv) {
  const std::string c = argc > 2 && std::strcmp(argv[1], "--case") == 0 ? argv[2] : "";
  if (c == "emulate") return fa::case_emulate();
  if (c != "check" && c != "time") {
    std::printf("usage: attn_prefill_fa --case emulate|check|time\n");
    return 2;
  }
  cudaDeviceProp prop;
  DEV_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("== case %s on %s\n", c.c_str(), prop.name);
  return c == "check" ? fa::case_check() : fa::case_time();
}
