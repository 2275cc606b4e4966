// Batch-1 GEMV kernels for decode: y = W @ x, weights streamed once with 16-byte loads (launchers: gemv.cu).
//
// INT4 (layout 1, docs/architecture.md): lane l of a warp loads 16 bytes = one "unit" of 32 values (4 words)
// at unit index m = c*32 + l of the row, so a warp reads 512 contiguous bytes per step; kUnroll steps are
// issued before any is used. Word j of a unit holds values k = 32m + 8j .. +7 with nibble i -> k = PERM[i];
// (w >> 4s) & 0x000F000F gives the pair (2s, 2s+1), OR 0x6400 makes f16 1024+u, minus 1032 gives exact u-8.
// Layout 2 (zero point z per (row, group), uint8 [N][K/g]): minus 1024+z gives exact u-z; gemv_int4<..., ZP = true>
// loads a unit's zero beside its scale (same index, one byte) and passes the group's constants to the unpack; it
// runs on x / 2 and doubles its sums, so that its f16 products keep layout 1's range (F16Units::fma).
// Products and 4-deep partial sums are f16x2 (HFMA2), everything above that is f32.
// The input x (K) is staged in shared memory as f16 (RMSNorm fused: computed by every block from the f32
// residual stream). For INT4 the 16-byte x units are stored transposed, unit p = 4m + j at j*(K/32) + m, so the
// 32 lanes of a warp read 32 consecutive 16-byte units (no bank conflicts).
// f16/bf16 weights: gemv_rowpair, one warp per row (two rows per step), x staged in order.
// Included by gemv.cu (the library's instantiations and launchers) and by csrc/dev/ programs that time other
// instantiations or reuse the helpers; it holds no host state (the SM count is a launch argument).
#pragma once
#include "kernels.h"
#include "device_util.cuh"
#include "launch.h"

