// Can the MLP be one grid-wide phase instead of two? (bench/NOTES.md "Session 41" §2.) Today a layer's MLP is two
// PDL kernels: gate/up (N = intermediate rows from x) hands over to down (N = hidden rows from all of h). In a fused
// form each block would compute a slice of h and then its down partial: W_down[:, slice] x h[slice], a whole hidden-
// length vector a block, summed across the grid by atomic adds into the next residual. That removes one PDL boundary
// a layer (~1.25-1.5 µs in isolation, "Session 36" §6) and adds the partials' reduction. This program times both
// chains with no weight bytes (the weights' streaming is the same either way), so what is timed is the boundaries,
// x's round trip, and the reduction:
//   split      two phases a layer, one kernel each (PDL): P1 reads kX words of x and writes its rows of h
//              (h[r] = S x a(r) + r, uint32); P2 reads kX words of h and writes its rows of the next x,
//              x'[r] = (x[r] & 255) + ((S x a(r) + r) >> 24). (The product's chain, as session 36's phase_floor.)
//   store      one phase a layer: each block computes its partial of every hidden output, p_b[i] = (S_b x a(i) + i)
//              >> 24, and stores it to its own row (no reduction: the floor of one phase doing this work; not
//              checked, and its x is never summed).
//   atomic     one phase a layer: the same partials added into the next x by vector atomics (float4 red.add, L2),
//              the residual (x[i] & 255) added once, by the block owning i's slice; the next x zeroed beforehand.
//   cluster C  one phase a layer: thread-block clusters of C blocks reduce their partials in distributed shared
//              memory first (each rank pushes slice j of its partials into rank j by st.async, the product's split
//              epilogue protocol, gemv_frag.cuh), then rank j adds slice j of the cluster's sum by atomics: C times
//              fewer atomics, one cluster launch.
// S_b = sum over j < kX of uint(x[(b kX + j) mod K]) x m(p, k) (mod 2^32), one round trip for x. Every value a chain
// keeps is an integer below 2^24 held in float32, so the sums are exact whatever the atomics' order: split, atomic and
// cluster must equal the CPU's final x exactly (validated before timing: split's outputs and h poisoned with NaN /
// all-ones words, the fused ways' targets zeroed, since they add into them).
// Grids 1, 2 and 4 blocks an SM of 128 threads (today's gate/up: 592 blocks on the 7B).
//
//   make -C csrc/dev && build/dev/mlp_phases [layers (28) [hidden intermediate heads kv_heads head_dim]]
//   e.g. the 0.5B: build/dev/mlp_phases 24 896 4864 14 2 64
#include "dev_common.cuh"
#include "device_util.cuh"
#include "launch.h"
#include "sm90_sync.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kX = 1024;                // words of x a block reads (kX / kThreads loads a thread, all in flight)
constexpr int kLoads = kX / kThreads;   // 8
constexpr int kMaxHidden = 8192;        // the cluster way's shared buffer (32 KB)

__host__ __device__ inline uint32_t m_of(int p, int k) { return ((uint32_t)k * 2654435761u + (uint32_t)p * 40503u) | 1u; }
__host__ __device__ inline uint32_t a_of(int p, int r) { return ((uint32_t)r * 2246822519u + (uint32_t)p) | 1u; }
__host__ __device__ inline uint32_t partial_of(uint32_t S, int p, int i) { return (S * a_of(p, i) + (uint32_t)i) >> 24; }
// block b of B owns outputs [first_of(N, b, B), first_of(N, b + 1, B))
__host__ __device__ inline int first_of(int N, int b, int B) { return (int)((long long)N * b / B); }

struct Chain {
  float* xs;      // [layers + 1][H]: x_0 (the seed), then each layer's output
  uint32_t* h;    // [layers][I] (split)
  float* rows;    // [B][H] (store)
  int H, I, layers;
};

