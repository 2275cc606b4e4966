// A decode step's GEMV chain run as ONE persistent kernel that streams every weight through a shared-memory ring,
// against the product's chain of PDL-launched GEMVs (csrc/src/gemv.cu) on the same weights, and against the read
// ceiling over the same bytes. The question (bench/NOTES.md "Session 19"): how much of the ~24 us a 7B layer spends
// above its bytes (50.7 us against 26.9) goes when weights never wait for activations.
//
// The chain, L layers of a Qwen2.5 size's widths (7B by default), INT4 g128 in the fragment order (int4_frag.cuh):
//   qkv   x = rmsnorm(h) * ln1 (f16), qkv_out = W_qkv x + b          (f32, STORE)
//   o     x = qkv_out[0 .. q) as f16 (attention's stand-in: identity), h += W_o x        (ADD)
//   gu    x = rmsnorm(h) * ln2 (f16), act = silu(gate x) * (up x)     (f16, the gate/up pair P: SWIGLU)
//   down  x = act, h += W_down x                                                          (ADD)
// The x roundings are the product's (gemv_frag.cuh frag_stage_x): what differs between the two chains is the order
// of the f32 sums, so both are validated against one CPU reference (double sums of the same f16-rounded x).
//
// persistent<NC>: one block an SM (cooperative launch: all resident), NC consumer warps and one producer lane.
// * Work: each GEMV's (tile, chunk) units, tile-major (a tile = 64 weight rows; a chunk = 128 k: 4 KB of words and
//   128 B of scales, contiguous in the fragment order), are cut into G contiguous ranges, range b for block b
//   (stream-K). A range's run inside one tile is a "segment"; a segment's chunks go through the ring in stages of up
//   to kCPS chunks (one cp.async.bulk for the words, one for the scales).
// * The producer walks the same stages for every GEMV of the step, waiting only for free ring slots (the "empty"
//   mbarriers): weights never depend on activations, so it runs ahead through dependency waits, up to the ring's
//   depth (~190 KB an SM on the 7B).
// * Consumers, per GEMV: wait until every block has finished the previous GEMV (a flag a block and GEMV: the
//   threads of the block poll the G flags at once, acquire), stage x in
//   shared memory (f16, whole K, normed where the GEMV takes rmsnorm(h)), then per segment: warp w takes step pairs
//   w, w + NC, ... of each stage (the product's CUDA-core arithmetic, frag_warp_dot_fma: f16 products summed two
//   steps deep, f32 times the row's scale), warps summed in warp order. A segment that is a whole tile writes its
//   outputs; one that is part of a tile writes its partial, and the block that completes the tile (a counter a
//   tile) adds the partials in block order and writes the outputs: deterministic, whatever the schedule. Then the
//   block's flag (release).
// * Counters and flags grow across launches (tile counters reach (epoch + 1) x pieces, flags hold epoch + 1), so a
//   step needs no memset.
//
// Outcome (bench/NOTES.md "Session 19" §2-5, H200): it validates and loses. A 7B layer takes 73 µs against the PDL
// chain's 45.8 and the bytes' 26: the split-tile protocol costs ~15 µs a layer, x staging, waits and flags ~7-10,
// and 8 consumer warps from shared memory run at ~2.6 TB/s (gate/up 23.6-27.7 µs of compute for 15.5 µs of bytes);
// 33 KB stages (decode_layers_cps8) gain 4.7 µs. The variants and the per-block trace say which part is which.
//
//   make -C csrc/dev && build/dev/decode_layers [layers (28) [hidden intermediate heads kv_heads head_dim]]
#include "../src/gemv.cu"   // the product's GEMVs (nq::gemv) for the chain of kernels
#include "dev_common.cuh"
#include "bulk_ring.cuh"
#include <omp.h>

