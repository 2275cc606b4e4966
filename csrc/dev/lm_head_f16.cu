// The f16 lm_head of a batched decode step (C[M][N] = A[M][K] @ W[N][K]^T, M = 1..64 token rows, W f16: 1.09 GB on
// the 7B), three ways, on the same weights:
//   product  gemm_f16_kernel (gemm_kernels.cuh): wmma over a 4-stage cp.async ring of A and W tiles in shared
//            memory; 330 us at M = 32 in the 32-stream step (CUPTI, bench/NOTES.md "Session 15" §5), ~3.3 TB/s;
//   regs     W straight from global memory into mma.m16n8k16 B fragments (no shared memory for W), A in shared
//            memory, a k-permutation shared by both so that one 16-byte load per lane is exactly its fragments;
//   ceiling  a plain read of the same bytes (dev_common.cuh read_ceiling).
//
// regs, the layout pair (as Marlin pairs its repack with its unpack; here nothing is repacked: the order is W's own).
// A 32-k chunk of W row n: lane (g, t) of the warp's n8 tile loads W[n0 + g][k0 + 8t .. k0 + 8t + 7] (16 bytes =
// halves h0..h7 = words w0..w3). mma step s (s = 0, 1) of the chunk uses b0 = w_{2s}, b1 = w_{2s+1}, i.e. it maps
// the mma's logical k (2t, 2t+1 | 2t+8, 2t+9) to physical k0 + 8t + 4s + (0, 1 | 2, 3). A takes the same map:
// a0 | a2 = A[m = g][k0 + 8t + 4s .. + 3] (one 8-byte shared load), a1 | a3 = the same for row g + 8. Any
// permutation of k applied to both operands leaves the dot products unchanged, so no data is moved.
// Block: kRegsWarps warps x NT n8 tiles (8 NT rows a warp); every A fragment read from shared memory feeds NT MMAs,
// every W fragment MT (m16 tiles of tokens). W loads run U chunks ahead in a register ring across the whole K; A is
// staged in kSlice-k slices, double-buffered (cp.async), rows past M zero.
//
//   make -C csrc/dev && build/dev/lm_head_f16 [--rows N]  (default: the 7B's 152,064 x 3,584; M = 1, 8, 16, 32, 64)
// Validation: every 97th output row against a double-precision CPU product of the same f16 values (tolerance
// kTol: f32 accumulation of 3,584 products, ~1e-6 relative; 1e-3 catches any indexing mistake, which moves an
// output by O(1) relative).
#include "dev_common.cuh"
#include "cp_async.cuh"
#include "launch.h"
#include "gemm_kernels.cuh"
#include <cstring>
#include <string>

