// INT4 (layout 1) x f16 prefill GEMM on Hopper wgmma (sm_90a), a standalone dev program: correctness against a
// float64 CPU reference over the Qwen2.5-7B shapes and M in {7, 64, 512, 513, 2048}, and timing of the builds
// against each other, the library's gemm_int4_mma (mma.sync) and the product path (gemm.cu's gemm_multi).
//   make -C csrc/dev ../../build/dev/gemm_int4_wgmma && build/dev/gemm_int4_wgmma --list
//   build/dev/gemm_int4_wgmma --case smoke:tma_n256w2     # one case per process: a fault in one leaves the others
//
// Two kernels, one contract (gemm_int4_mma's: C[M, N] (+)= A[M, K] @ W[N, K]^T (+ bias[N]), f32 C, segments):
// * the library's gemm_int4_wgmma (csrc/src/gemm_wgmma.cuh: TMA producer warpgroup, mbarriers, 2-3 consumer
//   warpgroups; its header holds the design) in the three builds gemm.cu chooses from (tma_*), and
// * gemm_int4_wgmma_cpasync below, the first version: every thread issues cp.async for the stage (activations
//   written 128-byte swizzled by hand, the layout TMA writes), one __syncthreads per stage, the same dequantisation
//   and wgmma (register A operand, the register-A rule of gemm_wgmma.cuh), MT m64 tiles per warpgroup and the
//   library's serial split-K. It lost to the TMA kernel on every shape (bench/NOTES.md) and stays as the reference
//   point of that comparison.
// check_wgmma_sass.py checks the register-A rule on this program's and the library's SASS.
#include "gemm_dev.cuh"
#include "gemm_wgmma.cuh"
#include "gemm.cu"  // the product entry point gemm_multi (gemm.cu picks the kernel)
#include "wgmma_rs.cuh"
#include <cstring>
#include <string>

