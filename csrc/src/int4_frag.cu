// The repack of layout-1 INT4 weights into the fragment order (int4_frag.cuh), in place on the device: the weight's
// words and scales are copied to a scratch, then one thread per output word (and per output scale) gathers its
// codes from the copy. Run once per weight at load (model.cu). Its numpy twin is tests/fragment_order.py; the test
// tests/test_gpu_frag_repack.py compares the two bit for bit.
#include "int4_frag.cuh"
#include "format_contract.h"
#include "model_file.h"

namespace nq {
namespace {

// The source of P row r (PAIR) or W row r: (tensor 0 = gate / the weight, 1 = up; its row)
template <bool PAIR>
__device__ __forceinline__ int src_row(int r, int* which) {
  if (!PAIR) {
    *which = 0;
    return r;
  }
  return frag::pair_src_row(r, which);
}

// Value position v (0..7) of a file word -> its nibble (kInt4Perm: nibble i holds value kInt4Perm[i])
__device__ __forceinline__ int file_nibble(int v) { return (v >> 1) + 4 * (v & 1); }

// Output words of rows [0, R) (R = N, or 2I for the pair): word index ((nb * KB + kb) * 32 + lane) * 4 + w of the
// output matrix; tiles below `split_tile` go to out0, the rest to out1 (tile - split_tile).
template <bool PAIR>
__global__ void frag_repack_words(const uint32_t* __restrict__ src0, const uint32_t* __restrict__ src1, int K,
                                  long long total, int split_tile, uint32_t* out0, uint32_t* out1) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int KB = K / frag::kStepK;
  const int w = (int)(i & 3), lane = (int)((i >> 2) & 31);
  const long long tk = i >> 7;                 // nb * KB + kb
  const int kb = (int)(tk % KB), nb = (int)(tk / KB);
  uint32_t word = 0;
#pragma unroll
  for (int n = 0; n < 8; n++) {
    int which = 0;
    const int row = src_row<PAIR>(frag::kTileRows * nb + frag::nibble_row(lane, w, n), &which);
    const int k = frag::kStepK * kb + frag::nibble_k(lane, n);
    const uint32_t s = (which ? src1 : src0)[(size_t)row * (K / 8) + k / 8];
    word |= ((s >> (4 * file_nibble(k & 7))) & 15u) << (4 * n);
  }
  const long long per_tile = (long long)KB * 128;   // words of one 64-row tile
  if (nb < split_tile) out0[i] = word;
  else out1[i - (long long)split_tile * per_tile] = word;
}

// Output scales: index ((nb * G + gi) * 8 + g) * 8 + j <- the scale of row 64 nb + 8 j + g, group gi
template <bool PAIR>
__global__ void frag_repack_scales(const __half* __restrict__ src0, const __half* __restrict__ src1, int G,
                                   long long total, int split_tile, __half* out0, __half* out1) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int j = (int)(i & 7), g = (int)((i >> 3) & 7);
  const long long tg = i >> 6;                 // nb * G + gi
  const int gi = (int)(tg % G), nb = (int)(tg / G);
  int which = 0;
  const int row = src_row<PAIR>(frag::kTileRows * nb + 8 * j + g, &which);
  const __half v = (which ? src1 : src0)[(size_t)row * G + gi];
  const long long per_tile = (long long)G * 64;
  if (nb < split_tile) out0[i] = v;
  else out1[i - (long long)split_tile * per_tile] = v;
}

size_t word_bytes(const LinW& W) { return (size_t)W.N * W.K / 2; }
size_t scale_bytes(const LinW& W) { return (size_t)W.N * (W.K / W.group) * 2; }

int check_repackable(const LinW& W, const char* what) {
  if (W.type != WT_INT4 || W.zeros != nullptr || W.order != ORDER_FILE)
    return fail(NQ_E_INVALID_ARG, "%s: only a layout-1 INT4 weight in the file's order is repacked", what);
  if (!contract::int4_group_ok(W.group, W.K) || !frag::shape_ok(W.N, W.K, W.group))
    return fail(NQ_E_UNSUPPORTED, "%s: shape %d x %d group %d has no fragment order", what, W.N, W.K, W.group);
  return NQ_OK;
}