namespace {

constexpr double kTol = 1e-3;
constexpr int kRegsWarps = 4, kRegsThreads = 32 * kRegsWarps;
constexpr int kSlice = 512;              // k per staged A slice
constexpr int kALd = kSlice + 8;         // halves per staged A row (8-byte loads of 8 rows g spread over banks)

template <int MT>
struct RegsSmem {
  __half a[2][16 * MT][kALd];            // two A slices (double buffer)
};

// C[m][n] = sum_k A[m][k] W[n][k] for m < M, n < N; K % kSlice == 0. grid: ceil(N / (8 NT kRegsWarps)).
template <int MT, int NT, int U>
__global__ void __launch_bounds__(kRegsThreads) lm_head_regs(const __half* __restrict__ W, const __half* __restrict__ A,
                                                            float* __restrict__ C, int M, int N, int K) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  RegsSmem<MT>& S = *reinterpret_cast<RegsSmem<MT>*>(smem_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int n_warp = (blockIdx.x * kRegsWarps + warp) * 8 * NT;      // the warp's first W row
  const int chunks = K / 32, slices = K / kSlice, cps = kSlice / 32;  // chunks per slice
  // the lane's W rows (clamped: rows past N load row N - 1 and are not stored)
  const __half* wrow[NT];
#pragma unroll
  for (int j = 0; j < NT; j++) wrow[j] = W + (size_t)min(n_warp + 8 * j + g, N - 1) * K + 8 * t;
  auto load_w = [&](int c, uint4 (&r)[NT]) {
#pragma unroll
    for (int j = 0; j < NT; j++) r[j] = c < chunks ? nq::ld_stream16(reinterpret_cast<const uint4*>(wrow[j] + 32 * c))
                                                   : make_uint4(0, 0, 0, 0);
  };
  auto stage_a = [&](int sl, int buf) {   // rows >= M zero-filled
    const uint32_t base = nq::smem_u32(&S.a[buf][0][0]);
    for (int i = threadIdx.x; i < 16 * MT * (kSlice / 8); i += kRegsThreads) {
      const int r = i / (kSlice / 8), c = i % (kSlice / 8);
      const bool ok = r < M;
      nq::cp_async16(base + 2u * (uint32_t)(r * kALd + 8 * c), ok ? A + (size_t)r * K + sl * kSlice + 8 * c : A,
                     ok ? 16 : 0);
    }
    nq::cp_async_commit();
  };
  uint4 ring[U][NT];
#pragma unroll
  for (int u = 0; u < U; u++) load_w(u, ring[u]);   // weights first: they do not depend on earlier kernels
  nq::pdl_wait();
  nq::pdl_trigger();
  stage_a(0, 0);
  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int j = 0; j < NT; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  for (int sl = 0; sl < slices; sl++) {
    nq::cp_async_wait<0>();
    __syncthreads();                           // slice sl staged; every warp is done with slice sl - 1's buffer
    if (sl + 1 < slices) stage_a(sl + 1, (sl + 1) & 1);
    const __half* As = &S.a[sl & 1][0][0];
    for (int cc = 0; cc < cps; cc += U) {
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int c = sl * cps + cc + u;       // the chunk in ring[u] (cps % U == 0)
        uint4 w[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) w[j] = ring[u][j];
        load_w(c + U, ring[u]);                // U chunks ahead, across slices
#pragma unroll
        for (int s = 0; s < 2; s++) {
          const int kk = 32 * (cc + u) + 8 * t + 4 * s;   // within the slice
#pragma unroll
          for (int mt = 0; mt < MT; mt++) {
            const uint2 lo = *reinterpret_cast<const uint2*>(As + (16 * mt + g) * kALd + kk);
            const uint2 hi = *reinterpret_cast<const uint2*>(As + (16 * mt + g + 8) * kALd + kk);
#pragma unroll
            for (int j = 0; j < NT; j++) {
              const uint32_t b0 = s ? w[j].z : w[j].x, b1 = s ? w[j].w : w[j].y;
              nq::mma16816(acc[mt][j], lo.x, hi.x, lo.y, hi.y, b0, b1);
            }
          }
        }
      }
    }
  }
  // c0, c1: (m = 16 mt + g, n = 8 j + 2t, +1); c2, c3: m + 8
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const int n = n_warp + 8 * j + 2 * t;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int m = 16 * mt + g + 8 * h;
        if (m >= M) continue;
        if (n + 1 < N && N % 2 == 0) {        // 8-byte aligned: n is even
          *reinterpret_cast<float2*>(C + (size_t)m * N + n) = make_float2(acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
        } else {
          if (n < N) C[(size_t)m * N + n] = acc[mt][j][2 * h];
          if (n + 1 < N) C[(size_t)m * N + n + 1] = acc[mt][j][2 * h + 1];
        }
      }
    }
}