namespace wg {

constexpr int KB = nq::WG_KB;  // k per stage: one 128-byte (swizzle-atom) row of f16 per token
// dev-program knobs of the launchers: a forced split-K count (0 = the library's chooser) for the split sweep, and
// the split count of the last launch, printed by the timing
int g_force_splits = 0, g_last_splits = 1;

template <int TN, int WGS, int MT, int STAGES>
struct Cfg {
  static constexpr int kThreads = 128 * WGS;
  static constexpr int kRows = 64 * MT * WGS;        // W rows per block (MT m64 tiles per warpgroup)
  static constexpr int kActBytes = TN * KB * 2;      // TN token rows x 128 B, 128-byte swizzle
  static constexpr int kWBytes = kRows * KB / 2;     // raw int4 words: 32 B per W row
  static constexpr int kStageBytes = kActBytes + kWBytes;
  static constexpr int kSmem = STAGES * kStageBytes + 1024;  // + slack to align the ring to 1024 B
  static_assert(kActBytes % 1024 == 0 && kWBytes % 1024 == 0, "stages must stay 1024-byte aligned");
  static_assert((TN * 8) % kThreads == 0, "activation chunks must split evenly over the threads");
  static_assert(STAGES >= 3, "the loop waits for stage kt+1 with STAGES-3 groups in flight");
  static_assert((kRows * 2) % kThreads == 0, "W halves must split evenly over the threads");
  static constexpr int kActPer = TN * 8 / kThreads;   // 16-byte activation chunks per thread per stage
  static constexpr int kWPer = kRows * 2 / kThreads;  // 16-byte W halves per thread per stage
};

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// keeps the compiler from moving reads of an accumulator across the wgmma wait (the asm outputs look final to it)
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// The register-A rule (gemm_wgmma.cuh) holds here too: the next stage is dequantised after wgmma.wait_group 0.
// f16 pair of the nibble pair in the low bits of each half of an already shifted word, times (s, s)
__device__ __forceinline__ uint32_t dq(uint32_t w_shifted, uint32_t s2) {
  return nq::dq_pair(w_shifted, 0, nq::u32_as_h2(s2));
}

template <int TN, int WGS, int MT, int STAGES>
__global__ void __launch_bounds__(128 * WGS, 1)
    gemm_int4_wgmma_cpasync(const nq::GemmGroup g, const __half* A, int lda, int M, int ldc, int add, int* sem) {
  using C_ = Cfg<TN, WGS, MT, STAGES>;
  extern __shared__ __align__(128) unsigned char wsm_raw[];
  const uint32_t raw_u32 = nq::smem_u32(wsm_raw);
  const uint32_t sbase = (raw_u32 + 1023u) & ~1023u;
  unsigned char* const wsm = wsm_raw + (sbase - raw_u32);

  const int by = blockIdx.y;  // W-row tile over all segments; blockIdx.x = token tile (fastest: W read ~once)
  const int seg = (g.n > 2 && by >= g.tiles0 + g.tiles1) ? 2 : (g.n > 1 && by >= g.tiles0) ? 1 : 0;
  const nq::LinW W = seg == 2 ? g.s[2].W : seg == 1 ? g.s[1].W : g.s[0].W;
  const int n0 = (by - (seg == 2 ? g.tiles0 + g.tiles1 : seg == 1 ? g.tiles0 : 0)) * C_::kRows;
  const int m0 = blockIdx.x * TN;
  const int tid = threadIdx.x;
  const int KTall = W.K / KB, z = blockIdx.z, nz = gridDim.z;
  const int kt0 = (int)((long long)KTall * z / nz), KT = (int)((long long)KTall * (z + 1) / nz) - kt0;

  // producer roles (every thread): activation chunks idx = tid + i * kThreads = (row a_r + i * kThreads / 8,
  // chunk a_c): the row's swizzle (row & 7) is the same for every i since kThreads / 8 is a multiple of 8; W halves
  // idx = tid + i * kThreads = (row idx / 2, half idx & 1)
  const int a_r = tid >> 3, a_c = tid & 7;
  constexpr int kARowStep = C_::kThreads / 8;
  const uint32_t a_dst = a_r * 128 + ((a_c ^ (a_r & 7)) << 4);
  const __half* a_src = A + (size_t)(m0 + a_r) * lda + a_c * 8;
  const int a_rows_ok = M - m0 - a_r;  // chunk i is real iff i * kARowStep < a_rows_ok
  const int w_half = tid & 1, w_row = tid >> 1;
  constexpr int kWRowStep = C_::kThreads / 2;
  const unsigned char* w_src = W.w + (size_t)(n0 + w_row) * (W.K / 2) + w_half * 16;
  const int w_rows_ok = W.N - n0 - w_row;
  const uint32_t w_dst = C_::kActBytes + w_row * 32 + w_half * 16;
  auto issue = [&](int stage_idx, int k0) {
    const uint32_t buf = sbase + stage_idx * C_::kStageBytes;
#pragma unroll
    for (int i = 0; i < C_::kActPer; i++) {
      const bool ok = i * kARowStep < a_rows_ok;  // rows >= M: 16 zero bytes, nothing read
      nq::cp_async16(buf + a_dst + i * kARowStep * 128, ok ? a_src + (size_t)i * kARowStep * lda + k0 : A,
                     ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < C_::kWPer; i++) {
      const bool ok = i * kWRowStep < w_rows_ok;
      nq::cp_async16(buf + w_dst + i * kWRowStep * 32,
                     ok ? (const void*)(w_src + (size_t)i * kWRowStep * (W.K / 2) + k0 / 2) : (const void*)W.w,
                     ok ? 16 : 0);
    }
  };

  // consumer roles: warpgroup wg owns block rows wg*64*MT .. +64*MT-1, m64 tile mt rows + 64 mt; in each, this
  // thread holds rows r0 and r0 + 8 (r0 = 16 wq + gid)
  const int lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3, gid = lane >> 2, tig = lane & 3;
  const int r0 = wg * 64 * MT + wq * 16 + gid;
  const int sh = 4 * tig;
  const int groups = W.K / W.group, gshift = __ffs(W.group) - 1;  // groups are powers of two (format rule)
  // scale rows of r0 + 64 mt + 8 h; rows beyond N read row 0's (their outputs are never stored)
  const __half* srow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int n = n0 + r0 + 64 * mt + 8 * h;
      srow[mt][h] = W.scales + (size_t)(n < W.N ? n : 0) * groups;
    }
  // (s, s) pairs of rows r0 + 64 mt + 8 h for the two 32-k halves q of the stage at k0
  auto load_scales = [&](int k0, uint32_t (&s)[MT][2][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int q = 0; q < 2; q++) {
          const unsigned short b = __half_as_ushort(__ldg(srow[mt][h] + ((k0 + 32 * q) >> gshift)));
          s[mt][h][q] = (uint32_t)b | ((uint32_t)b << 16);
        }
  };
  auto dequant = [&](int stage_idx, const uint32_t (&s)[MT][2][2], uint32_t (&fa)[MT][4][4]) {
    const unsigned char* wp = wsm + stage_idx * C_::kStageBytes + C_::kActBytes;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      const int ra = r0 + 64 * mt;
      const uint4 x0 = *reinterpret_cast<const uint4*>(wp + ra * 32);
      const uint4 y0 = *reinterpret_cast<const uint4*>(wp + ra * 32 + 16);
      const uint4 x1 = *reinterpret_cast<const uint4*>(wp + (ra + 8) * 32);
      const uint4 y1 = *reinterpret_cast<const uint4*>(wp + (ra + 8) * 32 + 16);
      const uint32_t w0[8] = {x0.x, x0.y, x0.z, x0.w, y0.x, y0.y, y0.z, y0.w};
      const uint32_t w1[8] = {x1.x, x1.y, x1.z, x1.w, y1.x, y1.y, y1.z, y1.w};
#pragma unroll
      for (int t = 0; t < 4; t++) {
        fa[mt][t][0] = dq(w0[2 * t] >> sh, s[mt][0][t >> 1]);
        fa[mt][t][1] = dq(w1[2 * t] >> sh, s[mt][1][t >> 1]);
        fa[mt][t][2] = dq(w0[2 * t + 1] >> sh, s[mt][0][t >> 1]);
        fa[mt][t][3] = dq(w1[2 * t + 1] >> sh, s[mt][1][t >> 1]);
      }
    }
  };

