// gemm_int4_wgmma: the INT4 x f16 prefill GEMM on Hopper wgmma + TMA (sm_90a only; launchers below, dispatch:
// gemm.cu), over layout 1 as the file stores it, layout 2 (ZP builds) or layout 1 in the fragment order (FRAG
// builds). Same contract as gemm_int4_mma (gemm_kernels.cuh): C[M, N] (+)= A[M, K] @ W[N, K]^T (+ bias), A f16
// (row stride lda), f32 C (row stride ldc), 1-3 segments sharing A (GemmGroup), any group of the format.
// Development, variants and measurements: csrc/dev/gemm_int4_wgmma.cu, bench/NOTES.md ("wgmma prefill GEMM").
//
// * C^T = W A^T: wgmma's M (64 rows per consumer warpgroup) = W rows, its N (TN = 128 or 256) = tokens. The
//   dequantised weights are the A operand FROM REGISTERS; the activations are the B operand from shared memory,
//   K-major, 128-byte swizzle.
// * Register A fragment of wgmma m64nNk16 (PTX ISA, "Register Fragments"): warp w of the warpgroup holds rows
//   16w..16w+15 in the mma.m16n8k16 A layout: a01 = (row gid, k 2tig,+1), a23 = (gid+8, 2tig,+1), a45 = (gid,
//   2tig+8,+9), a67 = (gid+8, 2tig+8,+9), lane = 4 gid + tig. The B side's k order is that of the activations as
//   stored, so thread tig needs real k 16t+2tig,+1 (word 2t) and 16t+8+2tig,+1 (word 2t+1) of 16-k step t: in
//   layout 1 that is nibble pair tig of every word ((w >> 4 tig) & 0x000F000F = codes of k 8j+2tig, 8j+2tig+1).
//   Each thread reads the 8 words of each of its 2 rows per 64-k stage and dequantises one pair per word with
//   gemm_int4_mma's arithmetic (dq_pair: bit-identical f16 weights), once per W tile per block.
// * Accumulator of m64nNk16: d[4j + 2h + e] = (W row 16w + gid + 8h, token 8j + 2tig + e).
// * Shared-memory descriptor (PTX ISA, "Matrix Descriptor"): start address >> 4 (bits 0-13), leading byte offset
//   1 (unused for swizzled K-major), stride byte offset 1024 B >> 4 (8-row core-matrix groups), base offset 0 (every
//   stage's activation tile is 1024-byte aligned), swizzle mode 1 = 128 B (bits 62-63). The 128-byte swizzle XORs
//   address bits 4-6 with bits 7-9 (chunk c of token row r at r*128 + ((c ^ (r & 7)) << 4), which is what the TMA
//   unit writes with CU_TENSOR_MAP_SWIZZLE_128B); 16-k step t starts 32 t bytes into the atom.
// * Warp specialisation: the last warpgroup is the producer (one thread issues; setmaxnreg.dec), loading each
//   64-k stage with TMA (cp.async.bulk.tensor.2d): the activation box 64 k x TN tokens (128-byte swizzle) and the raw
//   W box 32 bytes x rows (no swizzle); rows beyond M or N are zero-filled by the TMA unit. Full/empty mbarriers per
//   stage. Each consumer warpgroup (setmaxnreg.inc) waits on full[s], dequantises into registers, issues the
//   stage's 4 wgmmas, waits for them and releases the stage (one arrive per consumer warp). No block barrier lines
//   the warpgroups up, so one dequantises while another's wgmmas run.
// * The register-A rule: nothing may write the A fragment registers while a wgmma reading them is in flight (the
//   tensor core reads them when it dispatches the HGMMA, up to hundreds of cycles after issue), hence
//   wgmma.wait_group 0 before the next dequantisation. Dequantising the next stage during the wgmmas let ptxas give
//   the new values the in-flight HGMMAs' registers (NaN results, bench/NOTES.md); csrc/dev/check_wgmma_sass.py
//   checks the rule on the SASS.
// * Split-K. The prefill builds do not split: every split count > 1 was slower on the 7B shapes (bench/NOTES.md), and
//   small grids take a narrower block instead. The few-token builds (batched decode, TN 16-64: the weight stream)
//   split K so that their grids fill the GPU (gemm.cu's choice), and reduce in parallel: every split stores its
//   partial, the tile's last split sums them in split order (deterministic). gemm_int4_mma's serial order (split z
//   adds into C after split z - 1) costs a global round trip per split, which at these sizes is most of a launch.
// * Stages of KSUB 64-k sub-tiles (each an activation atom and a raw W box, as above): the prefill builds take 1,
//   the few-token builds 4, whose per-stage work (mbarrier wait and arrive, wgmma fence/commit/wait, loop and scale
//   addressing: ~90 of the ~160 instructions of a 1-sub-tile stage in their SASS) is then paid once per 256 k.
// * Scales: __ldg into registers one stage ahead (groups are powers of two: the index is a shift), per 32-k half.
// * Layout 2 (the ZP builds): the zero points (uint8 [N][K/g]) are loaded beside the scales, one stage ahead, same
//   index, and the dequantisation subtracts (1024 + z, 1024 + z) where layout 1 subtracts 1032 (dq_pair's kz). One
//   register per row and 64-k sub-tile holds both 32-k halves' zeros (group 32: one 16-bit load of the two bytes,
//   byte q = half q; groups >= 64: one byte, the same group for both halves), so the few-token builds' 4 sub-tiles a
//   stage stay within the consumer registers.
// * The fragment order (FRAG builds, launch_int4_wgmma_frag; layout-1 weights repacked at load, int4_frag.cuh): the
//   words of a 64-row tile and 16-k step are 512 contiguous bytes, lane l's 16 at 16 l, and word w of them is exactly
//   the register-A fragment of warp w of a warpgroup (int4_frag.cuh). The W box of a 64-k sub-tile is one TMA per
//   64-row tile: the words viewed as a 2-D tensor of 8-byte elements, N/64 rows (tiles) of K/16 x 64 elements, box
//   256 x 1 (4 steps = 2,048 B); warpgroup wg's tile lands at wg x 2,048 in the stage, the same kWBytes as the file
//   order's box. Tiles past N are neither loaded nor counted in the stage's expect_tx (N % 64 == 0: a tile is all in
//   or all out; its warpgroup computes on stale shared memory, rows never stored). Warp wq at step t reads word wq of
//   its lane's 16 bytes (one 4-byte LDS: 4-way bank-conflicted, the 4 wavefronts of the file order's LDS.128),
//   unpacks the exact codes (frag::unpack_word) and scales each pair with one HMUL2: the same f16 weights as dq_pair
//   ((code - 8) exact, one rounding by the scale), so a FRAG build's output equals the file-order build's bit for
//   bit. Scales [N/64][K/g][8 g][8 j]: a thread loads one 32-bit word per 32-k half, both of its rows' scales. The
//   SwiGLU pair (ORDER_FRAG_PAIR) is one matrix P of 2I rows whose tile T holds gate and up rows 32 T .. 32 T + 31 in
//   the fragment rows gid and gid + 8: block by takes P tiles by WGS .., the first I/64 tiles from gate's tensor map,
//   the rest from up's, and the paired epilogue's row mapping is the file order's. The register-A rule holds as above.
// * Tensor maps are encoded on the host per launch (cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion:
//   no -lcuda) and passed as __grid_constant__ parameters, so a captured launch replays with the pointers it had.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <algorithm>
#include "gemm_kernels.cuh"
#include "int4_frag.cuh"
#include "wgmma_rs.cuh"
#include "sm90_sync.cuh"

