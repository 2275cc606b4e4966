// What a kernel boundary costs a decode step, without the GEMV arithmetic: a chain of dependent read-only streams
// with a 7B layer's byte counts (qkv 8.5 MB, o 6.6 MB, gate/up 70.0 MB, down 35.0 MB: weights + f16 scales) x 28
// layers = 3.37 GB (or another size's: see main), each stage's "activation" the previous stage's output, run five
// ways on the same buffers:
//   kernels     one kernel a stage, launched with PDL in one CUDA graph, as the product's decode chain: every thread
//               issues its first U loads, waits (griddepcontrol.wait), reads the previous stage's output, triggers
//               its dependents, then streams the rest of its share (a register ring of U loads);
//   persistent  one cooperative launch, every block resident: the same per-stage code, but a block goes on to the next
//               stage's first U loads as soon as it has added its partial, then waits on a completion counter
//               (acquire) instead of a kernel boundary;
//   counters    the launches of `kernels` (PDL, one graph), but a block waits on the previous stage's completion
//               counter (acquire, as `persistent`) instead of griddepcontrol.wait, then triggers its dependents; each
//               block adds 1 to its stage's counter after its partial. Safe: a kernel's dependents launch only once
//               all of its blocks have triggered, i.e. are resident, so a waiting block never holds a slot that the
//               kernel it waits for still needs;
//   unchained   the kernels of `kernels` without their dependency (no wait, plain launches in a graph): the cost of
//               112 launches and their tails alone;
//   ceiling     one kernel over all 3.37 GB: no boundary at all;
//   +pf         kernels (or unchained) where each stage's blocks also prefetch the next stage's first P bytes into
//               L2 (cp.async.bulk.prefetch, their slice of it), at their start or after their own stream: the next
//               stage's first loads hit L2, and HBM stays busy through the boundary (NOTES "Session 20" §1);
//   R blocks    kernels and kernels+pf with dynamic shared memory (unused) that lets only R blocks of any stage
//               share an SM: R = 4 is the product's case (its decode GEMVs fill the register file, so the next
//               kernel's blocks start only as the current one's exit), R = 5-6 leaves one or two slots for the next
//               stage's first blocks (NOTES "Session 21" §4).
//   +fixed      kernels (at R = 4, and free) whose stages also do a decode GEMV's per-block fixed work, with no
//               arithmetic (NOTES "Session 22: where it stands", item 1): x staging (after the wait, the block reads
//               its split's K range of an f32 x into shared memory as f16, as frag_stage_x; 4 loads in flight a
//               thread), the RMSNorm's sum of squares over all of K for the normed stages (qkv, gate/up), and the
//               split reduction of the product's plans: clusters of 4 blocks (qkv, o, down; gate/up: none) that
//               sum 64 outputs through distributed shared memory between two cluster barriers. Masks: x (1), norm
//               (2), cluster (4). x holds zeros and the folds are masked by a run-time zero, so y is unchanged.
// A stage's output: y_s = sum over its 32-bit words w of (w ^ x_s) mod 2^32 with x_s = y_{s-1} (x_0 a seed), so
// every word's use needs the previous stage, while its load does not (as a GEMV's weights and x). Sums mod 2^32 do
// not depend on the order, so every variant's y must equal the CPU's exactly (validate: all 112 stages).
// Prediction and outcome: bench/NOTES.md "Session 18" §6 (written before the first run).
//
//   make -C csrc/dev && build/dev/chain_read [layers (28) [hidden intermediate heads kv_heads head_dim]]
#include "dev_common.cuh"
#include "launch.h"
#include <cooperative_groups.h>
#include <omp.h>

