// Paged-KV attention (decode and prefill share it) + RoPE/KV-cache write.
//
// One query token a block: attn_decode_kernel. Grid (n_kv, n_split, M): block (h, s, t) serves query token t for the
// G = n_heads/n_kv query heads of KV head h (they share one read of K and V), over keys [s*kps, min((s+1)*kps, pos+1)).
// Token t is at *pos0 + pos_offset + t in the session's cache (decode: M = 1; a prefill chunk of a few tokens with
// the keys split), or, in a batched decode step, token t of sequence t at pos_of[t] in kv_of[t] through
// page_table_of[t]. kps = max(keys_per_split, ceil32((pos+1)/n_split)) is computed from the position at run time, so
// every split has work at any context length and one captured graph serves all positions; blocks past the last used
// split return at once (split_plan). One split: the block writes the f16 output itself. Several: each writes a
// partial (m, l, O / l) per head, and attn_merge_kernel, launched after it, merges them (a block a query head).
// Clusters (sm_90, a session's short-context decode graphs; kernels.h): the keys spread over one cluster of C splits
// that merge in distributed shared memory and write the output, no merge kernel after. Decode (write_kv):
// the block whose key range holds the current position writes rope(k), v into the cache and puts the same f16 row
// into its shared tile directly (no write-then-read round trip).
// Tensor cores: the G heads are the rows of one m16 tile and a tile of keys is one 16-key page (the kernel's
// comment below). The CUDA-core kernel it replaced (bench/NOTES.md "Session 16") took 9.6 us a 7B layer at 577 keys
// and one token, against 7.0 (4 warps a block then; 6.3 with the 8-warp build of one block an SM, "Session 21").
//
// Many query tokens (prefill, n_split 1): attn_prefill_fa (attn_prefill.cuh), FlashAttention-2 style.
#include "kernels.h"
#include "device_util.cuh"
#include "launch.h"
#include "cp_async.cuh"
#include "sm90_sync.cuh"
#include "attn_prefill.cuh"
#include <cooperative_groups.h>
#include <math_constants.h>
#include <type_traits>