  float acc[MT][TN / 2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int i = 0; i < TN / 2; i++) acc[mt][i] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < KT) issue(s, (kt0 + s) * KB);
    nq::cp_async_commit();
  }
  uint32_t fa[MT][4][4], sc[MT][2][2];
  load_scales(kt0 * KB, sc);
  nq::cp_async_wait<STAGES - 2>();
  fence_proxy_async();
  __syncthreads();
  dequant(0, sc, fa);
  if (KT > 1) load_scales((kt0 + 1) * KB, sc);

  int rd = 0;  // ring index of stage kt
  for (int kt = 0; kt < KT; kt++) {
    const uint32_t act = sbase + rd * C_::kStageBytes;
    wg_fence();
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
      for (int mt = 0; mt < MT; mt++) wgmma::mma_rs<TN>(acc[mt], fa[mt][t], nq::wg_desc_sw128(act + 32 * t));
    wg_commit();
    const bool more = kt + 1 < KT;
    if (more) {
      nq::cp_async_wait<STAGES - 3>();  // stage kt+1 landed (this thread's copies)
      fence_proxy_async();
    }
    __syncthreads();  // stage kt+1 visible to all; every warpgroup finished the wgmmas of stage kt-1
    {
      const int st = kt + STAGES - 1;  // into the buffer of stage kt-1
      if (st < KT) issue((rd + STAGES - 1) % STAGES, (kt0 + st) * KB);
      nq::cp_async_commit();
    }
    rd = rd + 1 == STAGES ? 0 : rd + 1;
    wg_wait0();  // before the fragments are rewritten (see the rule above)
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int i = 0; i < TN / 2; i++) reg_fence(acc[mt][i]);
    if (more) {
      dequant(rd, sc, fa);
      if (kt + 2 < KT) load_scales((kt0 + kt + 2) * KB, sc);
    }
  }
  nq::cp_async_wait<0>();

  // epilogue: acc[mt][4j + 2h + e] = (block row r0 + 64 mt + 8h, token 8j + 2tig + e); serial split-K as
  // gemm_int4_mma
  float* const C = seg == 2 ? g.s[2].C : seg == 1 ? g.s[1].C : g.s[0].C;
  const float* const bias = seg == 2 ? g.s[2].bias : seg == 1 ? g.s[1].bias : g.s[0].bias;
  int* const tile_sem = sem ? sem + (blockIdx.y * gridDim.x + blockIdx.x) : nullptr;
  if (tile_sem && z > 0) {
    if (tid == 0) nq::split_wait_turn(tile_sem, z);
    __syncthreads();
  }
  const bool first = z == 0, accumulate = add || !first;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int n = n0 + r0 + 64 * mt + 8 * h;
      if (n >= W.N) continue;
      const float bn = (bias && first) ? bias[n] : 0.f;
#pragma unroll
      for (int j = 0; j < TN / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int m = m0 + 8 * j + 2 * tig + e;
          if (m >= M) continue;
          float* dst = C + (size_t)m * ldc + n;
          float v = acc[mt][4 * j + 2 * h + e] + bn;
          if (accumulate) v += __ldcg(dst);
          __stcg(dst, v);
        }
    }
  if (tile_sem && z + 1 < nz) {
    __threadfence();
    __syncthreads();
    if (tid == 0) nq::split_hand_over(tile_sem, z + 1);
  }
}