namespace nq {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32, kUnroll = 2;  // kUnroll: units per lane per pipeline stage
constexpr int kMaxDynSmem = 160 * 1024;
constexpr int kBlocksPerSm = 4;   // at most this many resident GEMV blocks per SM are planned for

// ---- prologue: x into shared memory -------------------------------------------------------------------------
// Writes `xs` (f16 units), K/8 uint4; layout per WT (see file comment).
// Loads are batched (several per thread issued before any use): the prologue costs a few L2 round trips,
// not one per loop iteration.
// 1 / rms(x) of the f32 input when the RMSNorm prologue applies (x_f32 with norm_w), else 1 (block-wide).
// Thread i sums the squares of float4s i, i + bd, ... (kRmsBatch loads in flight a pass), then the block sums;
// frag_stage_x's one-pass staging (gemv_frag.cuh) repeats this order with the same helpers, so both give the same inv.
constexpr int kRmsBatch = 8;
__device__ __forceinline__ float sumsq4(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float rms_inv_of(float ss, int K, float eps) { return rsqrtf(ss / (float)K + eps); }
__device__ float rms_inv(const GemvArgs& a, int K, float* red) {
  if (a.x_f16 != nullptr || a.norm_w == nullptr) return 1.f;
  constexpr int B = kRmsBatch;
  const int bd = blockDim.x;
  float ss = 0.f;
  const float4* x4 = reinterpret_cast<const float4*>(a.x_f32);
  for (int i0 = threadIdx.x; i0 < (K >> 2); i0 += B * bd) {
    float4 v[B];
#pragma unroll
    for (int b = 0; b < B; b++) {
      const int i = i0 + b * bd;
      v[b] = i < (K >> 2) ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int b = 0; b < B; b++) ss += sumsq4(v[b]);
  }
  ss = block_sum(ss, red);
  return rms_inv_of(ss, K, a.eps);
}

// HI16 (for csrc/dev/gemv_int4_tc.cuh, the tensor-core INT4 GEMV): the second and fourth f16 pair of every 8
// values (.y, .w of a unit, the pairs its unpack takes "in place" as 1024 + 16u) are stored divided by 16 (exact:
// a power of two). HALF_X (gemv_int4's layout-2 build): every value is stored halved (exact, f16 subnormals aside),
// which gives the layout-2 f16 products and partial sums layout 1's range (F16Units::fma).
template <int WT, bool HI16 = false, bool HALF_X = false>
__device__ void stage_x_f16(const GemvArgs& a, int K, uint4* xs, float* red) {
  const __half2 k1_16 = __half2half2(__ushort_as_half((unsigned short)0x2C00));   // 1/16
  const __half2 k1_2 = __half2half2(__ushort_as_half((unsigned short)0x3800));    // 1/2
  const float post = HALF_X ? 0.5f : 1.f;
  const int nunits = K >> 3, bd = blockDim.x;
  const bool norm = a.x_f16 == nullptr && a.norm_w != nullptr;
  const float inv = rms_inv(a, K, red);
  if (a.x_f16) {
    constexpr int B = 8;
    const uint4* src = reinterpret_cast<const uint4*>(a.x_f16);
    for (int p0 = threadIdx.x; p0 < nunits; p0 += B * bd) {
      uint4 u[B];
#pragma unroll
      for (int b = 0; b < B; b++) {
        const int p = p0 + b * bd;
        if (p < nunits) u[b] = src[p];
      }
#pragma unroll
      for (int b = 0; b < B; b++) {
        const int p = p0 + b * bd;
        if (HI16) {
          u[b].y = h2_as_u32(__hmul2(u32_as_h2(u[b].y), k1_16));
          u[b].w = h2_as_u32(__hmul2(u32_as_h2(u[b].w), k1_16));
        }
        if (HALF_X) {
          u[b].x = h2_as_u32(__hmul2(u32_as_h2(u[b].x), k1_2));
          u[b].y = h2_as_u32(__hmul2(u32_as_h2(u[b].y), k1_2));
          u[b].z = h2_as_u32(__hmul2(u32_as_h2(u[b].z), k1_2));
          u[b].w = h2_as_u32(__hmul2(u32_as_h2(u[b].w), k1_2));
        }
        if (p < nunits) xs[(WT == WT_INT4) ? (p & 3) * (K >> 5) + (p >> 2) : p] = u[b];
      }
    }
  } else {
    constexpr int B = 2;
    const float4* x4 = reinterpret_cast<const float4*>(a.x_f32);
    const float4* w4 = reinterpret_cast<const float4*>(a.norm_w);
    for (int p0 = threadIdx.x; p0 < nunits; p0 += B * bd) {
      float4 v0[B], v1[B], w0[B], w1[B];
#pragma unroll
      for (int b = 0; b < B; b++) {
        const int p = p0 + b * bd;
        if (p < nunits) {
          v0[b] = x4[2 * p];
          v1[b] = x4[2 * p + 1];
          if (norm) { w0[b] = w4[2 * p]; w1[b] = w4[2 * p + 1]; }
        }
      }
#pragma unroll
      for (int b = 0; b < B; b++) {
        const int p = p0 + b * bd;
        if (p < nunits) {
          float f[8] = {v0[b].x, v0[b].y, v0[b].z, v0[b].w, v1[b].x, v1[b].y, v1[b].z, v1[b].w};
          if (norm) {
            const float w[8] = {w0[b].x, w0[b].y, w0[b].z, w0[b].w, w1[b].x, w1[b].y, w1[b].z, w1[b].w};
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] = f[e] * inv * w[e];
          }
          if (HALF_X) {
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] *= post;
          }
          if (HI16) {
            f[2] *= 0.0625f; f[3] *= 0.0625f; f[6] *= 0.0625f; f[7] *= 0.0625f;
          }
          uint4 u;
          u.x = h2_as_u32(__floats2half2_rn(f[0], f[1]));
          u.y = h2_as_u32(__floats2half2_rn(f[2], f[3]));
          u.z = h2_as_u32(__floats2half2_rn(f[4], f[5]));
          u.w = h2_as_u32(__floats2half2_rn(f[6], f[7]));
          xs[(WT == WT_INT4) ? (p & 3) * (K >> 5) + (p >> 2) : p] = u;
        }
      }
    }
  }
  __syncthreads();
}

struct RowRef {            // one weight row: its 16-byte units, its scales (int4), log2(units per group)
  const uint4* w;
  const __half* s;
  int gshift;
};

// The unpack constants of one group with zero point z (word_dot): lo = (1024 + z, 1024 + z) and hi = (-(64 + z),
// -(64 + z)) as f16 pairs, exact for z <= 15 (ulp 1 at 1024, 1/16 at 64: bits 0x6400 + z and 0xD400 + 16 z). Layout 1
// is z = 8 (zero_pair_layout1: 1032 and -72).
struct ZeroPair {
  __half2 lo, hi;
};
__device__ __forceinline__ ZeroPair zero_pair(uint32_t z) {
  return ZeroPair{u32_as_h2(0x64006400u + z * 0x00010001u), u32_as_h2(0xD400D400u + z * 0x00100010u)};
}
__device__ __forceinline__ ZeroPair zero_pair_layout1() {
  return ZeroPair{__half2half2(__ushort_as_half((unsigned short)0x6408)),    // 1032
                  __half2half2(__ushort_as_half((unsigned short)0xD480))};   // -72
}