// the kX words of v (length K) block b reads, the indices and multipliers computed before the dependency
struct Pre {
  int k[kLoads];
  uint32_t m[kLoads];
};
__device__ __forceinline__ Pre pre_of(int p, int K) {
  Pre pre;
#pragma unroll
  for (int i = 0; i < kLoads; i++) {
    pre.k[i] = (int)((blockIdx.x * (unsigned)kX + i * kThreads + threadIdx.x) % (unsigned)K);
    pre.m[i] = m_of(p, pre.k[i]);
  }
  return pre;
}
// S_b over v: the loads all issued, then a block reduction (every thread gets S)
template <typename T>
__device__ __forceinline__ uint32_t block_sum(const T* v, const Pre& pre, uint32_t* red) {
  uint32_t w[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; i++) w[i] = (uint32_t)__ldcg(v + pre.k[i]);   // x: integers held in float32
  uint32_t s = 0;
#pragma unroll
  for (int i = 0; i < kLoads; i++) s += w[i] * pre.m[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  s = 0;
#pragma unroll
  for (int w2 = 0; w2 < kThreads / 32; w2++) s += red[w2];
  return s;
}

// split, P1 (phase 2l): h_l's rows from x_l
__global__ void __launch_bounds__(kThreads) split_up(Chain c, int l) {
  __shared__ uint32_t red[kThreads / 32];
  const Pre pre = pre_of(2 * l, c.H);
  nq::pdl_wait();
  nq::pdl_trigger();
  const uint32_t S = block_sum(c.xs + (size_t)l * c.H, pre, red);
  uint32_t* h = c.h + (size_t)l * c.I;
  for (int r = first_of(c.I, blockIdx.x, gridDim.x) + threadIdx.x; r < first_of(c.I, blockIdx.x + 1, gridDim.x);
       r += kThreads)
    h[r] = S * a_of(2 * l, r) + (uint32_t)r;
}
// split, P2 (phase 2l + 1): x_{l+1}'s rows from h_l, the residual from x_l
__global__ void __launch_bounds__(kThreads) split_down(Chain c, int l) {
  __shared__ uint32_t red[kThreads / 32];
  const Pre pre = pre_of(2 * l + 1, c.I);
  nq::pdl_wait();
  nq::pdl_trigger();
  const uint32_t S = block_sum(c.h + (size_t)l * c.I, pre, red);
  const float* x = c.xs + (size_t)l * c.H;
  float* y = c.xs + (size_t)(l + 1) * c.H;
  for (int r = first_of(c.H, blockIdx.x, gridDim.x) + threadIdx.x; r < first_of(c.H, blockIdx.x + 1, gridDim.x);
       r += kThreads)
    y[r] = (float)(((uint32_t)__ldcg(x + r) & 255u) + partial_of(S, 2 * l + 1, r));
}

// y[0..3] += v, one vector reduction at L2 (red: no value returned; atomicAdd(float4 *) compiles to atom)
__device__ __forceinline__ void red_add_v4(float4* y, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(y), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// element i's residual term, added once: by the block (atomic) or cluster (cluster) owning i's slice
__device__ __forceinline__ float residual_of(const float* x, int i, int owner, int me) {
  return owner == me ? (float)((uint32_t)__ldcg(x + i) & 255u) : 0.f;
}

// The fused ways add into x_{l+1}, so it must be zero before layer l: layer l zeroes x_{l+2} (block b its slice),
// which nothing reads or writes until layer l + 1, and that starts after layer l has completed (its PDL wait). In the
// product the o projection would write the residual there instead. Layer 0's x_1 is zeroed by the host, for the
// validated run; the timed runs after it keep adding into x_1 (finite, no longer exact: only their time counts).
__device__ __forceinline__ void zero_ahead(const Chain& c, int l, int b, int B) {
  if (l + 2 > c.layers) return;
  float* z = c.xs + (size_t)(l + 2) * c.H;
  for (int i = first_of(c.H, b, B) + threadIdx.x; i < first_of(c.H, b + 1, B); i += kThreads) z[i] = 0.f;
}

// store / atomic (one phase a layer): every hidden output's partial from this block
template <bool kAtomic>
__global__ void __launch_bounds__(kThreads) fused_flat(Chain c, int l) {
  __shared__ uint32_t red[kThreads / 32];
  const Pre pre = pre_of(2 * l, c.H);
  nq::pdl_wait();
  nq::pdl_trigger();
  const float* x = c.xs + (size_t)l * c.H;
  const int b = blockIdx.x, B = gridDim.x;
  if (kAtomic) zero_ahead(c, l, b, B);
  const uint32_t S = block_sum(x, pre, red);
  for (int g = threadIdx.x; g < c.H / 4; g += kThreads) {
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int i = 4 * g + e;
      v[e] = (float)partial_of(S, 2 * l + 1, i);
      if (kAtomic) v[e] += residual_of(x, i, (int)(((long long)i * B) / c.H), b);
    }
    const float4 f = make_float4(v[0], v[1], v[2], v[3]);
    if (kAtomic) red_add_v4(reinterpret_cast<float4*>(c.xs + (size_t)(l + 1) * c.H) + g, f);
    else reinterpret_cast<float4*>(c.rows + (size_t)b * c.H)[g] = f;
  }
}

// cluster C (one phase a layer): the cluster's partials summed in rank j's shared memory for slice j, then added
template <int C>
__global__ void __launch_bounds__(kThreads) fused_cluster(Chain c, int l) {
  __shared__ uint32_t red[kThreads / 32];
  __shared__ __align__(16) float slots[kMaxHidden];   // [C][H / C]: row z = rank z's partials of this rank's slice
  __shared__ __align__(8) uint64_t full;
  const int sl = c.H / C, me = (int)(blockIdx.x % C), cl = (int)(blockIdx.x / C), ncl = (int)(gridDim.x / C);
  if (threadIdx.x == 0) {
    nq::mbarrier_init(nq::smem_u32(&full), 1);
    nq::mbarrier_arrive_expect_tx(nq::smem_u32(&full), (uint32_t)(c.H * sizeof(float)));   // C ranks x sl floats
    nq::fence_mbarrier_init_cluster();
  }
  nq::cluster_arrive_relaxed();
  const Pre pre = pre_of(2 * l, c.H);
  nq::cluster_wait();
  nq::pdl_wait();
  nq::pdl_trigger();
  const float* x = c.xs + (size_t)l * c.H;
  zero_ahead(c, l, blockIdx.x, gridDim.x);
  const uint32_t S = block_sum(x, pre, red);
  for (int g = threadIdx.x; g < c.H / 4; g += kThreads) {   // push: element i goes to rank i / sl, row me
    const int i = 4 * g, owner = i / sl;
    const float4 f = make_float4((float)partial_of(S, 2 * l + 1, i), (float)partial_of(S, 2 * l + 1, i + 1),
                                 (float)partial_of(S, 2 * l + 1, i + 2), (float)partial_of(S, 2 * l + 1, i + 3));
    nq::st_async_v4(nq::map_cluster(&slots[me * sl + (i - owner * sl)], owner), f, nq::map_cluster(&full, owner));
  }
  nq::mbarrier_wait_parity_cluster(nq::smem_u32(&full), 0);   // every rank's partials of this rank's slice
  float4* y = reinterpret_cast<float4*>(c.xs + (size_t)(l + 1) * c.H);
  for (int g = threadIdx.x; g < sl / 4; g += kThreads) {
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int j = 4 * g + e, i = me * sl + j;
      float s = residual_of(x, i, (int)(((long long)i * ncl) / c.H), cl);
      for (int z = 0; z < C; z++) s += slots[z * sl + j];
      v[e] = s;
    }
    red_add_v4(y + (me * sl) / 4 + g, make_float4(v[0], v[1], v[2], v[3]));
  }
  // no exit barrier: every rank waits for all pushes into it before leaving (gemv_frag.cuh's protocol)
}