// sm_90a device code only (wgmma, setmaxnreg, TMA); the sm_80 build compiles the kernels empty and the host never
// launches them there (wgmma_available()).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NQ_WGMMA_DEVICE 1
#else
#define NQ_WGMMA_DEVICE 0
#endif

namespace nq {
namespace {

constexpr int WG_KB = 64;  // k per stage: one 128-byte (swizzle-atom) row of f16 per token

template <int TN, int WGS, int STAGES, int KSUB, bool ZP = false, bool FRAG = false>
struct WgCfg {
  static constexpr int kConsumers = 128 * WGS;
  static constexpr int kThreads = kConsumers + 128;  // + the producer warpgroup
  static constexpr int kRows = 64 * WGS;             // W rows per block
  static constexpr int kActBytes = TN * WG_KB * 2;   // a 64-k sub-tile of the activations: TN token rows x 128 B
  static constexpr int kWBytes = kRows * WG_KB / 2;  // a 64-k sub-tile of raw int4 words: 32 B per W row
  // FRAG: the same bytes as WGS fragment-order tiles of 64 rows x 64 k (4 steps of 512 B), tile i at i * kFragTileBytes
  static constexpr int kFragTileBytes = (WG_KB / frag::kStepK) * frag::kTileStepBytes;  // 2,048
  static_assert(!FRAG || kWBytes == WGS * kFragTileBytes, "a FRAG sub-tile is WGS fragment tiles");
  static_assert(!(ZP && FRAG), "the fragment order takes layout 1 only");
  static_assert(!FRAG || (TN >= 128 && KSUB == 1), "FRAG: the prefill builds only (no split-K, one sub-tile a stage)");
  static constexpr int kSubBytes = kActBytes + kWBytes;
  static constexpr int kStageBytes = KSUB * kSubBytes;  // a stage: KSUB sub-tiles, each [activations][W words]
  static constexpr int kSmem = STAGES * kStageBytes + 2 * STAGES * 8 + 1024;  // + mbarriers + 1024-B alignment slack
  // setmaxnreg split of one block per SM's registers: the producer keeps 40, the consumers take the rest.
  // The block launches with kLaunchRegs per thread (__launch_bounds__(kThreads, 1): the register file over the
  // threads, in steps of 8), and setmaxnreg.inc only takes registers that the producer's setmaxnreg.dec gave back
  // to the block: a consumer count above that waits forever (the first 4-warpgroup build did, at 112 of 96 + 14).
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8 > 255 ? 248 : (65536 / kThreads) / 8 * 8;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = WGS == 2 ? 232 : WGS == 3 ? 152 : 104;
  static_assert(WGS >= 2 && WGS <= 4, "2, 3 or 4 consumer warpgroups (4: csrc/dev few-token builds only)");
  static_assert(KSUB == 1 || KSUB == 2 || KSUB == 4, "64-k sub-tiles per stage: 1, 2 or 4");
  static_assert(kConsumerRegs % 8 == 0 && kProducerRegs % 8 == 0, "setmaxnreg counts are multiples of 8");
  static_assert(WGS * (kConsumerRegs - kLaunchRegs) <= kLaunchRegs - kProducerRegs,
                "the consumers' setmaxnreg.inc must fit in what the producer's setmaxnreg.dec frees");
  // accumulators, the A fragments and scales (and zero points, ZP) of a stage, the words of a sub-tile, addresses
  static_assert(kConsumerRegs >= TN / 2 + (ZP ? 22 : 20) * KSUB + 48, "consumer registers");
  static_assert(kSmem <= 227 * 1024, "shared memory per SM");
  static_assert(kActBytes % 1024 == 0 && kWBytes % 1024 == 0, "sub-tiles must stay 1024-byte aligned");
  static_assert(TN <= 256 && kRows <= 256, "a TMA box is at most 256 rows");
};

__device__ __forceinline__ uint64_t wg_desc_sw128(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}

#if NQ_WGMMA_DEVICE
__device__ __forceinline__ void wg_tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// keeps the compiler from moving reads of an accumulator across the wgmma wait
__device__ __forceinline__ void wg_reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
#endif

// ZP: INT4 layout 2 (every segment has zero points; gemm_multi launches per segment where layouts differ).
// FRAG: the fragment order (every segment ORDER_FRAG, or the SwiGLU pair ORDER_FRAG_PAIR; the prefill builds only).
template <int TN, int WGS, int STAGES, int KSUB, bool ZP = false, bool FRAG = false>
__global__ void __launch_bounds__(128 * WGS + 128, 1)
    gemm_int4_wgmma(const GemmGroup g, const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmW0,
                    const __grid_constant__ CUtensorMap tmW1, const __grid_constant__ CUtensorMap tmW2, int M, int ldc,
                    int add, int* sem, float* part) {
#if NQ_WGMMA_DEVICE
  using C_ = WgCfg<TN, WGS, STAGES, KSUB, ZP, FRAG>;
  // launched with PDL (launch.h): A, C and the split-K scratch are the earlier kernels' outputs. The consumers wait
  // before their first stage; the producer first issues the weight boxes of the first STAGES stages (weights do not
  // depend on earlier kernels), then waits, then loads A: the pipeline fills while the previous kernel drains. Every
  // thread that waits triggers after its wait (the others exit at once), as in every kernel of the library: a
  // kernel's pre-wait code then runs only once the kernel two back has completed.
  extern __shared__ __align__(128) unsigned char wsm_raw[];
  const uint32_t raw_u32 = smem_u32(wsm_raw);
  const uint32_t sbase = (raw_u32 + 1023u) & ~1023u;
  unsigned char* const wsm = wsm_raw + (sbase - raw_u32);
  const uint32_t full0 = sbase + STAGES * C_::kStageBytes, empty0 = full0 + STAGES * 8;

  const int by = blockIdx.y;  // W-row tile over all segments; blockIdx.x = token tile (fastest: W read ~once)
  // SwiGLU blocks (g.swiglu_out; the prefill builds only, gemm.cu): rows n0 .. n0 + kRows/2 - 1 of gate and the
  // same rows of up, one TMA box each
  const bool swiglu = TN >= 128 && g.swiglu_out != nullptr;
  const int seg = swiglu ? 0 : (g.n > 2 && by >= g.tiles0 + g.tiles1) ? 2 : (g.n > 1 && by >= g.tiles0) ? 1 : 0;
  const LinW W = seg == 2 ? g.s[2].W : seg == 1 ? g.s[1].W : g.s[0].W;
  const CUtensorMap* tmW = seg == 2 ? &tmW2 : seg == 1 ? &tmW1 : &tmW0;
  const int n0 = swiglu ? by * (C_::kRows / 2) : (by - (seg == 2 ? g.tiles0 + g.tiles1 : seg == 1 ? g.tiles0 : 0)) * C_::kRows;
  const int m0 = blockIdx.x * TN;
  const int tid = threadIdx.x;
  // FRAG: the block's 64-row fragment tiles ftile0 .. ftile0 + WGS - 1 (consumer warpgroup wg: tile ftile0 + wg), those
  // below fend real (N % 64 == 0: a tile is all in or all out). Segments: tiles n0/64 .. of the segment's weight (map
  // tmW). SwiGLU: tiles by WGS .. of the pair P (I/32 tiles), below fhalf = I/64 in gate's bytes (map tmW0, tile T),
  // the rest in up's (map tmW1, tile T - I/64); P tile T's rows 16 wq + gid and 16 wq + 8 + gid are gate and up row
  // 32 T + 8 wq + gid, which is n0 + a below (the paired epilogue as in the file order).
  const int ftile0 = swiglu ? by * WGS : n0 / 64;
  const int fend = swiglu ? 2 * (W.N / 64) : W.N / 64;
  const int fhalf = swiglu ? W.N / 64 : 0x7fffffff;
  // split-K (gridDim.z splits; sem != null): split z owns the 64-k sub-tiles [kt0, kt0 + KT), in NS stages of KSUB
  // (the last one possibly shorter)
  // The prefill builds (TN >= 128) never split (gemm.cu), so their k range is constant-folded to the whole of K: the
  // split offsets in their loop's scale addressing cost ~14 % of their speed (SASS: 164 vs 144 instructions a stage).
  constexpr bool kSplits = TN < 128;
  const int KTall = W.K / WG_KB, z = kSplits ? blockIdx.z : 0, nz = kSplits ? gridDim.z : 1;
  const int kt0 = kSplits ? (int)((long long)KTall * z / nz) : 0;
  const int KT = kSplits ? (int)((long long)KTall * (z + 1) / nz) - kt0 : KTall;
  const int NS = (KT + KSUB - 1) / KSUB;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; s++) {
      mbarrier_init(full0 + 8 * s, 1);                     // the producer's expect_tx arrive (+ the TMA bytes)
      mbarrier_init(empty0 + 8 * s, C_::kConsumers / 32);  // one arrive per consumer warp
    }
    fence_mbarrier_init_cluster();
  }
  __syncthreads();

