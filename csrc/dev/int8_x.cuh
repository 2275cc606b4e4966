// int8 activations for the dp4a GEMV experiments: x quantised per 32-value unit (scale amax/127, round to nearest),
// packed for dp4a against the nibble order of layout 1, and the unit dot product in exact int32.
#pragma once
#include "gemv_kernels.cuh"

namespace nq {
namespace {

// dp4a staging: per 32-value unit m: int2 xq[j][m] (j = word 0..3: .x = bytes for the low nibbles (k offsets
// 0,4,1,5), .y = high nibbles (2,6,3,7)), float sx[m] (scale), int xsum[m] (sum of the int8 values).
__device__ void stage_x_i8(const GemvArgs& a, int K, int2* xq, float* sx, int* xsum, float* red) {
  const int nunits = K >> 5;
  float inv = 1.f;
  const bool norm = a.x_f16 == nullptr && a.norm_w != nullptr;
  if (norm) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < (K >> 2); i += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(a.x_f32)[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = block_sum(ss, red);
    inv = rsqrtf(ss / (float)K + a.eps);
  }
  for (int m = threadIdx.x; m < nunits; m += blockDim.x) {
    float f[32];
#pragma unroll
    for (int e = 0; e < 32; e++) {
      const int k = 32 * m + e;
      float v = a.x_f16 ? __half2float(a.x_f16[k]) : a.x_f32[k];
      if (norm) v = v * inv * a.norm_w[k];
      f[e] = v;
    }
    float amax = 0.f;
#pragma unroll
    for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(f[e]));
    const float s = amax / 127.f;
    const float r = amax > 0.f ? 127.f / amax : 0.f;
    int q[32];
    int sum = 0;
#pragma unroll
    for (int e = 0; e < 32; e++) {
      q[e] = __float2int_rn(f[e] * r);
      sum += q[e];
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int* b = q + 8 * j;
      const int lo = (b[0] & 0xff) | ((b[4] & 0xff) << 8) | ((b[1] & 0xff) << 16) | ((b[5] & 0xff) << 24);
      const int hi = (b[2] & 0xff) | ((b[6] & 0xff) << 8) | ((b[3] & 0xff) << 16) | ((b[7] & 0xff) << 24);
      xq[j * nunits + m] = make_int2(lo, hi);
    }
    sx[m] = s;
    xsum[m] = sum;
  }
  __syncthreads();
}

constexpr int kQ8Batch = 4;  // stage_x_q8: passes whose loads are issued before any is used
// x quantised to int8 per 32-value unit exactly as stage_x_i8 (gemv_v1.cuh) (scale amax/127,
// round-to-nearest, same packing: xq[j * nunits + m] = (bytes of k offsets 0,4,1,5 ; 2,6,3,7) of word j of unit m,
// sx[m], xsum[m]), but vectorised: thread p of a pass takes word p = 4m + j (8 consecutive values, one 16-byte
// f16 load or two float4 of x and of norm_w), the 4 threads of a unit are consecutive lanes (amax and the sum:
// two shuffles each), and kQ8Batch passes' loads are issued before any is used (stage_x_i8 walked 32 scalar loads
// per unit on one thread: its K = 18944 prologue dominated the v1 dp4a kernel; bench/NOTES.md).
__device__ void stage_x_q8(const GemvArgs& a, int K, int2* xq, float* sx, int* xsum, float* red) {
  const int nwords = K >> 3, nunits = K >> 5, bd = blockDim.x;
  const bool norm = a.x_f16 == nullptr && a.norm_w != nullptr;
  const float inv = rms_inv(a, K, red);
  for (int p0 = 0; p0 < nwords; p0 += kQ8Batch * bd) {  // same trip count in every thread: shuffles stay uniform
    float f[kQ8Batch][8];
#pragma unroll
    for (int b = 0; b < kQ8Batch; b++) {
      const int p = p0 + b * bd + threadIdx.x;
      if (p < nwords) {
        if (a.x_f16) {
          const uint4 u = reinterpret_cast<const uint4*>(a.x_f16)[p];
          const uint32_t uu[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const float2 t = __half22float2(u32_as_h2(uu[e]));
            f[b][2 * e] = t.x;
            f[b][2 * e + 1] = t.y;
          }
        } else {
          const float4 v0 = reinterpret_cast<const float4*>(a.x_f32)[2 * p];
          const float4 v1 = reinterpret_cast<const float4*>(a.x_f32)[2 * p + 1];
          float4 w0 = make_float4(1.f, 1.f, 1.f, 1.f), w1 = w0;
          if (norm) {
            w0 = reinterpret_cast<const float4*>(a.norm_w)[2 * p];
            w1 = reinterpret_cast<const float4*>(a.norm_w)[2 * p + 1];
          }
          f[b][0] = v0.x * inv * w0.x; f[b][1] = v0.y * inv * w0.y; f[b][2] = v0.z * inv * w0.z; f[b][3] = v0.w * inv * w0.w;
          f[b][4] = v1.x * inv * w1.x; f[b][5] = v1.y * inv * w1.y; f[b][6] = v1.z * inv * w1.z; f[b][7] = v1.w * inv * w1.w;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; e++) f[b][e] = 0.f;
      }
    }
#pragma unroll
    for (int b = 0; b < kQ8Batch; b++) {
      const int p = p0 + b * bd + threadIdx.x;
      float amax = 0.f;
#pragma unroll
      for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(f[b][e]));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      const float r = amax > 0.f ? 127.f / amax : 0.f;
      int q[8], sum = 0;
#pragma unroll
      for (int e = 0; e < 8; e++) {
        q[e] = __float2int_rn(f[b][e] * r);
        sum += q[e];
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (p < nwords) {
        const int lo = (q[0] & 0xff) | ((q[4] & 0xff) << 8) | ((q[1] & 0xff) << 16) | ((q[5] & 0xff) << 24);
        const int hi = (q[2] & 0xff) | ((q[6] & 0xff) << 8) | ((q[3] & 0xff) << 16) | ((q[7] & 0xff) << 24);
        const int m = p >> 2, j = p & 3;
        xq[j * nunits + m] = make_int2(lo, hi);
        if (j == 0) {
          sx[m] = amax / 127.f;
          xsum[m] = sum;
        }
      }
    }
  }
  __syncthreads();
}

__device__ __forceinline__ float unit_dot_i8(const uint4 w, const int2* xq, int nunits, int m) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  int acc = 0;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int2 xv = xq[j * nunits + m];
    acc = __dp4a((int)(ws[j] & 0x0F0F0F0Fu), xv.x, acc);
    acc = __dp4a((int)((ws[j] >> 4) & 0x0F0F0F0Fu), xv.y, acc);
  }
  return (float)acc;
}

}  // namespace
}  // namespace nq