// Launch as gemm.cu launches gemm_int4_mma: `tiles` = W-row tiles of kRows over all segments; split-K by the
// library's chooser (blocks per SM from the occupancy calculator) when allow_split.
template <int TN, int WGS, int MT, int STAGES>
int launch_wgmma(const nq::GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add,
                 bool allow_split, cudaStream_t st) {
  using C_ = Cfg<TN, WGS, MT, STAGES>;
  auto kern = gemm_int4_wgmma_cpasync<TN, WGS, MT, STAGES>;
  static int per_sm = 0;
  if (!per_sm) {
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C_::kSmem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, C_::kThreads, C_::kSmem) != cudaSuccess ||
        per_sm < 1)
      return nq::fail(NQ_E_UNSUPPORTED, "wgmma: cannot fit TN=%d WGS=%d MT=%d STAGES=%d", TN, WGS, MT, STAGES);
  }
  const int mtiles = (M + TN - 1) / TN;
  int splits = allow_split ? nq::choose_splits(mtiles * tiles, g.s[0].W.K / KB, per_sm) : 1;
  if (g_force_splits > 0) splits = std::min(g_force_splits, g.s[0].W.K / KB);
  g_last_splits = splits;
  int* sem = nullptr;
  if (splits > 1) {
    const size_t bytes = (size_t)mtiles * tiles * sizeof(int);
    if (cudaMallocAsync(reinterpret_cast<void**>(&sem), bytes, st) != cudaSuccess) {
      (void)cudaGetLastError();
      sem = nullptr;
      splits = 1;
    } else if (cudaMemsetAsync(sem, 0, bytes, st) != cudaSuccess) {
      return nq::fail(NQ_E_CUDA, "wgmma: memset");
    }
  }
  dim3 grid(mtiles, tiles, splits);
  kern<<<grid, C_::kThreads, C_::kSmem, st>>>(g, A, lda, M, ldc, add ? 1 : 0, sem);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return nq::fail(NQ_E_CUDA, "wgmma launch: %s", cudaGetErrorString(e));
  if (sem) cudaFreeAsync(sem, st);
  return NQ_OK;
}

// ------------------------------------------------------------------------------------------------------ harness
using Launch = int (*)(const nq::GemmGroup&, int, const __half*, int, int, int, bool, bool, cudaStream_t);
struct Kernel {
  const char* name;
  int rows;  // W rows per block (the GemmGroup tile)
  int tn;    // tokens per block
  Launch launch;
};
int launch_library(const nq::GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add,
                   bool allow_split, cudaStream_t st) {
  g_last_splits = allow_split ? nq::choose_splits(((M + nq::MM_BM - 1) / nq::MM_BM) * tiles, g.s[0].W.K / nq::MM_BK, 2)
                              : 1;
  return nq::launch_int4_mma<3, 2>(g, tiles, A, lda, M, ldc, add, allow_split, st);  // gemm.cu's mma.sync build
}
// the library's gemm_int4_wgmma builds (gemm_wgmma.cuh): the prefill builds (TN >= 128) unsplit, the few-token
// builds split as gemm.cu splits them (or g_force_splits). The prefill builds never split: their kernel reads the whole
// of K whatever the grid (gemm_wgmma.cuh), so a forced split count does not apply to them.
template <int TN, int WGS, int STAGES, int KSUB = 1>
int launch_lib_wgmma(const nq::GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add,
                     bool allow_split, cudaStream_t st) {
  int splits = 1;
  if (TN < 128 && allow_split)
    splits = nq::choose_splits((long long)((M + TN - 1) / TN) * tiles, g.s[0].W.K / KB, 1, nq::kSmallMaxSplits,
                               nq::kSmallMinStages, /*fill_rounds=*/true);
  if (TN < 128 && g_force_splits > 0) splits = std::min(g_force_splits, g.s[0].W.K / KB);
  g_last_splits = splits;
  return nq::launch_int4_wgmma<TN, WGS, STAGES, KSUB>(g, tiles, A, lda, M, ldc, add, splits, st);
}
// the product path: nq::gemm_multi (gemm.cu), which picks the kernel and the block shape itself
int launch_product(const nq::GemmGroup& g, int, const __half* A, int lda, int M, int ldc, bool add, bool,
                   cudaStream_t st) {
  nq::LinW W[3];
  float* C[3];
  const float* B[3];
  for (int i = 0; i < g.n; i++) W[i] = g.s[i].W, C[i] = g.s[i].C, B[i] = g.s[i].bias;
  g_last_splits = 0;
  return nq::gemm_multi(W, C, B, g.n, A, lda, M, ldc, add, st);
}
// ordered from the smallest (safest) instantiation to the largest; name = n<tokens per block>w<warpgroups>[m<m64
// tiles per warpgroup>]; the cp.async builds (this file) first, then the library's TMA builds
const Kernel kKernels[] = {
    {"n64w1", 64, 64, launch_wgmma<64, 1, 1, 4>},
    {"n128w2", 128, 128, launch_wgmma<128, 2, 1, 4>},
    {"n256w2", 128, 256, launch_wgmma<256, 2, 1, 4>},
    {"n128w2m2", 256, 128, launch_wgmma<128, 2, 2, 4>},
    {"tma_n128w2", 128, 128, launch_lib_wgmma<128, 2, 5>},
    {"tma_n256w2", 128, 256, launch_lib_wgmma<256, 2, 4>},
    {"tma_n128w3", 192, 128, launch_lib_wgmma<128, 3, 5>},
    // few-token builds (batched decode): s<stages>, k<64-k sub-tiles per stage>; split-K reduced by each tile's last
    // split
    {"tma_n16w3s8", 192, 16, launch_lib_wgmma<16, 3, 8>},
    {"tma_n32w3s8", 192, 32, launch_lib_wgmma<32, 3, 8>},
    {"tma_n16w3s4k4", 192, 16, launch_lib_wgmma<16, 3, 4, 4>},
    {"tma_n32w3s6k2", 192, 32, launch_lib_wgmma<32, 3, 6, 2>},
    {"tma_n32w3s4k4", 192, 32, launch_lib_wgmma<32, 3, 4, 4>},
    {"tma_n64w3s6k2", 192, 64, launch_lib_wgmma<64, 3, 6, 2>},
    // 4 consumer warpgroups (256 W rows a block, 104 registers a consumer thread): 4 warps per scheduler where the
    // library's builds have 3, to hide more of each warpgroup's dequantise -> wgmma -> wait chain
    {"tma_n16w4s6k2", 256, 16, launch_lib_wgmma<16, 4, 6, 2>},
    {"tma_n32w4s6k2", 256, 32, launch_lib_wgmma<32, 4, 6, 2>},
    {"tma_n64w4s8k1", 256, 64, launch_lib_wgmma<64, 4, 8, 1>},
    {"library", nq::MM_BN, nq::MM_BM, launch_library},
    {"product", 128, 0, launch_product},
};
const Kernel* find_kernel(const std::string& name) {
  for (const Kernel& k : kKernels)
    if (name == k.name) return &k;
  return nullptr;
}