  if (tid >= C_::kConsumers) {  // producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C_::kProducerRegs));
    if (tid == C_::kConsumers) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmA)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmW)) : "memory");
      if (swiglu) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmW1)) : "memory");
      // FRAG: one box per real tile (the tiles past fend are not loaded and not counted; their consumers' rows are
      // never stored)
      const int nft = FRAG ? min(WGS, fend - ftile0) : WGS;
      const uint32_t sub_bytes = FRAG ? C_::kActBytes + nft * C_::kFragTileBytes : C_::kSubBytes;
      // stage ks's boxes: the weights (w) and / or A (a); the stage's full barrier expects both (set with the first)
      auto issue = [&](int ks, bool w, bool a) {
        const int s = ks % STAGES, nsub = KSUB == 1 ? 1 : min(KSUB, KT - ks * KSUB);
        const uint32_t buf = sbase + s * C_::kStageBytes, full = full0 + 8 * s;
        if (w) mbarrier_arrive_expect_tx(full, nsub * sub_bytes);
        for (int q = 0; q < nsub; q++) {
          const int kt = kt0 + ks * KSUB + q;
          if (a) wg_tma_load_2d(buf + q * C_::kSubBytes, &tmA, kt * WG_KB, m0, full);
          if (!w) continue;
          if constexpr (FRAG) {  // tile i: 2,048 B = 256 8-byte elements from element 256 kt of its row (tile)
#pragma unroll
            for (int i = 0; i < WGS; i++)
              if (i < nft) {
                const int T = ftile0 + i;
                const bool up = T >= fhalf;
                wg_tma_load_2d(buf + q * C_::kSubBytes + C_::kActBytes + i * C_::kFragTileBytes, up ? &tmW1 : tmW,
                               kt * (C_::kFragTileBytes / 8), up ? T - fhalf : T, full);
              }
          } else if (swiglu) {  // kRows/2 rows of gate, then the same rows of up
            wg_tma_load_2d(buf + q * C_::kSubBytes + C_::kActBytes, &tmW0, kt * WG_KB / 2, n0, full);
            wg_tma_load_2d(buf + q * C_::kSubBytes + C_::kActBytes + C_::kWBytes / 2, &tmW1, kt * WG_KB / 2, n0, full);
          } else {
            wg_tma_load_2d(buf + q * C_::kSubBytes + C_::kActBytes, tmW, kt * WG_KB / 2, n0, full);
          }
        }
      };
      const int pre = min(STAGES, NS);   // the stages whose weights go out before the wait (their slots are free)
      for (int ks = 0; ks < pre; ks++) issue(ks, true, false);
      pdl_wait();
      pdl_trigger();
      for (int ks = 0; ks < pre; ks++) issue(ks, false, true);
      for (int ks = pre; ks < NS; ks++) {
        mbarrier_wait_parity(empty0 + 8 * (ks % STAGES), ((ks / STAGES) - 1) & 1);
        issue(ks, true, true);
      }
    }
    return;
  }
  pdl_wait();
  pdl_trigger();
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C_::kConsumerRegs));

  // consumer: warpgroup wg owns block rows 64 wg .. 64 wg + 63; this thread's A fragment rows are gid and gid + 8
  // of its warp's 16: block rows r0 and r0 + 8. A SwiGLU block pairs them instead: fragment row gid takes gate row
  // `a` (shared-memory row a of the gate box) and row gid + 8 up's row `a` (row kRows/2 + a), so that acc[4j + e]
  // and acc[4j + 2 + e] are g and u of one (row, token) in one thread: the epilogue needs no exchange.
  const int lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3, gid = lane >> 2, tig = lane & 3;
  const int r0 = wg * 64 + wq * 16 + gid;
  const int a = wg * 32 + wq * 8 + gid;                                   // SwiGLU: 0 .. kRows/2 - 1
  const int sr0 = swiglu ? a : r0, sr1 = swiglu ? C_::kRows / 2 + a : r0 + 8;  // shared-memory rows
  const int sh = 4 * tig;
  const int groups = W.K / W.group, gshift = __ffs(W.group) - 1;  // groups are powers of two (format rule)
  // scale rows of the two fragment rows; rows beyond N read row 0's (their outputs are never stored). SwiGLU: gate
  // and up have one K, group and layout (gemm.cu checks), so `groups` is both's.
  const int wr0 = n0 + (swiglu ? a : r0), wr1 = swiglu ? wr0 : wr0 + 8;
  const LinW& W1 = swiglu ? g.s[1].W : W;   // the matrix of the second fragment row
  const __half* srow0 = W.scales + (size_t)(wr0 < W.N ? wr0 : 0) * groups;
  const __half* srow1 = W1.scales + (size_t)(wr1 < W.N ? wr1 : 0) * groups;
  // ZP: the zero points of the same rows, indexed as the scales
  const uint8_t* zrow0 = ZP ? W.zeros + (size_t)(wr0 < W.N ? wr0 : 0) * groups : nullptr;
  const uint8_t* zrow1 = ZP ? W1.zeros + (size_t)(wr1 < W.N ? wr1 : 0) * groups : nullptr;
  // FRAG: this warpgroup's tile ft (tile 0 of the same weight where ft is past fend) and the scale word of the thread's
  // two rows 16 wq + gid (low half) and 16 wq + 8 + gid (high half): word wq of the uint4 (nb * groups + gi) * 8 + gid,
  // i.e. uint32 ((nb * groups + gi) * 8 + gid) * 4 + wq (int4_frag.cuh, frag::word_scales)
  const int ft = ftile0 + wg;
  const bool fup = ft >= fhalf;
  const uint32_t* const fsc =
      FRAG ? reinterpret_cast<const uint32_t*>(fup ? g.s[1].W.scales : W.scales) +
                 ((size_t)(ft < fend ? (fup ? ft - fhalf : ft) : 0) * groups * 8 + gid) * 4 + wq
           : nullptr;
  // The scales' raw bits [row r0 / r0+8][32-k half], loaded a stage ahead and paired (s, s) only where the next
  // stage dequantises: pairing them here made the thread wait for the loads before it issued this stage's wgmmas
  // (SASS: the PRMTs right after the LDGs, ahead of WARPGROUP.ARRIVE), a global-memory latency in every stage.
  // FRAG: s[0][q] = the scale word of both rows (fsc above) for 32-k half q
  auto load_scales = [&](int k0, uint32_t (&s)[2][2]) {
    if constexpr (FRAG) {
#pragma unroll
      for (int q = 0; q < 2; q++) s[0][q] = __ldg(fsc + (((k0 + 32 * q) >> gshift) << 5));
    } else {
#pragma unroll
      for (int q = 0; q < 2; q++) {
        s[0][q] = __half_as_ushort(__ldg(srow0 + ((k0 + 32 * q) >> gshift)));
        s[1][q] = __half_as_ushort(__ldg(srow1 + ((k0 + 32 * q) >> gshift)));
      }
    }
  };
  // ZP: the zero bytes of rows r0 and r0 + 8 for the sub-tile at k0 (a multiple of 64), one register per row (file
  // comment): group 32, the two bytes at the even index k0 / 32 (rows of K / 32 bytes, K % 64 == 0, and the zeros'
  // base 128-byte aligned: a 2-byte aligned load); turned into dq_pair's (1024 + z, 1024 + z) only where the next
  // stage dequantises (as the scales)
  const int zsh = gshift == 5 ? 8 : 0;    // half q's zero: (register >> q * zsh) & 0xFF
  auto load_zeros = [&](int k0, uint32_t (&zz)[2]) {
    if (gshift == 5) {
      zz[0] = __ldg(reinterpret_cast<const unsigned short*>(zrow0 + (k0 >> 5)));
      zz[1] = __ldg(reinterpret_cast<const unsigned short*>(zrow1 + (k0 >> 5)));
    } else {
      zz[0] = __ldg(zrow0 + (k0 >> gshift));
      zz[1] = __ldg(zrow1 + (k0 >> gshift));
    }
  };
  auto pair = [](uint32_t b) { return u32_as_h2(b | (b << 16)); };

  float acc[TN / 2];