namespace {

using nq::frag::kTileRows;
constexpr int kChunkK = 128;                              // k of a chunk (= the group: g128 only)
constexpr int kChunkWords = kTileRows * kChunkK / 2;      // bytes of a chunk's words (4096)
constexpr int kChunkScales = kTileRows * 2;               // bytes of a chunk's scales (one group, 64 rows f16: 128)
#ifndef DECODE_LAYERS_CPS
#define DECODE_LAYERS_CPS 4
#endif
constexpr int kCPS = DECODE_LAYERS_CPS;                   // chunks a stage (-DDECODE_LAYERS_CPS=8: 33 KB stages)
constexpr int kStageBytes = kCPS * (kChunkWords + kChunkScales);
constexpr int kMaxStages = 16;
constexpr int kMaxPieces = 16;                            // blocks sharing a tile (the host checks)
constexpr int kBarConsumers = 1;                          // named barrier of the consumer warps
constexpr float kEps = 1e-6f;

struct Op {
  const uint4* w;                    // fragment-order words, tile-major (SWIGLU: the pair P's 2I rows)
  const uint4* s;                    // its scales
  const float* x_f32;                // x: f32 (normed with norm_w when set) or f16
  const __half* x_f16;
  const float* norm_w;
  const float* bias;                 // STORE only (or null)
  float* out_f32;                    // STORE / ADD
  __half* out_f16;                   // SWIGLU
  int tiles, K, mode;                // mode: nq::GEMV_STORE / GEMV_ADD / GEMV_SWIGLU
};
struct Plan {
  const Op* ops;
  int n_ops;
  uint32_t* tile_cnt;                // [n_ops][max_tiles] pieces added
  uint32_t* flags;                   // [n_ops][G] epoch + 1 once block b has written its tiles of the op
  float* part;                       // [2][max_tiles][kMaxPieces][64] partial sums of split tiles
  int max_tiles, n_stages;
  uint32_t epoch;
  unsigned long long* trace;         // null, or [n_ops][G][kTracePoints] %globaltimer ns (see kTrace*)
};
// Trace points a block records per op (thread 0 of the consumers; the producer lane the last two): the op's loop
// start, the dependency resolved, x staged, its first stage full, its last tile written, its flag stored; the
// producer's first and last stage of the op issued.
enum { kTraceStart, kTraceWaited, kTraceStaged, kTraceData, kTraceWritten, kTraceFlag, kTraceProdFirst,
       kTraceProdLast, kTracePoints };
__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t add_acq_rel(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// the first unit of block b of G over U units, and the block that holds unit u
__host__ __device__ inline int range_begin(long long U, int b, int G) { return (int)(U * b / G); }
__host__ __device__ inline int block_of(long long u, long long U, int G) { return (int)(((u + 1) * G - 1) / U); }

template <int NC>
__device__ __forceinline__ void cbar() { named_bar(kBarConsumers, NC * 32); }

// x of op into xs (f16, k order, all K), rounded as frag_stage_x: f16 as given; f32 once; normed (x * inv) * w once.
// Every load of a pass is issued before the first use (one L2 round trip a pass: the whole x of every Qwen2.5 size
// is one pass for f32 x, K <= 8 x kStageUnitsPerBlock; f16 x takes ceil(K / (8 x kStageUnitsF16PerBlock)) passes).
constexpr int kStageUnitsPerBlock = 1024;   // 8-element units of f32 x a block holds in registers (32 / NC a thread)
constexpr int kStageUnitsF16PerBlock = 3072;   // of f16 x (96 / NC a thread: the 7B's down x, 2,368, in one pass)
template <int NC>
__device__ void stage_x(const Op& op, __half* xs, float* red) {
  constexpr int NT = NC * 32, kStageUnits = kStageUnitsPerBlock / NT;
  const int ct = threadIdx.x, n8 = op.K / 8;
  uint4* xs4 = reinterpret_cast<uint4*>(xs);
  if (op.x_f16) {
    constexpr int R = NC >= 16 ? 4 : kStageUnitsF16PerBlock / NT;   // NC = 16 (96 registers) spilled at 6
    const uint4* src = reinterpret_cast<const uint4*>(op.x_f16);
    for (int p0 = ct; p0 < n8; p0 += R * NT) {
      uint4 v[R];
#pragma unroll
      for (int r = 0; r < R; r++)
        if (p0 + r * NT < n8) v[r] = __ldcg(src + p0 + r * NT);
#pragma unroll
      for (int r = 0; r < R; r++)
        if (p0 + r * NT < n8) xs4[p0 + r * NT] = v[r];
    }
    return;
  }
  // f32 x: one pass (the host checks K / 8 <= kStageUnitsPerBlock)
  const float4* x4 = reinterpret_cast<const float4*>(op.x_f32);
  const float4* w4 = reinterpret_cast<const float4*>(op.norm_w);
  float4 v[2 * kStageUnits];
  float ss = 0.f;
#pragma unroll
  for (int r = 0; r < kStageUnits; r++) {
    const int p = ct + r * NT;
    if (p < n8) {
      v[2 * r] = __ldcg(x4 + 2 * p);
      v[2 * r + 1] = __ldcg(x4 + 2 * p + 1);
    }
  }
  float inv = 1.f;
  if (op.norm_w) {
#pragma unroll
    for (int r = 0; r < kStageUnits; r++)
      if (ct + r * NT < n8)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const float4 a = v[2 * r + e];
          ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((ct & 31) == 0) red[ct >> 5] = ss;
    cbar<NC>();
    float tot = 0.f;
    for (int w = 0; w < NC; w++) tot += red[w];
    inv = rsqrtf(tot / (float)op.K + kEps);
  }
#pragma unroll
  for (int r = 0; r < kStageUnits; r++) {
    const int p = ct + r * NT;
    if (p < n8) {
      const float4 a = v[2 * r], b = v[2 * r + 1];
      float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      if (op.norm_w) {
        const float4 na = __ldg(w4 + 2 * p), nb = __ldg(w4 + 2 * p + 1);
        const float nw[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w};
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = f[e] * inv * nw[e];
      }
      uint4 o;
      o.x = nq::h2_as_u32(__floats2half2_rn(f[0], f[1]));
      o.y = nq::h2_as_u32(__floats2half2_rn(f[2], f[3]));
      o.z = nq::h2_as_u32(__floats2half2_rn(f[4], f[5]));
      o.w = nq::h2_as_u32(__floats2half2_rn(f[6], f[7]));
      xs4[p] = o;
    }
  }
}

// acc[j] += s_j * sum(j) for the lane's 8 rows (row 8 j + g of the tile: scale j is half j & 1 of word j / 2 of s4)
template <class Sum>
__device__ __forceinline__ void add_scaled(const uint4& s4, Sum sum, float (&acc)[8]) {
  const uint32_t sw[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const uint32_t bits = j & 1 ? sw[j >> 1] >> 16 : sw[j >> 1] & 0xFFFFu;
    acc[j] = fmaf(__half2float(__ushort_as_half((unsigned short)bits)), sum(j), acc[j]);
  }
}

// The words of a step pair as the lane unpacks them: f(u, w, p, xlo, xhi) for step u (0, 1) and word w (0..3) with
// unpack_word's pairs p and the lane's x pairs of that step ((2t, 2t + 1), (2t + 8, 2t + 9) as f16x2 bits)
template <class F>
__device__ __forceinline__ void step_pair_words(const uint4* cw, const __half* xc, F f) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < 2; u++) {
    const uint4 cur = cw[u * 32 + lane];
    const uint32_t xlo = *reinterpret_cast<const uint32_t*>(xc + nq::frag::kStepK * u);
    const uint32_t xhi = *reinterpret_cast<const uint32_t*>(xc + nq::frag::kStepK * u + 8);
    const uint32_t wd[4] = {cur.x, cur.y, cur.z, cur.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
      __half2 p[4];
      nq::frag::unpack_word(wd[w], p);
      f(u, w, p, xlo, xhi);
    }
  }
}

// One step pair (steps 2 pp, 2 pp + 1 of a chunk) of a warp: frag_warp_dot's arithmetic on words from the ring
__device__ __forceinline__ void step_pair(const uint4* cw, const uint4* cs, const __half* xc, float (&acc)[8]) {
  const int lane = threadIdx.x & 31;
  const uint4 s4 = cs[lane >> 2];
  __half2 h[8];
  step_pair_words(cw, xc, [&](int u, int w, const __half2 (&p)[4], uint32_t xl, uint32_t xh) {
    const __half2 xlo = nq::frag::u2h(xl), xhi = nq::frag::u2h(xh);
    if (u == 0) {
      h[2 * w] = __hfma2(p[1], xhi, __hmul2(p[0], xlo));
      h[2 * w + 1] = __hfma2(p[3], xhi, __hmul2(p[2], xlo));
    } else {
      h[2 * w] = __hfma2(p[1], xhi, __hfma2(p[0], xlo, h[2 * w]));
      h[2 * w + 1] = __hfma2(p[3], xhi, __hfma2(p[2], xlo, h[2 * w + 1]));
    }
  });
  add_scaled(s4, [&](int j) { return __low2float(h[j]) + __high2float(h[j]); }, acc);
}