// ---- row dot products ---------------------------------------------------------------------------------------
// 8 values of one word times 8 x values, accumulated into a f16x2 `acc`. One shift per word: pairs (0,1) and
// (4,5) come out as 1024 + u (minus zp.lo = 1024 + z: u - z); pairs (2,3) and (6,7) are taken in place (mask
// 0x00F000F0) as 1024 + 16u, and (v / 16) + zp.hi = 64 + u - (64 + z) = u - z is one exact HFMA2. One LOP3 per
// nibble pair (and_or). Layout 1: zp = zero_pair_layout1() (z = 8), whose constants fold into the instructions.
__device__ __forceinline__ __half2 word_dot(uint32_t q, const uint4 xv, __half2 acc,
                                            const ZeroPair zp = zero_pair_layout1()) {
  const __half2 k1_16 = __half2half2(__ushort_as_half((unsigned short)0x2C00));   // 1/16
  const uint32_t q8 = q >> 8;
  const __half2 h01 = __hsub2(u32_as_h2(and_or(q, 0x000F000Fu, 0x64006400u)), zp.lo);
  const __half2 h23 = __hfma2(u32_as_h2(and_or(q, 0x00F000F0u, 0x64006400u)), k1_16, zp.hi);
  const __half2 h45 = __hsub2(u32_as_h2(and_or(q8, 0x000F000Fu, 0x64006400u)), zp.lo);
  const __half2 h67 = __hfma2(u32_as_h2(and_or(q8, 0x00F000F0u, 0x64006400u)), k1_16, zp.hi);
  acc = __hfma2(h01, u32_as_h2(xv.x), acc);
  acc = __hfma2(h23, u32_as_h2(xv.y), acc);
  acc = __hfma2(h45, u32_as_h2(xv.z), acc);
  return __hfma2(h67, u32_as_h2(xv.w), acc);
}

// One 16-byte unit (32 values): two f16x2 partial sums of 8 products each, then f32.
// Accuracy of the f16 partial sums: the unpacked values u - 8 are exact in f16; each half
// of the two f16x2 accumulators a, b sums 8 products p_i = (u_i - 8) x_i (x already rounded to f16) with HFMA2, one
// rounding (unit roundoff 2^-11) per step, so |fl(sum) - sum| <= gamma_8 * sum|p_i|, gamma_8 = 8u/(1 - 8u) ~ 3.9e-3
// in the worst case and ~sqrt(8) u ~ 1.4e-3 of the partial's magnitude for random signs; the 4 partials per unit
// and everything after are f32 and the scale is applied once per unit (f32 FFMA). Errors of the K/16 partials of a
// row are independent, so the row's relative error stays ~1e-3 or below (tests: 3e-3 on every Qwen2.5 shape).
// Range: |partial| <= 8 * 8 * max|x|, finite for max|x| < 1023 (inputs are RMS-normalised activations or SwiGLU
// outputs; larger ones would overflow to inf here).
__device__ __forceinline__ float unit_dot_f16(const uint4 w, const uint4* xs, int xstride, int m) {
  const __half2 z = __float2half2_rn(0.f);
  const __half2 a = word_dot(w.y, xs[xstride + m], word_dot(w.x, xs[m], z));
  const __half2 b = word_dot(w.w, xs[3 * xstride + m], word_dot(w.z, xs[2 * xstride + m], z));
  const float2 fa = __half22float2(a), fb = __half22float2(b);
  return (fa.x + fa.y) + (fb.x + fb.y);
}

template <int WT>
__device__ __forceinline__ float unit_dot_dense(const uint4 w, const uint4 xv) {
  const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xx[4] = {xv.x, xv.y, xv.z, xv.w};
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float2 xf = __half22float2(u32_as_h2(xx[j]));
    float2 wf;
    if (WT == WT_F16) {
      wf = __half22float2(u32_as_h2(ww[j]));
    } else {
      wf.x = bf16_bits_to_float(ww[j] & 0xffffu);
      wf.y = bf16_bits_to_float(ww[j] >> 16);
    }
    acc = fmaf(wf.x, xf.x, acc);
    acc = fmaf(wf.y, xf.y, acc);
  }
  return acc;
}

template <int WT>
__device__ __forceinline__ void dot2_dense(const RowRef r0, const RowRef r1, bool has1, int K,
                                           const void* smem, int lane, float& y0, float& y1) {
  const uint4* xs = static_cast<const uint4*>(smem);
  const int nunits = K >> 3;
  const uint4* wr0 = r0.w;
  const uint4* wr1 = r1.w;
  constexpr int U = kUnroll;
  float acc0 = 0.f, acc1 = 0.f;
  uint4 a0[U], a1[U];
  auto load = [&](int base, uint4 (&w0)[U], uint4 (&w1)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int m = base + u * 32 + lane;
      if (m < nunits) {
        w0[u] = ld_stream16(wr0 + m);
        if (has1) w1[u] = ld_stream16(wr1 + m);
      }
    }
  };
  load(0, a0, a1);
  for (int base = 0; base < nunits; base += 32 * U) {
    uint4 b0[U], b1[U];
    const bool more = base + 32 * U < nunits;
    if (more) load(base + 32 * U, b0, b1);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int m = base + u * 32 + lane;
      if (m < nunits) {
        const uint4 xv = xs[m];
        acc0 += unit_dot_dense<WT>(a0[u], xv);
        if (has1) acc1 += unit_dot_dense<WT>(a1[u], xv);
      }
    }
    if (more) {
#pragma unroll
      for (int u = 0; u < U; u++) { a0[u] = b0[u]; a1[u] = b1[u]; }
    }
  }
  y0 = warp_sum(acc0);
  y1 = warp_sum(acc1);
}

