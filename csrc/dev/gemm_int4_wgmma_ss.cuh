// gemm_int4_wgmma_ss: the few-token INT4 GEMM (batched decode, M = 2..64) with the dequantised weights in SHARED
// memory, so that a warpgroup dequantises sub-tile c + 1 while the tensor cores run sub-tile c. Dev experiment,
// included by gemm_int4_wgmma.cu (its harness validates and times it: kernels ss_*).
//
// Why (bench/NOTES.md, session 6 and 8): the library's few-token builds (gemm_wgmma.cuh, TN = 16..64) take the
// dequantised weights as the wgmma A operand from REGISTERS. The register-A rule (nothing may write those registers
// while an HGMMA that reads them is in flight) makes every warpgroup run dequantise -> wgmma -> wait_group 0 ->
// dequantise in series, and keeping a second fragment set alive made ptxas serialise the wgmmas (C7513). ncu on the
// 192 x 32 build: 0.49 issued instructions per scheduler-cycle, 0.8 of 3.2 warps eligible, DRAM 23 %: the warps wait
// on their own chain. Per 7B layer the few-token GEMMs take 126-146 us at 5-32 rows against ~27 us of weight reads.
//
// What changes against gemm_wgmma.cuh (the producer warpgroup, the TMA stage ring, the split-K epilogue are the same):
// * each consumer warpgroup owns two 8 KB buffers in shared memory: its 64 W rows x one 64-k sub-tile as f16, K-major,
//   128-byte swizzled (chunk c of row r at r * 128 + ((c ^ (r & 7)) << 4): the layout of the activation tiles, so the
//   same descriptor form, wg_desc_sw128, addresses both operands);
// * the dequantisation is spread without redundancy: thread t of a warpgroup converts row t / 2, 32-k half t & 1 of
//   each sub-tile (one 16-byte shared load of 4 raw words, 16 dq_pair, four 16-byte stores: a word of layout 1 holds
//   k 8j .. 8j + 7, i.e. one 16-byte chunk of the f16 row), where the register-A kernel's four threads of a quad each
//   load every word of their two rows and keep one nibble pair of it;
// * per sub-tile: dequantise into buffer c & 1, fence.proxy.async (the generic-proxy stores become visible to the
//   tensor core's async proxy), a warpgroup barrier, 4 wgmma m64nTNk16 (A and B by descriptor), commit, then
//   wait_group 1: the wgmmas of sub-tile c - 1 are done, so its buffer can be refilled at c + 1 and, at the first
//   sub-tile of a stage, the previous stage goes back to the producer. The accumulators stay in flight across the
//   dequantisation (fenced against compiler motion as the product fences them after its wait);
// * scales one stage ahead, as in the product (a load's first use must not sit in the stage's critical path).
// Numerics: the same dq_pair (f16 of s * (u - 8)), the same f32 accumulation order per k step: outputs bit-identical
// to the register-A kernel for the same split count (the harness compares both to the float64 reference).
#pragma once

namespace wgss {

constexpr int kABytes = 64 * nq::WG_KB * 2;  // one warpgroup's dequantised 64-k sub-tile: 64 rows x 128 B

// wgmma.mma_async m64nNk16, f32 += f16 x f16, A and B from shared memory by descriptor (both K-major: imm-trans 0)
template <int N> __device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void mma_ss<16>(float (&d)[8], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db));
}
template <>
__device__ __forceinline__ void mma_ss<32>(float (&d)[16], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db));
}
template <>
__device__ __forceinline__ void mma_ss<64>(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db));
}

template <int TN, int WGS, int STAGES, int KSUB>
struct SsCfg {
  using B = nq::WgCfg<TN, WGS, STAGES, KSUB>;
  // the stage ring, then WGS x 2 dequantised buffers, then the mbarriers (+ 1024 B of alignment slack)
  static constexpr int kSmem = STAGES * B::kStageBytes + WGS * 2 * kABytes + 2 * STAGES * 8 + 1024;
  static_assert(TN < 128, "few-token builds only");
  static_assert(kSmem <= 227 * 1024, "shared memory per SM");
};