#pragma unroll
  for (int i = 0; i < TN / 2; i++) acc[i] = 0.f;
  // a stage's A fragments (KSUB sub-tiles x 4 16-k steps) and scales; the scales of the next stage are loaded while
  // this one's wgmmas run
  uint32_t fa[KSUB][4][4], sc[KSUB][2][2];
  uint32_t zc[ZP ? KSUB : 1][2];      // ZP: the zero bytes of a stage, [sub-tile][row] (unused in layout 1's builds)
#pragma unroll
  for (int q = 0; q < KSUB; q++)
    if (q < KT) {
      load_scales((kt0 + q) * WG_KB, sc[q]);
      if constexpr (ZP) load_zeros((kt0 + q) * WG_KB, zc[q]);
    }
  for (int ks = 0; ks < NS; ks++) {
    // (constant for one sub-tile per stage, so the prefill builds' loop has no sub-tile branches)
    const int s = ks % STAGES, nsub = KSUB == 1 ? 1 : min(KSUB, KT - ks * KSUB);
    mbarrier_wait_parity(full0 + 8 * s, (ks / STAGES) & 1);
#pragma unroll
    for (int q = 0; q < KSUB; q++) {
      if (q >= nsub) break;
      if constexpr (FRAG) {
        // step t: word wq of the lane's 16 bytes of tile wg is this warp's A fragment (int4_frag.cuh): one 4-byte LDS
        // (4-way bank-conflicted: the 4 wavefronts of the file order's LDS.128), exact codes, one HMUL2 per pair with
        // the row's scale, as dq_pair rounds: {a01, a23, a45, a67} = {p0 s_lo, p2 s_hi, p1 s_lo, p3 s_hi}
        const unsigned char* fp = wsm + s * C_::kStageBytes + q * C_::kSubBytes + C_::kActBytes +
                                  wg * C_::kFragTileBytes + lane * 16 + 4 * wq;
#pragma unroll
        for (int t = 0; t < 4; t++) {
          const uint32_t word = *reinterpret_cast<const uint32_t*>(fp + t * frag::kTileStepBytes);
          __half2 p[4];
          frag::unpack_word(word, p);
          const uint32_t sw = sc[q][0][t >> 1];
          const __half2 s_lo = u32_as_h2(__byte_perm(sw, 0, 0x1010)), s_hi = u32_as_h2(__byte_perm(sw, 0, 0x3232));
          fa[q][t][0] = h2_as_u32(__hmul2(p[0], s_lo));
          fa[q][t][1] = h2_as_u32(__hmul2(p[2], s_hi));
          fa[q][t][2] = h2_as_u32(__hmul2(p[1], s_lo));
          fa[q][t][3] = h2_as_u32(__hmul2(p[3], s_hi));
        }
        continue;
      }
      // dequantise the two fragment rows (shared-memory rows sr0, sr1) of sub-tile q into the A fragments of its 4
      // 16-k steps
      const unsigned char* wp = wsm + s * C_::kStageBytes + q * C_::kSubBytes + C_::kActBytes;
      const uint4 x0 = *reinterpret_cast<const uint4*>(wp + sr0 * 32);
      const uint4 y0 = *reinterpret_cast<const uint4*>(wp + sr0 * 32 + 16);
      const uint4 x1 = *reinterpret_cast<const uint4*>(wp + sr1 * 32);
      const uint4 y1 = *reinterpret_cast<const uint4*>(wp + sr1 * 32 + 16);
      const uint32_t w0[8] = {x0.x, x0.y, x0.z, x0.w, y0.x, y0.y, y0.z, y0.w};
      const uint32_t w1[8] = {x1.x, x1.y, x1.z, x1.w, y1.x, y1.y, y1.z, y1.w};
#pragma unroll
      for (int t = 0; t < 4; t++) {
        if constexpr (ZP) {
          const __half2 kz0 = u32_as_h2(zero_bias_pair((zc[q][0] >> ((t >> 1) * zsh)) & 0xFFu));
          const __half2 kz1 = u32_as_h2(zero_bias_pair((zc[q][1] >> ((t >> 1) * zsh)) & 0xFFu));
          fa[q][t][0] = dq_pair(w0[2 * t] >> sh, 0, pair(sc[q][0][t >> 1]), kz0);
          fa[q][t][1] = dq_pair(w1[2 * t] >> sh, 0, pair(sc[q][1][t >> 1]), kz1);
          fa[q][t][2] = dq_pair(w0[2 * t + 1] >> sh, 0, pair(sc[q][0][t >> 1]), kz0);
          fa[q][t][3] = dq_pair(w1[2 * t + 1] >> sh, 0, pair(sc[q][1][t >> 1]), kz1);
        } else {
          fa[q][t][0] = dq_pair(w0[2 * t] >> sh, 0, pair(sc[q][0][t >> 1]));
          fa[q][t][1] = dq_pair(w1[2 * t] >> sh, 0, pair(sc[q][1][t >> 1]));
          fa[q][t][2] = dq_pair(w0[2 * t + 1] >> sh, 0, pair(sc[q][0][t >> 1]));
          fa[q][t][3] = dq_pair(w1[2 * t + 1] >> sh, 0, pair(sc[q][1][t >> 1]));
        }
      }
    }
    const int nnext = KSUB == 1 ? (ks + 1 < KT ? 1 : 0) : min(KSUB, KT - (ks + 1) * KSUB);
#pragma unroll
    for (int q = 0; q < KSUB; q++)
      if (q < nnext) {
        load_scales((kt0 + (ks + 1) * KSUB + q) * WG_KB, sc[q]);
        if constexpr (ZP) load_zeros((kt0 + (ks + 1) * KSUB + q) * WG_KB, zc[q]);
      }
    const uint32_t stage = sbase + s * C_::kStageBytes;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int q = 0; q < KSUB; q++) {
      if (q >= nsub) break;
#pragma unroll
      for (int t = 0; t < 4; t++) wgmma::mma_rs<TN>(acc, fa[q][t], wg_desc_sw128(stage + q * C_::kSubBytes + 32 * t));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");  // the register-A rule; stage s is free
#pragma unroll
    for (int i = 0; i < TN / 2; i++) wg_reg_fence(acc[i]);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty0 + 8 * s);
  }

  // epilogue: acc[4j + 2h + e] = (block row r0 + 8h, token 8j + 2tig + e)
  if (swiglu) {  // acc[4j + e] = g, acc[4j + 2 + e] = u of gate/up row n0 + a, token 8j + 2tig + e
    const int n = n0 + a;
    if (n < W.N) {
#pragma unroll
      for (int j = 0; j < TN / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int m = m0 + 8 * j + 2 * tig + e;
          if (m < M) g.swiglu_out[(size_t)m * g.swiglu_ld + n] = swiglu_f16(acc[4 * j + e], acc[4 * j + 2 + e]);
        }
    }
    return;
  }
  float* const C = seg == 2 ? g.s[2].C : seg == 1 ? g.s[1].C : g.s[0].C;
  const float* const bias = seg == 2 ? g.s[2].bias : seg == 1 ? g.s[1].bias : g.s[0].bias;
  if (nz > 1) {
    // parallel split-K: every split stores its partial (thread-major, TN/2 floats per thread); the tile's last split to
    // finish (tile counter in sem) sums all of them in split order, so the result does not depend on which one that is
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
      if (s_last) sem[tl] = 0;  // every split has counted: the counter is zero again for the next launch
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

// cuTensorMapEncodeTiled from the driver, looked up once (null if the driver lacks it)
inline PFN_cuTensorMapEncodeTiled_v12000 wg_encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static bool looked = false;
  if (!looked) {
    looked = true;
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    else
      (void)cudaGetLastError();
  }
  return fn;
}
// 2D row-major tensor of `rows` x `inner` elements (row pitch `pitch_bytes`), box box_inner x box_rows
inline bool wg_encode_2d(CUtensorMap* map, CUtensorMapDataType type, const void* base, uint64_t inner, uint64_t rows,
                         uint64_t pitch_bytes, uint32_t box_inner, uint32_t box_rows, CUtensorMapSwizzle swz) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = wg_encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[2] = {inner, rows};
  const cuuint64_t strides[1] = {pitch_bytes};
  const cuuint32_t box[2] = {box_inner, box_rows};
  const cuuint32_t estr[2] = {1, 1};
  return fn(map, type, 2, const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, swz,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// One launch of gemm_int4_wgmma<TN, WGS, STAGES, KSUB, ZP>; `tiles` = W-row tiles of 64 WGS rows over all segments
// (with g.swiglu_out: tiles of 32 WGS rows of gate and up each), `splits` = split-K count (1: none; the few-token
// builds only), reduced by each tile's last split.
template <int TN, int WGS, int STAGES, int KSUB, bool ZP = false>
int launch_int4_wgmma(const GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add, int splits,
                      cudaStream_t st, GemmScratch* ws = nullptr) {
  using C_ = WgCfg<TN, WGS, STAGES, KSUB, ZP>;
  auto kern = gemm_int4_wgmma<TN, WGS, STAGES, KSUB, ZP>;
  static bool raised = false;
  if (!raised) {
    NQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C_::kSmem));
    raised = true;
  }
  if (tiles > 65535) return fail(NQ_E_UNSUPPORTED, "gemm: %d N tiles (at most 65535)", tiles);
  if (TN >= 128 && splits > 1)  // the prefill builds' k range is the whole of K (kernel comment)
    return fail(NQ_E_INVALID_ARG, "gemm: split-K (%d) with a %d-token build", splits, TN);
  CUtensorMap tmA, tmW[3];
  if (!wg_encode_2d(&tmA, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, A, (uint64_t)g.s[0].W.K, (uint64_t)M, (uint64_t)lda * 2,
                    WG_KB, TN, CU_TENSOR_MAP_SWIZZLE_128B))
    return fail(NQ_E_CUDA, "gemm: cuTensorMapEncodeTiled failed for the activations (M=%d, K=%d, lda=%d)", M,
                g.s[0].W.K, lda);
  const bool swiglu = g.swiglu_out != nullptr;
  if (swiglu && (g.n != 2 || splits > 1 || g.s[0].W.N != g.s[1].W.N || g.s[0].W.K != g.s[1].W.K ||
                 g.s[0].W.group != g.s[1].W.group))
    return fail(NQ_E_INVALID_ARG, "gemm: the SwiGLU epilogue needs gate and up of one shape and group, no split");
  for (int i = 0; i < 3; i++) {
    const LinW& W = g.s[i < g.n ? i : 0].W;
    if (!wg_encode_2d(&tmW[i], CU_TENSOR_MAP_DATA_TYPE_UINT8, W.w, (uint64_t)W.K / 2, (uint64_t)W.N,
                      (uint64_t)W.K / 2, WG_KB / 2, swiglu ? C_::kRows / 2 : C_::kRows, CU_TENSOR_MAP_SWIZZLE_NONE))
      return fail(NQ_E_CUDA, "gemm: cuTensorMapEncodeTiled failed for weight segment %d (N=%d, K=%d)", i, W.N, W.K);
  }
  const int mtiles = (M + TN - 1) / TN;
  int* sem = nullptr;
  float* part = nullptr;
  bool own = false;  // sem/part allocated for this launch alone
  const size_t sem_bytes = ((size_t)mtiles * tiles * sizeof(int) + 255) / 256 * 256;
  const size_t part_bytes = (size_t)splits * mtiles * tiles * C_::kConsumers * (TN / 2) * sizeof(float);
  if (splits > 1 && ws) {  // the caller's scratch, grown if this launch needs more and the stream is not captured
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    NQ_CUDA(cudaStreamIsCapturing(st, &cs));
    if ((ws->counter_bytes < sem_bytes || ws->part_bytes < part_bytes) && cs == cudaStreamCaptureStatusNone) {
      const size_t cb = std::max(ws->counter_bytes, sem_bytes), pb = std::max(ws->part_bytes, part_bytes);
      if (ws->p) NQ_CUDA(cudaFreeAsync(ws->p, st));
      *ws = GemmScratch{};
      NQ_CUDA(cudaMallocAsync(&ws->p, cb + pb, st));
      NQ_CUDA(cudaMemsetAsync(ws->p, 0, cb, st));
      ws->counter_bytes = cb, ws->part_bytes = pb;
    }
    if (ws->counter_bytes >= sem_bytes && ws->part_bytes >= part_bytes) {
      sem = static_cast<int*>(ws->p);
      part = reinterpret_cast<float*>(static_cast<char*>(ws->p) + ws->counter_bytes);
    }
  }
  if (splits > 1 && !sem) {
    // per-launch tile counters + partials, stream-ordered: no state shared between streams or launches
    own = true;
    if (cudaMallocAsync(reinterpret_cast<void**>(&sem), sem_bytes + part_bytes, st) != cudaSuccess) {
      (void)cudaGetLastError();  // no stream-ordered allocator here: run unsplit
      sem = nullptr;
      splits = 1;
    } else {
      NQ_CUDA(cudaMemsetAsync(sem, 0, sem_bytes, st));
      part = reinterpret_cast<float*>(reinterpret_cast<char*>(sem) + sem_bytes);
    }
  }
  dim3 grid(mtiles, tiles, splits > 1 ? splits : 1);
  NQ_TRY(launch_pdl("gemm_int4_wgmma", kern, grid, dim3(C_::kThreads), C_::kSmem, st, g, tmA, tmW[0], tmW[1], tmW[2],
                    M, ldc, add ? 1 : 0, sem, part));
  if (own && sem) NQ_CUDA(cudaFreeAsync(sem, st));
  return NQ_OK;
}