template <int WT>
__device__ __forceinline__ RowRef row_ref(const LinW& W, int row) {
  RowRef r;
  const int K = W.K;
  if (WT == WT_INT4) {
    r.w = reinterpret_cast<const uint4*>(W.w) + (size_t)row * (K >> 5);
    r.s = W.scales + (size_t)row * (K / W.group);
    r.gshift = __ffs(W.group >> 5) - 1;
  } else {
    r.w = reinterpret_cast<const uint4*>(W.w) + (size_t)row * (K >> 3);
    r.s = nullptr;
    r.gshift = 0;
  }
  return r;
}

// output row r -> (row reference, bias, row inside its segment)
template <int WT>
__device__ __forceinline__ RowRef locate(const GemvArgs& a, int r, const float*& bias, int& row) {
  const int n0 = a.seg[0].N, n1 = a.nseg > 1 ? a.seg[1].N : 0;
  if (a.nseg > 2 && r >= n0 + n1) { bias = a.bias[2]; row = r - n0 - n1; return row_ref<WT>(a.seg[2], row); }
  if (a.nseg > 1 && r >= n0) { bias = a.bias[1]; row = r - n0; return row_ref<WT>(a.seg[1], row); }
  bias = a.bias[0]; row = r;
  return row_ref<WT>(a.seg[0], row);
}

template <int MODE>
__device__ __forceinline__ void store_row(const GemvArgs& a, int r, float y, const float* bias, int row) {
  const float b = bias ? bias[row] : 0.f;
  if (MODE == GEMV_ADD) a.out_f32[r] += y + b;
  else a.out_f32[r] = y + b;
}

// Row-pair kernel (f16/bf16 weights). Persistent grid: each warp walks rows r, r + stride, ... (two per step: r and r + stride, or for SWIGLU the
// gate and up rows of r), so x is staged once per block and every warp keeps 2 x kUnroll loads in flight.
// The weight-type hooks of gemv_rowpair: how x is staged and how two rows are dotted with it. The library runs
// DenseRows<WT_F16> and DenseRows<WT_BF16>; csrc/dev programs plug in INT4 ones.
template <int WT_>
struct DenseRows {
  static constexpr int WT = WT_;
  static constexpr int kUnitShift = 3;  // log2(values per 16-byte unit)
  __device__ static void stage(const GemvArgs& a, int K, uint4* smem, float* red) { stage_x_f16<WT>(a, K, smem, red); }
  __device__ static void dot2(const RowRef r0, const RowRef r1, bool has1, int K, const void* smem, int lane,
                              float& y0, float& y1) {
    dot2_dense<WT>(r0, r1, has1, K, smem, lane, y0, y1);
  }
};

template <class Rows, int MODE>
__global__ void __launch_bounds__(kThreads, 3) gemv_rowpair(const GemvArgs a, int total_rows) {
  constexpr int WT = Rows::WT;
  extern __shared__ uint4 smem[];
  __shared__ float red[32];
  const int K = a.seg[0].K;
  {  // weights do not depend on the previous kernel: start pulling this warp's first rows into L2 now
    const int r = blockIdx.x * kWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r < total_rows) {
      const float* b;
      int row;
      const RowRef q0 = MODE == GEMV_SWIGLU ? row_ref<WT>(a.seg[0], r) : locate<WT>(a, r, b, row);
      const int nunits = K >> Rows::kUnitShift;
      for (int m = lane; m < nunits && m < 32 * kUnroll; m += 32) prefetch_l2(q0.w + m);
      if (MODE == GEMV_SWIGLU) {
        const RowRef q1 = row_ref<WT>(a.up, r);
        for (int m = lane; m < nunits && m < 32 * kUnroll; m += 32) prefetch_l2(q1.w + m);
      }
    }
  }
  pdl_wait();     // x / out were written by the previous kernel
  pdl_trigger();
  Rows::stage(a, K, smem, red);
  const int lane = threadIdx.x & 31;
  const int stride = gridDim.x * kWarps;
  if (MODE == GEMV_SWIGLU) {
    for (int r = blockIdx.x * kWarps + (threadIdx.x >> 5); r < total_rows; r += stride) {
      float g, u;
      Rows::dot2(row_ref<WT>(a.seg[0], r), row_ref<WT>(a.up, r), true, K, smem, lane, g, u);
      if (lane == 0) a.out_f16[r] = swiglu_f16(g, u);
    }
  } else {
    for (int r = blockIdx.x * kWarps + (threadIdx.x >> 5); r < total_rows; r += 2 * stride) {
      const int r1 = r + stride;
      const bool has1 = r1 < total_rows;
      const float *b0, *b1;
      int row0, row1;
      const RowRef q0 = locate<WT>(a, r, b0, row0);
      const RowRef q1 = locate<WT>(a, has1 ? r1 : r, b1, row1);
      float y0, y1;
      Rows::dot2(q0, q1, has1, K, smem, lane, y0, y1);
      if (lane == 0) {
        store_row<MODE>(a, r, y0, b0, row0);
        if (has1) store_row<MODE>(a, r1, y1, b1, row1);
      }
    }
  }
}