namespace nq {
namespace {

constexpr int kMaxG = 8;

// Token t's position: in a batched decode step, sequence t's (pos_of); else *pos0 + pos_offset + t
__device__ __forceinline__ int token_pos(const AttnArgs& a, int t) {
  return a.kv_of != nullptr ? a.pos_of[t] : *a.pos0 + a.pos_offset + t;
}

// How a launch splits a token's n_keys keys over `spread` blocks (a plain launch: its n_split; a cluster launch: its
// first cluster's C), as the decode kernel runs it and the merge kernel reads it back: kps keys a split (at least
// keys_per_split, a multiple of 32), n_used splits with keys (<= spread)
struct SplitPlan {
  int kps, n_used;
};
__device__ __forceinline__ SplitPlan split_plan(const AttnArgs& a, int n_keys, int spread) {
  SplitPlan p;
  p.kps = max(a.keys_per_split, ((n_keys + spread - 1) / spread + 31) / 32 * 32);
  p.n_used = (n_keys + p.kps - 1) / p.kps;
  return p;
}

// ---- attn_decode_kernel: one query token a block, on tensor cores ------------------------------------------------
// A CUDA-core kernel (a lane per key for the scores, a thread per dim for P.V) is bound by its shared-memory
// instructions: it reads q for every key and p for every key and head (~1 TB/s of K/V at 32 rows x 577 keys,
// bench/NOTES.md "Session 15"). Here the G query heads of the KV head are the rows of one m16 tile (rows G..15 zero)
// and the keys its columns:
//   S = Q K^T: A = Q (ldmatrix.x4, kept in registers), B = a K tile (ldmatrix.x4 of [key][d] rows: B's "col" layout);
//   O += P V:  A = the S fragments rounded to f16 (rows 8..15 are pads: zero), B = ldmatrix.x4.trans of [key][d] V rows;
// online softmax per row in the log2 domain (q is scaled by log2(e)/sqrt(D)). A tile is one 16-key page of one KV
// head (4 KB of K and 4 KB of V at D = 128), copied with cp.async into a ring of kStages stages per warp; warp w of
// the block's WARPS takes its tiles w, w + WARPS, ... with its own ring, softmax state and O, and the warps' results
// are merged in shared memory at the end (WARPS: 8 or 4, launch_decode below). Shared-memory rows are D halves, their
// 16-byte chunks XOR-swizzled by row (chunk c of row r at c ^ (r & 7)) so that ldmatrix's 8 rows of one chunk hit
// distinct banks.
constexpr int kKT = 16;       // keys per tile (= kPage: a tile is one page)
constexpr int kStages = 2;    // ring stages per warp
static_assert(kKT == kPage, "an attention tile is one KV page");
// CLUSTER builds are launched in clusters of C <= kAttnMaxCluster blocks along the splits (sm_90, launch_decode), for
// launches whose tokens have at most C x attn_cluster_keys_per_block(D) keys: the first cluster's C blocks take the
// keys and merge in distributed shared memory (no partials in global memory, no merge kernel after); the other
// clusters' blocks leave at once. A separate build: the cluster code in the plain one cost ~0.25 us a launch at
// every context (bench/NOTES.md "Session 22" §2).

template <int D, int WARPS>
struct AttnSmem {
  static constexpr int TILE_H = kKT * D;   // halves of one K (or V) tile
  static constexpr int LDQ = D + 8;             // q rows 16 B apart mod 128 B
  // obuf rows 8 floats apart mod 32 banks: a warp's float2 stores of O (lane (g, tq) at row g, column 8 n + 2 tq) hit
  // distinct banks in each half-warp; with rows of D floats all 8 rows of g fell on one bank pair (8-way conflicts,
  // ~1.2 us of the block's merge: bench/NOTES.md "Session 25" §4)
  static constexpr int LDO = D + 8;
  union {
    __half ring[WARPS][kStages][2][TILE_H];   // per warp and stage: K tile, V tile
    float obuf[WARPS][kMaxG][LDO];                       // the warps' O, scaled to the block's max
  } u;
  __align__(16) __half q[16][LDQ];   // roped q of the G heads times log2(e)/sqrt(D), f16; rows G..15 zero
  __align__(16) __half knew[D];      // this step's roped k and v (the cache row at pos)
  __align__(16) __half vnew[D];
  float wm[WARPS][kMaxG], wl[WARPS][kMaxG];
  float inv[kMaxG];
};

// The cluster build's shared memory: AttnSmem and the receive side of the merge (kept out of the other builds: the
// 4-warp build's 3 blocks an SM would not fit). From rank z: its (m, l) of head hg at recv_ml[z][hg], and its O chunk
// (4 floats) of this rank's j-th item at recv_o[z * per + j] (per = ceil(items / C), items = G x D / 4); recv_full:
// the mbarrier that counts those bytes (one arrival, the rank's own expect_tx).
template <int D, int WARPS>
struct AttnSmemCluster : AttnSmem<D, WARPS> {
  float2 recv_ml[kAttnMaxCluster][kMaxG];
  float4 recv_o[kMaxG * (D / 4) + kAttnMaxCluster];
  unsigned long long recv_full;
};
template <int D, int WARPS, bool CLUSTER>
using AttnSmemOf = std::conditional_t<CLUSTER, AttnSmemCluster<D, WARPS>, AttnSmem<D, WARPS>>;

// The cluster merge's items (4 outputs of one head each, G x D / 4 of them) that rank z of C owns: items
// [z per, (z + 1) per), per = ceil(items / C), clipped to the items there are (0 for ranks past the last)
[[maybe_unused]] __device__ __forceinline__ int attn_merge_items(int items, int C, int z) {   // unused in the sm_80 pass
  const int per = (items + C - 1) / C;
  return max(0, min(per, items - z * per));
}

// byte offset of 16-byte chunk c of row r in a swizzled [rows][D] f16 tile
template <int D>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return (uint32_t)(r * D + ((c ^ (r & 7)) << 3)) * 2u;
}

template <int D, int WARPS, bool CLUSTER>
__global__ void __launch_bounds__(WARPS * 32) attn_decode_kernel(const AttnArgs a) {
  constexpr int THREADS = WARPS * 32;
  constexpr int CPR = D / 8;                 // 16-byte chunks per row
  constexpr int KS = D / 16, ND = D / 8;     // k-steps of S = Q K^T; n8 tiles of O
  extern __shared__ __align__(128) unsigned char attn_smem[];
  AttnSmemOf<D, WARPS, CLUSTER>& S = *reinterpret_cast<AttnSmemOf<D, WARPS, CLUSTER>*>(attn_smem);
  const int h = blockIdx.x, split = blockIdx.y, t = blockIdx.z;
  const int G = a.n_heads / a.n_kv;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  // Decode and the batched step (write_kv) issue their first K/V tiles before the PDL wait: every cache row they read
  // was written by an earlier step (the row at pos comes from this kernel's own registers), and the positions, page
  // tables and cache pointers were set before the step's first kernel, which has completed by the time this kernel
  // can start (its predecessor triggers only after its own wait). So the tiles' DRAM latency overlaps the tail of the
  // GEMV or GEMM before. A prefill chunk (no write_kv) reads the rows rope_kv_write, the kernel before, wrote: it
  // waits first.
  if (!a.write_kv) {
    pdl_wait();
    pdl_trigger();
  }
  const bool batched = a.kv_of != nullptr;   // token t of sequence t (attention() checks the three arrays)
  const int pos = token_pos(a, t);
  const KvLayer kv = batched ? a.kv_of[t] : a.kv;
  const int* pt = batched ? a.page_table_of[t] : a.page_table;
  const int n_keys = pos + 1;
  int C = 1;   // blocks a cluster
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (CLUSTER) C = (int)cooperative_groups::this_cluster().num_blocks();
#endif
  // A cluster launch (a short-context graph's, whose keys the host bounds: launch_decode) spreads the keys over its
  // first cluster; any count is right there, more only slower
  const SplitPlan plan = split_plan(a, n_keys, C > 1 ? C : a.n_split);   // uniform over the grid
  const int kps = plan.kps, n_used = plan.n_used;
  // dsmem: the first cluster's blocks merge in distributed shared memory, each one of them (also those without keys:
  // m = -inf, l = 0, O = 0) reaching the prologue's cluster barrier and pushing its partial. Else a block without
  // keys leaves here.
  const bool dsmem = C > 1 && n_used > 1;
  if (split >= (dsmem ? C : n_used)) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (CLUSTER) if (dsmem) {   // the merge's receive mbarrier, published before any rank can push (decode:
    if (tid == 0) {                     // before the PDL wait, so the cluster barrier overlaps the kernel before)
      mbarrier_init(smem_u32(&S.recv_full), 1);
      // the bytes this rank receives: from each of the C ranks, its O chunk of each of this rank's items and, where
      // this rank has items, its (m, l) of every head (attn_merge_items)
      const int z = (int)cooperative_groups::this_cluster().block_rank();
      const int n_items = attn_merge_items(G * (D / 4), C, z);
      mbarrier_arrive_expect_tx(smem_u32(&S.recv_full), n_items > 0 ? (uint32_t)(C * (n_items * 16 + G * 8)) : 0u);
      fence_mbarrier_init_cluster();
    }
    cluster_arrive_relaxed();   // fence.mbarrier_init orders the init before it
    cluster_wait();
  }
#endif
  const int k0 = split * kps, k1 = min(n_keys, k0 + kps);
  const int ntiles = k1 > k0 ? (k1 - k0 + kKT - 1) / kKT : 0;
  const bool own = a.write_kv && pos >= k0 && pos < k1;   // this block writes the cache row at pos
  const int skip = own ? pos : -1;                        // that row comes from knew / vnew, not the cache
  const size_t page_stride = (size_t)a.n_kv * kPage * D;   // elements per physical page

  const uint32_t ring_u = smem_u32(&S.u.ring[warp][0][0][0]);
  constexpr uint32_t kStageBytes = 2u * kKT * D * 2u, kTileBytes = kKT * D * 2u;
  // The pages of the warp's tiles: lane i holds the page of the warp's tile 32 c + i (c: the last chunk of 32 tiles
  // read), so a tile's copies wait for no page-table load of their own (k0 is a multiple of kPage: tile t of the
  // block is page k0 / kPage + t).
  int pages_chunk = -1, lane_page = 0;
  // the warp's j-th tile (block tile warp + WARPS j) into stage j % kStages; one commit group per call, empty or not
  auto issue = [&](int j) {
    if ((j >> 5) != pages_chunk) {   // warp-uniform
      pages_chunk = j >> 5;
      const int tl = warp + WARPS * (32 * pages_chunk + lane);
      lane_page = tl < ntiles ? pt[k0 / kPage + tl] : 0;
    }
    const int page = __shfl_sync(0xffffffffu, lane_page, j & 31);
    const int tile = warp + WARPS * j;
    if (tile < ntiles) {
      const int kt0 = k0 + tile * kKT;
      const size_t base = ((size_t)page * page_stride) + (size_t)h * kPage * D;
      const uint32_t st = ring_u + (uint32_t)(j % kStages) * kStageBytes;
#pragma unroll
      for (int p = 0; p < kKT * CPR / 32; p++) {
        const int ci = lane + 32 * p, r = ci / CPR, c = ci % CPR;
        const int key = kt0 + r;
        if (key == skip) continue;           // this step's row: from knew / vnew below
        const int bytes = key < k1 ? 16 : 0; // past the range: zeros (the page's unwritten rows are NaN-poisoned)
        const size_t off = base + (size_t)r * D + c * 8;
        cp_async16(st + swz<D>(r, c), kv.k + off, bytes);
        cp_async16(st + kTileBytes + swz<D>(r, c), kv.v + off, bytes);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int j = 0; j < kStages; j++) issue(j);
  if (a.write_kv) {   // q, k and v of this step come from the kernel before
    pdl_wait();
    pdl_trigger();
  }

  // q: roped, scaled, f16; rows past G zero. The owning block also writes rope(k), v into the cache row at pos. Every
  // global load is issued first, then the arithmetic and the stores: one L2 round trip after the PDL wait (a loop of
  // load-then-use took one a row batch, and the owning block's k / v one more: bench/NOTES.md "Session 25" §5).
  const float* qkv = a.qkv + (size_t)t * a.qkv_stride;
  const float2* rope = a.rope + (size_t)pos * (D / 2);
  const float qscale = 1.4426950408889634f * rsqrtf((float)D);
  constexpr int QPT = (kMaxG * (D / 2) + THREADS - 1) / THREADS;   // (head, rotation pair) items a thread, at most
  static_assert(D / 2 <= THREADS, "one rotation pair of k and v a thread");
  const int q_items = G * (D / 2);
  float qx0[QPT], qx1[QPT];
  float2 qcs[QPT];
#pragma unroll
  for (int k = 0; k < QPT; k++) {
    const int i = tid + k * THREADS;
    if (i < q_items) {
      const int r = i / (D / 2), d = i % (D / 2);
      const float* qin = qkv + (h * G + r) * D;
      qcs[k] = rope[d];
      qx0[k] = qin[d];
      qx1[k] = qin[d + D / 2];
    }
  }
  const bool kv_lane = own && tid < D / 2;   // this thread writes rotation pair tid of the step's k and v
  float kx0 = 0.f, kx1 = 0.f, vx0 = 0.f, vx1 = 0.f;
  float2 kcs = make_float2(0.f, 0.f);
  int kpage = 0;
  if (kv_lane) {
    const float* kin = qkv + a.n_heads * D + h * D;
    const float* vin = qkv + (a.n_heads + a.n_kv) * D + h * D;
    kcs = rope[tid];
    kx0 = kin[tid]; kx1 = kin[tid + D / 2];
    vx0 = vin[tid]; vx1 = vin[tid + D / 2];
    kpage = pt[pos / kPage];
  }
#pragma unroll
  for (int k = 0; k < QPT; k++) {
    const int i = tid + k * THREADS;
    if (i < q_items) {
      const int r = i / (D / 2), d = i % (D / 2);
      const float2 cs = qcs[k];
      S.q[r][d] = __float2half_rn((qx0[k] * cs.x - qx1[k] * cs.y) * qscale);
      S.q[r][d + D / 2] = __float2half_rn((qx1[k] * cs.x + qx0[k] * cs.y) * qscale);
    }
  }
  for (int i = q_items + tid; i < 16 * (D / 2); i += THREADS) {   // rows G..15: zero
    const int r = i / (D / 2), d = i % (D / 2);
    S.q[r][d] = __float2half_rn(0.f);
    S.q[r][d + D / 2] = __float2half_rn(0.f);
  }
  if (kv_lane) {
    const int i = tid;
    const size_t idx = (((size_t)kpage * a.n_kv + h) * kPage + (pos % kPage)) * (size_t)D;
    const __half k0h = __float2half_rn(kx0 * kcs.x - kx1 * kcs.y), k1h = __float2half_rn(kx1 * kcs.x + kx0 * kcs.y);
    const __half v0h = __float2half_rn(vx0), v1h = __float2half_rn(vx1);
    kv.k[idx + i] = k0h; kv.k[idx + i + D / 2] = k1h;
    kv.v[idx + i] = v0h; kv.v[idx + i + D / 2] = v1h;
    S.knew[i] = k0h; S.knew[i + D / 2] = k1h;
    S.vnew[i] = v0h; S.vnew[i + D / 2] = v1h;
  }
  __syncthreads();   // q, knew, vnew staged

  uint32_t qf[KS][4];   // A fragments of Q, k-step ks: rows (lane & 7) + 8 ((lane >> 3) & 1), dims 16 ks + 8 (lane >> 4)
  {
    const uint32_t q_u = smem_u32(&S.q[0][0]);
    const int qr = (lane & 7) + 8 * ((lane >> 3) & 1), qc = 8 * (lane >> 4);
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
      ldmatrix_x4(qf[ks], q_u + 2u * (uint32_t)(qr * AttnSmem<D, WARPS>::LDQ + 16 * ks + qc));
  }
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run = -CUDART_INF_F, l_run = 0.f;   // row g of the warp's keys (the quad's 4 lanes agree)
  // ldmatrix lane roles: K (non-trans): matrix mi = lane >> 3 is (keys 8 (mi >> 1) .., chunk 2 ks + (mi & 1));
  // V (trans): (keys 8 (mi & 1) .., chunk 2 dp + (mi >> 1))
  const int mi = lane >> 3, mr = lane & 7;
  const int k_row = mr + 8 * (mi >> 1), k_chunk = mi & 1;
  const int v_row = mr + 8 * (mi & 1), v_chunk = mi >> 1;

  const int my_tiles = ntiles > warp ? (ntiles - warp + WARPS - 1) / WARPS : 0;
  for (int j = 0; j < my_tiles; j++) {
    cp_async_wait<kStages - 1>();
    const int tile = warp + WARPS * j, kt0 = k0 + tile * kKT;
    const uint32_t st = ring_u + (uint32_t)(j % kStages) * kStageBytes;
    if (own && pos >= kt0 && pos < kt0 + kKT && lane < 2 * CPR) {   // this step's row from registers' copy
      const int r = pos - kt0, c = lane % CPR;
      const __half* src = lane < CPR ? S.knew : S.vnew;
      const uint4 v = *reinterpret_cast<const uint4*>(src + c * 8);
      const uint32_t dst = st + (lane < CPR ? 0u : kTileBytes) + swz<D>(r, c);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
    }
    __syncwarp();
    // S = Q K^T: two n8 tiles (keys 0-7, 8-15)
    float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      uint32_t b[4];
      ldmatrix_x4(b, st + swz<D>(k_row, 2 * ks + k_chunk));
      mma16816(sc[0], qf[ks], b[0], b[1]);
      mma16816(sc[1], qf[ks], b[2], b[3]);
    }
    // online softmax of row g over the tile's keys kt0 + 8 n + 2 tq + e (keys >= k1: none)
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        if (kt0 + 8 * n + 2 * tq + e >= k1) sc[n][e] = -CUDART_INF_F;
        mx = fmaxf(mx, sc[n][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx);            // finite: every tile has a key below k1
    const float corr = exp2f(m_run - m_new);         // 0 on the warp's first tile
    float p[2][2], ps = 0.f;
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        p[n][e] = exp2f(sc[n][e] - m_new);           // 0 for the keys set to -inf
        ps += p[n][e];
      }
    ps += __shfl_xor_sync(0xffffffffu, ps, 1);
    ps += __shfl_xor_sync(0xffffffffu, ps, 2);
    l_run = l_run * corr + ps;
    m_run = m_new;
#pragma unroll
    for (int n = 0; n < ND; n++) { o[n][0] *= corr; o[n][1] *= corr; }
    // O += P V: A = P (rows 8..15 zero), one k-step of the tile's 16 keys
    const uint32_t pa[4] = {h2_as_u32(__floats2half2_rn(p[0][0], p[0][1])), 0u,
                            h2_as_u32(__floats2half2_rn(p[1][0], p[1][1])), 0u};
#pragma unroll
    for (int dp = 0; dp < D / 16; dp++) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, st + kTileBytes + swz<D>(v_row, 2 * dp + v_chunk));
      mma16816(o[2 * dp], pa, b[0], b[1]);
      mma16816(o[2 * dp + 1], pa, b[2], b[3]);
    }
    __syncwarp();   // every lane's ldmatrix of this stage is done before it is refilled
    issue(j + kStages);
  }
  cp_async_wait<0>();
  // the warps' (m, l, O) into the block's: O_w scaled by exp2(m_w - m) in shared memory, summed over warps
  if (tq == 0 && g < G) { S.wm[warp][g] = m_run; S.wl[warp][g] = l_run; }
  __syncthreads();   // every warp is done with its ring: obuf may overwrite it
  if (g < G) {
    float mb = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < WARPS; w++) mb = fmaxf(mb, S.wm[w][g]);
    const float f = mb == -CUDART_INF_F ? 0.f : exp2f(m_run - mb);   // 0 for a warp without tiles (m_run = -inf)
#pragma unroll
    for (int n = 0; n < ND; n++) {
      *reinterpret_cast<float2*>(&S.u.obuf[warp][g][8 * n + 2 * tq]) = make_float2(o[n][0] * f, o[n][1] * f);
    }
  }
  __syncthreads();   // the warps' O in obuf
  __half* out = a.out + (size_t)t * a.n_heads * D + h * G * D;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (CLUSTER) if (dsmem) {   // rank r of the cluster merges items [r per, (r + 1) per) over the C blocks' (m, l, O), in rank order
    // push (sm90_sync.cuh), straight from the warps' buffers: this block's O chunk of item i (summed over its warps
    // in warp order) to the rank owning i, and its (m, l) of every head to every rank that owns items, each by
    // st.async, which signals the receiver's mbarrier (no fence, no arrival, no further barrier in this block)
    const int z = (int)cooperative_groups::this_cluster().block_rank();
    const int items = G * (D / 4), per = (items + C - 1) / C;   // per <= THREADS: one item a thread below
    static_assert(kMaxG * (D / 4) / 2 <= THREADS, "a rank's items (C >= 2) fit one a thread");
    for (int i = tid; i < items; i += THREADS) {
      const int hg = i / (D / 4), d = (i % (D / 4)) * 4, r = i / per;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < WARPS; w++) {
        const float4 x = *reinterpret_cast<const float4*>(&S.u.obuf[w][hg][d]);
        v.x += x.x; v.y += x.y; v.z += x.z; v.w += x.w;
      }
      st_async_v4(map_cluster(&S.recv_o[z * per + (i - r * per)], r), v, map_cluster(&S.recv_full, r));
    }
    if (tid < C * G && attn_merge_items(items, C, tid / G) > 0) {   // the block's max and sum of head tid % G
      const int hg = tid % G;
      float mb = -CUDART_INF_F;
      for (int w = 0; w < WARPS; w++) mb = fmaxf(mb, S.wm[w][hg]);
      float lb = 0.f;   // 0 in a block without keys: every warp's m is -inf
      if (mb != -CUDART_INF_F)
        for (int w = 0; w < WARPS; w++) lb += S.wl[w][hg] * exp2f(S.wm[w][hg] - mb);
      st_async_v2(map_cluster(&S.recv_ml[z][hg], tid / G), make_float2(mb, lb), map_cluster(&S.recv_full, tid / G));
    }
    // No exit barrier: a rank with items waits below for every byte pushed into it before its block can leave; a
    // rank without items is pushed nothing; st.async reads registers only, so a sender may leave once it has issued.
    if (tid < attn_merge_items(items, C, z)) {
      mbarrier_wait_parity_cluster(smem_u32(&S.recv_full), 0);   // every rank's pushes into this one
      const int i = z * per + tid, hg = i / (D / 4), d = (i % (D / 4)) * 4;
      float M = -CUDART_INF_F;
#pragma unroll
      for (int zz = 0; zz < kAttnMaxCluster; zz++)
        if (zz < C) M = fmaxf(M, S.recv_ml[zz][hg].x);   // finite: rank 0 has keys
      float L = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int zz = 0; zz < kAttnMaxCluster; zz++)
        if (zz < C) {
          const float2 ml = S.recv_ml[zz][hg];
          const float wz = exp2f(ml.x - M);   // 0 for a rank without keys
          const float4 v = S.recv_o[zz * per + tid];
          L = fmaf(ml.y, wz, L);
          acc.x = fmaf(v.x, wz, acc.x); acc.y = fmaf(v.y, wz, acc.y); acc.z = fmaf(v.z, wz, acc.z); acc.w = fmaf(v.w, wz, acc.w);
        }
      const float iv = 1.f / L;
      __half2* o2 = reinterpret_cast<__half2*>(out + hg * D + d);
      o2[0] = __floats2half2_rn(acc.x * iv, acc.y * iv);
      o2[1] = __floats2half2_rn(acc.z * iv, acc.w * iv);
    }
    return;
  }