// step_pair on tensor cores (kMma): word w of a lane's 16 bytes is the A fragment of the m16 tile of rows 16 w ..
// 16 w + 15 ({pair 0, pair 2, pair 1, pair 3} of unpack_word: int4_frag.cuh), x the B operand in all 8 columns
// (b0b1 = x(2t, 2t + 1), b2b3 = x(2t + 8, 2t + 9)), so every lane's c0 / c2 are the full 16-k sums of rows 16 w + g /
// 16 w + 8 + g: 8 mma a step pair instead of 32 HFMA2 and 8 FADD, f32 sums over the two steps, then the row scale.
// The quad shuffles after the loop add the 4 lanes' copies: each adds a quarter (exact: a power of two).
__device__ __forceinline__ void step_pair_mma(const uint4* cw, const uint4* cs, const __half* xc, float (&acc)[8]) {
  const int lane = threadIdx.x & 31;
  const uint4 s4 = cs[lane >> 2];
  float c[4][4];
#pragma unroll
  for (int w = 0; w < 4; w++) c[w][0] = c[w][1] = c[w][2] = c[w][3] = 0.f;
  step_pair_words(cw, xc, [&](int, int w, const __half2 (&p)[4], uint32_t xlo, uint32_t xhi) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[w][0]), "+f"(c[w][1]), "+f"(c[w][2]), "+f"(c[w][3])
                 : "r"(nq::frag::h2u(p[0])), "r"(nq::frag::h2u(p[2])), "r"(nq::frag::h2u(p[1])),
                   "r"(nq::frag::h2u(p[3])), "r"(xlo), "r"(xhi));
  });
  add_scaled(s4, [&](int j) { return 0.25f * c[j >> 1][(j & 1) * 2]; }, acc);
}

// The epilogue of tile `tile` of op from its 64 row sums (ts, shared memory): consumer threads 0..63; `add`: thread
// ct's row of h for ADD
__device__ __forceinline__ void tile_epilogue(const Op& op, int tile, const float* ts, float add) {
  const int ct = threadIdx.x;
  if (op.mode == nq::GEMV_SWIGLU) {   // output 32 T + 8 q + g: gate = P row 16 q + g, up = 16 q + 8 + g
    if (ct < 32) {
      const int q = ct >> 3, g = ct & 7;
      op.out_f16[32 * tile + ct] = nq::swiglu_f16(ts[16 * q + g], ts[16 * q + 8 + g]);
    }
  } else if (ct < kTileRows) {
    const int r = kTileRows * tile + ct;
    float v = ts[ct] + (op.bias ? __ldg(op.bias + r) : 0.f);
    if (op.mode == nq::GEMV_ADD) v += add;
    op.out_f32[r] = v;
  }
}

