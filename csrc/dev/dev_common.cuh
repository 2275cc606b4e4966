// Harness shared by the csrc/dev programs: error checks, random INT4 weights in the file's layout 1 with their
// dequantised f32 copy, CPU references, validate_result, and a timer that rotates over buffers larger than L2.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>
#include "common.h"
#include "format_contract.h"
#include "device_util.cuh"

#define DEV_CHECK(call)                                                                                   \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));          \
      std::exit(2);                                                                                       \
    }                                                                                                     \
  } while (0)

namespace dev {

// Bytes every timed rotation covers: > 4 x the H200's 60 MB L2, so no launch finds its weights in L2.
constexpr size_t kRotateBytes = 256ull << 20;

inline uint64_t align128(uint64_t n) { return (n + 127) / 128 * 128; }

// One N x K INT4 weight: codes u (0..15, stored q + 8), f16 scales per group, packed as the file stores it
// (layout 1: word j of a row holds k = 8j..8j+7, nibble i -> k = 8j + PERM[i]; qweight, pad to 128, scales).
struct Int4Weight {
  int N = 0, K = 0, group = 0;
  std::vector<uint8_t> file_bytes;  // qweight + pad + scales, as one tensor's data in a .nanoqwen file
  std::vector<float> w;             // dequantised (u - 8) * f16 scale, row-major N x K
  size_t scales_offset() const { return align128((size_t)N * K / 2); }
  size_t bytes() const { return align128(scales_offset() + (size_t)N * (K / group) * 2); }
};

inline Int4Weight random_int4(int N, int K, int group, uint32_t seed) {
  std::mt19937 rng(seed);
  Int4Weight W;
  W.N = N; W.K = K; W.group = group;
  W.file_bytes.assign(W.bytes(), 0);
  W.w.resize((size_t)N * K);
  std::uniform_real_distribution<float> sd(0.5f, 1.5f);
  const float base = 1.f / std::sqrt(21.5f * (float)K);   // |W x| ~ |x| for codes uniform in 0..15
  uint32_t* q = reinterpret_cast<uint32_t*>(W.file_bytes.data());
  __half* sc = reinterpret_cast<__half*>(W.file_bytes.data() + W.scales_offset());
  for (int n = 0; n < N; n++) {
    for (int g = 0; g < K / group; g++) {
      float s = sd(rng) * base * ((rng() % 10) ? 1.f : -1.f);   // some negative scales
      sc[(size_t)n * (K / group) + g] = __float2half_rn(s);
    }
    for (int j = 0; j < K / 8; j++) {
      uint32_t word = 0;
      for (int i = 0; i < 8; i++) {
        const uint32_t u = rng() & 15u;
        const int k = 8 * j + nq::contract::kInt4Perm[i];
        word |= u << (4 * i);
        W.w[(size_t)n * K + k] = ((float)u - (float)nq::contract::kInt4ZeroCode) *
                                 __half2float(sc[(size_t)n * (K / group) + k / group]);
      }
      q[(size_t)n * (K / 8) + j] = word;
    }
  }
  return W;
}

// CPU references (double accumulation)
inline std::vector<float> gemv_ref(const Int4Weight& W, const std::vector<float>& x) {
  std::vector<float> y(W.N);
  for (int n = 0; n < W.N; n++) {
    double acc = 0.0;
    for (int k = 0; k < W.K; k++) acc += (double)W.w[(size_t)n * W.K + k] * x[k];
    y[n] = (float)acc;
  }
  return y;
}
// x rounded to f16 and back: what a kernel that stages x as f16 multiplies
inline std::vector<float> round_f16(std::vector<float> x) {
  for (float& v : x) v = __half2float(__float2half_rn(v));
  return x;
}
inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (float& e : v) e = nd(rng);
  return v;
}

// A library launch helper's status: on failure print nq_last_error() and exit 2.
inline void must(int rc) {
  if (rc != NQ_OK) {
    std::fprintf(stderr, "launch: %s\n", nq::last_error());
    std::exit(2);
  }
}

// Relative Frobenius error of got vs ref; every value must be finite. Prints one line; exits 1 on failure.
inline void validate_result(const char* what, const float* got, const std::vector<float>& ref, double tol) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); i++) {
    if (!std::isfinite(got[i])) {
      std::printf("%s: FAIL, element %zu is %f (unwritten or overflowed)\n", what, i, got[i]);
      std::exit(1);
    }
    num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  const double err = std::sqrt(num / std::max(den, 1e-300));
  std::printf("%s: relative error %.2e (tolerance %.1e) %s\n", what, err, tol, err < tol ? "ok" : "FAIL");
  if (!(err < tol)) std::exit(1);
}