enum Way { kSplit, kStore, kAtomic, kCluster2, kCluster4, kCluster8 };
const char* way_name(Way w) {
  switch (w) {
    case kSplit: return "split";
    case kStore: return "store";
    case kAtomic: return "atomic";
    case kCluster2: return "cluster2";
    case kCluster4: return "cluster4";
    default: return "cluster8";
  }
}
int cluster_of(Way w) { return w == kCluster2 ? 2 : w == kCluster4 ? 4 : w == kCluster8 ? 8 : 1; }

}  // namespace

int main(int argc, char** argv) {
  int layers = 0;
  dev::Widths wd;
  if (!dev::layers_and_widths(argc, argv, "mlp_phases", layers, wd)) return 2;
  const int H = wd.hidden, I = wd.intermediate;
  if (H > kMaxHidden) {
    std::fprintf(stderr, "mlp_phases: hidden %d above %d\n", H, kMaxHidden);
    return 2;
  }
  int dev_id = 0, sms = 0;
  DEV_CHECK(cudaGetDevice(&dev_id));
  DEV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_id));
  const int max_b = 4 * sms;
  Chain c{nullptr, nullptr, nullptr, H, I, layers};
  DEV_CHECK(cudaMalloc(&c.xs, (size_t)(layers + 1) * H * 4));
  DEV_CHECK(cudaMalloc(&c.h, (size_t)layers * I * 4));
  DEV_CHECK(cudaMalloc(&c.rows, (size_t)max_b * H * 4));
  std::vector<float> seed(H);
  for (int i = 0; i < H; i++) seed[i] = (float)(dev::hash_word((uint64_t)i + 77) & 255u);
  std::printf("mlp_phases: %d layers, hidden %d, intermediate %d, %d SMs, %d words of x a block, %d threads a block\n",
              layers, H, I, sms, kX, kThreads);

  for (int bps : {1, 2, 4}) {
    const int B = bps * sms;
    // the CPU's chains for this grid: split's, and the fused ways' (atomic and cluster C sum the same partials)
    std::vector<float> xs_split(seed), xs_fused(seed);
    for (int l = 0; l < layers; l++) {
      std::vector<uint32_t> h(I);
      for (int b = 0; b < B; b++) {
        uint32_t S = 0;
        for (int j = 0; j < kX; j++) {
          const int k = (int)(((unsigned)b * kX + j) % (unsigned)H);
          S += (uint32_t)xs_split[k] * m_of(2 * l, k);
        }
        for (int r = first_of(I, b, B); r < first_of(I, b + 1, B); r++) h[r] = S * a_of(2 * l, r) + (uint32_t)r;
      }
      std::vector<float> y(H);
      for (int b = 0; b < B; b++) {
        uint32_t S = 0;
        for (int j = 0; j < kX; j++) {
          const int k = (int)(((unsigned)b * kX + j) % (unsigned)I);
          S += h[k] * m_of(2 * l + 1, k);
        }
        for (int r = first_of(H, b, B); r < first_of(H, b + 1, B); r++)
          y[r] = (float)(((uint32_t)xs_split[r] & 255u) + partial_of(S, 2 * l + 1, r));
      }
      xs_split = y;
      std::vector<double> sum(H);
      for (int i = 0; i < H; i++) sum[i] = (double)((uint32_t)xs_fused[i] & 255u);
      for (int b = 0; b < B; b++) {
        uint32_t S = 0;
        for (int j = 0; j < kX; j++) {
          const int k = (int)(((unsigned)b * kX + j) % (unsigned)H);
          S += (uint32_t)xs_fused[k] * m_of(2 * l, k);
        }
        for (int i = 0; i < H; i++) sum[i] += partial_of(S, 2 * l + 1, i);
      }
      for (int i = 0; i < H; i++) xs_fused[i] = (float)sum[i];   // < 2^24: exact
    }

    for (Way w : {kSplit, kStore, kAtomic, kCluster2, kCluster4, kCluster8}) {
      const int C = cluster_of(w);
      if (B % C != 0 || H % (4 * C) != 0) {
        std::printf("%-9s %4d blocks  skipped (the grid or hidden / 4 not a multiple of the cluster)\n", way_name(w), B);
        continue;
      }
      cudaStream_t st;
      DEV_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      cudaGraph_t g;
      cudaGraphExec_t ge;
      DEV_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (int l = 0; l < layers; l++) {
        const dim3 grid(B), block(kThreads), cl(C);
        switch (w) {
          case kSplit:
            dev::must(nq::launch_pdl("split_up", split_up, grid, block, 0, st, c, l));
            dev::must(nq::launch_pdl("split_down", split_down, grid, block, 0, st, c, l));
            break;
          case kStore: dev::must(nq::launch_pdl("fused_store", fused_flat<false>, grid, block, 0, st, c, l)); break;
          case kAtomic: dev::must(nq::launch_pdl("fused_atomic", fused_flat<true>, grid, block, 0, st, c, l)); break;
          case kCluster2:
            dev::must(nq::launch_pdl_cluster("fused_cluster2", fused_cluster<2>, grid, block, cl, 0, st, c, l));
            break;
          case kCluster4:
            dev::must(nq::launch_pdl_cluster("fused_cluster4", fused_cluster<4>, grid, block, cl, 0, st, c, l));
            break;
          default:
            dev::must(nq::launch_pdl_cluster("fused_cluster8", fused_cluster<8>, grid, block, cl, 0, st, c, l));
        }
      }
      DEV_CHECK(cudaStreamEndCapture(st, &g));
      DEV_CHECK(cudaGraphInstantiate(&ge, g, 0));
      DEV_CHECK(cudaGraphDestroy(g));
      // validation: x_0 the seed; split's outputs poisoned (NaN), the atomics' targets zeroed (they add into them)
      DEV_CHECK(cudaMemcpy(c.xs, seed.data(), (size_t)H * 4, cudaMemcpyHostToDevice));
      DEV_CHECK(cudaMemset(c.xs + H, w == kSplit ? 0xFF : 0, (size_t)layers * H * 4));
      DEV_CHECK(cudaMemset(c.h, 0xFF, (size_t)layers * I * 4));
      DEV_CHECK(cudaGraphLaunch(ge, st));
      DEV_CHECK(cudaStreamSynchronize(st));
      if (w != kStore) {
        std::vector<float> got(H);
        DEV_CHECK(cudaMemcpy(got.data(), c.xs + (size_t)layers * H, (size_t)H * 4, cudaMemcpyDeviceToHost));
        const std::vector<float>& ref = w == kSplit ? xs_split : xs_fused;
        for (int i = 0; i < H; i++)
          if (got[i] != ref[i]) {
            std::printf("%s, %d blocks: FAIL, output %d of the last layer: %.1f, CPU %.1f\n", way_name(w), B, i,
                        got[i], ref[i]);
            return 1;
          }
      }
      // timing: the graph again and again (zero_ahead: only the first run's values are checked)
      const double us = dev::median_us([&](int) { DEV_CHECK(cudaGraphLaunch(ge, 0)); }, 20, 9);
      std::printf("%-9s %4d blocks  %9.1f us a run  %6.2f us a layer%s\n", way_name(w), B, us, us / layers,
                  w == kStore ? "  (not checked: no reduction)" : "  (final x equals the CPU's)");
      DEV_CHECK(cudaGraphExecDestroy(ge));
      DEV_CHECK(cudaStreamDestroy(st));
    }
  }
  return 0;
}