#endif
  if (tid < G) {   // the block's max and sum of head tid
    float mb = -CUDART_INF_F;
    for (int w = 0; w < WARPS; w++) mb = fmaxf(mb, S.wm[w][tid]);
    float lb = 0.f;
    if (mb != -CUDART_INF_F)
      for (int w = 0; w < WARPS; w++) lb += S.wl[w][tid] * exp2f(S.wm[w][tid] - mb);
    S.wm[0][tid] = mb;   // read below only after the barrier; every warp's wm was read above
    S.inv[tid] = lb;
  }
  __syncthreads();
  const size_t ph0 = ((size_t)t * a.n_heads + h * G) * a.n_split;
  for (int i = tid; i < G * D; i += THREADS) {
    const int hg = i / D, d = i % D;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) v += S.u.obuf[w][hg][d];
    if (n_used == 1) out[hg * D + d] = __float2half_rn(v / S.inv[hg]);
    else a.part_o[(ph0 + (size_t)hg * a.n_split + split) * D + d] = __float2half_rn(v / S.inv[hg]);
  }
  if (n_used > 1 && tid < G) {   // attn_merge_kernel merges the splits' partials
    a.part_ml[(ph0 + (size_t)tid * a.n_split + split) * 2] = S.wm[0][tid];
    a.part_ml[(ph0 + (size_t)tid * a.n_split + split) * 2 + 1] = S.inv[tid];
  }
}