template <int TN, int WGS, int STAGES, int KSUB>
__global__ void __launch_bounds__(128 * WGS + 128, 1)
    gemm_int4_wgmma_ss(const nq::GemmGroup g, const __grid_constant__ CUtensorMap tmA,
                       const __grid_constant__ CUtensorMap tmW0, const __grid_constant__ CUtensorMap tmW1,
                       const __grid_constant__ CUtensorMap tmW2, int M, int ldc, int add, int* sem, float* part) {
#if NQ_WGMMA_DEVICE
  using C_ = nq::WgCfg<TN, WGS, STAGES, KSUB>;
  extern __shared__ __align__(128) unsigned char wsm_raw[];
  const uint32_t raw_u32 = nq::smem_u32(wsm_raw);
  const uint32_t sbase = (raw_u32 + 1023u) & ~1023u;
  unsigned char* const wsm = wsm_raw + (sbase - raw_u32);
  const uint32_t abase = sbase + STAGES * C_::kStageBytes;  // 1024-aligned: stages are whole KB
  const uint32_t full0 = abase + WGS * 2 * kABytes, empty0 = full0 + STAGES * 8;

  const int by = blockIdx.y;  // W-row tile over all segments; blockIdx.x = token tile
  const int seg = (g.n > 2 && by >= g.tiles0 + g.tiles1) ? 2 : (g.n > 1 && by >= g.tiles0) ? 1 : 0;
  const nq::LinW W = seg == 2 ? g.s[2].W : seg == 1 ? g.s[1].W : g.s[0].W;
  const CUtensorMap* tmW = seg == 2 ? &tmW2 : seg == 1 ? &tmW1 : &tmW0;
  const int n0 = (by - (seg == 2 ? g.tiles0 + g.tiles1 : seg == 1 ? g.tiles0 : 0)) * C_::kRows;
  const int m0 = blockIdx.x * TN;
  const int tid = threadIdx.x;
  // split-K as the product's few-token builds: split z owns the 64-k sub-tiles [kt0, kt0 + KT) in NS stages
  const int KTall = W.K / nq::WG_KB, z = blockIdx.z, nz = gridDim.z;
  const int kt0 = (int)((long long)KTall * z / nz);
  const int KT = (int)((long long)KTall * (z + 1) / nz) - kt0;
  const int NS = (KT + KSUB - 1) / KSUB;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; s++) {
      nq::wg_mbar_init(full0 + 8 * s, 1);
      nq::wg_mbar_init(empty0 + 8 * s, C_::kConsumers / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (tid >= C_::kConsumers) {  // producer warpgroup: as gemm_wgmma.cuh
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C_::kProducerRegs));
    if (tid == C_::kConsumers) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmA)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmW)) : "memory");
      for (int ks = 0; ks < NS; ks++) {
        const int s = ks % STAGES, nsub = min(KSUB, KT - ks * KSUB);
        if (ks >= STAGES) nq::wg_mbar_wait(empty0 + 8 * s, ((ks / STAGES) - 1) & 1);
        const uint32_t buf = sbase + s * C_::kStageBytes, full = full0 + 8 * s;
        nq::wg_mbar_expect_tx(full, nsub * C_::kSubBytes);
        for (int q = 0; q < nsub; q++) {
          const int kt = kt0 + ks * KSUB + q;
          nq::wg_tma_load_2d(buf + q * C_::kSubBytes, &tmA, kt * nq::WG_KB, m0, full);
          nq::wg_tma_load_2d(buf + q * C_::kSubBytes + C_::kActBytes, tmW, kt * nq::WG_KB / 2, n0, full);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C_::kConsumerRegs));

  const int lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3, gid = lane >> 2, tig = lane & 3;
  const int t = tid & 127;
  // dequantisation: this thread converts row dr (0..63 of its warpgroup's 64), 32-k half dh of every sub-tile
  const int dr = t >> 1, dh = t & 1, drow = 64 * wg + dr;
  const int groups = W.K / W.group, gshift = __ffs(W.group) - 1;  // groups are powers of two (format rule)
  const __half* const srow = W.scales + (size_t)(n0 + drow < W.N ? n0 + drow : 0) * groups;  // beyond N: row 0's
  auto load_scale = [&](int kt) { return (uint32_t)__half_as_ushort(__ldg(srow + ((kt * nq::WG_KB + 32 * dh) >> gshift))); };
  const uint32_t abuf = abase + wg * 2 * kABytes;  // this warpgroup's two buffers
  unsigned char* const abuf_p = wsm + (abuf - sbase);

  float acc[TN / 2];