// Element tolerance of the sampled check, besides dev::kTolGemmF16 on the relative Frobenius error: |got - ref| <=
// kTolElem * rms(ref samples). The f16 dequantisation (2^-12 relative per weight) and the f32 accumulation over K
// <= 18944 leave ~3e-4 rms relative error; 1e-2 of the rms flags a single wrong output (a wrong k slot or token
// typically errs by ~1 rms) without tripping on rounding.
constexpr double kTolElem = 1e-2;

struct Problem {
  dev::Int4Weight W;
  std::vector<float> A;   // f16-rounded activations, M x K
  std::vector<float> bias;
};

struct CaseResult {
  bool ok = true;
  std::string why;
};

// Runs one GEMM of kernel k on (W, A[M x K]) and checks it: the whole C for unwritten values (poisoned NaN), then
// every token row at 4 random n plus 4096 random (m, n) against the float64 reference. With add: C starts from a
// random C0 and must equal C0 + A W^T (+ bias).
CaseResult run_check(const Kernel& k, const dev::Int4Weight& W, const std::vector<float>& A, int M, bool use_bias,
                     bool add, bool allow_split, const char* label) {
  const int N = W.N, K = W.K;
  std::vector<__half> Ah((size_t)M * K);
  for (size_t i = 0; i < Ah.size(); i++) Ah[i] = __float2half_rn(A[i]);
  std::vector<float> bias;
  if (use_bias) bias = dev::random_vector(N, 99u + N, 0.5f);
  std::vector<float> C0;
  if (add) C0 = dev::random_vector((size_t)M * N, 77u + M, 1.f);
  uint8_t* dW = nullptr;
  __half* dA = nullptr;
  float *dC = nullptr, *dB = nullptr;
  CaseResult res;
  auto cuda_fail = [&](const char* what, cudaError_t e) {
    res.ok = false;
    res.why = std::string(what) + ": " + cudaGetErrorString(e);
  };
  cudaError_t e;
  if ((e = cudaMalloc(&dW, W.file_bytes.size())) != cudaSuccess) { cuda_fail("malloc", e); return res; }
  cudaMalloc(&dA, Ah.size() * 2);
  cudaMalloc(&dC, (size_t)M * N * 4);
  if (use_bias) cudaMalloc(&dB, (size_t)N * 4);
  cudaMemcpy(dW, W.file_bytes.data(), W.file_bytes.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dA, Ah.data(), Ah.size() * 2, cudaMemcpyHostToDevice);
  if (use_bias) cudaMemcpy(dB, bias.data(), (size_t)N * 4, cudaMemcpyHostToDevice);
  if (add) cudaMemcpy(dC, C0.data(), (size_t)M * N * 4, cudaMemcpyHostToDevice);
  else cudaMemset(dC, 0xff, (size_t)M * N * 4);  // poison: NaN
  nq::LinW L;
  L.w = dW;
  L.scales = reinterpret_cast<const __half*>(dW + W.scales_offset());
  L.N = N; L.K = K; L.group = W.group; L.type = nq::WT_INT4;
  nq::GemmGroup g = dev::single(L, dC, k.rows);
  g.s[0].bias = dB;
  const int rc = k.launch(g, g.tiles0, dA, K, M, N, add, allow_split, 0);
  e = cudaDeviceSynchronize();
  if (rc != NQ_OK) { res.ok = false; res.why = std::string("launch: ") + nq::last_error(); }
  else if (e != cudaSuccess) cuda_fail("kernel", e);
  std::vector<float> C((size_t)M * N);
  if (res.ok) {
    e = cudaMemcpy(C.data(), dC, C.size() * 4, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) cuda_fail("copy back", e);
  }
  cudaFree(dW); cudaFree(dA); cudaFree(dC); cudaFree(dB);
  if (res.ok) {
    size_t bad = C.size();
    for (size_t i = 0; i < C.size(); i++)
      if (!std::isfinite(C[i])) { bad = i; break; }
    if (bad < C.size()) {
      char b[160];
      std::snprintf(b, sizeof b, "first non-finite output at m=%zu n=%zu (unwritten: poison)", bad / N, bad % N);
      res.ok = false;
      res.why = b;
    }
  }
  double num = 0, den = 0, max_err = 0;
  int max_m = -1, max_n = -1, first_m = -1, first_n = -1;
  long samples = 0;
  if (res.ok) {
    std::mt19937 rng(5);
    std::vector<std::pair<int, int>> pts;
    for (int m = 0; m < M; m++)
      for (int r = 0; r < 4; r++) pts.push_back({m, (int)(rng() % N)});
    for (int s = 0; s < 4096; s++) pts.push_back({(int)(rng() % M), (int)(rng() % N)});
    pts.push_back({M - 1, N - 1});
    std::vector<double> ref(pts.size());
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)pts.size(); i++) {
      const int m = pts[i].first, n = pts[i].second;
      double a = 0.0;
      const float* ar = &A[(size_t)m * K];
      const float* wr = &W.w[(size_t)n * K];
      for (int kk = 0; kk < K; kk++) a += (double)ar[kk] * wr[kk];
      if (use_bias) a += bias[n];
      if (add) a += C0[(size_t)m * N + n];
      ref[i] = a;
    }
    for (size_t i = 0; i < pts.size(); i++) den += ref[i] * ref[i];
    const double rms = std::sqrt(den / pts.size());
    for (size_t i = 0; i < pts.size(); i++) {
      const int m = pts[i].first, n = pts[i].second;
      const double d = (double)C[(size_t)m * N + n] - ref[i];
      num += d * d;
      if (std::fabs(d) > max_err) max_err = std::fabs(d), max_m = m, max_n = n;
      if (first_m < 0 && std::fabs(d) > kTolElem * rms) first_m = m, first_n = n;
    }
    samples = (long)pts.size();
    const double rel = std::sqrt(num / std::max(den, 1e-300));
    char b[256];
    std::snprintf(b, sizeof b, "rel %.2e (tol %.0e), max |err| %.2e at m=%d n=%d (rms %.2e), %ld samples", rel,
                  dev::kTolGemmF16, max_err, max_m, max_n, rms, samples);
    res.why = b;
    if (!(rel < dev::kTolGemmF16) || first_m >= 0) {
      res.ok = false;
      if (first_m >= 0) {
        std::snprintf(b, sizeof b, "; first sample beyond %.0e x rms at m=%d n=%d", kTolElem, first_m, first_n);
        res.why += b;
      }
    }
  }
  std::printf("  %-7s %-28s M=%5d N=%5d K=%5d g%-3d%s%s%s: %s  %s\n", k.name, label, M, N, K, W.group,
              use_bias ? " bias" : "", add ? " add" : "", allow_split ? " split" : "", res.ok ? "PASS" : "FAIL",
              res.why.c_str());
  std::fflush(stdout);
  return res;
}

