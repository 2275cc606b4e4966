// Helpers shared by the testing library's entry points: an RAII device buffer, int4 weights placed as the file
// places them, the paged KV cache filled from (position, kv head, dim) arrays, CUDA-event timing.
#pragma once
#include "kernels.h"
#include "model_file.h"
#include "nanoqwen_testing.h"
#include <algorithm>
#include <vector>

namespace nq {
namespace testing {

// RAII device buffer: freed on every exit path.
struct DBuf {
  void* p = nullptr;
  DBuf() = default;
  DBuf(const DBuf&) = delete;
  DBuf& operator=(const DBuf&) = delete;
  ~DBuf() { if (p) cudaFree(p); }
  int alloc(size_t n) {
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(n, 16));
    if (e != cudaSuccess) return fail(cuda_status(e), "cudaMalloc(%zu): %s", n, cudaGetErrorString(e));
    return NQ_OK;
  }
  int put(const void* h, size_t n) {
    NQ_TRY(alloc(n));
    NQ_CUDA(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
    return NQ_OK;
  }
  int poison(size_t n) {  // 0xff bytes: NaN in f16 and f32, so an unwritten output fails a finiteness check
    NQ_CUDA(cudaMemset(p, 0xff, n));
    return NQ_OK;
  }
  template <class T> T* as() const { return static_cast<T*>(p); }
};

// int4 weight placed like the file does: qweight, pad to 128, scales (layout 1); with zeros (uint8 (N, K/g), may
// be null) layout 2: then pad to 128 and the zero points
inline int put_int4(DBuf& b, const uint32_t* qw, const uint16_t* sc, const uint8_t* zeros, int N, int K, int g,
                    LinW* w) {
  const size_t qbytes = (size_t)N * K / 2, off = align128(qbytes), sbytes = (size_t)N * (K / g) * 2;
  const size_t zoff = align128(off + sbytes), zbytes = zeros ? (size_t)N * (K / g) : 0;
  NQ_TRY(b.alloc(zeros ? zoff + zbytes : off + sbytes));
  NQ_CUDA(cudaMemcpy(b.p, qw, qbytes, cudaMemcpyHostToDevice));
  NQ_CUDA(cudaMemcpy(static_cast<char*>(b.p) + off, sc, sbytes, cudaMemcpyHostToDevice));
  if (zeros) NQ_CUDA(cudaMemcpy(static_cast<char*>(b.p) + zoff, zeros, zbytes, cudaMemcpyHostToDevice));
  w->w = b.as<uint8_t>();
  w->scales = reinterpret_cast<const __half*>(static_cast<char*>(b.p) + off);
  w->zeros = zeros ? static_cast<const uint8_t*>(b.p) + zoff : nullptr;
  w->N = N; w->K = K; w->group = g; w->type = WT_INT4;
  return NQ_OK;
}

// put_int4 (layout 1), then the repack into the fragment order on the device (int4_frag.cuh), as the loader does
// on a GPU where int4_fragment_order_available(): the product's kernels then take their fragment-order paths.
inline int put_int4_frag(DBuf& b, const uint32_t* qw, const uint16_t* sc, int N, int K, int g, LinW* w) {
  NQ_TRY(put_int4(b, qw, sc, nullptr, N, K, g, w));
  DBuf scratch;
  NQ_TRY(scratch.alloc(frag_repack_scratch_bytes(*w)));
  NQ_TRY(frag_repack(w, scratch.p, frag_repack_scratch_bytes(*w), 0));
  NQ_CUDA(cudaDeviceSynchronize());
  return NQ_OK;
}
// The same for a gate/up pair (ORDER_FRAG_PAIR on both)
inline int put_int4_frag_pair(DBuf& bg, DBuf& bu, const uint32_t* qg, const uint16_t* sg, const uint32_t* qu,
                              const uint16_t* su, int I, int K, int g, LinW* gate, LinW* up) {
  NQ_TRY(put_int4(bg, qg, sg, nullptr, I, K, g, gate));
  NQ_TRY(put_int4(bu, qu, su, nullptr, I, K, g, up));
  const size_t n = frag_repack_scratch_bytes(*gate) + frag_repack_scratch_bytes(*up);
  DBuf scratch;
  NQ_TRY(scratch.alloc(n));
  NQ_TRY(frag_repack_pair(gate, up, scratch.p, n, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  return NQ_OK;
}

// Bytes of one int4 N x K matrix of group g placed as the file places it: qweight, pad to 128, scales, pad to 128;
// layout 2 (zp) then the zero points, pad to 128.
inline size_t int4_copy_bytes(int N, int K, int g, bool zp = false) {
  const size_t l1 = align128(align128((size_t)N * K / 2) + (size_t)N * (K / g) * 2);
  return zp ? align128(l1 + (size_t)N * (K / g)) : l1;
}

// Random int4 weights (codes from an LCG, every scale 2^-7; layout 2 (zp): zero points from the LCG too, 0..15) of
// `copies` N x K matrices placed back to back, each as the file places one (int4_copy_bytes); *per = bytes per copy.
inline int put_random_int4(DBuf& b, int N, int K, int g, int copies, uint64_t seed, size_t* per, bool zp = false) {
  const size_t off = align128((size_t)N * K / 2), zoff = int4_copy_bytes(N, K, g);
  *per = int4_copy_bytes(N, K, g, zp);
  NQ_TRY(b.alloc(*per * copies));
  std::vector<uint8_t> h(*per);
  uint64_t st = seed;
  for (size_t i = 0; i < off; i++) { st = st * 6364136223846793005ull + 1442695040888963407ull; h[i] = (uint8_t)(st >> 56); }
  for (size_t i = off; i + 1 < zoff; i += 2) { h[i] = 0x00; h[i + 1] = 0x20; }  // scale 2^-7 ~ 0.0078
  for (size_t i = zoff; i < *per; i++) { st = st * 6364136223846793005ull + 1442695040888963407ull; h[i] = (uint8_t)(st >> 60); }
  NQ_CUDA(cudaMemcpy(b.p, h.data(), *per, cudaMemcpyHostToDevice));
  for (int c = 1; c < copies; c++) NQ_CUDA(cudaMemcpy(b.as<uint8_t>() + *per * c, b.p, *per, cudaMemcpyDeviceToDevice));
  return NQ_OK;
}
inline LinW int4_copy(const DBuf& b, size_t per, int c, int N, int K, int g, bool zp = false) {
  LinW L;
  L.w = b.as<uint8_t>() + per * c;
  L.scales = reinterpret_cast<const __half*>(b.as<uint8_t>() + per * c + align128((size_t)N * K / 2));
  L.zeros = zp ? b.as<uint8_t>() + per * c + int4_copy_bytes(N, K, g) : nullptr;
  L.N = N; L.K = K; L.group = g; L.type = WT_INT4;
  return L;
}

// The paged f16 cache of one layer holding rows 0 .. n_rows-1 of k/v (n_pos, n_kv, D) f32, for n_pos positions;
// pages in REVERSED physical order to exercise the page table.
struct PagedCache {
  std::vector<int> page_table;
  std::vector<__half> k, v;
};
inline PagedCache fill_paged_cache(const float* k, const float* v, int n_rows, int n_pos, int n_kv, int D) {
  PagedCache c;
  const int pages = (n_pos + kPage - 1) / kPage;
  c.page_table.resize(pages);
  for (int i = 0; i < pages; i++) c.page_table[i] = pages - 1 - i;
  c.k.assign((size_t)pages * n_kv * kPage * D, __float2half(0.f));
  c.v.assign(c.k.size(), __float2half(0.f));
  for (int j = 0; j < n_rows; j++)
    for (int h = 0; h < n_kv; h++)
      for (int d = 0; d < D; d++) {
        const size_t idx = (((size_t)c.page_table[j / kPage] * n_kv + h) * kPage + j % kPage) * D + d;
        c.k[idx] = __float2half_rn(k[((size_t)j * n_kv + h) * D + d]);
        c.v[idx] = __float2half_rn(v[((size_t)j * n_kv + h) * D + d]);
      }
  return c;
}

// A one-token decode launch's keys (n_pos) bounded as a session's decode graphs bound them (session.cu): a
// short-context graph's where they fit kAttnMaxCluster blocks (clusters where C x attn_cluster_keys_per_block(D) >=
// n_pos), else none (every split's partial merged by attn_merge_kernel)
inline void bound_decode_keys(AttnArgs& a, int n_pos) {
  if (n_pos <= kAttnMaxCluster * attn_cluster_keys_per_block(a.D)) a.cluster_keys = n_pos;
}

// Milliseconds per call of `iters` calls of run(i) on stream 0 after `warm` untimed ones (CUDA events).
template <class F>
int time_ms(int warm, int iters, F run, float* ms) {
  for (int i = 0; i < warm; i++) NQ_TRY(run(i));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  NQ_CUDA(cudaEventCreate(&e0));
  if (cudaEventCreate(&e1) != cudaSuccess) { cudaEventDestroy(e0); return fail(NQ_E_CUDA, "cudaEventCreate failed"); }
  int rc = NQ_OK;
  cudaEventRecord(e0, 0);
  for (int i = 0; i < iters && rc == NQ_OK; i++) rc = run(i);
  cudaEventRecord(e1, 0);
  cudaError_t e = cudaEventSynchronize(e1);
  float t = 0.f;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&t, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (rc != NQ_OK) return rc;
  if (e != cudaSuccess) return fail(NQ_E_CUDA, "bench timing: %s", cudaGetErrorString(e));
  *ms = t / iters;
  return NQ_OK;
}

inline int check_nk(int N, int K) {
  if (N <= 0 || K <= 0 || K % 32) return fail(NQ_E_INVALID_ARG, "N=%d, K=%d: need N > 0 and K a positive multiple of 32", N, K);
  return NQ_OK;
}
// An int4 N x K matrix of group g: checked before anything divides by g (the kernels' own check comes later).
inline int check_int4(int N, int K, int g) {
  NQ_TRY(check_nk(N, K));
  if (!contract::int4_group_ok(g, K)) return fail(NQ_E_INVALID_ARG, "group %d does not fit K=%d", g, K);
  return NQ_OK;
}

}  // namespace testing
}  // namespace nq