// ---- attn_merge_kernel: the partials of one query head into its output ------------------------------------------
// Grid (n_heads, M), kMergeThreads threads: block (hq, t) merges the n_merge partials (O / l in f16, (m, l) in f32)
// that the decode kernel's plain launch left for query head hq of token t (split_plan: one a split with keys) into out
// (f16 [D]); where it left one, it wrote the output itself and the block leaves. Thread (sg, c) takes dims
// 4c .. 4c + 3 of the partials sg, sg + NG, ... (NG split groups: 8 at D 128, 16 at D 64), loads a batch of
// kMergeBatch partials' O chunks and (m, l) before it uses any, and folds them into its running (m, l, acc): partial
// s weighs exp2(m_s - m) l_s. One batch covers NG x kMergeBatch partials (64 at D 128: the 7B's 33 splits in one L2
// round trip; with 128 threads two, 1.84 us from the wait to the folded partials at 8K in the chain trace, NOTES
// "Session 33" §4). Group 0 then merges the NG groups' states through shared memory. A head's partials are n_merge x
// D x 2 bytes (8.4 KB at the 7B's 33 splits), read by n_heads blocks on as many SMs at once. The decode kernel's last
// block per KV head merged them before (one SM reading G heads' partials after a GPU-scope atomic: ~4 us of the 7B
// layer's chain at 8K), and past 16K keys clusters of 8 splits merged in distributed shared memory first; H200, 7B
// (bench/NOTES.md "Session 33" §1-2): the merge kernel alone decodes after 8K / 32K tokens in 1.639 / 1.956 ms/token
// against 1.662-1.663 / 1.971 by those.
constexpr int kMergeThreads = 256, kMergeBatch = 8;