int g_pass = 0, g_fail = 0;
void tally(const CaseResult& r) { (r.ok ? g_pass : g_fail)++; }
std::vector<float> acts(int M, int K) { return dev::round_f16(dev::random_vector((size_t)M * K, 7u + K + 31u * M, 1.f)); }

// smoke: one block, then a few blocks and k tiles, then tails of M and N, the groups, bias/add and split-K
void case_smoke(const Kernel& k) {
  struct S { int M, N, K, group; bool bias, add, split; const char* what; };
  const S ss[] = {
      {64, 64, 128, 128, false, false, false, "one tile, 2 k stages"},
      {64, 128, 128, 128, false, false, false, "one block"},
      {64, 256, 1024, 128, false, false, false, "16 k stages"},
      {256, 512, 512, 128, false, false, false, "several blocks"},
      {7, 256, 512, 128, false, false, false, "M tail 7"},
      {70, 200, 256, 64, false, false, false, "N tail 200, M 70"},
      {128, 256, 512, 32, false, false, false, "group 32"},
      {128, 256, 512, 64, false, false, false, "group 64"},
      {128, 256, 1024, 256, false, false, false, "group 256"},
      {96, 256, 512, 128, true, true, false, "bias + add"},
      {64, 128, 4096, 128, true, false, true, "split-K (64 k tiles)"},
      {64, 128, 4096, 128, true, true, true, "split-K + bias + add"},
  };
  for (const S& s : ss) {
    const dev::Int4Weight W = dev::random_int4(s.N, s.K, s.group, 4321u + s.N + s.K);
    tally(run_check(k, W, acts(s.M, s.K), s.M, s.bias, s.add, s.split, s.what));
  }
}