#pragma unroll
  for (int i = 0; i < TN / 2; i++) acc[i] = 0.f;
  uint32_t sc[KSUB];
#pragma unroll
  for (int q = 0; q < KSUB; q++) sc[q] = q < KT ? load_scale(kt0 + q) : 0u;
  int c = 0;  // sub-tiles issued by this warpgroup
  for (int ks = 0; ks < NS; ks++) {
    const int s = ks % STAGES, nsub = min(KSUB, KT - ks * KSUB);
    nq::wg_mbar_wait(full0 + 8 * s, (ks / STAGES) & 1);
    uint32_t scn[KSUB];  // the next stage's scales, loaded while this stage runs
#pragma unroll
    for (int q = 0; q < KSUB; q++) scn[q] = (ks + 1) * KSUB + q < KT ? load_scale(kt0 + (ks + 1) * KSUB + q) : 0u;
#pragma unroll
    for (int q = 0; q < KSUB; q++) {
      if (q >= nsub) break;
      const unsigned char* wp = wsm + s * C_::kStageBytes + q * C_::kSubBytes + C_::kActBytes;
      const uint4 x = *reinterpret_cast<const uint4*>(wp + drow * 32 + dh * 16);
      const uint32_t w4[4] = {x.x, x.y, x.z, x.w};
      const __half2 s2 = nq::u32_as_h2(sc[q] | (sc[q] << 16));
      unsigned char* const ap = abuf_p + (c & 1) * kABytes + dr * 128;
#pragma unroll
      for (int i = 0; i < 4; i++) {  // word 4 dh + i = k 8(4 dh + i) .. +7 = 16-byte chunk 4 dh + i of the row
        const uint4 o = make_uint4(nq::dq_pair(w4[i], 0, s2), nq::dq_pair(w4[i], 1, s2), nq::dq_pair(w4[i], 2, s2),
                                   nq::dq_pair(w4[i], 3, s2));
        *reinterpret_cast<uint4*>(ap + ((((4 * dh + i) ^ (dr & 7))) << 4)) = o;
      }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");  // the warpgroup's tile is complete
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      const uint32_t a_addr = abuf + (c & 1) * kABytes, b_addr = sbase + s * C_::kStageBytes + q * C_::kSubBytes;
#pragma unroll
      for (int k4 = 0; k4 < 4; k4++)
        mma_ss<TN>(acc, nq::wg_desc_sw128(a_addr + 32 * k4), nq::wg_desc_sw128(b_addr + 32 * k4));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      // sub-tile c - 1 is done: its buffer is free for c + 1; at a stage's first sub-tile the previous stage is free
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#pragma unroll
      for (int i = 0; i < TN / 2; i++) nq::wg_reg_fence(acc[i]);
      if (q == 0 && ks > 0) {
        __syncwarp();
        if (lane == 0) nq::wg_mbar_arrive(empty0 + 8 * ((ks - 1) % STAGES));
      }
      c++;
    }
#pragma unroll
    for (int q = 0; q < KSUB; q++) sc[q] = scn[q];
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < TN / 2; i++) nq::wg_reg_fence(acc[i]);

  // epilogue, as gemm_wgmma.cuh: acc[4j + 2h + e] = (block row r0 + 8h, token 8j + 2tig + e)
  const int r0 = wg * 64 + wq * 16 + gid;
  float* const C = seg == 2 ? g.s[2].C : seg == 1 ? g.s[1].C : g.s[0].C;
  const float* const bias = seg == 2 ? g.s[2].bias : seg == 1 ? g.s[1].bias : g.s[0].bias;
  if (nz > 1) {
    const size_t ntile = (size_t)gridDim.x * gridDim.y, tl = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
    auto slot = [&](int zz) {
      return reinterpret_cast<float4*>(part + (((size_t)zz * ntile + tl) * C_::kConsumers + tid) * (TN / 2));
    };
    float4* const mine = slot(z);
#pragma unroll
    for (int i = 0; i < TN / 8; i++)
      __stcg(mine + i, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
    __threadfence();
    asm volatile("bar.sync 1, %0;\n" ::"n"(C_::kConsumers) : "memory");
    __shared__ int s_last;
    if (tid == 0) {
      s_last = atomicAdd(sem + tl, 1) == nz - 1;
      if (s_last) sem[tl] = 0;
    }
    asm volatile("bar.sync 1, %0;\n" ::"n"(C_::kConsumers) : "memory");
    if (!s_last) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < TN / 2; i++) acc[i] = 0.f;
    for (int zz = 0; zz < nz; zz++) {
      const float4* const p = slot(zz);
#pragma unroll
      for (int i = 0; i < TN / 8; i++) {
        const float4 v = __ldcg(p + i);
        acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int n = n0 + r0 + 8 * h;
    if (n >= W.N) continue;
    const float bn = bias ? bias[n] : 0.f;
#pragma unroll
    for (int j = 0; j < TN / 8; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int m = m0 + 8 * j + 2 * tig + e;
        if (m >= M) continue;
        float* dst = C + (size_t)m * ldc + n;
        float v = acc[4 * j + 2 * h + e] + bn;
        if (add) v += __ldcg(dst);
        __stcg(dst, v);
      }
  }
#endif
}

// One launch (the product launcher's contract: `tiles` W-row tiles of 64 WGS rows, `splits` split-K count); the
// split-K workspace is allocated per launch, stream-ordered, as the product does without a kept scratch.
template <int TN, int WGS, int STAGES, int KSUB>
int launch_ss(const nq::GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add, int splits,
              cudaStream_t st) {
  using C_ = nq::WgCfg<TN, WGS, STAGES, KSUB>;
  using S_ = SsCfg<TN, WGS, STAGES, KSUB>;
  auto kern = gemm_int4_wgmma_ss<TN, WGS, STAGES, KSUB>;
  static bool raised = false;
  if (!raised) {
    NQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S_::kSmem));
    raised = true;
  }
  CUtensorMap tmA, tmW[3];
  if (!nq::wg_encode_2d(&tmA, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, A, (uint64_t)g.s[0].W.K, (uint64_t)M, (uint64_t)lda * 2,
                        nq::WG_KB, TN, CU_TENSOR_MAP_SWIZZLE_128B))
    return nq::fail(NQ_E_CUDA, "gemm_ss: tensor map of the activations");
  for (int i = 0; i < 3; i++) {
    const nq::LinW& W = g.s[i < g.n ? i : 0].W;
    if (!nq::wg_encode_2d(&tmW[i], CU_TENSOR_MAP_DATA_TYPE_UINT8, W.w, (uint64_t)W.K / 2, (uint64_t)W.N,
                          (uint64_t)W.K / 2, nq::WG_KB / 2, C_::kRows, CU_TENSOR_MAP_SWIZZLE_NONE))
      return nq::fail(NQ_E_CUDA, "gemm_ss: tensor map of weight segment %d", i);
  }
  const int mtiles = (M + TN - 1) / TN;
  int* sem = nullptr;
  float* part = nullptr;
  if (splits > 1) {
    const size_t sem_bytes = ((size_t)mtiles * tiles * sizeof(int) + 255) / 256 * 256;
    const size_t part_bytes = (size_t)splits * mtiles * tiles * C_::kConsumers * (TN / 2) * sizeof(float);
    NQ_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&sem), sem_bytes + part_bytes, st));
    NQ_CUDA(cudaMemsetAsync(sem, 0, sem_bytes, st));
    part = reinterpret_cast<float*>(reinterpret_cast<char*>(sem) + sem_bytes);
  }
  dim3 grid(mtiles, tiles, splits > 1 ? splits : 1);
  kern<<<grid, C_::kThreads, S_::kSmem, st>>>(g, tmA, tmW[0], tmW[1], tmW[2], M, ldc, add ? 1 : 0, sem, part);
  NQ_LAUNCH_CHECK("gemm_int4_wgmma_ss");
  if (sem) NQ_CUDA(cudaFreeAsync(sem, st));
  return NQ_OK;
}

}  // namespace wgss