// Copies W's words and scales into scratch at `at` (returns the scratch's words and scales)
int copy_out(const LinW& W, uint8_t* at, cudaStream_t st, const uint32_t** words, const __half** scales) {
  const size_t soff = align128(word_bytes(W));
  NQ_CUDA(cudaMemcpyAsync(at, W.w, word_bytes(W), cudaMemcpyDeviceToDevice, st));
  NQ_CUDA(cudaMemcpyAsync(at + soff, W.scales, scale_bytes(W), cudaMemcpyDeviceToDevice, st));
  *words = reinterpret_cast<const uint32_t*>(at);
  *scales = reinterpret_cast<const __half*>(at + soff);
  return NQ_OK;
}

template <bool PAIR>
int launch_repack(const uint32_t* w0, const uint32_t* w1, const __half* s0, const __half* s1, int rows, int K,
                  int group, int split_tile, uint8_t* out_w0, uint8_t* out_w1, const __half* out_s0,
                  const __half* out_s1, cudaStream_t st) {
  constexpr int kThreads = 256;
  const long long nw = (long long)rows * K / 8, ns = (long long)rows * (K / group);
  frag_repack_words<PAIR><<<(unsigned)((nw + kThreads - 1) / kThreads), kThreads, 0, st>>>(
      w0, w1, K, nw, split_tile, reinterpret_cast<uint32_t*>(out_w0), reinterpret_cast<uint32_t*>(out_w1));
  NQ_LAUNCH_CHECK("frag_repack_words");
  frag_repack_scales<PAIR><<<(unsigned)((ns + kThreads - 1) / kThreads), kThreads, 0, st>>>(
      s0, s1, K / group, ns, split_tile, const_cast<__half*>(out_s0), const_cast<__half*>(out_s1));
  NQ_LAUNCH_CHECK("frag_repack_scales");
  return NQ_OK;
}

}  // namespace

size_t frag_repack_scratch_bytes(const LinW& W) {
  if (W.type != WT_INT4 || W.group <= 0) return 0;
  return align128(align128(word_bytes(W)) + scale_bytes(W));
}

int frag_repack(LinW* W, void* scratch, size_t scratch_bytes, cudaStream_t st) {
  NQ_TRY(check_repackable(*W, "frag_repack"));
  if (scratch_bytes < frag_repack_scratch_bytes(*W)) return fail(NQ_E_INVALID_ARG, "frag_repack: scratch too small");
  const uint32_t* w;
  const __half* s;
  NQ_TRY(copy_out(*W, static_cast<uint8_t*>(scratch), st, &w, &s));
  uint8_t* out = const_cast<uint8_t*>(W->w);
  NQ_TRY(launch_repack<false>(w, w, s, s, W->N, W->K, W->group, W->N / frag::kTileRows, out, out, W->scales,
                              W->scales, st));
  W->order = ORDER_FRAG;
  return NQ_OK;
}

int frag_repack_pair(LinW* gate, LinW* up, void* scratch, size_t scratch_bytes, cudaStream_t st) {
  NQ_TRY(check_repackable(*gate, "frag_repack_pair (gate)"));
  NQ_TRY(check_repackable(*up, "frag_repack_pair (up)"));
  if (gate->N != up->N || gate->K != up->K || gate->group != up->group)
    return fail(NQ_E_INVALID_ARG, "frag_repack_pair: gate and up differ in shape or group");
  const size_t g_bytes = frag_repack_scratch_bytes(*gate);
  if (scratch_bytes < g_bytes + frag_repack_scratch_bytes(*up))
    return fail(NQ_E_INVALID_ARG, "frag_repack_pair: scratch too small");
  const uint32_t *gw, *uw;
  const __half *gs, *us;
  NQ_TRY(copy_out(*gate, static_cast<uint8_t*>(scratch), st, &gw, &gs));
  NQ_TRY(copy_out(*up, static_cast<uint8_t*>(scratch) + g_bytes, st, &uw, &us));
  NQ_TRY(launch_repack<true>(gw, uw, gs, us, 2 * gate->N, gate->K, gate->group, gate->N / frag::kTileRows,
                             const_cast<uint8_t*>(gate->w), const_cast<uint8_t*>(up->w), gate->scales, up->scales,
                             st));
  gate->order = ORDER_FRAG_PAIR;
  up->order = ORDER_FRAG_PAIR;
  return NQ_OK;
}

}  // namespace nq