// Timing-only variants (their outputs are not checked): kNoMath, the consumers release each stage without the
// arithmetic (the ring and the op boundaries alone); kNoWait, no op waits for the previous one (the ring and the
// arithmetic without the dependency chain); both: the ring alone. kNoPieces: a split tile's every block writes its
// partial as if it were the whole tile (wrong outputs; the cost of the split-tile protocol). kMma (checked): the
// consumers' arithmetic on tensor cores (step_pair_mma).
constexpr int kNoMath = 1, kNoWait = 2, kNoPieces = 4, kMma = 8;
template <int NC, int VAR = 0>
__global__ void __launch_bounds__(32 * (NC + 1), 1) decode_persistent(const Plan P) {
  extern __shared__ __align__(128) uint8_t smem[];   // [n_stages][kStageBytes] ring, then x (f16, max K)
  __shared__ __align__(8) uint64_t bars[2 * kMaxStages];   // full[s], empty[s]
  __shared__ float warp_sums[NC][kTileRows];
  __shared__ float tile_sums[kTileRows];
  __shared__ float red[32];
  __shared__ int last_flag;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, NS = P.n_stages, G = gridDim.x, b = blockIdx.x;
  __half* xs = reinterpret_cast<__half*>(smem + (size_t)NS * kStageBytes);
  auto full = [&](int s) { return smem_u32(&bars[s]); };
  auto empty = [&](int s) { return smem_u32(&bars[kMaxStages + s]); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < NS; s++) { mbar_init(full(s), 1); mbar_init(empty(s), NC); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == NC) {   // producer: every stage of every op, in the consumers' order; waits only for free slots
    if (lane == 0) {
      uint32_t it = 0;
      for (int oi = 0; oi < P.n_ops; oi++) {
        const Op op = P.ops[oi];   // a copy: a reference to global memory is re-read after every asm clobber
        const int KC = op.K / kChunkK;
        const long long U = (long long)op.tiles * KC;
        const int u0 = range_begin(U, b, G), u1 = range_begin(U, b + 1, G);
        unsigned long long* tr = P.trace ? P.trace + ((size_t)oi * G + b) * kTracePoints : nullptr;
        for (int u = u0; u < u1;) {
          const int tile = u / KC, c = u % KC, cend = min(KC, c + (u1 - u));
          for (int cc = c; cc < cend; cc += kCPS, it++) {
            const int nch = min(kCPS, cend - cc), slot = it % NS;
            if (it >= (uint32_t)NS) mbar_wait(empty(slot), ((it / NS) + 1) & 1);
            if (tr && u == u0 && cc == c) tr[kTraceProdFirst] = dev::globaltimer();
            mbar_arrive_expect_tx(full(slot), nch * (kChunkWords + kChunkScales));
            uint8_t* st = smem + (size_t)slot * kStageBytes;
            const size_t unit = (size_t)tile * KC + cc;
            bulk_g2s(smem_u32(st), op.w + unit * (kChunkWords / 16), nch * kChunkWords, full(slot));
            bulk_g2s(smem_u32(st + kCPS * kChunkWords), op.s + unit * (kChunkScales / 16), nch * kChunkScales,
                     full(slot));
          }
          u += cend - c;
        }
        if (tr) tr[kTraceProdLast] = dev::globaltimer();
      }
    }
    return;
  }

  // consumers
  const int ct = threadIdx.x, g = lane >> 2, t = lane & 3;
  uint32_t it = 0;
  for (int oi = 0; oi < P.n_ops; oi++) {
    const Op op = P.ops[oi];
    const int KC = op.K / kChunkK;
    const long long U = (long long)op.tiles * KC;
    const int u0 = range_begin(U, b, G), u1 = range_begin(U, b + 1, G);
    uint32_t* my_flag = P.flags + (size_t)oi * G + b;
    unsigned long long* tr = P.trace && ct == 0 ? P.trace + ((size_t)oi * G + b) * kTracePoints : nullptr;
    if (tr) tr[kTraceStart] = dev::globaltimer();
    if (u0 == u1) {   // nothing of this op here: done at once
      if (ct == 0) st_release(my_flag, P.epoch + 1);
      if (tr) tr[kTraceWaited] = tr[kTraceStaged] = tr[kTraceData] = tr[kTraceWritten] = tr[kTraceFlag] = 0;
      continue;
    }
    if (!(VAR & kNoWait) && oi > 0 && ct < G) {   // every op reads what the previous one wrote (and only that: see the header)
      const uint32_t* f = P.flags + (size_t)(oi - 1) * G + ct;
      const long long t0 = clock64();
      while (ld_acquire(f) < P.epoch + 1) {
        if (clock64() - t0 > 4000000000ll) {   // dev watchdog (~2 s): a schedule bug fails the launch, not the call
          printf("dependency wait timeout: block %d op %d, block %d's flag %u\n", blockIdx.x, oi, ct, *f);
          __trap();
        }
      }
    }
    cbar<NC>();
    if (tr) tr[kTraceWaited] = dev::globaltimer();
    stage_x<NC>(op, xs, red);
    cbar<NC>();
    if (tr) tr[kTraceStaged] = dev::globaltimer();
    for (int u = u0; u < u1;) {
      const int tile = u / KC, c = u % KC, cend = min(KC, c + (u1 - u));
      float acc[8];
#pragma unroll
      for (int j = 0; j < 8; j++) acc[j] = 0.f;
      for (int cc = c; cc < cend; cc += kCPS, it++) {
        const int nch = min(kCPS, cend - cc), slot = it % NS;
        mbar_wait(full(slot), (it / NS) & 1);
        if (tr && u == u0 && cc == c) tr[kTraceData] = dev::globaltimer();
        const uint8_t* st = smem + (size_t)slot * kStageBytes;
        const uint4* sw = reinterpret_cast<const uint4*>(st);
        const uint4* ss = reinterpret_cast<const uint4*>(st + kCPS * kChunkWords);
        for (int p = warp; p < 4 * nch && !(VAR & kNoMath); p += NC) {   // step pair p: chunk p / 4 of the stage, steps 2 (p % 4) + 0, 1
          const int ch = p >> 2, pp = p & 3;
          const uint4* cw = sw + ch * (kChunkWords / 16) + 2 * pp * 32;
          const uint4* cs = ss + ch * (kChunkScales / 16);
          const __half* xc = xs + kChunkK * (cc + ch) + 2 * pp * nq::frag::kStepK + 2 * t;
          if (VAR & kMma) step_pair_mma(cw, cs, xc, acc);
          else step_pair(cw, cs, xc, acc);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(slot));
      }
#pragma unroll
      for (int j = 0; j < 8; j++) {
        acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 1);
        acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 2);
      }
      if (t == 0)
#pragma unroll
        for (int j = 0; j < 8; j++) warp_sums[warp][8 * j + g] = acc[j];
      cbar<NC>();
      float v = 0.f;
      if (ct < kTileRows)
        for (int w = 0; w < NC; w++) v += warp_sums[w][ct];   // warp order
      bool write = true;
      float add = 0.f;   // ADD: the row's h, loaded with the pieces (the same round trip)
      if ((c == 0 && cend == KC) || (VAR & kNoPieces)) {
        if (ct < kTileRows) {
          if (op.mode == nq::GEMV_ADD) add = __ldcg(op.out_f32 + kTileRows * tile + ct);
          tile_sums[ct] = v;
        }
      } else {   // part of a split tile: the block that adds the tile's last piece writes it
        // the tile's blocks: first .. last, of which those with a non-empty range (all of them when U >= G; when
        // U < G a range holds 0 or 1 unit) each add one piece, in slot b - first
        const int first = block_of((long long)tile * KC, U, G), last = block_of((long long)(tile + 1) * KC - 1, U, G);
        int np = 0;
        for (int q = first; q <= last; q++) np += range_begin(U, q + 1, G) > range_begin(U, q, G);
        float* part = P.part + ((size_t)(oi & 1) * P.max_tiles + tile) * kMaxPieces * kTileRows;
        if (ct < kTileRows) part[(b - first) * kTileRows + ct] = v;
        cbar<NC>();
        if (ct == 0)   // release: the block's piece (ordered by the barrier); acquire: the other pieces
          last_flag = add_acq_rel(&P.tile_cnt[(size_t)oi * P.max_tiles + tile], 1u) + 1 == (P.epoch + 1) * (uint32_t)np;
        cbar<NC>();
        write = last_flag != 0;
        if (write && ct < kTileRows) {
          float pv[kMaxPieces];
#pragma unroll
          for (int q = 0; q < kMaxPieces; q++)   // every load issued before the sum
            pv[q] = first + q <= last ? __ldcg(part + q * kTileRows + ct) : 0.f;
          if (op.mode == nq::GEMV_ADD) add = __ldcg(op.out_f32 + kTileRows * tile + ct);
          float s = 0.f;
#pragma unroll
          for (int q = 0; q < kMaxPieces; q++)   // block order; a block with an empty range wrote no piece
            if (first + q <= last && range_begin(U, first + q + 1, G) > range_begin(U, first + q, G)) s += pv[q];
          tile_sums[ct] = s;
        }
      }
      cbar<NC>();
      if (write) tile_epilogue(op, tile, tile_sums, add);
      u += cend - c;
    }
    cbar<NC>();
    if (tr) tr[kTraceWritten] = dev::globaltimer();
    if (ct == 0) st_release(my_flag, P.epoch + 1);   // the block's outputs (ordered by the barrier), then its flag
    if (tr) tr[kTraceFlag] = dev::globaltimer();
  }
}