template <int D>
__global__ void __launch_bounds__(kMergeThreads) attn_merge_kernel(const AttnArgs a) {
  // The next kernel (o's GEMV) may enter and stream its weights now: its PDL wait is for this grid's end, which comes
  // after the decode kernel's (this grid's wait).
  pdl_trigger();
  pdl_wait();
  constexpr int CH = D / 4, NG = kMergeThreads / CH;   // 4-dim chunks of a head; split groups
  const int hq = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, c = tid % CH, sg = tid / CH;
  const int n_merge = split_plan(a, token_pos(a, t) + 1, a.n_split).n_used;
  if (n_merge == 1) return;   // block-uniform
  const size_t r0 = ((size_t)t * a.n_heads + hq) * a.n_split;
  const uint2* po = reinterpret_cast<const uint2*>(a.part_o + r0 * D) + c;
  const float2* pml = reinterpret_cast<const float2*>(a.part_ml) + r0;
  float m = -CUDART_INF_F, l = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = sg; s0 < n_merge; s0 += NG * kMergeBatch) {
    uint2 u[kMergeBatch];
    float2 ml[kMergeBatch];
#pragma unroll
    for (int k = 0; k < kMergeBatch; k++) {
      const int s = s0 + NG * k;
      const bool in = s < n_merge;
      u[k] = in ? __ldcg(po + (size_t)s * CH) : make_uint2(0u, 0u);
      ml[k] = in ? __ldcg(pml + s) : make_float2(-CUDART_INF_F, 0.f);
    }
    float mb = m;
#pragma unroll
    for (int k = 0; k < kMergeBatch; k++) mb = fmaxf(mb, ml[k].x);   // finite: partial s0 has keys
    const float f = exp2f(m - mb);                                   // 0 on the first batch (m = -inf)
    l *= f; acc.x *= f; acc.y *= f; acc.z *= f; acc.w *= f;
#pragma unroll
    for (int k = 0; k < kMergeBatch; k++) {
      const float w = exp2f(ml[k].x - mb) * ml[k].y;                 // 0 past n_merge
      const float2 v01 = __half22float2(*reinterpret_cast<const __half2*>(&u[k].x));
      const float2 v23 = __half22float2(*reinterpret_cast<const __half2*>(&u[k].y));
      l += w;
      acc.x = fmaf(v01.x, w, acc.x); acc.y = fmaf(v01.y, w, acc.y);
      acc.z = fmaf(v23.x, w, acc.z); acc.w = fmaf(v23.y, w, acc.w);
    }
    m = mb;
  }
  __shared__ float4 g_acc[NG][CH];
  __shared__ float2 g_ml[NG];
  g_acc[sg][c] = acc;
  if (c == 0) g_ml[sg] = make_float2(m, l);
  __syncthreads();
  if (sg != 0) return;
  float M = -CUDART_INF_F;
