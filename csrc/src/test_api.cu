// Kernel test entry points of the C ABI (nq_test_*, nq_bench_*): host arrays in, one kernel, host arrays out.
// Used by tests/test_gpu_kernels.py to compare each kernel with a numpy reference.
#include "kernels.h"
#include "model_file.h"
#include <vector>
#include <cstring>

using namespace nq;

namespace {
// RAII device buffer
struct DBuf {
  void* p = nullptr;
  ~DBuf() { if (p) cudaFree(p); }
  int alloc(size_t n) {
    cudaError_t e = cudaMalloc(&p, std::max<size_t>(n, 16));
    if (e != cudaSuccess) return fail(NQ_E_CUDA, "cudaMalloc(%zu): %s", n, cudaGetErrorString(e));
    return NQ_OK;
  }
  int put(const void* h, size_t n) {
    NQ_TRY(alloc(n));
    NQ_CUDA(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
    return NQ_OK;
  }
  template <class T> T* as() const { return static_cast<T*>(p); }
};

// int4 weight (qweight + scales) placed like the file does: qweight, pad to 128, scales
int put_int4(DBuf& b, const uint32_t* qw, const uint16_t* sc, int N, int K, int g, LinW* w) {
  const size_t qbytes = (size_t)N * K / 2, off = align128(qbytes), sbytes = (size_t)N * (K / g) * 2;
  NQ_TRY(b.alloc(off + sbytes));
  NQ_CUDA(cudaMemcpy(b.p, qw, qbytes, cudaMemcpyHostToDevice));
  NQ_CUDA(cudaMemcpy(static_cast<char*>(b.p) + off, sc, sbytes, cudaMemcpyHostToDevice));
  w->w = b.as<uint8_t>();
  w->scales = reinterpret_cast<const __half*>(static_cast<char*>(b.p) + off);
  w->N = N; w->K = K; w->group = g; w->type = WT_INT4;
  return NQ_OK;
}

int check_nk(int N, int K) {
  if (N <= 0 || K <= 0 || K % 32) return fail(NQ_E_INVALID_ARG, "N=%d, K=%d: need N > 0 and K a positive multiple of 32", N, K);
  return NQ_OK;
}
}  // namespace

extern "C" {

int nq_test_gemv_int4(const uint32_t* qweight, const uint16_t* scales, int32_t N, int32_t K, int32_t group,
                      const float* x, const float* norm_w, float eps, int32_t variant, float* y) {
  if (!qweight || !scales || !x || !y) return fail(NQ_E_INVALID_ARG, "nq_test_gemv_int4: NULL argument");
  NQ_TRY(check_nk(N, K));
  if (variant < 0 || variant > 4) return fail(NQ_E_INVALID_ARG, "variant %d", variant);
  NQ_TRY(gemv_prepare());
  DBuf w, dx, dn, dy;
  GemvArgs a;
  NQ_TRY(put_int4(w, qweight, scales, N, K, group, &a.seg[0]));
  NQ_TRY(dx.put(x, (size_t)K * 4));
  if (norm_w) NQ_TRY(dn.put(norm_w, (size_t)K * 4));
  NQ_TRY(dy.alloc((size_t)N * 4));
  NQ_CUDA(cudaMemset(dy.p, 0xff, (size_t)N * 4));  // poison: NaN
  a.x_f32 = dx.as<float>(); a.norm_w = norm_w ? dn.as<float>() : nullptr; a.eps = eps;
  a.out_f32 = dy.as<float>(); a.mode = GEMV_STORE; a.variant = variant;
  NQ_TRY(gemv(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(y, dy.p, (size_t)N * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_test_gemv_int4_mode(const uint32_t* qweight, const uint16_t* scales, const uint32_t* qweight_up,
                           const uint16_t* scales_up, int32_t N, int32_t K, int32_t group, const float* x,
                           const float* norm_w, float eps, int32_t mode, int32_t variant, float* y) {
  if (!qweight || !scales || !x || !y) return fail(NQ_E_INVALID_ARG, "nq_test_gemv_int4_mode: NULL argument");
  NQ_TRY(check_nk(N, K));
  if (variant < 0 || variant > 4) return fail(NQ_E_INVALID_ARG, "variant %d", variant);
  if (mode != GEMV_ADD && mode != GEMV_SWIGLU) return fail(NQ_E_INVALID_ARG, "mode %d (1 = add, 2 = swiglu)", mode);
  if (mode == GEMV_SWIGLU && (!qweight_up || !scales_up)) return fail(NQ_E_INVALID_ARG, "swiglu needs the up weight");
  if (mode == GEMV_ADD && norm_w) return fail(NQ_E_INVALID_ARG, "add mode takes an f16 input without norm");
  NQ_TRY(gemv_prepare());
  DBuf w, wu, dx, dn, dy;
  GemvArgs a;
  NQ_TRY(put_int4(w, qweight, scales, N, K, group, &a.seg[0]));
  a.eps = eps; a.mode = mode; a.variant = variant;
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
  NQ_TRY(put_int4(wu, qweight_up, scales_up, N, K, group, &a.up));   // y = silu(Wg x) * (Wu x), out f16
  NQ_TRY(dx.put(x, (size_t)K * 4));
  if (norm_w) NQ_TRY(dn.put(norm_w, (size_t)K * 4));
  NQ_TRY(dy.alloc((size_t)N * 2));
  NQ_CUDA(cudaMemset(dy.p, 0xff, (size_t)N * 2));  // poison: NaN
  a.x_f32 = dx.as<float>(); a.norm_w = norm_w ? dn.as<float>() : nullptr; a.out_f16 = dy.as<__half>();
  NQ_TRY(gemv(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  std::vector<__half> yh(N);
  NQ_CUDA(cudaMemcpy(yh.data(), dy.p, (size_t)N * 2, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++) y[i] = __half2float(yh[i]);
  return NQ_OK;
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
  NQ_CUDA(cudaMemset(dy.p, 0xff, (size_t)N * 4));
  a.x_f32 = dx.as<float>(); a.out_f32 = dy.as<float>(); a.mode = GEMV_STORE;
  NQ_TRY(gemv(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(y, dy.p, (size_t)N * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_test_gemm_int4(const uint32_t* qweight, const uint16_t* scales, int32_t N, int32_t K, int32_t group,
                      const float* A, int32_t M, float* C) {
  if (!qweight || !scales || !A || !C) return fail(NQ_E_INVALID_ARG, "nq_test_gemm_int4: NULL argument");
  NQ_TRY(check_nk(N, K));
  if (M <= 0) return fail(NQ_E_INVALID_ARG, "M=%d", M);
  DBuf w, da, dc;
  LinW W;
  NQ_TRY(put_int4(w, qweight, scales, N, K, group, &W));
  std::vector<__half> ah((size_t)M * K);
  for (size_t i = 0; i < ah.size(); i++) ah[i] = __float2half_rn(A[i]);
  NQ_TRY(da.put(ah.data(), ah.size() * 2));
  NQ_TRY(dc.alloc((size_t)M * N * 4));
  NQ_CUDA(cudaMemset(dc.p, 0xff, (size_t)M * N * 4));
  NQ_TRY(gemm(W, da.as<__half>(), K, M, dc.as<float>(), N, nullptr, false, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(C, dc.p, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_bench_gemv_int4_mode(int32_t N, int32_t K, int32_t group, int32_t mode, int32_t iters, int32_t nvar,
                            const int32_t* variants, float* ms) {
  if (!ms || !variants || nvar <= 0 || iters <= 0) return fail(NQ_E_INVALID_ARG, "nq_bench_gemv_int4: bad argument");
  for (int v = 0; v < nvar; v++)
    if (variants[v] < 0 || variants[v] > 4) return fail(NQ_E_INVALID_ARG, "variant %d", variants[v]);
  NQ_TRY(check_nk(N, K));
  if (mode < GEMV_STORE || mode > GEMV_SWIGLU) return fail(NQ_E_INVALID_ARG, "mode %d", mode);
  NQ_TRY(gemv_prepare());
  // rotate over enough copies that the weights exceed the 60 MB L2 several times; SWIGLU reads two matrices
  const int mats = mode == GEMV_SWIGLU ? 2 : 1;
  const size_t qbytes = (size_t)N * K / 2, off = align128(qbytes), per = align128(off + (size_t)N * (K / group) * 2);
  const int copies = (int)std::max<size_t>(2, (512ull << 20) / (per * mats) + 1);
  DBuf w, dx, dxh, dn, dy;
  NQ_TRY(w.alloc(per * copies * mats));
  {  // random bytes (codes and finite f16 scales): fill on host once, replicate
    std::vector<uint8_t> h(per);
    uint64_t st = 0x1234567ull;
    for (size_t i = 0; i < off; i++) { st = st * 6364136223846793005ull + 1442695040888963407ull; h[i] = (uint8_t)(st >> 56); }
    for (size_t i = off; i + 1 < per; i += 2) { h[i] = 0x00; h[i + 1] = 0x20; }  // scale 2^-7 ~ 0.0078
    NQ_CUDA(cudaMemcpy(w.as<uint8_t>(), h.data(), per, cudaMemcpyHostToDevice));
    for (int c = 1; c < copies * mats; c++) NQ_CUDA(cudaMemcpy(w.as<uint8_t>() + per * c, w.p, per, cudaMemcpyDeviceToDevice));
  }
  std::vector<float> xh(K), nh(K);
  std::vector<__half> x16(K);
  for (int i = 0; i < K; i++) {
    xh[i] = (float)((i * 37) % 17) / 8.f - 1.f;
    nh[i] = 1.f + (float)((i * 13) % 7) / 16.f;
    x16[i] = __float2half_rn(xh[i]);
  }
  NQ_TRY(dx.put(xh.data(), (size_t)K * 4));
  NQ_TRY(dn.put(nh.data(), (size_t)K * 4));
  NQ_TRY(dxh.put(x16.data(), (size_t)K * 2));
  NQ_TRY(dy.alloc((size_t)N * 4));
  NQ_CUDA(cudaMemset(dy.p, 0, (size_t)N * 4));
  std::vector<GemvArgs> args(copies);
  auto lin = [&](int c) {
    LinW L;
    L.w = w.as<uint8_t>() + per * c;
    L.scales = reinterpret_cast<const __half*>(w.as<uint8_t>() + per * c + off);
    L.N = N; L.K = K; L.group = group; L.type = WT_INT4;
    return L;
  };
  for (int c = 0; c < copies; c++) {
    GemvArgs& a = args[c];
    a.seg[0] = lin(mats * c);
    a.mode = mode;
    if (mode == GEMV_STORE) {            // qkv-like: x f32 with the RMSNorm prologue
      a.x_f32 = dx.as<float>(); a.norm_w = dn.as<float>(); a.out_f32 = dy.as<float>();
    } else if (mode == GEMV_ADD) {       // o/down-like: x f16, residual add
      a.x_f16 = dxh.as<__half>(); a.out_f32 = dy.as<float>();
    } else {                             // gate/up: RMSNorm prologue, two matrices, f16 out
      a.up = lin(2 * c + 1);
      a.x_f32 = dx.as<float>(); a.norm_w = dn.as<float>(); a.out_f16 = dy.as<__half>();
    }
  }
  cudaEvent_t e0, e1;
  NQ_CUDA(cudaEventCreate(&e0));
  NQ_CUDA(cudaEventCreate(&e1));
  int rc = NQ_OK;
  for (int v = 0; v < nvar && rc == NQ_OK; v++) {   // the variants one after another on the same data
    for (auto& a : args) a.variant = variants[v];
    for (int i = 0; i < 3 && rc == NQ_OK; i++) rc = gemv(args[i % copies], 0);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < iters && rc == NQ_OK; i++) rc = gemv(args[i % copies], 0);
    cudaEventRecord(e1, 0);
    cudaError_t e = cudaEventSynchronize(e1);
    float t = 0.f;
    if (rc == NQ_OK && e == cudaSuccess) e = cudaEventElapsedTime(&t, e0, e1);
    if (rc == NQ_OK && e != cudaSuccess) rc = fail(NQ_E_CUDA, "bench timing: %s", cudaGetErrorString(e));
    ms[v] = t / iters;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return rc;
}

int nq_bench_gemv_int4(int32_t N, int32_t K, int32_t group, int32_t variant, int32_t iters, float* ms) {
  return nq_bench_gemv_int4_mode(N, K, group, GEMV_STORE, iters, 1, &variant, ms);
}

int nq_bench_gemm_int4(int32_t M, int32_t N, int32_t K, int32_t group, int32_t iters, float* ms) {
  if (!ms || iters <= 0 || M <= 0) return fail(NQ_E_INVALID_ARG, "nq_bench_gemm_int4: bad argument");
  NQ_TRY(check_nk(N, K));
  const size_t qbytes = (size_t)N * K / 2, off = align128(qbytes), per = align128(off + (size_t)N * (K / group) * 2);
  DBuf w, da, dc;
  NQ_TRY(w.alloc(per));
  {
    std::vector<uint8_t> h(per);
    uint64_t st = 0x7654321ull;
    for (size_t i = 0; i < off; i++) { st = st * 6364136223846793005ull + 1442695040888963407ull; h[i] = (uint8_t)(st >> 56); }
    for (size_t i = off; i + 1 < per; i += 2) { h[i] = 0x00; h[i + 1] = 0x20; }
    NQ_CUDA(cudaMemcpy(w.p, h.data(), per, cudaMemcpyHostToDevice));
  }
  std::vector<__half> ah((size_t)M * K);
  for (size_t i = 0; i < ah.size(); i++) ah[i] = __float2half((float)((i * 37) % 17) / 8.f - 1.f);
  NQ_TRY(da.put(ah.data(), ah.size() * 2));
  NQ_TRY(dc.alloc((size_t)M * N * 4));
  LinW W;
  W.w = w.as<uint8_t>(); W.scales = reinterpret_cast<const __half*>(w.as<uint8_t>() + off);
  W.N = N; W.K = K; W.group = group; W.type = WT_INT4;
  cudaEvent_t e0, e1;
  NQ_CUDA(cudaEventCreate(&e0));
  NQ_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < 2; i++) NQ_TRY(gemm(W, da.as<__half>(), K, M, dc.as<float>(), N, nullptr, false, 0));
  NQ_CUDA(cudaEventRecord(e0, 0));
  for (int i = 0; i < iters; i++) NQ_TRY(gemm(W, da.as<__half>(), K, M, dc.as<float>(), N, nullptr, false, 0));
  NQ_CUDA(cudaEventRecord(e1, 0));
  NQ_CUDA(cudaEventSynchronize(e1));
  float t = 0.f;
  NQ_CUDA(cudaEventElapsedTime(&t, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  *ms = t / iters;
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
  NQ_CUDA(cudaMemset(dt.p, 0xff, 4));
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
  // Cache: pages in REVERSED physical order to exercise the page table.
  const int pages = (n_pos + kPage - 1) / kPage;
  std::vector<int> pt(pages);
  for (int i = 0; i < pages; i++) pt[i] = pages - 1 - i;
  std::vector<__half> kc((size_t)pages * n_kv * kPage * D, __float2half(0.f)), vc(kc.size(), __float2half(0.f));
  for (int j = 0; j < pos; j++)  // the last position is written by the kernel (write_kv)
    for (int h = 0; h < n_kv; h++)
      for (int d = 0; d < D; d++) {
        const size_t idx = (((size_t)pt[j / kPage] * n_kv + h) * kPage + j % kPage) * D + d;
        kc[idx] = __float2half_rn(k[((size_t)j * n_kv + h) * D + d]);
        vc[idx] = __float2half_rn(v[((size_t)j * n_kv + h) * D + d]);
      }
  const int Nq = n_heads * D, Nkv = n_kv * D;
  std::vector<float> qkv(Nq + 2 * Nkv);
  std::memcpy(qkv.data(), q, Nq * 4);
  std::memcpy(qkv.data() + Nq, k + (size_t)pos * Nkv, Nkv * 4);
  std::memcpy(qkv.data() + Nq + Nkv, v + (size_t)pos * Nkv, Nkv * 4);
  std::vector<float2> rope((size_t)n_pos * (D / 2), make_float2(1.f, 0.f));
  const int n_split = (n_pos + keys_per_split - 1) / keys_per_split + 1;  // one spare split: must be ignored
  DBuf dk, dv, dpt, dr, dq, dpos, dpo, dpm, dcnt, dout;
  NQ_TRY(dk.put(kc.data(), kc.size() * 2));
  NQ_TRY(dv.put(vc.data(), vc.size() * 2));
  NQ_TRY(dpt.put(pt.data(), pt.size() * 4));
  NQ_TRY(dr.put(rope.data(), rope.size() * sizeof(float2)));
  NQ_TRY(dq.put(qkv.data(), qkv.size() * 4));
  NQ_TRY(dpos.put(&pos, 4));
  NQ_TRY(dpo.alloc((size_t)n_heads * n_split * D * 4));
  NQ_TRY(dpm.alloc((size_t)n_heads * n_split * 2 * 4));
  NQ_TRY(dcnt.alloc((size_t)n_kv * 4));
  NQ_CUDA(cudaMemset(dcnt.p, 0, (size_t)n_kv * 4));
  NQ_TRY(dout.alloc((size_t)Nq * 2));
  NQ_CUDA(cudaMemset(dout.p, 0xff, (size_t)Nq * 2));
  AttnArgs a;
  a.qkv = dq.as<float>(); a.qkv_stride = Nq + 2 * Nkv; a.M = 1; a.pos0 = dpos.as<int>();
  a.kv.k = dk.as<__half>(); a.kv.v = dv.as<__half>(); a.page_table = dpt.as<int>(); a.rope = dr.as<float2>();
  a.n_heads = n_heads; a.n_kv = n_kv; a.D = D; a.keys_per_split = keys_per_split; a.n_split = n_split;
  a.write_kv = true; a.part_o = dpo.as<float>(); a.part_ml = dpm.as<float>(); a.counters = dcnt.as<int>();
  a.out = dout.as<__half>();
  NQ_TRY(attention(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  std::vector<__half> oh(Nq);
  NQ_CUDA(cudaMemcpy(oh.data(), dout.p, (size_t)Nq * 2, cudaMemcpyDeviceToHost));
  for (int i = 0; i < Nq; i++) out[i] = __half2float(oh[i]);
  // the counters must be re-armed (zero) for the next launch
  std::vector<int> cnt(n_kv);
  NQ_CUDA(cudaMemcpy(cnt.data(), dcnt.p, (size_t)n_kv * 4, cudaMemcpyDeviceToHost));
  for (int h = 0; h < n_kv; h++)
    if (cnt[h] != 0) return fail(NQ_E_CUDA, "attention left counter %d at %d", h, cnt[h]);
  return NQ_OK;
}

int nq_test_attention_prefill(const float* q, const float* k, const float* v, int32_t n_heads, int32_t n_kv,
                              int32_t head_dim, int32_t n_pos, int32_t M, float* out) {
  if (!q || !k || !v || !out || n_kv <= 0 || n_heads <= 0 || n_heads % n_kv || M < 2 || n_pos < M)
    return fail(NQ_E_INVALID_ARG, "nq_test_attention_prefill: bad argument");
  const int D = head_dim, pos0 = n_pos - M;
  // cache: all n_pos rows (the prefill path writes them before attention), pages in reversed physical order
  const int pages = (n_pos + kPage - 1) / kPage;
  std::vector<int> pt(pages);
  for (int i = 0; i < pages; i++) pt[i] = pages - 1 - i;
  std::vector<__half> kc((size_t)pages * n_kv * kPage * D, __float2half(0.f)), vc(kc.size(), __float2half(0.f));
  for (int j = 0; j < n_pos; j++)
    for (int h = 0; h < n_kv; h++)
      for (int d = 0; d < D; d++) {
        const size_t idx = (((size_t)pt[j / kPage] * n_kv + h) * kPage + j % kPage) * D + d;
        kc[idx] = __float2half_rn(k[((size_t)j * n_kv + h) * D + d]);
        vc[idx] = __float2half_rn(v[((size_t)j * n_kv + h) * D + d]);
      }
  const int Nq = n_heads * D, stride = Nq + 2 * n_kv * D;
  std::vector<float> qkv((size_t)M * stride, 1e30f);  // k/v parts are not read by the prefill kernel
  for (int t = 0; t < M; t++) std::memcpy(qkv.data() + (size_t)t * stride, q + (size_t)t * Nq, Nq * 4);
  std::vector<float2> rope((size_t)n_pos * (D / 2), make_float2(1.f, 0.f));  // q, k given already rotated
  DBuf dk, dv, dpt, dr, dq, dpos, dpo, dpm, dcnt, dout;
  NQ_TRY(dk.put(kc.data(), kc.size() * 2));
  NQ_TRY(dv.put(vc.data(), vc.size() * 2));
  NQ_TRY(dpt.put(pt.data(), pt.size() * 4));
  NQ_TRY(dr.put(rope.data(), rope.size() * sizeof(float2)));
  NQ_TRY(dq.put(qkv.data(), qkv.size() * 4));
  NQ_TRY(dpos.put(&pos0, 4));
  NQ_TRY(dpo.alloc(16));
  NQ_TRY(dpm.alloc(16));
  NQ_TRY(dcnt.alloc(16));
  NQ_TRY(dout.alloc((size_t)M * Nq * 2));
  NQ_CUDA(cudaMemset(dout.p, 0xff, (size_t)M * Nq * 2));  // poison: NaN unless written
  AttnArgs a;
  a.qkv = dq.as<float>(); a.qkv_stride = stride; a.M = M; a.pos0 = dpos.as<int>();
  a.kv.k = dk.as<__half>(); a.kv.v = dv.as<__half>(); a.page_table = dpt.as<int>(); a.rope = dr.as<float2>();
  a.n_heads = n_heads; a.n_kv = n_kv; a.D = D; a.keys_per_split = 32; a.n_split = 1; a.write_kv = false;
  a.part_o = dpo.as<float>(); a.part_ml = dpm.as<float>(); a.counters = dcnt.as<int>(); a.out = dout.as<__half>();
  NQ_TRY(attention(a, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  std::vector<__half> oh((size_t)M * Nq);
  NQ_CUDA(cudaMemcpy(oh.data(), dout.p, oh.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < oh.size(); i++) out[i] = __half2float(oh[i]);
  return NQ_OK;
}

}  // extern "C"

// ---- prefill GEMM with segments, bias, add and an explicit INT4 kernel variant (tests/test_gpu_gemm.py) ----------
namespace nq {
int gemm_multi_variant(const LinW* W, float* const* C, const float* const* bias, int n, const __half* A, int lda,
                       int M, int ldc, bool add, int variant, cudaStream_t st);  // gemm.cu
}

extern "C" {

// nseg (1..3) int4 weights sharing A: qweights[i] uint32 (Ns[i], K/8), scales[i] f16 bits (Ns[i], K/group);
// A f32 (M, lda) (rounded to f16 here; columns >= K are never read); bias[i] f32 (Ns[i]) or null (bias itself may
// be null); C f32 (M, ldc) in/out: segment i writes columns off_i .. off_i + Ns[i] - 1, off_i = Ns[0] + .. + Ns[i-1]
// (C is copied to the device first, so add = 1 adds to it and columns no segment owns must come back unchanged).
NQ_API int nq_test_gemm_int4_multi(int32_t nseg, const uint32_t* const* qweights, const uint16_t* const* scales,
                                   const int32_t* Ns, int32_t K, int32_t group, const float* A, int32_t M,
                                   int32_t lda, const float* const* bias, float* C, int32_t ldc, int32_t add,
                                   int32_t variant) {
  if (!qweights || !scales || !Ns || !A || !C) return fail(NQ_E_INVALID_ARG, "nq_test_gemm_int4_multi: NULL argument");
  if (nseg < 1 || nseg > 3) return fail(NQ_E_INVALID_ARG, "nseg=%d (1..3)", nseg);
  if (M <= 0 || lda < K) return fail(NQ_E_INVALID_ARG, "M=%d, lda=%d, K=%d", M, lda, K);
  DBuf w[3], db[3], da, dc;
  LinW W[3];
  float* Cs[3];
  const float* Bs[3] = {nullptr, nullptr, nullptr};
  int off = 0;
  for (int i = 0; i < nseg; i++) {
    NQ_TRY(check_nk(Ns[i], K));
    if (!qweights[i] || !scales[i]) return fail(NQ_E_INVALID_ARG, "segment %d: NULL weight", i);
    NQ_TRY(put_int4(w[i], qweights[i], scales[i], Ns[i], K, group, &W[i]));
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
  NQ_TRY(gemm_multi_variant(W, Cs, Bs, nseg, da.as<__half>(), lda, M, ldc, add != 0, variant, 0));
  NQ_CUDA(cudaDeviceSynchronize());
  NQ_CUDA(cudaMemcpy(C, dc.p, (size_t)M * ldc * 4, cudaMemcpyDeviceToHost));
  return NQ_OK;
}

// The ceiling of mma.sync.m16n8k16 (f16 x f16 -> f32) on this GPU, for reading the GEMM's TFLOP/s: every warp
// issues 8 independent HMMA chains (no memory traffic); returns TFLOP/s over blocks x 8 warps x iters x 8 HMMA.
NQ_API int nq_bench_mma_peak(int32_t blocks, int32_t iters, float* tflops);

// us per launch of the prefill GEMM (M tokens, nseg copies of an N x K int4 weight in one launch, like gate/up)
// for each of nvar INT4 kernel variants, on the same data; iters launches rotate over enough weight copies that
// they never sit in L2 as a whole (A, 2 x M x K bytes, may).
NQ_API int nq_bench_gemm_int4_variants(int32_t M, int32_t N, int32_t K, int32_t group, int32_t nseg, int32_t iters,
                                       int32_t nvar, const int32_t* variants, float* us) {
  if (!us || !variants || iters <= 0 || M <= 0 || nvar <= 0 || nseg < 1 || nseg > 3)
    return fail(NQ_E_INVALID_ARG, "nq_bench_gemm_int4_variants: bad argument");
  NQ_TRY(check_nk(N, K));
  const size_t qbytes = (size_t)N * K / 2, off = align128(qbytes), per = align128(off + (size_t)N * (K / group) * 2);
  const int copies = (int)std::max<size_t>(nseg, ((256ull << 20) / per + nseg) / nseg * nseg);
  DBuf w, da, dc;
  NQ_TRY(w.alloc(per * copies));
  {
    std::vector<uint8_t> h(per);
    uint64_t st = 0x7654321ull;
    for (size_t i = 0; i < off; i++) { st = st * 6364136223846793005ull + 1442695040888963407ull; h[i] = (uint8_t)(st >> 56); }
    for (size_t i = off; i + 1 < per; i += 2) { h[i] = 0x00; h[i + 1] = 0x20; }
    NQ_CUDA(cudaMemcpy(w.p, h.data(), per, cudaMemcpyHostToDevice));
    for (int c = 1; c < copies; c++) NQ_CUDA(cudaMemcpy(w.as<uint8_t>() + per * c, w.p, per, cudaMemcpyDeviceToDevice));
  }
  std::vector<__half> ah((size_t)M * K);
  for (size_t i = 0; i < ah.size(); i++) ah[i] = __float2half((float)((i * 37) % 17) / 8.f - 1.f);
  NQ_TRY(da.put(ah.data(), ah.size() * 2));
  NQ_TRY(dc.alloc((size_t)M * N * nseg * 4));
  const int sets = copies / nseg;
  std::vector<LinW> Ws((size_t)copies);
  for (int c = 0; c < copies; c++) {
    LinW& L = Ws[c];
    L.w = w.as<uint8_t>() + per * c; L.scales = reinterpret_cast<const __half*>(w.as<uint8_t>() + per * c + off);
    L.N = N; L.K = K; L.group = group; L.type = WT_INT4;
  }
  float* Cs[3] = {dc.as<float>(), dc.as<float>() + N, dc.as<float>() + 2 * (size_t)N};
  const float* Bs[3] = {nullptr, nullptr, nullptr};
  cudaEvent_t e0, e1;
  NQ_CUDA(cudaEventCreate(&e0));
  NQ_CUDA(cudaEventCreate(&e1));
  int rc = NQ_OK;
  for (int v = 0; v < nvar && rc == NQ_OK; v++) {
    for (int i = 0; i < 2 && rc == NQ_OK; i++)
      rc = gemm_multi_variant(&Ws[(i % sets) * nseg], Cs, Bs, nseg, da.as<__half>(), K, M, N * nseg, false,
                              variants[v], 0);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < iters && rc == NQ_OK; i++)
      rc = gemm_multi_variant(&Ws[(i % sets) * nseg], Cs, Bs, nseg, da.as<__half>(), K, M, N * nseg, false,
                              variants[v], 0);
    cudaEventRecord(e1, 0);
    cudaError_t e = cudaEventSynchronize(e1);
    float t = 0.f;
    if (rc == NQ_OK && e == cudaSuccess) e = cudaEventElapsedTime(&t, e0, e1);
    if (rc == NQ_OK && e != cudaSuccess) rc = fail(NQ_E_CUDA, "bench timing: %s", cudaGetErrorString(e));
    us[v] = t * 1e3f / iters;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return rc;
}

}  // extern "C"

namespace {
__global__ void __launch_bounds__(256) mma_peak_kernel(int iters, float* out) {
  float c[8][4] = {};
  uint32_t a0 = 0x3c003c00u ^ threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, b0 = 0x3c00u, b1 = 0x3c01u;
  for (int i = 0; i < iters; i++)
#pragma unroll
    for (int j = 0; j < 8; j++)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                   "{%0,%1,%2,%3};\n"
                   : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; j++) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 1.2345f) out[0] = s;  // keeps the chains alive
}
}  // namespace

extern "C" int nq_bench_mma_peak(int32_t blocks, int32_t iters, float* tflops) {
  if (!tflops || blocks <= 0 || iters <= 0) return fail(NQ_E_INVALID_ARG, "nq_bench_mma_peak: bad argument");
  DBuf o;
  NQ_TRY(o.alloc(16));
  cudaEvent_t e0, e1;
  NQ_CUDA(cudaEventCreate(&e0));
  NQ_CUDA(cudaEventCreate(&e1));
  mma_peak_kernel<<<blocks, 256>>>(iters, o.as<float>());  // warm-up (clocks up)
  mma_peak_kernel<<<blocks, 256>>>(iters, o.as<float>());
  cudaEventRecord(e0, 0);
  mma_peak_kernel<<<blocks, 256>>>(iters, o.as<float>());
  cudaEventRecord(e1, 0);
  cudaError_t e = cudaEventSynchronize(e1);
  float ms = 0.f;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (e != cudaSuccess) return fail(NQ_E_CUDA, "nq_bench_mma_peak: %s", cudaGetErrorString(e));
  *tflops = (float)(2.0 * 16 * 8 * 16 * 8 * 8.0 * iters * blocks / (ms * 1e-3) / 1e12);
  return NQ_OK;
}