// Copies of one weight's file bytes on the device, enough of them to exceed kRotateBytes.
struct DeviceCopies {
  uint8_t* base = nullptr;
  size_t per = 0;
  int n = 0;
  DeviceCopies(const std::vector<uint8_t>& bytes, int min_copies = 2) {
    per = bytes.size();
    n = (int)std::max<size_t>(min_copies, kRotateBytes / per + 1);
    DEV_CHECK(cudaMalloc(&base, per * n));
    for (int c = 0; c < n; c++) DEV_CHECK(cudaMemcpy(base + per * c, bytes.data(), per, cudaMemcpyHostToDevice));
  }
  ~DeviceCopies() { cudaFree(base); }
  uint8_t* copy(int c) const { return base + per * (c % n); }
};

// Median over `reps` repetitions of the mean time of `iters` back-to-back launches, in microseconds;
// launch(i) enqueues launch i on the default stream (rotate buffers with i).
inline double median_us(const std::function<void(int)>& launch, int iters = 100, int reps = 11) {
  cudaEvent_t e0, e1;
  DEV_CHECK(cudaEventCreate(&e0));
  DEV_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; i++) launch(i);   // warm-up
  std::vector<double> t;
  int at = 0;
  for (int r = 0; r < reps; r++) {
    DEV_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < iters; i++) launch(at++);
    DEV_CHECK(cudaEventRecord(e1));
    DEV_CHECK(cudaEventSynchronize(e1));
    float ms = 0.f;
    DEV_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1e3 / iters);
  }
  DEV_CHECK(cudaGetLastError());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The GPU's nanosecond clock (%globaltimer), for traces and timed spins
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
// Spins the calling thread for ns nanoseconds of %globaltimer: a kernel's stand-in for work of a known length
__device__ __forceinline__ void spin_ns(unsigned long long ns) {
  const unsigned long long t0 = globaltimer();
  while (globaltimer() - t0 < ns) {}
}

// Deterministic pseudo-random 32-bit words from an index (a splitmix-style hash), the same on host and device: large
// random buffers filled on the GPU (fill_hash_words) whose words a CPU reference can recompute or read back.
__host__ __device__ inline uint32_t hash_word(uint64_t j) {
  uint64_t z = j * 0x9E3779B97F4A7C15ull;
  z ^= z >> 29;
  return (uint32_t)(z * 0xBF58476D1CE4E5B9ull >> 32);
}
// w[j] = hash_word(j + salt), j < n
__global__ void fill_hash_words(uint32_t* w, size_t n, uint64_t salt) {
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
    w[j] = hash_word(j + salt);
}

// A Qwen2.5 size's widths (nanoqwen_format/shapes.py) and layer count from a dev program's command line:
// [layers [hidden intermediate heads kv_heads head_dim]], the 7B's 28 layers and widths by default. False (with a
// usage line on stderr) unless 1 <= layers <= 64 and hidden, intermediate and heads x head_dim are positive multiples
// of 128 (a GEMV's K) and kv_heads x head_dim a positive multiple of 32.
struct Widths { int hidden, intermediate, heads, kv_heads, head_dim; };
inline bool layers_and_widths(int argc, char** argv, const char* prog, int& layers, Widths& w) {
  layers = argc > 1 ? std::atoi(argv[1]) : 28;
  w = {3584, 18944, 28, 4, 128};
  if (argc > 6) w = {std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6])};
  const long long q = (long long)w.heads * w.head_dim, kv = (long long)w.kv_heads * w.head_dim;
  if (layers >= 1 && layers <= 64 && w.hidden > 0 && w.hidden % 128 == 0 && w.intermediate > 0 &&
      w.intermediate % 128 == 0 && q > 0 && q % 128 == 0 && kv > 0 && kv % 32 == 0)
    return true;
  std::fprintf(stderr, "usage: %s [layers (1..64) [hidden intermediate heads kv_heads head_dim]] (hidden, intermediate "
                       "and heads x head_dim multiples of 128, kv_heads x head_dim of 32)\n", prog);
  return false;
}

// The GEMV shapes of one Qwen2.5-7B layer (nanoqwen_format/shapes.py): name, N, K
struct Shape { const char* name; int N, K; };
inline std::vector<Shape> qwen7b_gemv_shapes() {
  return {{"7B qkv", 4608, 3584}, {"7B o", 3584, 3584}, {"7B gate", 18944, 3584}, {"7B down", 3584, 18944}};
}

// Read-only stream over n16 16-byte words (non-allocating loads, kCeilInFlight per thread issued before any use,
// tail predicated): the bandwidth ceiling the GEMV programs time their kernels against.
constexpr int kCeilThreads = 256, kCeilInFlight = 8;
__global__ void __launch_bounds__(kCeilThreads) read_ceiling(const uint4* p, size_t n16, unsigned* sink) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i < n16; i += kCeilInFlight * stride) {
    uint4 v[kCeilInFlight];
#pragma unroll
    for (int b = 0; b < kCeilInFlight; b++)
      v[b] = i + b * stride < n16 ? nq::ld_stream16(p + i + b * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int b = 0; b < kCeilInFlight; b++) acc ^= v[b].x ^ v[b].y ^ v[b].z ^ v[b].w;
  }
  if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;   // keeps the loads alive; practically never stores
}

}  // namespace dev