template <int MT, int NT, int U>
void launch_regs(const __half* W, const __half* A, float* C, int M, int N, int K) {
  constexpr size_t smem = sizeof(RegsSmem<MT>);
  static bool raised = false;
  if (!raised) {
    DEV_CHECK(cudaFuncSetAttribute(lm_head_regs<MT, NT, U>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    raised = true;
  }
  const int rows = 8 * NT * kRegsWarps;
  dev::must(nq::launch_pdl("lm_head_regs", lm_head_regs<MT, NT, U>, dim3((N + rows - 1) / rows), dim3(kRegsThreads),
                           smem, (cudaStream_t)0, W, A, C, M, N, K));
}

struct Build {
  std::string name;
  int max_m;   // the largest M the build serves (16 MT)
  void (*run)(const __half*, const __half*, float*, int, int, int);
};

template <int MT, int NT, int U>
Build regs_build() {
  return {"regs mt" + std::to_string(MT) + " nt" + std::to_string(NT) + " u" + std::to_string(U), 16 * MT,
          launch_regs<MT, NT, U>};
}

void run_product(const __half* W, const __half* A, float* C, int M, int N, int K) {
  nq::LinW lw;
  lw.w = reinterpret_cast<const uint8_t*>(W); lw.N = N; lw.K = K; lw.type = nq::WT_F16;
  nq::GemmGroup g;
  g.s[0].W = lw; g.s[0].C = C; g.s[0].bias = nullptr; g.n = 1;
  const int tiles = (N + nq::BN - 1) / nq::BN;
  g.tiles0 = tiles;
  dev::must(nq::launch_gemm_f16(g, tiles, A, K, M, N, false, 0));
}

}  // namespace

int main(int argc, char** argv) {
  int N = 152064, K = 3584;
  for (int i = 1; i + 1 < argc; i++)
    if (!std::strcmp(argv[i], "--rows")) N = std::atoi(argv[i + 1]);
  std::printf("lm_head f16: N %d x K %d (%.2f GB), token rows M in 1, 8, 16, 32, 64\n", N, K, 2.0 * N * K / 1e9);
  // W: random f16 (scale 1/sqrt(K)), one copy per rotation so that every timed launch reads HBM
  std::vector<__half> wh((size_t)N * K);
  {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f / std::sqrt((float)K));
    for (auto& v : wh) v = __float2half_rn(nd(rng));
  }
  std::vector<uint8_t> wbytes(wh.size() * 2);
  std::memcpy(wbytes.data(), wh.data(), wbytes.size());
  dev::DeviceCopies wc(wbytes, 2);
  std::vector<float> ceil_us;
  {
    unsigned* sink;
    DEV_CHECK(cudaMalloc(&sink, 4096 * sizeof(unsigned)));
    const size_t n16 = wbytes.size() / 16;
    const double us = dev::median_us([&](int i) {
      dev::read_ceiling<<<1056, dev::kCeilThreads>>>(reinterpret_cast<const uint4*>(wc.copy(i)), n16, sink);
    }, 20, 7);
    std::printf("read ceiling over the same bytes: %.1f us (%.0f GB/s)\n", us, wbytes.size() / us / 1e3);
    cudaFree(sink);
  }
  const std::vector<Build> builds = {
      {"product gemm_f16_kernel", 64, run_product},
      regs_build<1, 4, 4>(), regs_build<1, 4, 8>(), regs_build<2, 4, 4>(), regs_build<2, 4, 8>(),
      regs_build<2, 2, 8>(), regs_build<2, 2, 16>(), regs_build<4, 2, 8>()};
  float* C;
  __half* Ad;
  DEV_CHECK(cudaMalloc(&C, (size_t)64 * N * sizeof(float)));
  DEV_CHECK(cudaMalloc(&Ad, (size_t)64 * K * sizeof(__half)));
  std::vector<float> got((size_t)64 * N);
  for (int M : {1, 8, 16, 32, 64}) {
    const std::vector<float> a = dev::round_f16(dev::random_vector((size_t)M * K, 11 + M));
    std::vector<__half> ah(a.size());
    for (size_t i = 0; i < a.size(); i++) ah[i] = __float2half_rn(a[i]);
    DEV_CHECK(cudaMemcpy(Ad, ah.data(), ah.size() * 2, cudaMemcpyHostToDevice));
    // reference: every 97th W row, double accumulation of the same f16 values
    std::vector<int> rows;
    for (int n = 0; n < N; n += 97) rows.push_back(n);
    rows.push_back(N - 1);
    std::vector<float> ref(rows.size() * M);
#pragma omp parallel for
    for (int ri = 0; ri < (int)rows.size(); ri++)
      for (int m = 0; m < M; m++) {
        double s = 0.0;
        const __half* wr = wh.data() + (size_t)rows[ri] * K;
        for (int k = 0; k < K; k++) s += (double)__half2float(wr[k]) * a[(size_t)m * K + k];
        ref[ri * M + m] = (float)s;
      }
    for (const Build& b : builds) {
      if (M > b.max_m) continue;
      DEV_CHECK(cudaMemset(C, 0xFF, (size_t)64 * N * sizeof(float)));   // poison: NaN
      b.run(reinterpret_cast<const __half*>(wc.copy(0)), Ad, C, M, N, K);
      DEV_CHECK(cudaDeviceSynchronize());
      DEV_CHECK(cudaMemcpy(got.data(), C, (size_t)M * N * sizeof(float), cudaMemcpyDeviceToHost));
      std::vector<float> sampled(ref.size());
      for (size_t ri = 0; ri < rows.size(); ri++)
        for (int m = 0; m < M; m++) sampled[ri * M + m] = got[(size_t)m * N + rows[ri]];
      for (size_t i = 0; i < got.size() && i < (size_t)M * N; i++)
        if (!std::isfinite(got[i])) {
          std::printf("%s M %d: FAIL, output %zu not written\n", b.name.c_str(), M, i);
          return 1;
        }
      const std::string what = b.name + " M " + std::to_string(M);
      dev::validate_result(what.c_str(), sampled.data(), ref, kTol);
      const double us = dev::median_us([&](int i) {
        b.run(reinterpret_cast<const __half*>(wc.copy(i)), Ad, C, M, N, K);
      }, 20, 7);
      std::printf("  %-28s M %2d: %8.1f us  %6.0f GB/s\n", b.name.c_str(), M, us, wbytes.size() / us / 1e3);
    }
  }
  cudaFree(C);
  cudaFree(Ad);
  return 0;
}