// INT4 row reference without integer division (groups are powers of two: 32..256, checked at load); gemv_int4
// calls this once per task and row, where row_ref's K / group division cost ~20 instructions.
__device__ __forceinline__ RowRef row_ref_int4_fast(const LinW& W, int row) {
  RowRef r;
  const int lg = __ffs(W.group) - 1;                    // log2(group)
  r.w = reinterpret_cast<const uint4*>(W.w) + (size_t)row * (W.K >> 5);
  r.s = W.scales + (size_t)row * (W.K >> lg);
  r.gshift = lg - 5;
  return r;
}
__device__ __forceinline__ RowRef locate_int4_fast(const GemvArgs& a, int r) {
  const int n0 = a.seg[0].N, n1 = a.nseg > 1 ? a.seg[1].N : 0;
  if (a.nseg > 2 && r >= n0 + n1) return row_ref_int4_fast(a.seg[2], r - n0 - n1);
  if (a.nseg > 1 && r >= n0) return row_ref_int4_fast(a.seg[1], r - n0);
  return row_ref_int4_fast(a.seg[0], r);
}
// Layout 2: a row's zero points (uint8, indexed as its scales), and those of output row r located as
// locate_int4_fast locates its weights.
__device__ __forceinline__ const uint8_t* zero_row_int4(const LinW& W, int row) {
  return W.zeros + (size_t)row * (W.K >> (__ffs(W.group) - 1));
}
__device__ __forceinline__ const uint8_t* locate_zeros_int4(const GemvArgs& a, int r) {
  const int n0 = a.seg[0].N, n1 = a.nseg > 1 ? a.seg[1].N : 0;
  if (a.nseg > 2 && r >= n0 + n1) return zero_row_int4(a.seg[2], r - n0 - n1);
  if (a.nseg > 1 && r >= n0) return zero_row_int4(a.seg[1], r - n0);
  return zero_row_int4(a.seg[0], r);
}