namespace {

constexpr int kThreads = 128;   // as the product's decode GEMV blocks
constexpr uint32_t kSeed = 0x2545F491u;

struct Stage {
  const uint4* w;
  size_t n16;
  int xk;       // +fixed: the K range of x a block stages (the GEMV's K / its plan's splits)
  int norm_k;   // +fixed: K of the RMSNorm's sum of squares (0: not a normed stage)
  int split;    // +fixed: the plan's splits (the cluster a split reduction spans; 1: none)
};
struct Chain {
  const Stage* st;   // device array of stages
  int n;
  uint32_t* y;       // [n] stage outputs (zeroed before a run)
  uint32_t* done;    // [n] blocks that added their partial (persistent; zeroed before a run)
  size_t pf;         // kernels / unchained: bytes of the next stage each stage prefetches into L2 (0: none)
  int pf_end;        // 1: a block issues its prefetch after its own stream, 0: before its first loads
  const float* x = nullptr;   // +fixed: [intermediate] zeros, the stand-in for the GEMV's x
  uint32_t zero = 0;          // +fixed: 0 at run time (the compiler cannot drop the folds it masks)
};

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The block's slice of the first `bytes` of stage S (a multiple of 16), prefetched into L2 in 4 KB bulk requests
// (no registers, no completion to wait for)
__device__ __forceinline__ void prefetch_share(const Stage& S, size_t bytes) {
  bytes = bytes < S.n16 * 16 ? bytes : S.n16 * 16;
  const size_t per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16, b0 = (size_t)blockIdx.x * per;
  if (b0 >= bytes) return;
  const size_t n = per < bytes - b0 ? per : bytes - b0;
  const char* base = reinterpret_cast<const char*>(S.w) + b0;
  for (size_t o = (size_t)threadIdx.x * 4096; o < n; o += (size_t)blockDim.x * 4096) {
    const uint32_t len = (uint32_t)(n - o < 4096 ? n - o : 4096);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + o), "r"(len) : "memory");
  }
}

// The block's share of stage s: the first U loads of each thread (before the dependency), then the rest; returns
// the thread's sum of (w ^ x). get_x() is called between the first loads and their use.
template <int U, typename GetX>
__device__ __forceinline__ uint32_t stage_sum(const Stage& S, GetX get_x) {
  const size_t T = (size_t)gridDim.x * blockDim.x;
  const size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint4 r[U];
#pragma unroll
  for (int u = 0; u < U; u++) r[u] = i0 + u * T < S.n16 ? nq::ld_stream16(S.w + i0 + u * T) : make_uint4(0, 0, 0, 0);
  const uint32_t x = get_x();
  uint32_t acc = 0;
  for (size_t i = i0; i < S.n16; i += U * T) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const uint4 v = r[u];
      const size_t nx = i + (size_t)(u + U) * T;
      r[u] = nx < S.n16 ? nq::ld_stream16(S.w + nx) : make_uint4(0, 0, 0, 0);
      if (i + u * T < S.n16) acc += (v.x ^ x) + (v.y ^ x) + (v.z ^ x) + (v.w ^ x);
    }
  }
  return acc;
}

// sum of v over the block (mod 2^32), valid in thread 0
__device__ __forceinline__ uint32_t block_sum(uint32_t v, uint32_t* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  uint32_t s = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; w++) s += red[w];
  __syncthreads();   // red is reused by the next stage
  return s;
}

constexpr int kFixX = 1, kFixNorm = 2, kFixCluster = 4;
constexpr int kFixMaxXk = 8192;   // f16 units of the staged x a block holds (the 7B's down: 18,944 / 4 = 4,736)

// +fixed, after the dependency: the RMSNorm's sum of squares over norm_k (block-wide), then the block's xk of x into
// xh as f16 (4 loads in flight a thread, as frag_stage_x's f32 path); returns a value that is 0 when x is
template <int FIX>
__device__ __forceinline__ uint32_t stage_x_fixed(const Chain& c, const Stage& S, __half* xh, float* redf) {
  uint32_t fold = 0;
  if ((FIX & kFixNorm) && S.norm_k > 0) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < S.norm_k; i += kThreads) ss = fmaf(c.x[i], c.x[i], ss);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) redf[threadIdx.x >> 5] = ss;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < kThreads / 32; w++) t += redf[w];
    fold |= __float_as_uint(t);
    __syncthreads();
  }
  if (FIX & kFixX) {
    const int k0 = (int)(blockIdx.x % S.split) * S.xk;   // this block's split of K
    constexpr int B = 4;
    for (int p0 = threadIdx.x; p0 < S.xk; p0 += B * kThreads) {
      float v[B];
#pragma unroll
      for (int b = 0; b < B; b++) v[b] = p0 + b * kThreads < S.xk ? c.x[k0 + p0 + b * kThreads] : 0.f;
#pragma unroll
      for (int b = 0; b < B; b++)
        if (p0 + b * kThreads < S.xk) xh[p0 + b * kThreads] = __float2half_rn(v[b]);
    }
    __syncthreads();
    fold |= (uint32_t)__half_as_ushort(xh[threadIdx.x % S.xk]);
  }
  return fold & c.zero;
}