// ---- the model's weights and the CPU reference ---------------------------------------------------------------------
// scales: |s| in [0.5, 1.5) / sqrt(21.5 K) (|W x| ~ |x| for codes uniform in 0..15), one in 8 negative
__global__ void fill_scales(__half* s, size_t n, int K, uint64_t salt) {
  const float base = rsqrtf(21.5f * (float)K);
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
    const uint32_t h = dev::hash_word(j + salt);
    const float m = 0.5f + (float)(h >> 8) * (1.f / 16777216.f);
    s[j] = __float2half_rn((h & 7u) == 0 ? -m * base : m * base);
  }
}

struct Mat { uint8_t* w; __half* s; int N, K; size_t wbytes, sbytes; };
struct Layer { Mat qkv, o, pair, down; float *bqkv, *ln1, *ln2; };

float f16r(float v) { return __half2float(__float2half_rn(v)); }

// y[N] (double) = W x for W in the fragment order (host copies of its words and scales; x already f16-rounded)
void cpu_gemv(const std::vector<uint8_t>& w, const std::vector<uint8_t>& s, int N, int K, const std::vector<float>& x,
              std::vector<double>& y) {
  const int tiles = N / kTileRows, KS = K / 16, KC = K / kChunkK;
  y.assign(N, 0.0);
  const uint32_t* wd = reinterpret_cast<const uint32_t*>(w.data());
  const __half* sc = reinterpret_cast<const __half*>(s.data());
#pragma omp parallel for schedule(static)
  for (int tile = 0; tile < tiles; tile++) {
    double acc[kTileRows] = {0};
    for (int kb = 0; kb < KS; kb++)
      for (int lane = 0; lane < 32; lane++)
        for (int q = 0; q < 4; q++) {
          const uint32_t word = wd[(((size_t)tile * KS + kb) * 32 + lane) * 4 + q];
          for (int i = 0; i < 8; i++) {
            const int row = nq::frag::nibble_row(lane, q, i), k = 16 * kb + nq::frag::nibble_k(lane, i);
            const float scale = __half2float(sc[(((size_t)tile * KC + k / kChunkK) * 8 + (row & 7)) * 8 + (row >> 3)]);
            acc[row] += ((double)((word >> (4 * i)) & 15u) - 8.0) * scale * x[k];
          }
        }
    for (int r = 0; r < kTileRows; r++) y[(size_t)tile * kTileRows + r] = acc[r];
  }
}

std::vector<float> cpu_norm(const std::vector<float>& h, const std::vector<float>& w) {
  double ss = 0.0;
  for (float v : h) ss += (double)v * v;
  const float inv = 1.f / std::sqrt((float)(ss / h.size()) + kEps);
  std::vector<float> x(h.size());
  for (size_t k = 0; k < h.size(); k++) x[k] = f16r(h[k] * inv * w[k]);
  return x;
}

template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> v(n);
  DEV_CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
std::vector<uint8_t> bytes_of(const void* d, size_t n) { return to_host(reinterpret_cast<const uint8_t*>(d), n); }

}  // namespace