// ---- gemv_int4: INT4 weights, split-K warp groups, one pipeline per warp across rows ----------------------------
// Work: a "task" is a row pair (2t, 2t+1) (STORE/ADD; an odd last row is paired with itself and its second result
// dropped) or the (gate t, up t) pair (SWIGLU). A group of KS = 2^ks_log2 warps of one block shares each task, warp
// s of the group taking units [s*chunk, min(nunits, (s+1)*chunk)) of both rows (split K; chunk is a multiple of 8
// units, so every slice starts on a scale-group boundary for groups up to 256), so that small-N shapes still give
// every resident warp work. Group gid takes tasks gid, gid + NG, ... (NG groups in the grid).
// Each warp runs ONE software pipeline over the flattened sequence (task i, step j) of all its tasks: the loads of
// the next step -- also when it belongs to the next task -- are in flight while the current step is computed, so a
// row boundary costs no exposed memory latency. Ping-pong register buffers (no copies between stages). The first
// step's loads are issued before the PDL wait (weights never depend on the previous kernel).
// Cursors, not per-unit indices: the load side keeps one 32-bit unit cursor shared by both rows (row bases change
// only between tasks), the compute side another that also addresses x. Every task of a warp has the same slice, so only
// its last step can be partial, and the lanes that step covers are one bit mask computed once (`tail`): the full
// steps carry no per-unit bounds checks and no index arithmetic (ncu counted 39 such instructions per unit and row
// in the index-based version, a third of its issue slots: bench/NOTES.md "Session 4", "Session 5").
// Results: each warp's per-task partial pair goes to shared memory part[warp][round][2]; after one __syncthreads
// the block sums the KS partials of each task in slice order (deterministic) and applies the epilogue.
// The unit arithmetic of gemv_int4: x staging, and acc + scale * (one 16-byte unit of a row . x) with xp pointing at
// the unit's x in plane 0 of the transposed staging (planes nunits apart). The library runs F16Units.
struct F16Units {
  static constexpr int kUnroll = 2;  // units per lane and row per pipeline stage
  // x staged as f16; halved for layout 2 (gemv_int4's ZP build, whose task sums are doubled back: both exact)
  __device__ static void stage(const GemvArgs& a, int K, uint4* smem, float* red) {
    stage_x_f16<WT_INT4>(a, K, smem, red);
  }
  __device__ static void stage_halved(const GemvArgs& a, int K, uint4* smem, float* red) {
    stage_x_f16<WT_INT4, false, true>(a, K, smem, red);
  }
  // The two f16x2 chains of a unit (8 products per half each) are added in f16 (one more rounding of a sum of 16
  // products, unit_dot_f16's bound becomes gamma_9 of the same magnitudes) before the one conversion to f32.
  // zp: the unit's group constants (layout 2: zero_pair(z); layout 1 by default). Range: layout 1's products
  // (u - 8) x and 16-product partials stay finite for max|x| < 8190 and < 511. Layout 2's values u - z lie in
  // -15..15; on x / 2 (stage_halved) its products are at most 7.5 max|x| and its partials 120 max|x|: finite for
  // max|x| < 8733 and < 546, layout 1's range or more (on x itself they would end at 4370 and 273, which a
  // checkpoint with large activations in one channel can reach). Scaling by 2 is exact, so the accuracy bound above
  // (relative) is unchanged.
  __device__ static float fma(const uint4 w, __half s, const uint4* xp, int nunits, float acc,
                              const ZeroPair zp = zero_pair_layout1()) {
    const __half2 z = __float2half2_rn(0.f);
    const __half2 p = word_dot(w.y, xp[nunits], word_dot(w.x, xp[0], z, zp), zp);
    const __half2 q = word_dot(w.w, xp[3 * nunits], word_dot(w.z, xp[2 * nunits], z, zp), zp);
    const float2 f = __half22float2(__hadd2(p, q));
    return fmaf(__half2float(s), f.x + f.y, acc);
  }
};
constexpr int kTaskOverheadUnits = 48;          // per-task fixed cost (2 warp sums, partial store), in unit slots
constexpr int kSliceAlignUnits = 8;             // split-K slices start on multiples of this many units (group 256)

// MINB: resident blocks per SM the registers are budgeted for (the library runs 2: bench/NOTES.md).
// All segments (and `up`) share one group size (gemv() splits launches where they do not).
// ZP: INT4 layout 2 (every segment and `up` has zero points; gemv() splits launches where layouts differ): each
// unit's zero byte is loaded with its scale (same index, same pipeline stage) and the unpack subtracts 1024 + z; x is
// staged halved and each task's sums doubled (exact), for layout 1's f16 range (F16Units::fma).
// ZP = false compiles to layout 1's kernel as it was (no zero loads, constants folded).
template <int MODE, int MINB, class Units = F16Units, bool ZP = false>
__global__ void __launch_bounds__(kThreads, MINB)
gemv_int4(const GemvArgs a, int total_rows, int ntasks, int ks_log2, int rounds) {
  extern __shared__ uint4 smem[];
  __shared__ float red[32];
  constexpr int U = Units::kUnroll;
  constexpr int kStepUnits = 32 * U;
  const int K = a.seg[0].K, nunits = K >> 5;
  const int gs = __ffs(a.seg[0].group) - 6;            // log2(units per scale group): 0..3 for groups 32..256
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int KS = 1 << ks_log2, G = kWarps >> ks_log2;
  const int gid = blockIdx.x * G + (warp >> ks_log2), NG = gridDim.x * G;
  const int chunk = ((nunits + KS - 1) / KS + kSliceAlignUnits - 1) & ~(kSliceAlignUnits - 1);
  const int lo = min(nunits, (warp & (KS - 1)) * chunk), hi = min(nunits, lo + chunk);
  const int my_tasks = gid < ntasks ? (ntasks - 1 - gid) / NG + 1 : 0;   // <= rounds
  const int nsteps = (hi - lo + kStepUnits - 1) / kStepUnits;   // steps per task; 0: empty slice
  const int total = my_tasks * nsteps;
  float* part = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + (size_t)K * 2);  // [kWarps][rounds][2]
  unsigned tail = 0;                     // bit u: this lane's unit u of a task's last step lies inside the slice