struct Shape7B { const char* name; int N, K; };
const Shape7B kShapes[] = {{"qkv", 4608, 3584}, {"o", 3584, 3584}, {"gate/up", 18944, 3584}, {"down", 3584, 18944}};

// every 7B shape at M in {7, 64, 512, 513, 2048}, split-K allowed as the library allows it
void case_shapes(const Kernel& k, const std::vector<int>& Ms) {
  for (const Shape7B& sh : kShapes) {
    const dev::Int4Weight W = dev::random_int4(sh.N, sh.K, 128, 4321u + sh.N + sh.K);
    for (int M : Ms) tally(run_check(k, W, acts(M, sh.K), M, false, false, true, sh.name));
  }
}

// timing: every kernel on the 7B shapes at M = 512 and 2048 (weights rotated over > 256 MB), split-K allowed; the
// per-layer sum is qkv + o + gate+up (one 37888-row weight: the same tiles as gemm_multi's two segments) + down.
// Each entry is a kernel and a forced split count (0: the chooser's).
struct TimeEntry {
  const Kernel* k;
  int splits;
};
void case_time(const std::vector<TimeEntry>& ks, const std::vector<int>& Ms) {
  const Shape7B shapes[] = {{"qkv", 4608, 3584}, {"o", 3584, 3584}, {"gate+up", 37888, 3584}, {"down", 3584, 18944}};
  std::vector<dev::Int4Weight> Ws;  // generated once for every M (the 37888-row weight takes seconds)
  for (const Shape7B& sh : shapes) Ws.push_back(dev::random_int4(sh.N, sh.K, 128, 1234u + sh.N));
  for (int M : Ms) {
    std::printf("timing M = %d (us, TFLOP/s; median of 11 x 20 launches)\n", M);
    std::vector<double> layer(ks.size(), 0.0);
    for (size_t si = 0; si < 4; si++) {
      const Shape7B& sh = shapes[si];
      const dev::Int4Weight& W = Ws[si];
      const std::vector<float> Af = acts(M, sh.K);
      std::vector<__half> Ah(Af.size());
      for (size_t i = 0; i < Af.size(); i++) Ah[i] = __float2half_rn(Af[i]);
      dev::DeviceCopies wc(W.file_bytes);
      __half* dA = nullptr;
      float* dC = nullptr;
      DEV_CHECK(cudaMalloc(&dA, Ah.size() * 2));
      DEV_CHECK(cudaMalloc(&dC, (size_t)M * sh.N * 4));
      DEV_CHECK(cudaMemcpy(dA, Ah.data(), Ah.size() * 2, cudaMemcpyHostToDevice));
      std::printf("  %-8s N=%5d K=%5d:", sh.name, sh.N, sh.K);
      for (size_t ki = 0; ki < ks.size(); ki++) {
        const Kernel& k = *ks[ki].k;
        g_force_splits = ks[ki].splits;
        auto lin = [&](int c) {
          nq::LinW L;
          L.w = wc.copy(c);
          L.scales = reinterpret_cast<const __half*>(wc.copy(c) + W.scales_offset());
          L.N = sh.N; L.K = sh.K; L.group = 128; L.type = nq::WT_INT4;
          return L;
        };
        auto go = [&](int i) {
          const nq::GemmGroup g = dev::single(lin(i), dC, k.rows);
          dev::must(k.launch(g, g.tiles0, dA, sh.K, M, sh.N, false, true, 0));
        };
        const double us = dev::median_us(go, 20);
        layer[ki] += us;
        g_force_splits = 0;
        std::printf("  %s %7.1f (%3.0f s%d)", k.name, us, 2.0 * M * sh.N * sh.K / (us * 1e-6) / 1e12, g_last_splits);
        std::fflush(stdout);
      }
      std::printf("\n");
      cudaFree(dA);
      cudaFree(dC);
    }
    const double flop = 2.0 * M * 3584.0 * (4608 + 3584 + 37888) + 2.0 * M * 18944.0 * 3584;
    std::printf("  per layer:");
    for (size_t ki = 0; ki < ks.size(); ki++)
      std::printf("  %s%s %7.1f us (%3.0f TFLOP/s, x28 = %.2f ms)", ks[ki].k->name,
                  ks[ki].splits ? ("/s" + std::to_string(ks[ki].splits)).c_str() : "", layer[ki],
                  flop / (layer[ki] * 1e-6) / 1e12, 28 * layer[ki] / 1e3);
    std::printf("\n");
  }
}