int main(int argc, char** argv) {
  int layers = 0;
  dev::Widths wd;
  if (!dev::layers_and_widths(argc, argv, "decode_layers", layers, wd)) return 2;
  const int H = wd.hidden, I = wd.intermediate, q = wd.heads * wd.head_dim, kv = wd.kv_heads * wd.head_dim;
  const int Nqkv = q + 2 * kv;
  if (Nqkv % 64 || q > Nqkv) {
    std::fprintf(stderr, "decode_layers: q + 2 kv = %d rows must be a multiple of 64\n", Nqkv);
    return 2;
  }
  int dev_id = 0, sms = 0, optin = 0;
  DEV_CHECK(cudaGetDevice(&dev_id));
  DEV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_id));
  DEV_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev_id));
  dev::must(nq::gemv_prepare());

  // weights: one allocation, every matrix 256-byte aligned; words random, scales random in a sane range
  auto mat_bytes = [](int N, int K) { return std::make_pair((size_t)N * K / 2, (size_t)N * (K / kChunkK) * 2); };
  size_t total = 0;
  auto a256 = [](size_t n) { return (n + 255) / 256 * 256; };
  const int shapes[4][2] = {{Nqkv, H}, {H, q}, {2 * I, H}, {H, I}};
  for (int l = 0; l < layers; l++)
    for (auto& sh : shapes) { auto mb = mat_bytes(sh[0], sh[1]); total += a256(mb.first) + a256(mb.second); }
  uint8_t* buf = nullptr;
  DEV_CHECK(cudaMalloc(&buf, total));
  std::vector<Layer> L(layers);
  size_t at = 0, weight_bytes = 0;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto dev_vec = [&](size_t n, float mean, float sd) {
    std::vector<float> v(n);
    for (float& e : v) e = mean + sd * nd(rng);
    float* d = nullptr;
    DEV_CHECK(cudaMalloc(&d, n * 4));
    DEV_CHECK(cudaMemcpy(d, v.data(), n * 4, cudaMemcpyHostToDevice));
    return d;
  };
  for (int l = 0; l < layers; l++) {
    Mat* ms[4] = {&L[l].qkv, &L[l].o, &L[l].pair, &L[l].down};
    for (int m = 0; m < 4; m++) {
      Mat& M = *ms[m];
      M.N = shapes[m][0]; M.K = shapes[m][1];
      auto mb = mat_bytes(M.N, M.K);
      M.wbytes = mb.first; M.sbytes = mb.second;
      M.w = buf + at; at += a256(M.wbytes);
      M.s = reinterpret_cast<__half*>(buf + at); at += a256(M.sbytes);
      dev::fill_hash_words<<<4 * sms, 256>>>(reinterpret_cast<uint32_t*>(M.w), M.wbytes / 4, (uint64_t)(M.w - buf));
      fill_scales<<<4 * sms, 256>>>(M.s, M.sbytes / 2, M.K, (uint64_t)(M.w - buf));
      weight_bytes += M.wbytes + M.sbytes;
    }
    L[l].bqkv = dev_vec(Nqkv, 0.f, 0.1f);
    L[l].ln1 = dev_vec(H, 1.f, 0.1f);
    L[l].ln2 = dev_vec(H, 1.f, 0.1f);
  }
  DEV_CHECK(cudaGetLastError());
  float* h0 = dev_vec(H, 0.f, 1.f);
  float *h = nullptr, *qkv_out = nullptr;
  __half* act = nullptr;
  DEV_CHECK(cudaMalloc(&h, H * 4));
  DEV_CHECK(cudaMalloc(&qkv_out, Nqkv * 4));
  DEV_CHECK(cudaMalloc(&act, I * 2));

  // the ops of the step (both chains run these)
  std::vector<Op> ops;
  for (int l = 0; l < layers; l++) {
    const Layer& y = L[l];
    auto op = [](const Mat& M, int tiles) { Op o{}; o.w = (const uint4*)M.w; o.s = (const uint4*)M.s; o.tiles = tiles; o.K = M.K; return o; };
    Op a = op(y.qkv, Nqkv / 64); a.x_f32 = h; a.norm_w = y.ln1; a.bias = y.bqkv; a.out_f32 = qkv_out; a.mode = nq::GEMV_STORE;
    Op b = op(y.o, H / 64); b.x_f32 = qkv_out; b.out_f32 = h; b.mode = nq::GEMV_ADD;
    Op c = op(y.pair, 2 * I / 64); c.x_f32 = h; c.norm_w = y.ln2; c.out_f16 = act; c.mode = nq::GEMV_SWIGLU;
    Op d = op(y.down, H / 64); d.x_f16 = act; d.out_f32 = h; d.mode = nq::GEMV_ADD;
    ops.insert(ops.end(), {a, b, c, d});
  }
  const int n_ops = (int)ops.size();

  // the chain of the product's kernels: nq::gemv per op (fragment-order LinW; the pair as gate + up)
  auto linw = [](const Mat& M, int N, size_t w_off, size_t s_off, int order) {
    nq::LinW w;
    w.w = M.w + w_off; w.scales = M.s + s_off; w.N = N; w.K = M.K; w.group = kChunkK; w.type = nq::WT_INT4; w.order = order;
    return w;
  };
  std::vector<nq::GemvArgs> gargs;
  for (int l = 0; l < layers; l++) {
    const Layer& y = L[l];
    nq::GemvArgs a; a.seg[0] = linw(y.qkv, Nqkv, 0, 0, nq::ORDER_FRAG); a.bias[0] = y.bqkv; a.x_f32 = h; a.norm_w = y.ln1;
    a.eps = kEps; a.out_f32 = qkv_out; a.mode = nq::GEMV_STORE;
    nq::GemvArgs b; b.seg[0] = linw(y.o, H, 0, 0, nq::ORDER_FRAG); b.x_f32 = qkv_out; b.out_f32 = h; b.mode = nq::GEMV_ADD;
    nq::GemvArgs c; c.seg[0] = linw(y.pair, I, 0, 0, nq::ORDER_FRAG_PAIR);
    c.up = linw(y.pair, I, (size_t)I * H / 2, (size_t)I * (H / kChunkK), nq::ORDER_FRAG_PAIR);
    c.x_f32 = h; c.norm_w = y.ln2; c.eps = kEps; c.out_f16 = act; c.mode = nq::GEMV_SWIGLU;
    nq::GemvArgs d; d.seg[0] = linw(y.down, H, 0, 0, nq::ORDER_FRAG); d.x_f16 = act; d.out_f32 = h; d.mode = nq::GEMV_ADD;
    gargs.insert(gargs.end(), {a, b, c, d});
  }
  cudaStream_t st;
  DEV_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t gr;
  cudaGraphExec_t g_chain;
  DEV_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (const auto& a : gargs) dev::must(nq::gemv(a, st));
  DEV_CHECK(cudaStreamEndCapture(st, &gr));
  DEV_CHECK(cudaGraphInstantiate(&g_chain, gr, 0));

  // the persistent kernel's plan
  int max_tiles = 0, max_pieces = 1;
  for (const Op& o : ops) {
    max_tiles = std::max(max_tiles, o.tiles);
    const int KC = o.K / kChunkK;
    const long long U = (long long)o.tiles * KC;
    for (int t = 0; t < o.tiles; t++)
      max_pieces = std::max(max_pieces, block_of((long long)(t + 1) * KC - 1, U, sms) - block_of((long long)t * KC, U, sms) + 1);
  }
  Op* d_ops = nullptr;
  uint32_t *tile_cnt = nullptr, *flags = nullptr;
  float* part = nullptr;
  DEV_CHECK(cudaMalloc(&d_ops, n_ops * sizeof(Op)));
  DEV_CHECK(cudaMemcpy(d_ops, ops.data(), n_ops * sizeof(Op), cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&tile_cnt, (size_t)n_ops * max_tiles * 4));
  DEV_CHECK(cudaMalloc(&flags, (size_t)n_ops * sms * 4));
  if (sms > 8 * 32 || max_pieces > kMaxPieces || H / 8 > kStageUnitsPerBlock || q / 8 > kStageUnitsPerBlock) {
    std::printf("shape beyond the kernel's limits: %d pieces a tile (at most %d), f32 x of %d / %d\n", max_pieces,
                kMaxPieces, H, q);
    return 2;
  }
  DEV_CHECK(cudaMalloc(&part, (size_t)2 * max_tiles * kMaxPieces * kTileRows * 4));
  uint32_t epoch = 0;
  // one build of the persistent kernel, its ring sized to the shared memory its static part leaves
  struct Persistent { const void* fn; int nc, n_stages; size_t dyn; };
  auto persistent_setup = [&](const void* kernel, int nc) {
    cudaFuncAttributes fa;
    DEV_CHECK(cudaFuncGetAttributes(&fa, kernel));
    const size_t xs_bytes = (size_t)std::max({H, I, q}) * 2;
    const size_t dyn_max = (size_t)optin - fa.sharedSizeBytes;
    const int n_stages = (int)std::min<size_t>(kMaxStages, (dyn_max - xs_bytes) / kStageBytes);
    const size_t dyn = (size_t)n_stages * kStageBytes + xs_bytes;
    DEV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
    int per_sm = 0;
    DEV_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * (nc + 1), dyn));
    std::printf("persistent NC=%d: %d registers, %d stages of %d B (%.0f KB of ring an SM), x %zu B, %d block an SM\n",
                nc, fa.numRegs, n_stages, kStageBytes, n_stages * kStageBytes / 1024.0, xs_bytes, per_sm);
    if (per_sm < 1 || n_stages < 2) { std::printf("does not fit\n"); std::exit(2); }
    return Persistent{kernel, nc, n_stages, dyn};
  };
  // one step of the first `ops` ops (all of them by default), traced into `trace` when set
  auto run = [&](const Persistent& k, int ops = 0, unsigned long long* trace = nullptr) {
    Plan p{d_ops, ops ? ops : n_ops, tile_cnt, flags, part, max_tiles, k.n_stages, epoch++, trace};
    void* args[] = {(void*)&p};
    DEV_CHECK(cudaLaunchCooperativeKernel(k.fn, dim3(sms), dim3(32 * (k.nc + 1)), args, k.dyn, 0));
  };
  DEV_CHECK(cudaMemset(tile_cnt, 0, (size_t)n_ops * max_tiles * 4));
  DEV_CHECK(cudaMemset(flags, 0, (size_t)n_ops * sms * 4));
  const Persistent p8 = persistent_setup((const void*)decode_persistent<8>, 8);
  const Persistent p16 = persistent_setup((const void*)decode_persistent<16>, 16);

  // ---- validation: the first `lc` layers of both chains against the CPU (fresh h from h0; outputs poisoned) ----
  const int lc = std::min(layers, 2);
  std::vector<float> h_init = to_host(h0, H);
  std::vector<float> ref_h = h_init;
  {
    std::vector<double> y;
    for (int l = 0; l < lc; l++) {
      const Layer& Y = L[l];
      auto W = [&](const Mat& M) { return std::make_pair(bytes_of(M.w, M.wbytes), bytes_of(M.s, M.sbytes)); };
      auto x = cpu_norm(ref_h, to_host(Y.ln1, H));
      auto wq = W(Y.qkv);
      cpu_gemv(wq.first, wq.second, Nqkv, H, x, y);
      const std::vector<float> bq = to_host(Y.bqkv, Nqkv);
      std::vector<float> xo(q);
      for (int i = 0; i < q; i++) xo[i] = f16r((float)(y[i] + bq[i]));
      auto wo = W(Y.o);
      cpu_gemv(wo.first, wo.second, H, q, xo, y);
      for (int i = 0; i < H; i++) ref_h[i] = (float)(ref_h[i] + y[i]);
      x = cpu_norm(ref_h, to_host(Y.ln2, H));
      auto wp = W(Y.pair);
      cpu_gemv(wp.first, wp.second, 2 * I, H, x, y);
      std::vector<float> a(I);
      for (int T = 0; T < 2 * I / 64; T++)
        for (int o = 0; o < 32; o++) {
          const int qq = o >> 3, g = o & 7;
          const double gt = y[64 * T + 16 * qq + g], up = y[64 * T + 16 * qq + 8 + g];
          a[32 * T + o] = f16r((float)(gt / (1.0 + std::exp(-gt)) * up));
        }
      auto wdn = W(Y.down);
      cpu_gemv(wdn.first, wdn.second, H, I, a, y);
      for (int i = 0; i < H; i++) ref_h[i] = (float)(ref_h[i] + y[i]);
    }
  }
  std::vector<float> ref_delta(H);
  for (int i = 0; i < H; i++) ref_delta[i] = ref_h[i] - h_init[i];
  // Tolerance of the layers' contribution h - h0: each GEMV's f16 partial sums (products of f16-rounded x and
  // exact codes, 4 deep) give ~1e-3 relative error (the product's GEMV tests); 4 lc chained GEMVs, with the f16
  // roundings of the next x able to flip, stay within 1e-2.
  constexpr double kTol = 1e-2;
  auto check = [&](const char* what, auto run_first_lc) {
    DEV_CHECK(cudaMemcpy(h, h0, H * 4, cudaMemcpyDeviceToDevice));
    DEV_CHECK(cudaMemset(qkv_out, 0xFF, Nqkv * 4));   // NaN
    DEV_CHECK(cudaMemset(act, 0xFF, I * 2));
    run_first_lc();
    DEV_CHECK(cudaDeviceSynchronize());
    std::vector<float> got = to_host(h, H);
    for (int i = 0; i < H; i++) got[i] -= h_init[i];
    dev::validate_result(what, got.data(), ref_delta, kTol);
    return to_host(h, H);
  };
  // the first lc layers' ops alone: a graph of their launches / a plan of n_ops = 4 lc
  cudaGraphExec_t g_check;
  DEV_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 4 * lc; i++) dev::must(nq::gemv(gargs[i], st));
  DEV_CHECK(cudaStreamEndCapture(st, &gr));
  DEV_CHECK(cudaGraphInstantiate(&g_check, gr, 0));
  char what[96];
  std::snprintf(what, sizeof what, "kernels (product gemv), %d layers", lc);
  check(what, [&]() { DEV_CHECK(cudaGraphLaunch(g_check, 0)); });
  // epochs must match every op's counters: reset them before the shorter plan, and again after it
  auto reset_counters = [&]() {
    DEV_CHECK(cudaMemset(tile_cnt, 0, (size_t)n_ops * max_tiles * 4));
    DEV_CHECK(cudaMemset(flags, 0, (size_t)n_ops * sms * 4));
    epoch = 0;
  };
  std::snprintf(what, sizeof what, "persistent NC=8, %d layers", lc);
  reset_counters();
  const std::vector<float> p8a = check(what, [&]() { run(p8, 4 * lc); });
  const std::vector<float> p8b = check(what, [&]() { run(p8, 4 * lc); });
  std::printf("persistent NC=8: two runs %s\n", p8a == p8b ? "bit-identical" : "DIFFER (FAIL)");
  std::snprintf(what, sizeof what, "persistent NC=16, %d layers", lc);
  check(what, [&]() { run(p16, 4 * lc); });
  const Persistent p8m = persistent_setup((const void*)decode_persistent<8, kMma>, 8);
  std::snprintf(what, sizeof what, "persistent NC=8 mma, %d layers", lc);
  check(what, [&]() { run(p8m, 4 * lc); });
  if (p8a != p8b) return 1;
  reset_counters();   // the timed runs: every op from epoch 0

  const int iters = 10, reps = 7;
  unsigned* sink = nullptr;
  DEV_CHECK(cudaMalloc(&sink, 4 * sms * sizeof(unsigned)));
  const double t_ceil = dev::median_us([&](int) {
    dev::read_ceiling<<<4 * sms, dev::kCeilThreads>>>(reinterpret_cast<const uint4*>(buf), total / 16, sink);
  }, iters, reps);
  const double t_chain = dev::median_us([&](int) { DEV_CHECK(cudaGraphLaunch(g_chain, 0)); }, iters, reps);
  auto timed = [&](const Persistent& k) { return dev::median_us([&](int) { run(k); }, iters, reps); };
  const double t_p8 = timed(p8), t_p16 = timed(p16), t_p8m = timed(p8m);
  const double t_nomath = timed(persistent_setup((const void*)decode_persistent<8, kNoMath>, 8));
  const double t_nowait = timed(persistent_setup((const void*)decode_persistent<8, kNoWait>, 8));
  const double t_nowait16 = timed(persistent_setup((const void*)decode_persistent<16, kNoWait>, 16));
  const double t_nopieces = timed(persistent_setup((const void*)decode_persistent<8, kNoPieces>, 8));
  const double t_nowait_nopieces = timed(persistent_setup((const void*)decode_persistent<8, kNoWait | kNoPieces>, 8));
  const double t_mma_nwnp = timed(persistent_setup((const void*)decode_persistent<8, kMma | kNoWait | kNoPieces>, 8));
  reset_counters();   // kNoPieces adds to no tile counter: the runs after it need counters that match the epoch
  const double t_ring = timed(persistent_setup((const void*)decode_persistent<8, kNoMath | kNoWait>, 8));
  DEV_CHECK(cudaDeviceSynchronize());
  std::printf("decode_layers: %d layers (hidden %d, intermediate %d, q %d, kv %d), %.3f GB of weights + scales, "
              "%d SMs, %d pieces at most a split tile\n",
              layers, H, I, q, kv, weight_bytes / 1e9, sms, max_pieces);
  auto row = [&](const char* w, double us) {
    std::printf("%-16s %9.1f us  %6.3f TB/s  %5.1f %% of the ceiling  %6.2f us a layer\n", w, us,
                weight_bytes / us / 1e6, 100.0 * t_ceil / us, us / layers);
  };
  row("ceiling", t_ceil);
  row("kernels (PDL)", t_chain);
  row("persistent NC=8", t_p8);
  row("persistent NC=16", t_p16);
  row("NC=8 no math", t_nomath);
  row("NC=8 no wait", t_nowait);
  row("NC=16 no wait", t_nowait16);
  row("NC=8 ring alone", t_ring);
  row("NC=8 no pieces", t_nopieces);
  row("no wait/pieces", t_nowait_nopieces);
  row("NC=8 mma", t_p8m);
  row("mma no wait/pcs", t_mma_nwnp);

  // one traced run of NC=8: where an op's time goes (µs, mean over blocks and layers 1..L-1 of each GEMV)
  unsigned long long* d_trace = nullptr;
  const size_t n_tr = (size_t)n_ops * sms * kTracePoints;
  DEV_CHECK(cudaMalloc(&d_trace, n_tr * 8));
  DEV_CHECK(cudaMemset(d_trace, 0, n_tr * 8));
  run(p8, 0, d_trace);
  DEV_CHECK(cudaDeviceSynchronize());
  const std::vector<unsigned long long> tr = to_host(d_trace, n_tr);
  auto T = [&](int oi, int blk, int k) { return (double)tr[((size_t)oi * sms + blk) * kTracePoints + k]; };
  const char* names[4] = {"qkv", "o", "gate/up", "down"};
  std::printf("trace (NC=8, one step; µs, mean over the blocks with work and layers 1..%d):\n", layers - 1);
  std::printf("  %-8s %8s %8s %8s %8s %8s %8s %9s %9s %9s\n", "op", "wait", "stage x", "data", "compute", "flag",
              "span", "flag->go", "prod lead", "prod span");
  for (int k = 0; k < 4; k++) {
    double s_wait = 0, s_stage = 0, s_data = 0, s_comp = 0, s_flag = 0, s_span = 0, s_go = 0, s_lead = 0, s_pspan = 0;
    int n = 0, nl = 0;
    for (int l = 1; l < layers; l++) {
      const int oi = 4 * l + k;
      double prev_last_flag = 0, last_flag = 0, first_go = 1e300;
      for (int blk = 0; blk < sms; blk++) {
        prev_last_flag = std::max(prev_last_flag, T(oi - 1, blk, kTraceFlag));
        last_flag = std::max(last_flag, T(oi, blk, kTraceFlag));
        if (T(oi, blk, kTraceData) == 0) continue;   // no work in this op
        first_go = std::min(first_go, T(oi, blk, kTraceWaited));
        s_wait += T(oi, blk, kTraceWaited) - T(oi, blk, kTraceStart);
        s_stage += T(oi, blk, kTraceStaged) - T(oi, blk, kTraceWaited);
        s_data += T(oi, blk, kTraceData) - T(oi, blk, kTraceStaged);
        s_comp += T(oi, blk, kTraceWritten) - T(oi, blk, kTraceData);
        s_flag += T(oi, blk, kTraceFlag) - T(oi, blk, kTraceWritten);
        s_lead += T(oi, blk, kTraceProdFirst) - T(oi, blk, kTraceWaited);
        s_pspan += T(oi, blk, kTraceProdLast) - T(oi, blk, kTraceProdFirst);
        n++;
      }
      s_span += last_flag - prev_last_flag;   // the op's share of the step: last flag to last flag
      s_go += first_go - prev_last_flag;      // the previous op's last flag to the first block going on
      nl++;
    }
    std::printf("  %-8s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %9.2f\n", names[k], s_wait / n / 1e3,
                s_stage / n / 1e3, s_data / n / 1e3, s_comp / n / 1e3, s_flag / n / 1e3, s_span / nl / 1e3,
                s_go / nl / 1e3, s_lead / n / 1e3, s_pspan / n / 1e3);
  }
  return 0;
}