#pragma unroll
  for (int u = 0; u < U; u++)
    if (lo + (nsteps - 1) * kStepUnits + u * 32 + lane < hi) tail |= 1u << u;

  const uint4 *b0 = nullptr, *b1 = nullptr;   // the two rows of the task being loaded (units)
  const __half *c0 = nullptr, *c1 = nullptr;  // and their scales
  const uint8_t *d0 = nullptr, *d1 = nullptr; // and their zero points (ZP)
  auto seek = [&](int i) {               // the rows of task i
    const int t = gid + i * NG;
    RowRef r0, r1;
    if (MODE == GEMV_SWIGLU) {
      r0 = row_ref_int4_fast(a.seg[0], t);
      r1 = row_ref_int4_fast(a.up, t);
    } else {
      r0 = locate_int4_fast(a, 2 * t);
      r1 = locate_int4_fast(a, min(2 * t + 1, total_rows - 1));
    }
    b0 = r0.w;
    b1 = r1.w;
    c0 = r0.s;
    c1 = r1.s;
    if constexpr (ZP) {
      if (MODE == GEMV_SWIGLU) {
        d0 = zero_row_int4(a.seg[0], t);
        d1 = zero_row_int4(a.up, t);
      } else {
        d0 = locate_zeros_int4(a, 2 * t);
        d1 = locate_zeros_int4(a, min(2 * t + 1, total_rows - 1));
      }
    }
  };
  // One 32-bit cursor per side, shared by both rows: the unit of this lane's first load of the next step to load
  // (lo_ ...), and of the step being computed (co, which also addresses x).
  const int first = lo + lane;
  int lo_ = first, lj = 0, li = 0;       // next step to load: task li, step lj
  auto load = [&](uint4 (&w0)[U], uint4 (&w1)[U], __half (&s0)[U], __half (&s1)[U], uint32_t (&z0)[U],
                  uint32_t (&z1)[U]) {
    const bool last = lj == nsteps - 1;
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (!last || ((tail >> u) & 1)) {
        const int m = lo_ + u * 32;
        w0[u] = ld_stream16(b0 + m);
        w1[u] = ld_stream16(b1 + m);
        s0[u] = c0[m >> gs];
        s1[u] = c1[m >> gs];
        if constexpr (ZP) {
          z0[u] = d0[m >> gs];
          z1[u] = d1[m >> gs];
        }
      }
    }
    if (!last) {
      lj++;
      lo_ += kStepUnits;
    } else {
      lj = 0;
      lo_ = first;
      if (++li < my_tasks) seek(li);
    }
  };
  int cj = 0, ci = 0, co = first;        // step being computed: task ci, step cj
  float acc0 = 0.f, acc1 = 0.f;
  auto compute = [&](const uint4 (&w0)[U], const uint4 (&w1)[U], const __half (&s0)[U], const __half (&s1)[U],
                     const uint32_t (&z0)[U], const uint32_t (&z1)[U]) {
    const bool last = cj == nsteps - 1;
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (!last || ((tail >> u) & 1)) {
        if constexpr (ZP) {
          acc0 = Units::fma(w0[u], s0[u], smem + co + u * 32, nunits, acc0, zero_pair(z0[u]));
          acc1 = Units::fma(w1[u], s1[u], smem + co + u * 32, nunits, acc1, zero_pair(z1[u]));
        } else {
          acc0 = Units::fma(w0[u], s0[u], smem + co + u * 32, nunits, acc0);
          acc1 = Units::fma(w1[u], s1[u], smem + co + u * 32, nunits, acc1);
        }
      }
    }
    if (!last) {
      cj++;
      co += kStepUnits;
    } else {                             // task ci complete (uniform over the warp)
      cj = 0;
      co = first;
      const float xs = ZP ? 2.f : 1.f;   // the ZP build ran on x / 2
      const float y0 = xs * warp_sum(acc0), y1 = xs * warp_sum(acc1);
      if (lane == 0) {
        part[(warp * rounds + ci) * 2] = y0;
        part[(warp * rounds + ci) * 2 + 1] = y1;
      }
      acc0 = 0.f;
      acc1 = 0.f;
      ci++;
    }
  };

  uint4 wa0[U], wa1[U], wb0[U], wb1[U];
  __half sa0[U], sa1[U], sb0[U], sb1[U];
  uint32_t za0[U], za1[U], zb0[U], zb1[U];   // ZP: zero bytes (never written nor read in layout 1's build)
  if (total > 0) {
    seek(0);
    load(wa0, wa1, sa0, sa1, za0, za1);
  }
  pdl_wait();     // x / out were written by the previous kernel
  pdl_trigger();
  if constexpr (ZP)
    Units::stage_halved(a, K, smem, red);  // x / 2: layout 1's range for the layout-2 products (F16Units::fma)
  else
    Units::stage(a, K, smem, red);
  if (nsteps == 0 && lane == 0)          // empty slice: its partials are zero
    for (int i = 0; i < my_tasks; i++) part[(warp * rounds + i) * 2] = part[(warp * rounds + i) * 2 + 1] = 0.f;
  for (int q = 0; q < total; q += 2) {
    if (q + 1 < total) load(wb0, wb1, sb0, sb1, zb0, zb1);
    compute(wa0, wa1, sa0, sa1, za0, za1);
    if (q + 1 >= total) break;
    if (q + 2 < total) load(wa0, wa1, sa0, sa1, za0, za1);
    compute(wb0, wb1, sb0, sb1, zb0, zb1);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * rounds; idx += kThreads) {
    const int g = idx / rounds, i = idx - g * rounds;
    const int t = blockIdx.x * G + g + i * NG;
    if (t >= ntasks) continue;
    float y0 = 0.f, y1 = 0.f;
    for (int s = 0; s < KS; s++) {
      const float* p = part + ((g * KS + s) * rounds + i) * 2;
      y0 += p[0];
      y1 += p[1];
    }
    if (MODE == GEMV_SWIGLU) {
      a.out_f16[t] = swiglu_f16(y0, y1);
    } else {
      const float* b;
      int row;
      locate<WT_INT4>(a, 2 * t, b, row);
      store_row<MODE>(a, 2 * t, y0, b, row);
      if (2 * t + 1 < total_rows) {
        locate<WT_INT4>(a, 2 * t + 1, b, row);
        store_row<MODE>(a, 2 * t + 1, y1, b, row);
      }
    }
  }
}