#pragma unroll
  for (int g = 0; g < NG; g++) M = fmaxf(M, g_ml[g].x);   // finite: group 0 has partial 0
  float L = 0.f;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int g = 0; g < NG; g++) {
    const float w = exp2f(g_ml[g].x - M);   // 0 for a group without partials (m = -inf)
    const float4 v = g_acc[g][c];
    L = fmaf(g_ml[g].y, w, L);
    o.x = fmaf(v.x, w, o.x); o.y = fmaf(v.y, w, o.y); o.z = fmaf(v.z, w, o.z); o.w = fmaf(v.w, w, o.w);
  }
  const float iv = 1.f / L;
  __half2* o2 = reinterpret_cast<__half2*>(a.out + ((size_t)t * a.n_heads + hq) * D + 4 * c);
  o2[0] = __floats2half2_rn(o.x * iv, o.y * iv);
  o2[1] = __floats2half2_rn(o.z * iv, o.w * iv);
}

// ---- Prefill attention (M > 1 query tokens, causal): attn_prefill_fa<Cfg> of attn_prefill.cuh (mma.sync, FlashAttention-2
// style, (token, head) rows packed densely, key splits over thread-block clusters where the grid is small); its
// design in that header. The product builds two Cfgs per head_dim (PrefillShort / PrefillLong below, by key count);
// csrc/dev/attn_prefill_fa.cu times the other variants and the kernel this one replaced (csrc/dev/attn_prefill_v1.cuh).

