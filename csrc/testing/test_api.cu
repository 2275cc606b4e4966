// Kernel test entry points of libnanoqwen_testing (nanoqwen_testing.h): host arrays in, one kernel, host arrays
// out. Used by tests/test_gpu_kernels.py and tests/test_gpu_gemm.py to compare each kernel with a numpy reference.
#include "testing_util.h"
#include "session.h"
#include "int4_frag.cuh"
#include <cstring>

using namespace nq;
using namespace nq::testing;

namespace {
// Device buffers of one attention test: the paged cache, an identity rope table (q and k are given already
// rotated), the qkv rows, the first query position, partials for n_split splits of M tokens, the partials and the
// f16 output poisoned (a merge that read a partial no split wrote, or an output left unwritten, shows as NaN).
struct AttnBuffers {
  DBuf k, v, pt, rope, qkv, pos, part_o, part_ml, out;
  int setup(const PagedCache& c, const std::vector<float>& qkv_rows, int pos0, int n_pos, int n_heads, int n_kv, int D,
            int M, int n_split) {
    const std::vector<float2> rope_h((size_t)n_pos * (D / 2), make_float2(1.f, 0.f));
    NQ_TRY(k.put(c.k.data(), c.k.size() * 2));
    NQ_TRY(v.put(c.v.data(), c.v.size() * 2));
    NQ_TRY(pt.put(c.page_table.data(), c.page_table.size() * 4));
    NQ_TRY(rope.put(rope_h.data(), rope_h.size() * sizeof(float2)));
    NQ_TRY(qkv.put(qkv_rows.data(), qkv_rows.size() * 4));
    NQ_TRY(pos.put(&pos0, 4));
    NQ_TRY(part_o.alloc((size_t)M * n_heads * n_split * D * 2));
    NQ_TRY(part_o.poison((size_t)M * n_heads * n_split * D * 2));
    NQ_TRY(part_ml.alloc((size_t)M * n_heads * n_split * 2 * 4));
    NQ_TRY(part_ml.poison((size_t)M * n_heads * n_split * 2 * 4));
    NQ_TRY(out.alloc((size_t)M * n_heads * D * 2));
    return out.poison((size_t)M * n_heads * D * 2);
  }
  AttnArgs args(int qkv_stride, int M, int n_heads, int n_kv, int D) const {
    AttnArgs a;
    a.qkv = qkv.as<float>(); a.qkv_stride = qkv_stride; a.M = M; a.pos0 = pos.as<int>();
    a.kv.k = k.as<__half>(); a.kv.v = v.as<__half>(); a.page_table = pt.as<int>(); a.rope = rope.as<float2>();
    a.n_heads = n_heads; a.n_kv = n_kv; a.D = D;
    a.part_o = part_o.as<__half>(); a.part_ml = part_ml.as<float>();
    a.out = out.as<__half>();
    return a;
  }
  int read_out(float* dst, size_t n) const {  // n f16 outputs as f32
    std::vector<__half> h(n);
    NQ_CUDA(cudaMemcpy(h.data(), out.p, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) dst[i] = __half2float(h[i]);
    return NQ_OK;
  }
};

// The weights of a kernel test: as the file places them, or (frag) repacked into the fragment order on the device
// as the loader does on Hopper (layout 1 only).
int put_weight(DBuf& b, const uint32_t* qw, const uint16_t* sc, const uint8_t* zeros, int N, int K, int g, bool frag,
               LinW* w) {
  if (!frag) return put_int4(b, qw, sc, zeros, N, K, g, w);
  if (zeros) return fail(NQ_E_INVALID_ARG, "the fragment order takes layout 1 only (zeros must be NULL)");
  return put_int4_frag(b, qw, sc, N, K, g, w);
}

int test_gemv_int4(const uint32_t* qweight, const uint16_t* scales, const uint8_t* zeros, int32_t N, int32_t K,
                   int32_t group, const float* x, const float* norm_w, float eps, float* y, bool frag) {
  if (!qweight || !scales || !x || !y) return fail(NQ_E_INVALID_ARG, "nq_test_gemv_int4: NULL argument");
  NQ_TRY(check_int4(N, K, group));
  NQ_TRY(gemv_prepare());
  DBuf w, dx, dn, dy;
  GemvArgs a;
  NQ_TRY(put_weight(w, qweight, scales, zeros, N, K, group, frag, &a.seg[0]));
  NQ_TRY(dx.put(x, (size_t)K * 4));
  if (norm_w) NQ_TRY(dn.put(norm_w, (size_t)K * 4));
  NQ_TRY(dy.alloc((size_t)N * 4));
  NQ_TRY(dy.poison((size_t)N * 4));
  a.x_f32 = dx.as<float>(); a.norm_w = norm_w ? dn.as<float>() : nullptr; a.eps = eps;
  a.out_f32 = dy.as<float>(); a.mode = GEMV_STORE;
  NQ_TRY(gemv(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(y, dy.p, (size_t)N * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int test_gemv_int4_mode(const uint32_t* qweight, const uint16_t* scales, const uint8_t* zeros,
                        const uint32_t* qweight_up, const uint16_t* scales_up, const uint8_t* zeros_up, int32_t N,
                        int32_t K, int32_t group, const float* x, const float* norm_w, float eps, int32_t mode,
                        float* y, bool frag) {
  if (!qweight || !scales || !x || !y) return fail(NQ_E_INVALID_ARG, "nq_test_gemv_int4_mode: NULL argument");
  NQ_TRY(check_int4(N, K, group));
  if (mode != GEMV_ADD && mode != GEMV_SWIGLU) return fail(NQ_E_INVALID_ARG, "mode %d (1 = add, 2 = swiglu)", mode);
  if (mode == GEMV_SWIGLU && (!qweight_up || !scales_up)) return fail(NQ_E_INVALID_ARG, "swiglu needs the up weight");
  if (mode == GEMV_ADD && norm_w) return fail(NQ_E_INVALID_ARG, "add mode takes an f16 input without norm");
  NQ_TRY(gemv_prepare());
  DBuf w, wu, dx, dn, dy;
  GemvArgs a;
  if (frag && mode == GEMV_SWIGLU) {   // gate and up as the pair
    if (zeros || zeros_up) return fail(NQ_E_INVALID_ARG, "the fragment order takes layout 1 only (zeros must be NULL)");
    NQ_TRY(put_int4_frag_pair(w, wu, qweight, scales, qweight_up, scales_up, N, K, group, &a.seg[0], &a.up));
  } else {
    NQ_TRY(put_weight(w, qweight, scales, zeros, N, K, group, frag, &a.seg[0]));
  }
  a.eps = eps; a.mode = mode;
  if (mode == GEMV_ADD) {               // x as f16 (the o/down inputs), y += W x
    std::vector<__half> xh(K);
    for (int i = 0; i < K; i++) xh[i] = __float2half_rn(x[i]);
    NQ_TRY(dx.put(xh.data(), (size_t)K * 2));
    NQ_TRY(dy.put(y, (size_t)N * 4));
    a.x_f16 = dx.as<__half>(); a.out_f32 = dy.as<float>();
    NQ_TRY(gemv(a, 0));
    NQ_CUDA(cudaDeviceSynchronize());
    NQ_CUDA(cudaMemcpy(y, dy.p, (size_t)N * 4, cudaMemcpyDeviceToHost));
    return NQ_OK;
  }
  if (!frag) NQ_TRY(put_int4(wu, qweight_up, scales_up, zeros_up, N, K, group, &a.up));   // y = silu(Wg x) * (Wu x), out f16
  NQ_TRY(dx.put(x, (size_t)K * 4));
  if (norm_w) NQ_TRY(dn.put(norm_w, (size_t)K * 4));
  NQ_TRY(dy.alloc((size_t)N * 2));
  NQ_TRY(dy.poison((size_t)N * 2));
  a.x_f32 = dx.as<float>(); a.norm_w = norm_w ? dn.as<float>() : nullptr; a.out_f16 = dy.as<__half>();
  NQ_TRY(gemv(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  std::vector<__half> yh(N);
  NQ_CUDA(cudaMemcpy(yh.data(), dy.p, (size_t)N * 2, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++) y[i] = __half2float(yh[i]);
  return NQ_OK;
}

// q/k/v-like segments sharing x in one GEMV (STORE, f32 x, optional RMSNorm and biases), weights in the fragment
// order: y = the segments' outputs concatenated.
int test_gemv_int4_multi_frag(int32_t nseg, const uint32_t* const* qweights, const uint16_t* const* scales,
                              const int32_t* Ns, int32_t K, int32_t group, const float* x, const float* norm_w,
                              float eps, const float* const* bias, float* y) {
  if (!qweights || !scales || !Ns || !x || !y) return fail(NQ_E_INVALID_ARG, "nq_test_gemv_int4_multi_frag: NULL argument");
  if (nseg < 1 || nseg > 3) return fail(NQ_E_INVALID_ARG, "nseg=%d (1..3)", nseg);
  NQ_TRY(gemv_prepare());
  DBuf w[3], db[3], dx, dn, dy;
  GemvArgs a;
  a.nseg = nseg;
  int rows = 0;
  for (int i = 0; i < nseg; i++) {
    NQ_TRY(check_int4(Ns[i], K, group));
    if (!qweights[i] || !scales[i]) return fail(NQ_E_INVALID_ARG, "segment %d: NULL weight", i);
    NQ_TRY(put_int4_frag(w[i], qweights[i], scales[i], Ns[i], K, group, &a.seg[i]));
    if (bias && bias[i]) {
      NQ_TRY(db[i].put(bias[i], (size_t)Ns[i] * 4));
      a.bias[i] = db[i].as<float>();
    }
    rows += Ns[i];
  }
  NQ_TRY(dx.put(x, (size_t)K * 4));
  if (norm_w) NQ_TRY(dn.put(norm_w, (size_t)K * 4));
  NQ_TRY(dy.alloc((size_t)rows * 4));
  NQ_TRY(dy.poison((size_t)rows * 4));
  a.x_f32 = dx.as<float>(); a.norm_w = norm_w ? dn.as<float>() : nullptr; a.eps = eps;
  a.out_f32 = dy.as<float>(); a.mode = GEMV_STORE;
  NQ_TRY(gemv(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(y, dy.p, (size_t)rows * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}
}  // namespace

extern "C" {

int nq_test_gemv_int4(const uint32_t* qweight, const uint16_t* scales, const uint8_t* zeros, int32_t N, int32_t K,
                      int32_t group, const float* x, const float* norm_w, float eps, float* y) {
  return test_gemv_int4(qweight, scales, zeros, N, K, group, x, norm_w, eps, y, false);
}
int nq_test_gemv_int4_frag(const uint32_t* qweight, const uint16_t* scales, int32_t N, int32_t K, int32_t group,
                           const float* x, const float* norm_w, float eps, float* y) {
  return test_gemv_int4(qweight, scales, nullptr, N, K, group, x, norm_w, eps, y, true);
}
int nq_test_gemv_int4_mode(const uint32_t* qweight, const uint16_t* scales, const uint8_t* zeros,
                           const uint32_t* qweight_up, const uint16_t* scales_up, const uint8_t* zeros_up, int32_t N,
                           int32_t K, int32_t group, const float* x, const float* norm_w, float eps, int32_t mode,
                           float* y) {
  return test_gemv_int4_mode(qweight, scales, zeros, qweight_up, scales_up, zeros_up, N, K, group, x, norm_w, eps,
                             mode, y, false);
}
int nq_test_gemv_int4_mode_frag(const uint32_t* qweight, const uint16_t* scales, const uint32_t* qweight_up,
                                const uint16_t* scales_up, int32_t N, int32_t K, int32_t group, const float* x,
                                const float* norm_w, float eps, int32_t mode, float* y) {
  return test_gemv_int4_mode(qweight, scales, nullptr, qweight_up, scales_up, nullptr, N, K, group, x, norm_w, eps,
                             mode, y, true);
}
int nq_test_gemv_int4_multi_frag(int32_t nseg, const uint32_t* const* qweights, const uint16_t* const* scales,
                                 const int32_t* Ns, int32_t K, int32_t group, const float* x, const float* norm_w,
                                 float eps, const float* const* bias, float* y) {
  return test_gemv_int4_multi_frag(nseg, qweights, scales, Ns, K, group, x, norm_w, eps, bias, y);
}

int nq_test_gemv_dense(const uint16_t* wbits, int32_t dtype, int32_t N, int32_t K, const float* x, float* y) {
  if (!wbits || !x || !y) return fail(NQ_E_INVALID_ARG, "nq_test_gemv_dense: NULL argument");
  NQ_TRY(check_nk(N, K));
  if (dtype != WT_F16 && dtype != WT_BF16) return fail(NQ_E_INVALID_ARG, "dtype %d (1 = f16, 2 = bf16)", dtype);
  NQ_TRY(gemv_prepare());
  DBuf w, dx, dy;
  GemvArgs a;
  NQ_TRY(w.put(wbits, (size_t)N * K * 2));
  a.seg[0].w = w.as<uint8_t>(); a.seg[0].N = N; a.seg[0].K = K; a.seg[0].type = dtype;
  NQ_TRY(dx.put(x, (size_t)K * 4));
  NQ_TRY(dy.alloc((size_t)N * 4));
  NQ_TRY(dy.poison((size_t)N * 4));
  a.x_f32 = dx.as<float>(); a.out_f32 = dy.as<float>(); a.mode = GEMV_STORE;
  NQ_TRY(gemv(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(y, dy.p, (size_t)N * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_test_gemm_int4(const uint32_t* qweight, const uint16_t* scales, const uint8_t* zeros, int32_t N, int32_t K,
                      int32_t group, const float* A, int32_t M, float* C) {
  if (!qweight || !scales || !A || !C) return fail(NQ_E_INVALID_ARG, "nq_test_gemm_int4: NULL argument");
  NQ_TRY(check_int4(N, K, group));
  if (M <= 0) return fail(NQ_E_INVALID_ARG, "M=%d", M);
  DBuf w, da, dc;
  LinW W;
  NQ_TRY(put_int4(w, qweight, scales, zeros, N, K, group, &W));
  std::vector<__half> ah((size_t)M * K);
  for (size_t i = 0; i < ah.size(); i++) ah[i] = __float2half_rn(A[i]);
  NQ_TRY(da.put(ah.data(), ah.size() * 2));
  NQ_TRY(dc.alloc((size_t)M * N * 4));
  NQ_TRY(dc.poison((size_t)M * N * 4));
  NQ_TRY(gemm(W, da.as<__half>(), K, M, dc.as<float>(), N, nullptr, false, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(C, dc.p, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_test_gemm_dense(const uint16_t* w, int32_t dtype, int32_t N, int32_t K, const float* A, int32_t M, int32_t add,
                       float* C) {
  if (!w || !A || !C || N <= 0 || K <= 0 || M <= 0) return fail(NQ_E_INVALID_ARG, "nq_test_gemm_dense: bad argument");
  if (dtype != WT_F16 && dtype != WT_BF16) return fail(NQ_E_INVALID_ARG, "dtype %d (1 = f16, 2 = bf16)", dtype);
  DBuf dw, da, dc;
  NQ_TRY(dw.put(w, (size_t)N * K * 2));
  LinW W;
  W.w = dw.as<uint8_t>(); W.N = N; W.K = K; W.type = dtype;
  std::vector<__half> ah((size_t)M * K);
  for (size_t i = 0; i < ah.size(); i++) ah[i] = __float2half_rn(A[i]);
  NQ_TRY(da.put(ah.data(), ah.size() * 2));
  if (add) {
    NQ_TRY(dc.put(C, (size_t)M * N * 4));
  } else {
    NQ_TRY(dc.alloc((size_t)M * N * 4));
    NQ_TRY(dc.poison((size_t)M * N * 4));
  }
  NQ_TRY(gemm(W, da.as<__half>(), K, M, dc.as<float>(), N, nullptr, add != 0, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(C, dc.p, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_test_sample(const float* logits, int32_t V, const nq_sampling* sp, uint64_t counter, int32_t* out) {
  if (!logits || !sp || !out || V <= 0) return fail(NQ_E_INVALID_ARG, "nq_test_sample: bad argument");
  DBuf dl, dp, dc, dt;
  NQ_TRY(dl.put(logits, (size_t)V * 4));
  NQ_TRY(dp.put(sp, sizeof(nq_sampling)));
  unsigned long long c = counter;
  NQ_TRY(dc.put(&c, 8));
  NQ_TRY(dt.alloc(4));
  NQ_TRY(dt.poison(4));
  SampleArgs a;
  a.logits = dl.as<float>(); a.V = V; a.params = dp.as<nq_sampling>(); a.counter = dc.as<unsigned long long>();
  a.token_out = dt.as<int32_t>(); a.host_ring = nullptr; a.ring_size = 1;
  NQ_TRY(sample(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(out, dt.p, 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_test_attention(const float* q, const float* k, const float* v, int32_t n_heads, int32_t n_kv,
                      int32_t head_dim, int32_t n_pos, int32_t keys_per_split, float* out) {
  if (!q || !k || !v || !out || n_kv <= 0 || n_heads <= 0 || n_pos <= 0 || keys_per_split <= 0)
    return fail(NQ_E_INVALID_ARG, "nq_test_attention: bad argument");
  const int D = head_dim, pos = n_pos - 1;
  // q/k/v are given already rotated: use a rope table of (cos, sin) = (1, 0) for every position.
  // The cache holds rows 0 .. pos-1: the last position is written by the kernel (write_kv).
  const PagedCache cache = fill_paged_cache(k, v, pos, n_pos, n_kv, D);
  const int Nq = n_heads * D, Nkv = n_kv * D;
  std::vector<float> qkv(Nq + 2 * Nkv);
  std::memcpy(qkv.data(), q, Nq * 4);
  std::memcpy(qkv.data() + Nq, k + (size_t)pos * Nkv, Nkv * 4);
  std::memcpy(qkv.data() + Nq + Nkv, v + (size_t)pos * Nkv, Nkv * 4);
  const int n_split = (n_pos + keys_per_split - 1) / keys_per_split + 1;  // one spare split: must be ignored
  AttnBuffers b;
  NQ_TRY(b.setup(cache, qkv, pos, n_pos, n_heads, n_kv, D, 1, n_split));
  AttnArgs a = b.args(Nq + 2 * Nkv, 1, n_heads, n_kv, D);
  a.keys_per_split = keys_per_split; a.n_split = n_split; a.write_kv = true;
  bound_decode_keys(a, n_pos);   // as a session's graphs bound them
  NQ_TRY(attention(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  return b.read_out(out, Nq);
}

int nq_test_attention_batch(const float* q, const float* k, const float* v, const int32_t* n_pos, int32_t R,
                            int32_t P, int32_t n_heads, int32_t n_kv, int32_t head_dim, int32_t n_split, float* out) {
  if (!q || !k || !v || !n_pos || !out || R <= 0 || P <= 0 || n_kv <= 0 || n_heads <= 0 || n_heads % n_kv ||
      n_split <= 0)
    return fail(NQ_E_INVALID_ARG, "nq_test_attention_batch: bad argument");
  for (int r = 0; r < R; r++)
    if (n_pos[r] < 1 || n_pos[r] > P) return fail(NQ_E_INVALID_ARG, "nq_test_attention_batch: n_pos[%d] = %d", r, n_pos[r]);
  const int D = head_dim, pp = (P + kPage - 1) / kPage, pages = R * pp;
  const int Nq = n_heads * D, Nkv = n_kv * D, stride = Nq + 2 * Nkv;
  const size_t page_elems = (size_t)n_kv * kPage * D;
  // one pool: sequence r owns pages r, r + R, r + 2R, ... in reversed order (interleaved with the others'), every
  // element NaN until written; rows 0 .. n_pos[r] - 2 hold k / v, the kernel writes row n_pos[r] - 1
  const __half nan_h = __ushort_as_half((unsigned short)0xFFFF);
  std::vector<__half> hk((size_t)pages * page_elems, nan_h), hv(hk.size(), nan_h);
  std::vector<int> hpt((size_t)R * pp);
  for (int r = 0; r < R; r++)
    for (int i = 0; i < pp; i++) hpt[(size_t)r * pp + i] = (pp - 1 - i) * R + r;
  std::vector<float> qkv((size_t)R * stride);
  for (int r = 0; r < R; r++) {
    const int pos = n_pos[r] - 1;
    const float* kr = k + (size_t)r * P * Nkv;
    const float* vr = v + (size_t)r * P * Nkv;
    for (int j = 0; j < pos; j++)
      for (int h = 0; h < n_kv; h++)
        for (int d = 0; d < D; d++) {
          const size_t idx = ((size_t)hpt[(size_t)r * pp + j / kPage] * n_kv + h) * kPage * D + (size_t)(j % kPage) * D + d;
          hk[idx] = __float2half_rn(kr[((size_t)j * n_kv + h) * D + d]);
          hv[idx] = __float2half_rn(vr[((size_t)j * n_kv + h) * D + d]);
        }
    float* row = qkv.data() + (size_t)r * stride;
    std::memcpy(row, q + (size_t)r * Nq, Nq * 4);
    std::memcpy(row + Nq, kr + (size_t)pos * Nkv, Nkv * 4);
    std::memcpy(row + Nq + Nkv, vr + (size_t)pos * Nkv, Nkv * 4);
  }
  DBuf bk, bv, bqkv, bpt, bpts, bpos, bkvof, brope, bpo, bpm, bout;
  NQ_TRY(bk.put(hk.data(), hk.size() * 2));
  NQ_TRY(bv.put(hv.data(), hv.size() * 2));
  NQ_TRY(bqkv.put(qkv.data(), qkv.size() * 4));
  NQ_TRY(bpt.put(hpt.data(), hpt.size() * 4));
  std::vector<const int*> hpts(R);
  std::vector<KvLayer> hkv(R, KvLayer{bk.as<__half>(), bv.as<__half>()});
  std::vector<int> hpos(R);
  for (int r = 0; r < R; r++) hpts[r] = bpt.as<int>() + (size_t)r * pp, hpos[r] = n_pos[r] - 1;
  NQ_TRY(bpts.put(hpts.data(), R * sizeof(int*)));
  NQ_TRY(bkvof.put(hkv.data(), R * sizeof(KvLayer)));
  NQ_TRY(bpos.put(hpos.data(), R * 4));
  std::vector<float2> rope((size_t)P * (D / 2), make_float2(1.f, 0.f));   // q / k given roped: identity
  NQ_TRY(brope.put(rope.data(), rope.size() * sizeof(float2)));
  NQ_TRY(bpo.alloc((size_t)R * n_heads * n_split * D * 2));
  NQ_TRY(bpo.poison((size_t)R * n_heads * n_split * D * 2));
  NQ_TRY(bpm.alloc((size_t)R * n_heads * n_split * 2 * 4));
  NQ_TRY(bpm.poison((size_t)R * n_heads * n_split * 2 * 4));
  NQ_TRY(bout.alloc((size_t)R * Nq * 2));
  NQ_TRY(bout.poison((size_t)R * Nq * 2));
  AttnArgs a;   // as batch.cu sets it for its step
  a.qkv = bqkv.as<float>(); a.qkv_stride = stride; a.M = R; a.pos0 = bpos.as<int>(); a.rope = brope.as<float2>();
  a.n_heads = n_heads; a.n_kv = n_kv; a.D = D; a.keys_per_split = 32; a.n_split = n_split; a.write_kv = true;
  a.part_o = bpo.as<__half>(); a.part_ml = bpm.as<float>(); a.out = bout.as<__half>();
  a.pos_of = bpos.as<int>(); a.kv_of = bkvof.as<KvLayer>(); a.page_table_of = bpts.as<const int*>();
  NQ_TRY(attention(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  std::vector<__half> ho((size_t)R * Nq);
  NQ_CUDA(cudaMemcpy(ho.data(), bout.p, ho.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < ho.size(); i++) out[i] = __half2float(ho[i]);
  // the new rows: rope(k) (identity here) and v, rounded to f16, at each sequence's position
  NQ_CUDA(cudaMemcpy(hk.data(), bk.p, hk.size() * 2, cudaMemcpyDeviceToHost));
  NQ_CUDA(cudaMemcpy(hv.data(), bv.p, hv.size() * 2, cudaMemcpyDeviceToHost));
  for (int r = 0; r < R; r++) {
    const int pos = n_pos[r] - 1;
    for (int h = 0; h < n_kv; h++)
      for (int d = 0; d < D; d++) {
        const size_t idx = ((size_t)hpt[(size_t)r * pp + pos / kPage] * n_kv + h) * kPage * D + (size_t)(pos % kPage) * D + d;
        const float* src = qkv.data() + (size_t)r * stride + Nq;
        if (__half2float(hk[idx]) != __half2float(__float2half_rn(src[h * D + d])) ||
            __half2float(hv[idx]) != __half2float(__float2half_rn(src[Nkv + h * D + d])))
          return fail(NQ_E_CUDA, "attention: sequence %d's new cache row (head %d, dim %d) was not written", r, h, d);
      }
  }
  return NQ_OK;
}

int nq_test_attention_prefill(const float* q, const float* k, const float* v, int32_t n_heads, int32_t n_kv,
                              int32_t head_dim, int32_t n_pos, int32_t M, int32_t n_split, float* out) {
  if (!q || !k || !v || !out || n_kv <= 0 || n_heads <= 0 || n_heads % n_kv || M < 2 || n_pos < M || n_split < 1)
    return fail(NQ_E_INVALID_ARG, "nq_test_attention_prefill: bad argument");
  const int D = head_dim, pos0 = n_pos - M;
  // cache: all n_pos rows (the prefill path writes them before attention)
  const PagedCache cache = fill_paged_cache(k, v, n_pos, n_pos, n_kv, D);
  const int Nq = n_heads * D, stride = Nq + 2 * n_kv * D;
  std::vector<float> qkv((size_t)M * stride, 1e30f);  // k/v parts are not read by the prefill kernel
  for (int t = 0; t < M; t++) std::memcpy(qkv.data() + (size_t)t * stride, q + (size_t)t * Nq, Nq * 4);
  AttnBuffers b;
  NQ_TRY(b.setup(cache, qkv, pos0, n_pos, n_heads, n_kv, D, M, n_split));
  AttnArgs a = b.args(stride, M, n_heads, n_kv, D);
  a.keys_per_split = 32; a.n_split = n_split; a.write_kv = false;
  a.max_keys = n_pos;   // as session_prefill: picks the prefill kernel's build
  NQ_TRY(attention(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  return b.read_out(out, (size_t)M * Nq);
}

}  // extern "C"

namespace {
int test_gemm_int4_multi(int32_t nseg, const uint32_t* const* qweights, const uint16_t* const* scales,
                         const uint8_t* const* zeros, const int32_t* Ns, int32_t K, int32_t group, const float* A,
                         int32_t M, int32_t lda, const float* const* bias, float* C, int32_t ldc, int32_t add,
                         bool frag) {
  if (!qweights || !scales || !Ns || !A || !C) return fail(NQ_E_INVALID_ARG, "nq_test_gemm_int4_multi: NULL argument");
  if (nseg < 1 || nseg > 3) return fail(NQ_E_INVALID_ARG, "nseg=%d (1..3)", nseg);
  if (M <= 0 || lda < K) return fail(NQ_E_INVALID_ARG, "M=%d, lda=%d, K=%d", M, lda, K);
  DBuf w[3], db[3], da, dc;
  LinW W[3];
  float* Cs[3];
  const float* Bs[3] = {nullptr, nullptr, nullptr};
  int off = 0;
  for (int i = 0; i < nseg; i++) {
    NQ_TRY(check_int4(Ns[i], K, group));
    if (!qweights[i] || !scales[i]) return fail(NQ_E_INVALID_ARG, "segment %d: NULL weight", i);
    NQ_TRY(put_weight(w[i], qweights[i], scales[i], zeros ? zeros[i] : nullptr, Ns[i], K, group, frag, &W[i]));
    if (bias && bias[i]) {
      NQ_TRY(db[i].put(bias[i], (size_t)Ns[i] * 4));
      Bs[i] = db[i].as<float>();
    }
    off += Ns[i];
  }
  if (ldc < off) return fail(NQ_E_INVALID_ARG, "ldc=%d < sum of N=%d", ldc, off);
  std::vector<__half> ah((size_t)M * lda);
  for (size_t i = 0; i < ah.size(); i++) ah[i] = __float2half_rn(A[i]);
  NQ_TRY(da.put(ah.data(), ah.size() * 2));
  NQ_TRY(dc.put(C, (size_t)M * ldc * 4));
  off = 0;
  for (int i = 0; i < nseg; i++) {
    Cs[i] = dc.as<float>() + off;
    off += Ns[i];
  }
  NQ_TRY(gemm_multi(W, Cs, Bs, nseg, da.as<__half>(), lda, M, ldc, add != 0, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(C, dc.p, (size_t)M * ldc * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int test_gemm_swiglu(const uint32_t* q_gate, const uint16_t* s_gate, const uint8_t* z_gate, const uint32_t* q_up,
                     const uint16_t* s_up, const uint8_t* z_up, int32_t N, int32_t K, int32_t group, const float* A,
                     int32_t M, int32_t unfused, uint16_t* H, bool frag) {
  if (!q_gate || !s_gate || !q_up || !s_up || !A || !H) return fail(NQ_E_INVALID_ARG, "nq_test_gemm_swiglu: NULL argument");
  if (M <= 0) return fail(NQ_E_INVALID_ARG, "M=%d", M);
  NQ_TRY(check_int4(N, K, group));
  DBuf wg, wu, da, dg, du, dh;
  LinW Wg, Wu;
  if (frag) {   // the pair (the unfused path reads gate and up apart: the file's order only)
    if (z_gate || z_up || unfused) return fail(NQ_E_INVALID_ARG, "the fragment-order pair: layout 1, fused only");
    NQ_TRY(put_int4_frag_pair(wg, wu, q_gate, s_gate, q_up, s_up, N, K, group, &Wg, &Wu));
  } else {
    NQ_TRY(put_int4(wg, q_gate, s_gate, z_gate, N, K, group, &Wg));
    NQ_TRY(put_int4(wu, q_up, s_up, z_up, N, K, group, &Wu));
  }
  std::vector<__half> ah((size_t)M * K);
  for (size_t i = 0; i < ah.size(); i++) ah[i] = __float2half_rn(A[i]);
  NQ_TRY(da.put(ah.data(), ah.size() * 2));
  std::vector<uint16_t> poison((size_t)M * N, 0x7e00);  // f16 NaN: an output the kernel never writes stays NaN
  NQ_TRY(dh.put(poison.data(), poison.size() * 2));
  NQ_TRY(dg.alloc((size_t)M * N * 4));
  NQ_TRY(du.alloc((size_t)M * N * 4));
  if (unfused) {
    const LinW W2[2] = {Wg, Wu};
    float* const C2[2] = {dg.as<float>(), du.as<float>()};
    const float* const B2[2] = {nullptr, nullptr};
    NQ_TRY(gemm_multi(W2, C2, B2, 2, da.as<__half>(), K, M, N, false, 0));
    NQ_TRY(swiglu_rows(dg.as<float>(), du.as<float>(), M, N, dh.as<__half>(), 0));
  } else {
    NQ_TRY(gemm_swiglu(Wg, Wu, da.as<__half>(), K, M, dg.as<float>(), du.as<float>(), dh.as<__half>(), 0));
  }
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(H, dh.p, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

}  // namespace

extern "C" {

int nq_test_gemm_int4_multi(int32_t nseg, const uint32_t* const* qweights, const uint16_t* const* scales,
                            const uint8_t* const* zeros, const int32_t* Ns, int32_t K, int32_t group, const float* A,
                            int32_t M, int32_t lda, const float* const* bias, float* C, int32_t ldc, int32_t add) {
  return test_gemm_int4_multi(nseg, qweights, scales, zeros, Ns, K, group, A, M, lda, bias, C, ldc, add, false);
}
int nq_test_gemm_int4_multi_frag(int32_t nseg, const uint32_t* const* qweights, const uint16_t* const* scales,
                                 const int32_t* Ns, int32_t K, int32_t group, const float* A, int32_t M, int32_t lda,
                                 const float* const* bias, float* C, int32_t ldc, int32_t add) {
  return test_gemm_int4_multi(nseg, qweights, scales, nullptr, Ns, K, group, A, M, lda, bias, C, ldc, add, true);
}
int nq_test_gemm_swiglu(const uint32_t* q_gate, const uint16_t* s_gate, const uint8_t* z_gate, const uint32_t* q_up,
                        const uint16_t* s_up, const uint8_t* z_up, int32_t N, int32_t K, int32_t group, const float* A,
                        int32_t M, int32_t unfused, uint16_t* H) {
  return test_gemm_swiglu(q_gate, s_gate, z_gate, q_up, s_up, z_up, N, K, group, A, M, unfused, H, false);
}
int nq_test_gemm_swiglu_frag(const uint32_t* q_gate, const uint16_t* s_gate, const uint32_t* q_up,
                             const uint16_t* s_up, int32_t N, int32_t K, int32_t group, const float* A, int32_t M,
                             uint16_t* H) {
  return test_gemm_swiglu(q_gate, s_gate, nullptr, q_up, s_up, nullptr, N, K, group, A, M, 0, H, true);
}

// 1 where the loader repacks INT4 weights into the fragment order (int4_fragment_order_available), else 0
int nq_test_fragment_order_available(void) { return int4_fragment_order_available() ? 1 : 0; }

// The repack alone: the fragment order's words [N/64][K/16][32][4] (N K / 8 uint32) and scales [N/64][K/g][8][8]
// (N K / g f16) of a layout-1 weight, or (pair: qweight_up set) of the gate/up pair P (2N rows: gate's bytes, then
// up's). Compared bit for bit with tests/fragment_order.py.
int nq_test_frag_repack(const uint32_t* qweight, const uint16_t* scales, const uint32_t* qweight_up,
                        const uint16_t* scales_up, int32_t N, int32_t K, int32_t group, uint32_t* words,
                        uint16_t* scales_out) {
  if (!qweight || !scales || !words || !scales_out) return fail(NQ_E_INVALID_ARG, "nq_test_frag_repack: NULL argument");
  NQ_TRY(check_int4(N, K, group));
  if (!frag::shape_ok(N, K, group)) return fail(NQ_E_UNSUPPORTED, "no fragment order for %d x %d group %d", N, K, group);
  const size_t wb = (size_t)N * K / 2, sb = (size_t)N * (K / group) * 2;
  DBuf g, u;
  LinW G, U;
  if (qweight_up) {
    if (!scales_up) return fail(NQ_E_INVALID_ARG, "nq_test_frag_repack: NULL up scales");
    NQ_TRY(put_int4_frag_pair(g, u, qweight, scales, qweight_up, scales_up, N, K, group, &G, &U));
    NQ_CUDA(cudaMemcpy(words, G.w, wb, cudaMemcpyDeviceToHost));
    NQ_CUDA(cudaMemcpy(reinterpret_cast<uint8_t*>(words) + wb, U.w, wb, cudaMemcpyDeviceToHost));
    NQ_CUDA(cudaMemcpy(scales_out, G.scales, sb, cudaMemcpyDeviceToHost));
    NQ_CUDA(cudaMemcpy(reinterpret_cast<uint8_t*>(scales_out) + sb, U.scales, sb, cudaMemcpyDeviceToHost));
    return NQ_OK;
  }
  NQ_TRY(put_int4_frag(g, qweight, scales, N, K, group, &G));
  NQ_CUDA(cudaMemcpy(words, G.w, wb, cudaMemcpyDeviceToHost));
  NQ_CUDA(cudaMemcpy(scales_out, G.scales, sb, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_test_check_pages(int32_t pool_pages, int32_t max_pages, int32_t max_context, const int32_t* pages,
                        int32_t n_pages, int32_t position) {
  return check_session_pages(pool_pages, max_pages, max_context, pages, n_pages, position);
}

}  // extern "C"