// ---- host: gemv_int4 launch plan ----------------------------------------------------------------------------
// Split factor KS chosen per shape by a small cost model (unit slots on the busiest warp's critical path:
// rounds x (steps x 64 + per-task overhead), inflated up to 1.25x when the grid leaves resident block slots empty,
// since fewer warps per SM means fewer bytes in flight).
struct SplitPlan { int ks_log2, grid, rounds; };
// Weight of the empty block slots in the cost. 0.25: with 0.5 the 7B down projection took split 2 (15.33 us, two
// rounds for 70 % of the warps) over split 1 (14.73 us, one round on 224 of 264 slots); no other Qwen2.5 shape's
// choice changes (csrc/dev/gemv_int4_vs_v2, bench/NOTES.md "Session 5").
constexpr double kEmptySlotPenalty = 0.25;

// min_slice: the fewest units a split-K slice may have (one per lane for gemv_int4; csrc/dev kernels pass others);
// overhead: a task's fixed cost in unit slots.
SplitPlan plan_split(int ntasks, int nunits, int cap_blocks, int step_units, int min_slice = 32,
                     int overhead = kTaskOverheadUnits) {
  SplitPlan best{0, 1, 1};
  double best_cost = 1e300;
  for (int ksl = 0; ksl <= 3; ksl++) {
    const int ks = 1 << ksl, G = kWarps >> ksl;
    if (ks > 1 && nunits / ks < min_slice) break;
    const int grid = std::max(1, std::min((ntasks + G - 1) / G, cap_blocks));
    const int rounds = (ntasks + grid * G - 1) / (grid * G);
    const int steps = ((nunits + ks - 1) / ks + step_units - 1) / step_units;
    const double cost = (double)rounds * (steps * step_units + overhead) *
                        (1.0 + kEmptySlotPenalty * (1.0 - (double)grid / cap_blocks));
    if (cost < best_cost) { best_cost = cost; best = SplitPlan{ksl, grid, rounds}; }
  }
  return best;
}

// gemv_int4<MODE, MINB, Units, ZP> on `rows` output rows with a grid for `sm_count` SMs; checks the shared-memory
// need.
template <int MODE, int MINB, class Units = F16Units, bool ZP = false>
int launch_gemv_int4(const GemvArgs& a, int rows, int sm_count, cudaStream_t st) {
  const int K = a.seg[0].K, nunits = K >> 5;
  const int ntasks = MODE == GEMV_SWIGLU ? rows : (rows + 1) / 2;
  const size_t smem_x = (size_t)K * 2;  // f16 x (other Units must fit in as much)
  // occupancy with 2 KB for the partials (plans need 64 B x rounds; a larger need only costs residency, never
  // correctness: blocks do not wait on each other)
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_int4<MODE, MINB, Units, ZP>, kThreads, smem_x + 2048) != cudaSuccess ||
      occ < 1)
    occ = 1;
  const SplitPlan p = plan_split(ntasks, nunits, sm_count * std::min(occ, kBlocksPerSm), 32 * Units::kUnroll);
  const size_t smem = smem_x + (size_t)kWarps * p.rounds * 2 * sizeof(float);
  if (smem > (size_t)kMaxDynSmem) return fail(NQ_E_UNSUPPORTED, "gemv: K=%d with %d tasks too large", K, ntasks);
  return launch_pdl("gemv_int4", gemv_int4<MODE, MINB, Units, ZP>, dim3(p.grid), dim3(kThreads), smem, st, a, rows, ntasks,
                    p.ks_log2, p.rounds);
}

}  // namespace
}  // namespace nq