template <int D>
__global__ void rope_kv_kernel(const float* qkv, int qkv_stride, const int* pos0, KvLayer kv, const int* page_table,
                               const float2* rope, int n_heads, int n_kv) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x, h = blockIdx.y;
  const int pos = *pos0 + t;
  const float* kin = qkv + (size_t)t * qkv_stride + n_heads * D + h * D;
  const float* vin = qkv + (size_t)t * qkv_stride + (n_heads + n_kv) * D + h * D;
  const int page = page_table[pos / kPage];
  const size_t idx = (((size_t)page * n_kv + h) * kPage + pos % kPage) * D;
  const float2* r = rope + (size_t)pos * (D / 2);
  for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
    const float2 cs = r[i];
    const float x0 = kin[i], x1 = kin[i + D / 2];
    kv.k[idx + i] = __float2half_rn(x0 * cs.x - x1 * cs.y);
    kv.k[idx + i + D / 2] = __float2half_rn(x1 * cs.x + x0 * cs.y);
    kv.v[idx + i] = __float2half_rn(vin[i]);
    kv.v[idx + i + D / 2] = __float2half_rn(vin[i + D / 2]);
  }
}

}  // namespace

// Two builds of attn_prefill_fa, picked by the keys the chunk's last token sees (AttnArgs::max_keys; 0, unknown: the
// short build). Measured on the H200 (bench/NOTES.md Session 13, call 6: csrc/dev/attn_prefill_fa.cu, 7B, 512-token
// chunks): short key ranges are latency-bound and gain from many small blocks, long ones from 32-row warps and a
// key split over a cluster of 2 while the grid is under one block per SM.
//   short: w4m1k64s2q: 64 rows (4 warps x 16), Q in registers, 64-key tiles, 2 stages, no split (splits only lost):
//          512 tokens 23.6 us a layer (v1 37.3), 2,048 tokens in 4 chunks 194 (341);
//   long:  w4m2k32s3: 128 rows (4 warps x 32), 32-key tiles, 3 stages, split 2 (the 7B's 512-token chunk: 116 blocks
//          -> 232 on 132 SMs) or 1: 8K in 16 chunks 2,074 us (4,326), 32K in 64 chunks 27,205 (64,098), one launch
//          of 8K ~1,535 (2,556).
template <int D>
using PrefillShort = pf::Cfg<D, 4, 1, 64, 2, true, 2>;
template <int D>
using PrefillLong = pf::Cfg<D, 4, 2, 32, 3, false, 1>;
constexpr int kPrefillLongKeys = 2048;   // the crossover of the two builds' per-chunk times lies at ~1.2K-4K keys

template <int D>
int launch_prefill(const AttnArgs& a, cudaStream_t st) {
  if (a.max_keys < kPrefillLongKeys) return pf::launch_attn_prefill<PrefillShort<D>>(a, 1, st);
  using C = PrefillLong<D>;
  const int G = a.n_heads / a.n_kv, TQ = C::ROWS / G;
  const int blocks = a.n_kv * ((a.M + TQ - 1) / TQ);
  const int nsplit = pf::prefill_clusters_ok<C>() ? pf::prefill_splits(blocks, device_sms()) : 1;
  return pf::launch_attn_prefill<C>(a, nsplit, st);
}

// Two builds of attn_decode_kernel, by the launch's size. A launch of at most one block an SM (the decode step: SMs /
// n_kv splits, session.cu; the batched step, batch.cu) gets 8 warps a block where its shared memory fits the GPU
// (decode_build_fits): one block an SM (the K/V ring is 128 KB at D = 128) with 8 warps streaming keys, and half the
// partials to merge of 2 blocks an SM. Larger launches (few-token prefill chunks, a batched step of many rows) get 4
// warps (~71 KB: 3 blocks an SM). Measured on the H200 with 7B heads
// (bench/NOTES.md "Session 21" §2): at 8K / 32K keys 8 warps x 33 splits take 10.4 / 22.4 us against 14.4 / 29.8 for
// 4 warps x 64 splits. The 8-warp build has a cluster variant (CLUSTER) for launches whose keys the host bounds
// (AttnArgs::cluster_keys: a session's short-context graph): its splits merge in distributed shared memory.
constexpr int kDecodeWarpsOneWave = 8, kDecodeWarps = 4;

template <int D, int WARPS, bool CLUSTER>
cudaError_t decode_smem_raised() {
  static const cudaError_t raised = cudaFuncSetAttribute(attn_decode_kernel<D, WARPS, CLUSTER>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                         (int)sizeof(AttnSmemOf<D, WARPS, CLUSTER>));
  return raised;
}

// Whether a block of the build's shared memory fits this GPU (the 8-warp build's 136 KB at D = 128 does not where the
// opt-in limit is ~99 KB, e.g. sm_86 / sm_89, which run the sm_80 code: those keep the 4-warp build)
template <int D, int WARPS, bool CLUSTER = false>
bool decode_build_fits() {
  static const bool fits = [] {
    int dev = 0, optin = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
           (size_t)optin >= sizeof(AttnSmemOf<D, WARPS, CLUSTER>);
  }();
  return fits;
}

// The clusters of C blocks of the cluster build the GPU holds at once (0 where the kernel has no sm_90 code or its
// shared memory does not fit), asked once for every power of two C in [2, kAttnMaxCluster] (thread-safe: a function-local static)
template <int D>
int decode_max_clusters(int C) {
  struct Known { int n[kAttnMaxCluster + 1]; };
  static const Known known = [] {
    Known k{};
    auto kernel = attn_decode_kernel<D, kDecodeWarpsOneWave, true>;
    cudaFuncAttributes fa{};
    if (!decode_build_fits<D, kDecodeWarpsOneWave, true>() ||
        decode_smem_raised<D, kDecodeWarpsOneWave, true>() != cudaSuccess ||
        cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || fa.binaryVersion < 90)
      return k;
    for (int c = 2; c <= kAttnMaxCluster; c *= 2) {
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = 1; attr[0].val.clusterDim.y = c; attr[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(1, c, 1); cfg.blockDim = dim3(kDecodeWarpsOneWave * 32);
      cfg.dynamicSmemBytes = sizeof(AttnSmemOf<D, kDecodeWarpsOneWave, true>);
      cfg.attrs = attr; cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
      }
      k.n[c] = n;
    }
    return k;
  }();
  return C >= 2 && C <= kAttnMaxCluster ? known.n[C] : 0;
}