// +fixed, after the stream: a split reduction as the product's (gemv_frag_kernel): 64 sums in shared memory, a
// cluster barrier, rank r sums its slice of them over the cluster's blocks, a second barrier; returns 0 (masked)
__device__ __forceinline__ uint32_t split_reduce_fixed(const Chain& c, float* sums, uint32_t acc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const int S = (int)cl.num_blocks();
  if (S < 2) return 0;
  if (threadIdx.x < 64) sums[threadIdx.x] = (float)(acc & 0xFFu);
  cl.sync();
  const int r = (int)cl.block_rank(), per = 64 / S;
  float v = 0.f;
  if ((int)threadIdx.x < per)
    for (int z = 0; z < S; z++) v += cl.map_shared_rank(sums, z)[r * per + threadIdx.x];
  cl.sync();
  return __float_as_uint(v) & c.zero;
#else
  return 0;
#endif
}

// kernels / counters / unchained: one stage a launch (chained: wait for the previous stage's kernel, or for its
// counter, read its output). FIX: +fixed's per-block work (kernels only).
enum Dep { kNone, kGridDep, kCounter };
template <int U, Dep DEP, int FIX = 0>
__global__ void __launch_bounds__(kThreads) stage_kernel(Chain c, int s) {
  __shared__ uint32_t red[kThreads / 32];
  __shared__ uint32_t xs;
  __shared__ __half xh[FIX & kFixX ? kFixMaxXk : 1];
  __shared__ float redf[kThreads / 32], sums[64];
  if (c.pf && !c.pf_end && s + 1 < c.n) prefetch_share(c.st[s + 1], c.pf);
  uint32_t fold = 0;
  uint32_t acc = stage_sum<U>(c.st[s], [&]() {
    if (DEP == kNone) return s > 0 ? kSeed + (uint32_t)s : kSeed;   // unchained: no dependency (y not validated)
    if (DEP == kGridDep) nq::pdl_wait();
    if (threadIdx.x == 0) {
      if (DEP == kCounter && s > 0)
        while (ld_acquire(&c.done[s - 1]) < gridDim.x) {}
      xs = s > 0 ? ld_acquire(&c.y[s - 1]) : kSeed;
    }
    __syncthreads();
    nq::pdl_trigger();
    if (FIX & (kFixX | kFixNorm)) fold = stage_x_fixed<FIX>(c, c.st[s], xh, redf);
    return (uint32_t)xs ^ fold;
  });
  if (c.pf && c.pf_end && s + 1 < c.n) prefetch_share(c.st[s + 1], c.pf);
  if (FIX & kFixCluster) acc += split_reduce_fixed(c, sums, acc);
  const uint32_t b = block_sum(acc, red);
  if (threadIdx.x == 0) {
    atomicAdd(&c.y[s], b);
    if (DEP == kCounter) {
      __threadfence();               // the partial is visible before the count that announces it
      atomicAdd(&c.done[s], 1u);
    }
  }
}

// persistent: every stage in one launch; completion counters instead of kernel boundaries
template <int U>
__global__ void __launch_bounds__(kThreads) chain_persistent(Chain c) {
  __shared__ uint32_t red[kThreads / 32];
  __shared__ uint32_t xs;
  for (int s = 0; s < c.n; s++) {
    const uint32_t acc = stage_sum<U>(c.st[s], [&]() {
      if (threadIdx.x == 0) {
        if (s > 0) {
          while (ld_acquire(&c.done[s - 1]) < gridDim.x) __nanosleep(32);
          xs = ld_acquire(&c.y[s - 1]);
        } else {
          xs = kSeed;
        }
      }
      __syncthreads();
      return xs;
    });
    const uint32_t b = block_sum(acc, red);
    if (threadIdx.x == 0) {
      atomicAdd(&c.y[s], b);
      __threadfence();               // the partial is visible before the count that announces it
      atomicAdd(&c.done[s], 1u);
    }
  }
}