// the f16 lm_head (151936 x 3584, 1.09 GB) through the product gemm at the few-token M of a batched decode step
void time_lm_head(const std::vector<int>& Ms) {
  const int N = 151936, K = 3584;
  unsigned char* dW = nullptr;
  DEV_CHECK(cudaMalloc(&dW, (size_t)N * K * 2));
  DEV_CHECK(cudaMemset(dW, 0x2c, (size_t)N * K * 2));  // f16 0x2c2c ~ 0.065: finite, timing only
  for (int M : Ms) {
    __half* dA = nullptr;
    float* dC = nullptr;
    DEV_CHECK(cudaMalloc(&dA, (size_t)M * K * 2));
    DEV_CHECK(cudaMemset(dA, 0x2c, (size_t)M * K * 2));
    DEV_CHECK(cudaMalloc(&dC, (size_t)M * N * 4));
    nq::LinW L;
    L.w = dW;
    L.scales = nullptr;
    L.N = N; L.K = K; L.group = 0; L.type = nq::WT_F16;
    auto go = [&](int) { dev::must(nq::gemm(L, dA, K, M, dC, N, nullptr, false, 0)); };
    const double us = dev::median_us(go, 5);
    std::printf("  f16 lm_head M=%3d: %8.1f us (%.2f TB/s of weights)\n", M, us, (double)N * K * 2 / (us * 1e-6) / 1e12);
    cudaFree(dA);
    cudaFree(dC);
  }
  cudaFree(dW);
}

}  // namespace wg

int main(int argc, char** argv) {
  std::string c = argc > 2 && std::strcmp(argv[1], "--case") == 0 ? argv[2] : "";
  if (c.empty()) {
    std::printf("usage: gemm_int4_wgmma --case CASE\n  smoke:K   small shapes, tails, groups, bias/add, split-K\n"
                "  shapes:K  the 7B shapes at M in {7, 64, 512, 513, 2048}\n  time:K1,K2,...  7B shapes at M 512 "
                "and 2048\n  timesmall:K1,...  the same at M in {1, 8, 32, 64, 128, 256}\n  timebatch:K1,...  the same at M in {5, 8, 16, "
                "32, 64} (batched decode), then the f16 lm_head there\n  splits:K  split-K sweep at M "
                "= 512\n kernels K:");
    for (const wg::Kernel& k : wg::kKernels) std::printf(" %s", k.name);
    std::printf("\n");
    return argc > 1 && std::strcmp(argv[1], "--list") == 0 ? 0 : 2;
  }
  cudaDeviceProp prop;
  DEV_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("== case %s on %s\n", c.c_str(), prop.name);
  const size_t colon = c.find(':');
  const std::string what = c.substr(0, colon), arg = colon == std::string::npos ? "" : c.substr(colon + 1);
  if (what == "splits") {  // split-K sweep of one kernel at M = 512
    const wg::Kernel* k = wg::find_kernel(arg);
    if (!k) { std::printf("unknown kernel '%s'\n", arg.c_str()); return 2; }
    std::vector<wg::TimeEntry> es;
    for (int sp : {0, 1, 2, 3, 4, 6, 8}) es.push_back({k, sp});
    wg::case_time(es, {512});
    return 0;
  }
  if (what == "time" || what == "timesmall" || what == "timebatch") {
    std::vector<wg::TimeEntry> ks;
    size_t p = 0;
    while (p <= arg.size()) {
      const size_t q = arg.find(',', p);
      const std::string name = arg.substr(p, q == std::string::npos ? std::string::npos : q - p);
      const wg::Kernel* k = wg::find_kernel(name);
      if (!k) { std::printf("unknown kernel %s\n", name.c_str()); return 2; }
      ks.push_back({k, 0});
      if (q == std::string::npos) break;
      p = q + 1;
    }
    if (what == "time") wg::case_time(ks, {512, 2048});
    else if (what == "timebatch") wg::case_time(ks, {5, 8, 16, 32, 64}), wg::time_lm_head({5, 8, 16, 32, 64});
    else wg::case_time(ks, {1, 8, 32, 64, 128, 256});
    return 0;
  }
  const wg::Kernel* k = wg::find_kernel(arg);
  if (!k) { std::printf("unknown kernel '%s'\n", arg.c_str()); return 2; }
  if (what == "smoke") wg::case_smoke(*k);
  else if (what == "shapes") wg::case_shapes(*k, {7, 64, 512, 513, 2048});
  else { std::printf("unknown case '%s'\n", what.c_str()); return 2; }
  std::printf("== %s: %d passed, %d failed\n", c.c_str(), wg::g_pass, wg::g_fail);
  return wg::g_fail ? 1 : 0;
}