// launch_int4_wgmma_frag<TN, WGS, STAGES>: the fragment-order build (INT4 layout 1 repacked at load, int4_frag.cuh)
// of the prefill kernel; KSUB = 1, no split-K; builds (256, 2, 4), (128, 2, 5), (128, 3, 5).
// g: as launch_int4_wgmma takes it. Either 1-3 segments, every W in ORDER_FRAG, with C / bias (and add), g.tiles0 /
// g.tiles1 set for 64 WGS rows per block (gemm.cu's count_tiles(64 * WGS)); or SwiGLU: g.swiglu_out / g.swiglu_ld
// set, g.n = 2, g.s[0].W = gate and g.s[1].W = up, both ORDER_FRAG_PAIR, one shape and group (ldc, add unused).
// `tiles` = the grid's block rows (gridDim.y), exactly what launch_int4_wgmma takes for the same g:
//   segments: sum over segments i of ceil(N_i / (64 WGS)) (each block = WGS 64-row fragment tiles of one segment;
//             the 64-row tiles past N_i in a segment's last block are skipped);
//   SwiGLU:   ceil(I / (32 WGS)), I = gate.N (each block = WGS tiles of the pair P = outputs 32 WGS by ..
//             32 WGS by + 32 WGS - 1; P has I / 32 tiles).
// M: tokens (>= 1; gemm.cu sends M >= 128), A: f16 [M][lda] (lda % 8 == 0, 16-byte aligned), ldc: C's row stride.
// Tensor maps: the activations as launch_int4_wgmma's; each weight's words as a 2-D tensor of 8-byte elements, N/64
// rows (tiles) of K/16 x 64 elements (512 B a 16-k step), box 256 x 1 (one tile's 64-k sub-tile, 2,048 B).
template <int TN, int WGS, int STAGES>
int launch_int4_wgmma_frag(GemmGroup& g, int tiles, const __half* A, int lda, int M, int ldc, bool add,
                           cudaStream_t st) {
  using C_ = WgCfg<TN, WGS, STAGES, 1, false, true>;
  auto kern = gemm_int4_wgmma<TN, WGS, STAGES, 1, false, true>;
  static bool raised = false;
  if (!raised) {
    NQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C_::kSmem));
    raised = true;
  }
  if (tiles < 1 || tiles > 65535) return fail(NQ_E_UNSUPPORTED, "gemm: %d N tiles (1..65535)", tiles);
  if (M < 1 || g.n < 1 || g.n > 3) return fail(NQ_E_INVALID_ARG, "gemm: M=%d, %d segments", M, g.n);
  const bool swiglu = g.swiglu_out != nullptr;
  if (swiglu && (g.n != 2 || g.s[0].W.N != g.s[1].W.N || g.s[0].W.K != g.s[1].W.K || g.s[0].W.group != g.s[1].W.group))
    return fail(NQ_E_INVALID_ARG, "gemm: the SwiGLU epilogue needs gate and up of one shape and group");
  for (int i = 0; i < g.n; i++) {
    const LinW& W = g.s[i].W;
    if (W.type != WT_INT4 || W.zeros || W.order != (swiglu ? ORDER_FRAG_PAIR : ORDER_FRAG) ||
        !frag::shape_ok(W.N, W.K, W.group) || W.K != g.s[0].W.K || reinterpret_cast<uintptr_t>(W.w) % 16 != 0)
      return fail(NQ_E_INVALID_ARG, "gemm: segment %d is not an INT4 weight in the fragment order%s (N=%d, K=%d, g=%d)",
                  i, swiglu ? " pair" : "", W.N, W.K, W.group);
  }
  CUtensorMap tmA, tmW[3];
  if (!wg_encode_2d(&tmA, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, A, (uint64_t)g.s[0].W.K, (uint64_t)M, (uint64_t)lda * 2,
                    WG_KB, TN, CU_TENSOR_MAP_SWIZZLE_128B))
    return fail(NQ_E_CUDA, "gemm: cuTensorMapEncodeTiled failed for the activations (M=%d, K=%d, lda=%d)", M,
                g.s[0].W.K, lda);
  for (int i = 0; i < 3; i++) {
    const LinW& W = g.s[i < g.n ? i : 0].W;
    const uint64_t steps = (uint64_t)(W.K / frag::kStepK);
    if (!wg_encode_2d(&tmW[i], CU_TENSOR_MAP_DATA_TYPE_UINT64, W.w, steps * (frag::kTileStepBytes / 8),
                      (uint64_t)(W.N / frag::kTileRows), steps * frag::kTileStepBytes, C_::kFragTileBytes / 8, 1,
                      CU_TENSOR_MAP_SWIZZLE_NONE))
      return fail(NQ_E_CUDA, "gemm: cuTensorMapEncodeTiled failed for weight segment %d (N=%d, K=%d)", i, W.N, W.K);
  }
  dim3 grid((M + TN - 1) / TN, tiles, 1);
  return launch_pdl("gemm_int4_wgmma (fragment order)", kern, grid, dim3(C_::kThreads), C_::kSmem, st, g, tmA, tmW[0],
                    tmW[1], tmW[2], M, ldc, add ? 1 : 0, (int*)nullptr, (float*)nullptr);
}

}  // namespace
}  // namespace nq