// ceiling: all stages' bytes as one stream, no dependency
template <int U>
__global__ void __launch_bounds__(kThreads) all_at_once(Stage all, uint32_t* sink) {
  __shared__ uint32_t red[kThreads / 32];
  const uint32_t acc = stage_sum<U>(all, []() { return kSeed; });
  const uint32_t b = block_sum(acc, red);
  if (threadIdx.x == 0) atomicAdd(sink, b);
}

// The bytes a layer's decode GEMVs read (int4 weights + f16 scales of group 128, each padded to 16 bytes): qkv, o,
// gate/up (read by one SwiGLU GEMV), down, from a size's widths (nanoqwen_format/shapes.py: the 7B's by default,
// another size's passed on the command line, e.g. by bench/gpu_check.sh's chain step)
std::vector<size_t> layer_bytes(const dev::Widths& w) {
  auto gemv = [](size_t N, size_t K, size_t n) { return (n * (N * K / 2 + N * (K / 128) * 2) + 15) / 16 * 16; };
  const size_t h = w.hidden, q = (size_t)w.heads * w.head_dim, kv = (size_t)w.kv_heads * w.head_dim;
  return {gemv(q + 2 * kv, h, 1), gemv(h, q, 1), gemv(w.intermediate, h, 2), gemv(h, w.intermediate, 1)};
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 0;
  dev::Widths wd;
  if (!dev::layers_and_widths(argc, argv, "chain_read", layers, wd)) return 2;
  int dev_id = 0, sms = 0;
  DEV_CHECK(cudaGetDevice(&dev_id));
  DEV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_id));
  const std::vector<size_t> lb = layer_bytes(wd);
  std::vector<size_t> off;                                    // byte offset of each stage
  size_t total = 0;
  for (int l = 0; l < layers; l++)
    for (size_t b : lb) { off.push_back(total); total += b; }
  const int n = (int)off.size();
  std::printf("chain_read: %d stages (%d layers x 4; hidden %d, intermediate %d, heads %d / %d x %d), %.3f GB, "
              "%d SMs\n",
              n, layers, wd.hidden, wd.intermediate, wd.heads, wd.kv_heads, wd.head_dim, total / 1e9, sms);

  uint8_t* buf = nullptr;
  DEV_CHECK(cudaMalloc(&buf, total));
  dev::fill_hash_words<<<4 * sms, 256>>>(reinterpret_cast<uint32_t*>(buf), total / 4, 0);   // word j: hash_word(j)
  std::vector<Stage> hs(n);
  // +fixed: per stage kind, the K of its x, whether it is normed, and its plan's splits (frag_plan on the 7B: qkv /
  // o / down 4, gate/up 1; other sizes differ, the 7B's are kept)
  const int qd = wd.heads * wd.head_dim;
  const int kind_k[4] = {wd.hidden, qd, wd.hidden, wd.intermediate}, kind_norm[4] = {1, 0, 1, 0};
  const int kind_split[4] = {4, 4, 1, 4};
  for (int s = 0; s < n; s++) {
    const size_t bytes = (s + 1 < n ? off[s + 1] : total) - off[s];
    const int kd = s % 4;
    hs[s] = {reinterpret_cast<const uint4*>(buf + off[s]), bytes / 16, kind_k[kd] / kind_split[kd],
             kind_norm[kd] ? kind_k[kd] : 0, kind_split[kd]};
    if (hs[s].xk > kFixMaxXk) {
      std::printf("chain_read: a stage's x range (%d) exceeds kFixMaxXk\n", hs[s].xk);
      return 1;
    }
  }
  Stage* ds = nullptr;
  uint32_t *y = nullptr, *done = nullptr, *sink = nullptr;
  DEV_CHECK(cudaMalloc(&ds, n * sizeof(Stage)));
  DEV_CHECK(cudaMemcpy(ds, hs.data(), n * sizeof(Stage), cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&y, n * 4));
  DEV_CHECK(cudaMalloc(&done, n * 4));
  DEV_CHECK(cudaMalloc(&sink, 4));
  float* xz = nullptr;   // +fixed: the zero x
  DEV_CHECK(cudaMalloc(&xz, (size_t)std::max(wd.hidden, std::max(qd, wd.intermediate)) * sizeof(float)));
  DEV_CHECK(cudaMemset(xz, 0, (size_t)std::max(wd.hidden, std::max(qd, wd.intermediate)) * sizeof(float)));
  Chain c{ds, n, y, done, 0, 0, xz, 0u};

  // CPU reference: y_s = sum (w ^ x_s), x_s = y_{s-1}
  std::vector<uint32_t> ref(n);
  {
    uint32_t x = kSeed;
    for (int s = 0; s < n; s++) {
      const uint64_t j0 = off[s] / 4, j1 = j0 + hs[s].n16 * 4;
      uint32_t acc = 0;
#pragma omp parallel for reduction(+ : acc) schedule(static)
      for (int64_t j = (int64_t)j0; j < (int64_t)j1; j++) acc += dev::hash_word((uint64_t)j) ^ x;
      ref[s] = acc;
      x = acc;
    }
  }
  DEV_CHECK(cudaDeviceSynchronize());
  auto check = [&](const char* what) {
    std::vector<uint32_t> got(n);
    DEV_CHECK(cudaMemcpy(got.data(), y, n * 4, cudaMemcpyDeviceToHost));
    for (int s = 0; s < n; s++)
      if (got[s] != ref[s]) {
        std::printf("%s: FAIL, stage %d: %08x, CPU %08x\n", what, s, got[s], ref[s]);
        std::exit(1);
      }
    std::printf("%s: all %d stage outputs equal the CPU's\n", what, n);
  };

  constexpr int U = 8;   // loads in flight a thread, as the product's decode GEMV ring (8 x 16 B)
  const int grid = 4 * sms;   // the product's decode GEMVs: ~4 blocks of 128 threads an SM
  int per_sm = 0;
  DEV_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_persistent<U>, kThreads, 0));
  const int pgrid = std::min(4, per_sm) * sms;

  // a graph of what enqueue(st) launches, after a memset of y and of the counters
  auto graph_of = [&](auto enqueue) {
    cudaStream_t st;
    DEV_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    DEV_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    DEV_CHECK(cudaMemsetAsync(y, 0, n * 4, st));
    DEV_CHECK(cudaMemsetAsync(done, 0, n * 4, st));
    enqueue(st);
    DEV_CHECK(cudaStreamEndCapture(st, &g));
    DEV_CHECK(cudaGraphInstantiate(&ge, g, 0));
    DEV_CHECK(cudaGraphDestroy(g));
    DEV_CHECK(cudaStreamDestroy(st));
    return ge;
  };
  // kernels, counters and unchained: graphs of n launches
  auto capture = [&](Dep dep, const Chain& c, size_t smem = 0) {
    return graph_of([&](cudaStream_t st) {
      void (*kernel)(Chain, int) = dep == kGridDep   ? stage_kernel<U, kGridDep>
                                   : dep == kCounter ? stage_kernel<U, kCounter>
                                                     : stage_kernel<U, kNone>;
      for (int s = 0; s < n; s++) {
        if (dep != kNone && s > 0)   // chained: with PDL after the first stage
          dev::must(nq::launch_pdl("stage_kernel", kernel, dim3(grid), dim3(kThreads), smem, st, c, s));
        else
          kernel<<<grid, kThreads, smem, st>>>(c, s);
      }
    });
  };
  cudaGraphExec_t g_chain = capture(kGridDep, c), g_ctr = capture(kCounter, c), g_free = capture(kNone, c);
  // kernels (and once unchained) with an L2 prefetch of the next stage's first `pf` bytes, issued at a block's start
  // or after its own stream
  // (R > 0: at most R blocks of a stage an SM, by dynamic shared memory)
  int smem_sm = 0, smem_reserved = 0;
  DEV_CHECK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev_id));
  DEV_CHECK(cudaDeviceGetAttribute(&smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev_id));
  // shared memory is allocated in 128-byte units (R = 5 at 45,606 bytes got 4 blocks: 5 x (45,696 + 1,024) >
  // 233,472); one unit is held back for the kernel's static shared memory (~20 bytes)
  auto smem_for = [&](int R) { return R > 0 ? (size_t)(((smem_sm / R - smem_reserved) / 128 - 1) * 128) : (size_t)0; };
  DEV_CHECK(cudaFuncSetAttribute(stage_kernel<U, kGridDep>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem_for(4)));
  for (int R : {4, 5, 6, 8}) {   // the residency each R gets
    int got = 0;
    DEV_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, stage_kernel<U, kGridDep>, kThreads, smem_for(R)));
    std::printf("R = %d: %zu bytes of shared memory a block, %d blocks an SM\n", R, smem_for(R), got);
    if (got != R) { std::printf("R = %d: FAIL, %d blocks an SM\n", R, got); return 1; }
  }
  struct PfRun { double mb; int end; Dep dep; int R; cudaGraphExec_t g; };
  std::vector<PfRun> pf_runs;
  auto add_pf = [&](Dep dep, double mb, int end, int R = 0) {
    Chain cp = c;
    cp.pf = (size_t)(mb * 1e6) / 16 * 16;
    cp.pf_end = end;
    pf_runs.push_back({mb, end, dep, R, capture(dep, cp, smem_for(R))});
  };
  for (double mb : {4.0, 8.0, 16.0, 32.0})
    for (int end : {0, 1}) add_pf(kGridDep, mb, end);
  add_pf(kNone, 16.0, 0);
  for (int R : {4, 5, 6, 8})                      // mb 0: no prefetch (the kernels row at R blocks an SM)
    for (double mb : {0.0, 4.0, 8.0}) add_pf(kGridDep, mb, 1, R);
  // +fixed: kernels whose stages do a GEMV's per-block fixed work (mask FIX), at R blocks an SM (0: as the kernels
  // row); split stages in clusters of their plan's splits
  struct FixRun { int fix, R; cudaGraphExec_t g; };
  std::vector<FixRun> fix_runs;
  auto capture_fixed = [&](auto kernel, int fix, int R) {
    cudaFuncAttributes fa{};
    DEV_CHECK(cudaFuncGetAttributes(&fa, kernel));
    const size_t smem = R > 0 ? (size_t)(((smem_sm / R - smem_reserved - (int)fa.sharedSizeBytes) / 128 - 1) * 128) : 0;
    DEV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (R > 0) {
      int got = 0;
      DEV_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, kernel, kThreads, smem));
      if (got != R) { std::printf("+fixed %d, R = %d: FAIL, %d blocks an SM\n", fix, R, got); std::exit(1); }
    }
    const cudaGraphExec_t ge = graph_of([&](cudaStream_t st) {
      for (int s = 0; s < n; s++) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid); cfg.blockDim = dim3(kThreads); cfg.dynamicSmemBytes = smem; cfg.stream = st;
        cudaLaunchAttribute attr[2];
        unsigned na = 0;
        if ((fix & kFixCluster) && hs[s].split > 1) {
          attr[na].id = cudaLaunchAttributeClusterDimension;
          attr[na].val.clusterDim.x = hs[s].split; attr[na].val.clusterDim.y = 1; attr[na].val.clusterDim.z = 1;
          na++;
        }
        if (s > 0) {   // chained with PDL after the first stage, as the kernels row
          attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr[na].val.programmaticStreamSerializationAllowed = 1;
          na++;
        }
        cfg.attrs = attr; cfg.numAttrs = na;
        DEV_CHECK(cudaLaunchKernelEx(&cfg, kernel, c, s));
      }
    });
    fix_runs.push_back({fix, R, ge});
  };
  for (int R : {4, 0}) {
    if (R == 4) {
      capture_fixed(stage_kernel<U, kGridDep, kFixX | kFixNorm>, kFixX | kFixNorm, R);
      capture_fixed(stage_kernel<U, kGridDep, kFixCluster>, kFixCluster, R);
    }
    capture_fixed(stage_kernel<U, kGridDep, kFixX | kFixNorm | kFixCluster>, kFixX | kFixNorm | kFixCluster, R);
  }
  auto run_persistent = [&]() {
    DEV_CHECK(cudaMemsetAsync(y, 0, n * 4));
    DEV_CHECK(cudaMemsetAsync(done, 0, n * 4));
    void* args[] = {(void*)&c};
    DEV_CHECK(cudaLaunchCooperativeKernel((void*)chain_persistent<U>, dim3(pgrid), dim3(kThreads), args, 0, 0));
  };
  const Stage all{reinterpret_cast<const uint4*>(buf), total / 16};

  // validation first (fresh outputs each time: y is zeroed inside each run)
  DEV_CHECK(cudaGraphLaunch(g_chain, 0));
  DEV_CHECK(cudaDeviceSynchronize());
  check("kernels");
  DEV_CHECK(cudaMemset(y, 0xFF, n * 4));   // poison between the variants
  DEV_CHECK(cudaGraphLaunch(g_ctr, 0));
  DEV_CHECK(cudaDeviceSynchronize());
  check("counters");
  DEV_CHECK(cudaMemset(y, 0xFF, n * 4));
  DEV_CHECK(cudaGraphLaunch(pf_runs.front().g, 0));
  DEV_CHECK(cudaDeviceSynchronize());
  check("kernels + L2 prefetch");
  for (const FixRun& r : fix_runs) {
    DEV_CHECK(cudaMemset(y, 0xFF, n * 4));
    DEV_CHECK(cudaGraphLaunch(r.g, 0));
    DEV_CHECK(cudaDeviceSynchronize());
    check("kernels + fixed work");
  }
  DEV_CHECK(cudaMemset(y, 0xFF, n * 4));
  run_persistent();
  DEV_CHECK(cudaDeviceSynchronize());
  check("persistent");

  const int iters = 10, reps = 7;
  const double t_chain = dev::median_us([&](int) { DEV_CHECK(cudaGraphLaunch(g_chain, 0)); }, iters, reps);
  const double t_ctr = dev::median_us([&](int) { DEV_CHECK(cudaGraphLaunch(g_ctr, 0)); }, iters, reps);
  const double t_pers = dev::median_us([&](int) { run_persistent(); }, iters, reps);
  const double t_free = dev::median_us([&](int) { DEV_CHECK(cudaGraphLaunch(g_free, 0)); }, iters, reps);
  const double t_ceil = dev::median_us([&](int) { all_at_once<U><<<grid, kThreads>>>(all, sink); }, iters, reps);
  auto row = [&](const char* what, double us) {
    std::printf("%-26s %9.1f us  %6.3f TB/s  %5.1f %% of the ceiling  %6.2f us a layer\n", what, us, total / us / 1e6,
                100.0 * t_ceil / us, us / layers);
  };
  std::printf("grid: kernels / counters / unchained / ceiling %d blocks, persistent %d (%d an SM resident); "
              "U = %d loads a thread\n",
              grid, pgrid, per_sm, U);
  row("ceiling", t_ceil);
  row("unchained", t_free);
  row("kernels", t_chain);
  row("counters", t_ctr);
  for (const PfRun& r : pf_runs) {
    const double t = dev::median_us([&](int) { DEV_CHECK(cudaGraphLaunch(r.g, 0)); }, iters, reps);
    char what[64], res[16] = "";
    if (r.R > 0) std::snprintf(res, sizeof res, ", %d an SM", r.R);
    if (r.mb > 0)
      std::snprintf(what, sizeof what, "%s+pf %g MB %s%s", r.dep == kGridDep ? "kernels" : "unchained", r.mb,
                    r.end ? "end" : "start", res);
    else
      std::snprintf(what, sizeof what, "kernels%s", res);
    row(what, t);
  }
  for (const FixRun& r : fix_runs) {
    const double t = dev::median_us([&](int) { DEV_CHECK(cudaGraphLaunch(r.g, 0)); }, iters, reps);
    char what[64];
    std::snprintf(what, sizeof what, "kernels+fixed%s%s%s%s", r.fix & kFixX ? " x" : "", r.fix & kFixNorm ? " norm" : "",
                  r.fix & kFixCluster ? " cluster" : "", r.R > 0 ? ", 4 an SM" : "");
    row(what, t);
  }
  row("persistent", t_pers);
  return 0;
}