// The largest power of two <= kAttnMaxCluster dividing n_split whose clusters the GPU holds in one wave of
// n_kv x n_split x M blocks of the one-block-an-SM build; 1: none
template <int D>
int decode_cluster(int n_kv, int n_split, int M) {
  const long blocks = (long)n_kv * n_split * M;
  if (blocks > device_sms()) return 1;
  for (int C = kAttnMaxCluster; C >= 2; C /= 2)
    if (n_split % C == 0 && (long)decode_max_clusters<D>(C) * C >= blocks) return C;
  return 1;
}

template <int D, int WARPS, bool CLUSTER>
int launch_decode_build(const AttnArgs& a, int cluster, cudaStream_t st) {
  constexpr size_t smem = sizeof(AttnSmemOf<D, WARPS, CLUSTER>);
  const cudaError_t raised = decode_smem_raised<D, WARPS, CLUSTER>();
  if (raised != cudaSuccess)
    return fail(cuda_status(raised), "attention: %zu bytes of shared memory: %s", smem, cudaGetErrorString(raised));
  const dim3 grid(a.n_kv, a.n_split, a.M), block(WARPS * 32);
  if (CLUSTER)
    return launch_pdl_cluster("attn_decode_kernel", attn_decode_kernel<D, WARPS, CLUSTER>, grid, block,
                              dim3(1, cluster, 1), smem, st, a);
  return launch_pdl("attn_decode_kernel", attn_decode_kernel<D, WARPS, CLUSTER>, grid, block, smem, st, a);
}

template <int D>
int launch_decode(const AttnArgs& a, cudaStream_t st) {
  const long blocks = (long)a.n_kv * a.n_split * a.M;
  const bool one_wave = blocks <= device_sms() && decode_build_fits<D, kDecodeWarpsOneWave>();
  // a short-context graph's launch in clusters: the merge in distributed shared memory, no partials left
  const int C = one_wave && a.cluster_keys > 0 ? decode_cluster<D>(a.n_kv, a.n_split, a.M) : 1;
  if (C > 1 && a.cluster_keys <= C * attn_cluster_keys_per_block(D))
    return launch_decode_build<D, kDecodeWarpsOneWave, true>(a, C, st);
  const int rc = one_wave ? launch_decode_build<D, kDecodeWarpsOneWave, false>(a, 1, st)
                          : launch_decode_build<D, kDecodeWarps, false>(a, 1, st);
  if (rc != NQ_OK || a.n_split == 1) return rc;
  return launch_pdl("attn_merge_kernel", attn_merge_kernel<D>, dim3(a.n_heads, a.M), dim3(kMergeThreads), 0, st, a);
}

int attn_decode_cluster(int n_kv, int n_split, int D) {   // decode_max_clusters checks that the build fits
  return D == 128 ? decode_cluster<128>(n_kv, n_split, 1) : D == 64 ? decode_cluster<64>(n_kv, n_split, 1) : 1;
}

int attention(const AttnArgs& a, cudaStream_t st) {
  if (a.n_kv <= 0 || a.n_heads % a.n_kv || a.n_heads / a.n_kv > kMaxG)
    return fail(NQ_E_UNSUPPORTED, "attention: n_heads %d / n_kv %d (at most %d query heads per KV head)", a.n_heads, a.n_kv, kMaxG);
  if (a.n_split < 1 || a.n_split > kAttnMaxSplits)
    return fail(NQ_E_INVALID_ARG, "attention: n_split %d not in [1, %d]", a.n_split, kAttnMaxSplits);
  if (a.keys_per_split <= 0 || a.keys_per_split % 32)
    return fail(NQ_E_INVALID_ARG, "attention: keys_per_split %d", a.keys_per_split);
  if (a.D != 128 && a.D != 64) return fail(NQ_E_UNSUPPORTED, "attention: head_dim %d (64 or 128)", a.D);
  const bool batched = a.pos_of || a.kv_of || a.page_table_of;
  if (batched && !(a.pos_of && a.kv_of && a.page_table_of && a.write_kv))
    return fail(NQ_E_INVALID_ARG, "attention: a batched decode step needs pos_of, kv_of, page_table_of and write_kv");
  if (!batched && a.M > 1) {   // prefill: rope_kv_write wrote the cache
    if (a.write_kv) return fail(NQ_E_INVALID_ARG, "attention: write_kv with M = %d > 1", a.M);
    if (a.n_split == 1) return a.D == 128 ? launch_prefill<128>(a, st) : launch_prefill<64>(a, st);
    // a few tokens with the keys split: one query token a block, token t at *pos0 + pos_offset + t
  }
  return a.D == 128 ? launch_decode<128>(a, st) : launch_decode<64>(a, st);
}

int rope_kv_write(const float* qkv, int qkv_stride, int M, const int* pos0, KvLayer kv, const int* page_table,
                  const float2* rope, int n_heads, int n_kv, int D, cudaStream_t st) {
  dim3 grid(M, n_kv);
  if (D == 128)
    return launch_pdl("rope_kv_kernel", rope_kv_kernel<128>, grid, dim3(64), 0, st, qkv, qkv_stride, pos0, kv,
                      page_table, rope, n_heads, n_kv);
  if (D == 64)
    return launch_pdl("rope_kv_kernel", rope_kv_kernel<64>, grid, dim3(32), 0, st, qkv, qkv_stride, pos0, kv,
                      page_table, rope, n_heads, n_kv);
  return fail(NQ_E_UNSUPPORTED, "rope_kv_write: head_dim %d", D);
}

}  // namespace nq
