// Causal prefill attention on mma.sync (csrc/src/attn_prefill.cuh: the kernel attn_prefill_fa<Cfg>, its design in
// the header's comment) against the product's prefill path (csrc/src/attention.cu, included below and launched through
// nq::attention: since the promotion attn_prefill_fa with PrefillCfg and its split rule) and the kernel it replaced
// (v1, csrc/dev/attn_prefill_v1.cuh: ~52 TFLOP/s at a 512-token prompt and ~110-140 at 8K-32K on the H200). Issue 12;
// bench/NOTES.md "Session 13: prefill attention (helper)": the reasoning and the prediction.
//
//   build/dev/attn_prefill_fa --case emulate # CPU: the kernel's index math and data flow against float64
//   build/dev/attn_prefill_fa --case check   # GPU: every variant x split against float64, and the product
//   build/dev/attn_prefill_fa --case time    # GPU: 7B (28 / 4 heads, D 128) prompts 512..32768, µs per layer
//
// Variants (Cfg<D, WARPS, MT, KT, ST, QREG, MINB>): 128-row blocks of 8 warps x 16 rows (Q in registers, ~200
// registers, 1 block per SM; or Q from shared memory at <= 128 registers, 2 blocks per SM) or 4 warps x 32 rows
// (FlashAttention-2's split: each K/V fragment feeds 2 MMAs), 64-row blocks of 4 warps, 64- or 32-key tiles, 2 or 3
// ring stages; each with key splits 1, 2, 4 (clusters). Timing: per layer as the session runs a prompt (chunks of
// prefill_chunk = 512 tokens, launch c at pos0 = 512c) and as one launch of M = N (a larger chunk).
#include "dev_common.cuh"
#include "attention.cu"  // the product: nq::attention (attn_prefill_kernel), the baseline
#include "attn_prefill.cuh"  // the kernel (attn_prefill_fa<Cfg>), its index math, launch_attn_prefill
#include "attn_prefill_v1.cuh"  // the prefill kernel the product had before (v1), a baseline
#include "cp_async.cuh"
#include "launch.h"
#include <cooperative_groups.h>
#include <cstring>
#include <string>

namespace fa {
using namespace dev;
using nq::AttnArgs;
using nq::kPage;
using namespace nq::pf;

// ---- variants -------------------------------------------------------------------------------------------------
struct Variant {
  const char* name;
  int rows;                                          // rows per block (16 * MT * WARPS)
  int (*launch)(const AttnArgs&, int nsplit, cudaStream_t);
  int regs = 0, spill = 0, smem = 0;
};

//                      D   W  MT  KT ST QREG MINB
template <int D> using W8M1K64S2Q = Cfg<D, 8, 1, 64, 2, true, 1>;
template <int D> using W8M1K64S3Q = Cfg<D, 8, 1, 64, 3, true, 1>;
template <int D> using W4M2K64S2 = Cfg<D, 4, 2, 64, 2, false, 1>;
template <int D> using W4M2K32S3 = Cfg<D, 4, 2, 32, 3, false, 1>;
template <int D> using W4M1K64S2Q = Cfg<D, 4, 1, 64, 2, true, 2>;
template <int D> using W8M1K64S2B2 = Cfg<D, 8, 1, 64, 2, false, 2>;
template <int D> using W8M1K32S3B2 = Cfg<D, 8, 1, 32, 3, false, 2>;

template <class C>
Variant make_variant(const char* name) {
  Variant v{name, C::ROWS, &launch_attn_prefill<C>};
  cudaFuncAttributes fa;
  if (cudaFuncGetAttributes(&fa, attn_prefill_fa<C>) == cudaSuccess) {
    v.regs = fa.numRegs;
    v.spill = (int)fa.localSizeBytes;
  }
  v.smem = C::SMEM;
  return v;
}
template <class C> struct Tag { using type = C; };
template <int D, class F>
void for_each_variant(F&& f) {   // f(Tag<Cfg>, name)
  f(Tag<W8M1K64S2Q<D>>{}, "w8m1k64s2q");
  f(Tag<W8M1K64S3Q<D>>{}, "w8m1k64s3q");
  f(Tag<W4M2K64S2<D>>{}, "w4m2k64s2");
  f(Tag<W4M2K32S3<D>>{}, "w4m2k32s3");
  f(Tag<W4M1K64S2Q<D>>{}, "w4m1k64s2q");
  f(Tag<W8M1K64S2B2<D>>{}, "w8m1k64s2b2");
  f(Tag<W8M1K32S3B2<D>>{}, "w8m1k32s3b2");
}
template <int D>
std::vector<Variant> variants() {
  std::vector<Variant> v;
  for_each_variant<D>([&](auto tag, const char* name) { v.push_back(make_variant<typename decltype(tag)::type>(name)); });
  return v;
}

// ---- inputs ----------------------------------------------------------------------------------------------------
struct Problem {
  int n_heads, n_kv, D, M, pos0;  // M query tokens at positions pos0 .. pos0 + M - 1
  int stride() const { return (n_heads + 2 * n_kv) * D; }
  int n_pos() const { return pos0 + M; }
};

// Device buffers of one problem (the cache holds all n_pos rows; pages in reversed physical order as the tests'
// fill_paged_cache; the rest of the last page NaN: never read)
struct DevProblem {
  Problem p{};
  float* qkv = nullptr;
  __half *k = nullptr, *v = nullptr, *out = nullptr;
  int *pt = nullptr, *pos = nullptr;
  float2* rope = nullptr;
  __half* part_o = nullptr;
  float* part_ml = nullptr;
  int* counters = nullptr;
  size_t out_elems = 0, guard_elems = 0;
  ~DevProblem() {
    for (void* x : {(void*)qkv, (void*)k, (void*)v, (void*)out, (void*)pt, (void*)pos, (void*)rope, (void*)part_o,
                    (void*)part_ml, (void*)counters})
      if (x) cudaFree(x);
  }
  AttnArgs args(int chunk = 0) const {  // chunk c of a chunked prompt: pos[c], qkv rows from c * M
    AttnArgs a;
    a.qkv = qkv + (size_t)chunk * p.M * p.stride(); a.qkv_stride = p.stride(); a.M = p.M; a.pos0 = pos + chunk;
    a.kv.k = k; a.kv.v = v; a.page_table = pt; a.rope = rope;
    a.n_heads = p.n_heads; a.n_kv = p.n_kv; a.D = p.D;
    a.keys_per_split = 32; a.n_split = 1; a.write_kv = false;
    a.part_o = part_o; a.part_ml = part_ml; a.counters = counters;
    a.out = out + (size_t)chunk * p.M * p.n_heads * p.D;
    a.max_keys = p.pos0 + (chunk + 1) * p.M;   // as session_prefill: the product's build choice
    return a;
  }
};

inline std::vector<float2> rope_table(int n_pos, int D) {
  std::vector<float2> r((size_t)n_pos * (D / 2));
  for (int pos = 0; pos < n_pos; pos++)
    for (int i = 0; i < D / 2; i++) {
      const double th = pos * std::pow(1e6, -2.0 * i / D);   // Qwen2.5's rope base
      r[(size_t)pos * (D / 2) + i] = make_float2((float)std::cos(th), (float)std::sin(th));
    }
  return r;
}

// Host copy of a check problem and its float64 reference.
struct HostProblem {
  Problem p;
  std::vector<float> q;       // [M][n_heads * D], before rope
  std::vector<__half> kc, vc;  // [n_pos][n_kv][D] (f16: the cache values)
  std::vector<float2> rope;
};

HostProblem make_host(const Problem& p, uint32_t seed) {
  HostProblem hp;
  hp.p = p;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  hp.q.resize((size_t)p.M * p.n_heads * p.D);
  for (float& x : hp.q) x = 2.f * nd(rng);  // the tests' scale: peaked softmax rows
  hp.kc.resize((size_t)p.n_pos() * p.n_kv * p.D);
  hp.vc.resize(hp.kc.size());
  for (auto& x : hp.kc) x = __float2half_rn(nd(rng));
  for (auto& x : hp.vc) x = __float2half_rn(nd(rng));
  hp.rope = rope_table(p.n_pos(), p.D);
  return hp;
}

std::vector<double> reference(const HostProblem& hp) {
  const Problem& p = hp.p;
  const int G = p.n_heads / p.n_kv, D = p.D;
  std::vector<double> out((size_t)p.M * p.n_heads * D);
#pragma omp parallel for schedule(dynamic)
  for (int th = 0; th < p.M * p.n_heads; th++) {
    const int tq = th / p.n_heads, hq = th % p.n_heads, hk = hq / G, pos = p.pos0 + tq;
    std::vector<double> q(D), s(pos + 1);
    const float* qi = hp.q.data() + (size_t)tq * p.n_heads * D + hq * D;
    for (int d = 0; d < D / 2; d++) {
      const float2 cs = hp.rope[(size_t)pos * (D / 2) + d];
      q[d] = (double)qi[d] * cs.x - (double)qi[d + D / 2] * cs.y;
      q[d + D / 2] = (double)qi[d + D / 2] * cs.x + (double)qi[d] * cs.y;
    }
    double mx = -1e300;
    for (int j = 0; j <= pos; j++) {
      const __half* kr = hp.kc.data() + ((size_t)j * p.n_kv + hk) * D;
      double acc = 0.0;
      for (int d = 0; d < D; d++) acc += q[d] * (double)__half2float(kr[d]);
      s[j] = acc / std::sqrt((double)D);
      mx = std::max(mx, s[j]);
    }
    double sum = 0.0;
    for (int j = 0; j <= pos; j++) sum += (s[j] = std::exp(s[j] - mx));
    double* o = out.data() + (size_t)th * D;
    for (int d = 0; d < D; d++) o[d] = 0.0;
    for (int j = 0; j <= pos; j++) {
      const __half* vr = hp.vc.data() + ((size_t)j * p.n_kv + hk) * D;
      const double w = s[j] / sum;
      for (int d = 0; d < D; d++) o[d] += w * (double)__half2float(vr[d]);
    }
  }
  return out;
}

// The paged cache of a check problem: pages in reversed physical order (the tests' fill_paged_cache), the rows past
// n_pos in the last page NaN (never read)
struct HostCache {
  std::vector<int> pt;
  std::vector<__half> k, v;
};
HostCache make_cache(const HostProblem& hp) {
  const Problem& p = hp.p;
  const int pages = (p.n_pos() + kPage - 1) / kPage, D = p.D;
  HostCache c;
  c.pt.resize(pages);
  for (int i = 0; i < pages; i++) c.pt[i] = pages - 1 - i;
  const size_t cache = (size_t)pages * p.n_kv * kPage * D;
  c.k.assign(cache, __ushort_as_half(0xffff));
  c.v.assign(cache, __ushort_as_half(0xffff));
  for (int j = 0; j < p.n_pos(); j++)
    for (int hh = 0; hh < p.n_kv; hh++)
      for (int d = 0; d < D; d++) {
        const size_t idx = (((size_t)c.pt[j / kPage] * p.n_kv + hh) * kPage + j % kPage) * D + d;
        c.k[idx] = hp.kc[((size_t)j * p.n_kv + hh) * D + d];
        c.v[idx] = hp.vc[((size_t)j * p.n_kv + hh) * D + d];
      }
  return c;
}

void upload(DevProblem& dp, const HostProblem& hp) {
  const Problem& p = hp.p;
  dp.p = p;
  const HostCache hc = make_cache(hp);
  const std::vector<int>& pt = hc.pt;
  const std::vector<__half>&k = hc.k, &v = hc.v;
  const int pages = (int)pt.size(), D = p.D;
  const size_t cache = k.size();
  std::vector<float> qkv((size_t)p.M * p.stride(), 1e30f);  // the k/v parts: not read by prefill attention
  for (int t = 0; t < p.M; t++)
    std::memcpy(qkv.data() + (size_t)t * p.stride(), hp.q.data() + (size_t)t * p.n_heads * D, (size_t)p.n_heads * D * 4);
  DEV_CHECK(cudaMalloc(&dp.qkv, qkv.size() * 4));
  DEV_CHECK(cudaMemcpy(dp.qkv, qkv.data(), qkv.size() * 4, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.k, cache * 2));
  DEV_CHECK(cudaMalloc(&dp.v, cache * 2));
  DEV_CHECK(cudaMemcpy(dp.k, k.data(), cache * 2, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMemcpy(dp.v, v.data(), cache * 2, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.pt, pages * 4));
  DEV_CHECK(cudaMemcpy(dp.pt, pt.data(), pages * 4, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.pos, 4));
  DEV_CHECK(cudaMemcpy(dp.pos, &p.pos0, 4, cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.rope, hp.rope.size() * sizeof(float2)));
  DEV_CHECK(cudaMemcpy(dp.rope, hp.rope.data(), hp.rope.size() * sizeof(float2), cudaMemcpyHostToDevice));
  DEV_CHECK(cudaMalloc(&dp.part_o, 4 * 64));
  DEV_CHECK(cudaMalloc(&dp.part_ml, 4 * 64));
  DEV_CHECK(cudaMalloc(&dp.counters, 4 * 64));
  dp.out_elems = (size_t)p.M * p.n_heads * D;
  dp.guard_elems = (size_t)4 * p.n_heads * D;  // 4 rows past M: must stay poisoned
  DEV_CHECK(cudaMalloc(&dp.out, (dp.out_elems + dp.guard_elems) * 2));
}

// Runs launch on dp (output poisoned 0xff first); relative Frobenius error against ref, or -1 if an output is not
// finite (unwritten: the poison is NaN) or a guard element past M was written, -2 if the launch failed.
double run_and_compare(DevProblem& dp, const std::vector<double>& ref, const std::function<int()>& launch,
                       std::vector<float>* got_out = nullptr) {
  DEV_CHECK(cudaMemset(dp.out, 0xff, (dp.out_elems + dp.guard_elems) * 2));
  if (launch() != NQ_OK) {
    std::printf("  launch: %s\n", nq::last_error());
    (void)cudaGetLastError();
    return -2;
  }
  DEV_CHECK(cudaDeviceSynchronize());
  std::vector<__half> h(dp.out_elems + dp.guard_elems);
  DEV_CHECK(cudaMemcpy(h.data(), dp.out, h.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = dp.out_elems; i < h.size(); i++)
    if (__half_as_ushort(h[i]) != 0xffff) return -1;
  double num = 0.0, den = 0.0;
  if (got_out) got_out->resize(dp.out_elems);
  for (size_t i = 0; i < dp.out_elems; i++) {
    const float x = __half2float(h[i]);
    if (!std::isfinite(x)) return -1;
    if (got_out) (*got_out)[i] = x;
    num += (x - ref[i]) * (x - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ---- --case emulate (CPU): the kernel's index math and data flow on the host ------------------------------------
// Runs attn_prefill_fa<C>'s block geometry, key split, K/V copy addressing (against kv_row), Q staging, per-warp skip and
// causal-mask decisions, the online softmax with its lane ownership (lane 4g + t: rows g, g + 8 of each m-tile,
// keys / dims 8n + 2t + e), the f16 roundings of q and P, the output rows and the cluster merge, with the same
// shared helpers (block_geom, warp_rows, Copy). What it cannot see: ldmatrix / mma fragment addressing (the
// product's, unchanged), cp.async ordering and barriers (the GPU check's job).
template <class C>
std::vector<float> emulate(const HostProblem& hp, const HostCache& hc, int nsplit, long* addr_errors) {
  constexpr int D = C::D, KT = C::KT, MT = C::MT, ND = C::ND, ROWS = C::ROWS;
  using CP = Copy<C>;
  const Problem& p = hp.p;
  const int G = p.n_heads / p.n_kv, TQ = ROWS / G, nby = (p.M + TQ - 1) / TQ, pos0 = p.pos0;
  std::vector<float> out((size_t)p.M * p.n_heads * D, std::nanf(""));
  std::vector<int> written(out.size(), 0);
  const uint32_t pstride = (uint32_t)p.n_kv * kPage * D;
  long errs = 0;
#pragma omp parallel for schedule(dynamic) reduction(+ : errs)
  for (int hb = 0; hb < p.n_kv * nby; hb++) {
    const int h = hb % p.n_kv, by = hb / p.n_kv;
    std::vector<std::vector<float>> PO(nsplit, std::vector<float>((size_t)ROWS * D, 0.f));
    std::vector<std::vector<float>> PM(nsplit, std::vector<float>(ROWS)), PL(nsplit, std::vector<float>(ROWS));
    std::vector<float> Qs((size_t)ROWS * D), Ks((size_t)KT * D), Vs((size_t)KT * D);
    Geom b{};
    for (int split = 0; split < nsplit; split++) {
      b = block_geom<C>(p.n_heads, p.n_kv, p.M, pos0, by, nby, split, nsplit);
      // Q staging, as the kernel's items (r, d..d+3)
      const float qs = 1.4426950408889634f / std::sqrt((float)D);
      for (int i = 0; i < ROWS * (D / 8); i++) {
        const int r = i / (D / 8), d0 = (i % (D / 8)) * 4;
        const bool valid = r < b.Rreal;
        const int tq = valid ? r / G : 0, hg = valid ? r % G : 0;
        const float* qin = hp.q.data() + (size_t)(b.t0 + tq) * p.n_heads * D + (h * G + hg) * D;
        for (int e = 0; e < 4; e++) {
          const int d = d0 + e;
          const float2 cs = hp.rope[(size_t)(pos0 + b.t0 + tq) * (D / 2) + d];
          const float x0 = qin[d], x1 = qin[d + D / 2];
          Qs[(size_t)r * D + d] = valid ? __half2float(__float2half_rn((x0 * cs.x - x1 * cs.y) * qs)) : 0.f;
          Qs[(size_t)r * D + d + D / 2] = valid ? __half2float(__float2half_rn((x1 * cs.x + x0 * cs.y) * qs)) : 0.f;
        }
      }
      // per lane state: m per (warp, g, mt, hr) (equal over the quad), l per lane, O per (row, dim) (one owner each)
      std::vector<float> m((size_t)C::WARPS * 8 * MT * 2, -INFINITY), l((size_t)C::WARPS * 32 * MT * 2, 0.f);
      std::vector<float>& O = PO[split];
      std::fill(O.begin(), O.end(), 0.f);
      for (int i = 0; i < b.nt; i++) {
        const int tile = b.ts + i, kt0 = tile * KT;
        // copies
        for (int tid = 0; tid < C::THREADS; tid++) {
          const int cpart = tid % C::CPR, crow = tid / C::CPR;
          uint32_t pg[CP::NPG];
          for (int q = 0; q < CP::NPG; q++) {
            const int key = CP::page_key(tile, q, crow);
            pg[q] = key < b.n_keys ? (uint32_t)hc.pt[key >> 4] : 0u;
          }
          for (int pp = 0; pp < C::NPASS; pp++) {
            const int j = crow + pp * C::KPP, key = kt0 + j;
            const bool ok = key < b.n_keys;
            const size_t off = CP::src_bytes(pg[CP::page_reg(pp)], pstride, CP::thr_off(h, crow, cpart), pp) / 2;
            if (ok && off != (((size_t)hc.pt[key / kPage] * p.n_kv + h) * kPage + key % kPage) * D + cpart * 8) errs++;
            for (int e = 0; e < 8; e++) {
              Ks[(size_t)j * D + cpart * 8 + e] = ok ? __half2float(hc.k[off + e]) : 0.f;
              Vs[(size_t)j * D + cpart * 8 + e] = ok ? __half2float(hc.v[off + e]) : 0.f;
            }
          }
        }
        for (int w = 0; w < C::WARPS; w++) {
          const int wr0 = w * 16 * MT;
          for (int g = 0; g < 8; g++) {
            int wmin, wmax, rpos[MT][2];
            warp_rows<C>(b, pos0, w, g, wmin, wmax, rpos);
            if (kt0 > wmax) continue;
            const bool mask = kt0 + KT - 1 > wmin;
            for (int mt = 0; mt < MT; mt++)
              for (int hr = 0; hr < 2; hr++) {
                const int row = wr0 + 16 * mt + g + 8 * hr;
                float sc[KT];
                for (int kl = 0; kl < KT; kl++) {  // key kl = 8n + 2t + e lies in lane t's sc[mt][n][2hr + e]
                  float acc = 0.f;
                  for (int d = 0; d < D; d++) acc += Qs[(size_t)row * D + d] * Ks[(size_t)kl * D + d];
                  sc[kl] = mask && kt0 + kl > rpos[mt][hr] ? -INFINITY : acc;
                }
                float& mm = m[((size_t)(w * 8 + g) * MT + mt) * 2 + hr];
                float mx = -INFINITY;
                for (int kl = 0; kl < KT; kl++) mx = std::max(mx, sc[kl]);
                const float m_new = std::max(mm, mx), m_use = m_new == -INFINITY ? 0.f : m_new;
                const float corr = std::exp2(mm - m_use);
                for (int t = 0; t < 4; t++) {
                  float sum = 0.f;
                  for (int n = 0; n < KT / 8; n++)
                    for (int e = 0; e < 2; e++) {
                      float& v = sc[8 * n + 2 * t + e];
                      v = std::exp2(v - m_use);
                      sum += v;
                    }
                  float& ll = l[((size_t)(w * 32 + 4 * g + t) * MT + mt) * 2 + hr];
                  ll = ll * corr + sum;
                }
                mm = m_new;
                for (int dim = 0; dim < D; dim++) {  // owner: lane 4g + (dim % 8) / 2, o[mt][dim / 8][2hr + dim % 2]
                  float acc = O[(size_t)row * D + dim] * corr;
                  for (int kl = 0; kl < KT; kl++) acc += __half2float(__float2half_rn(sc[kl])) * Vs[(size_t)kl * D + dim];
                  O[(size_t)row * D + dim] = acc;
                }
              }
          }
        }
      }
      // row sums over the quad; partial or output
      for (int w = 0; w < C::WARPS; w++)
        for (int g = 0; g < 8; g++)
          for (int mt = 0; mt < MT; mt++)
            for (int hr = 0; hr < 2; hr++) {
              const int row = w * 16 * MT + 16 * mt + g + 8 * hr;
              float L = 0.f;
              for (int t = 0; t < 4; t++) L += l[((size_t)(w * 32 + 4 * g + t) * MT + mt) * 2 + hr];
              PM[split][row] = m[((size_t)(w * 8 + g) * MT + mt) * 2 + hr];
              PL[split][row] = L;
              if (nsplit == 1 && row < b.Rreal)
                for (int t = 0; t < 4; t++)
                  for (int n = 0; n < ND; n++)
                    for (int e = 0; e < 2; e++) {
                      const int dim = 8 * n + 2 * t + e;
                      const size_t oi = (size_t)(b.t0 + row / G) * p.n_heads * D + (h * G + row % G) * D + dim;
                      out[oi] = __half2float(__float2half_rn(O[(size_t)row * D + dim] * (1.f / L)));
                      written[oi]++;
                    }
            }
    }
    if (nsplit > 1)
      for (int rank = 0; rank < nsplit; rank++) {
        const int r0 = rank * b.Rreal / nsplit, r1 = (rank + 1) * b.Rreal / nsplit;
        for (int r = r0; r < r1; r++) {
          float M = -INFINITY, L = 0.f, wj[C::kMaxSplit];
          for (int j = 0; j < nsplit; j++) M = std::max(M, PM[j][r]);
          for (int j = 0; j < nsplit; j++) { wj[j] = std::exp2(PM[j][r] - M); L += PL[j][r] * wj[j]; }
          for (int dim = 0; dim < D; dim++) {
            float acc = 0.f;
            for (int j = 0; j < nsplit; j++) acc += wj[j] / L * PO[j][(size_t)r * D + dim];
            const size_t oi = (size_t)(b.t0 + r / G) * p.n_heads * D + (h * G + r % G) * D + dim;
            out[oi] = __half2float(__float2half_rn(acc));
            written[oi]++;
          }
        }
      }
  }
  for (int w : written)
    if (w != 1) errs++;   // every output exactly once
  *addr_errors = errs;
  return out;
}

template <class C>
int emulate_one(const char* name, const HostProblem& hp, const HostCache& hc, const std::vector<double>& ref, int nsplit) {
  long errs = 0;
  const std::vector<float> got = emulate<C>(hp, hc, nsplit, &errs);
  double num = 0.0, den = 0.0;
  bool finite = true;
  for (size_t i = 0; i < ref.size(); i++) {
    finite &= std::isfinite(got[i]);
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  const double e = std::sqrt(num / std::max(den, 1e-300));
  const bool ok = finite && errs == 0 && e < 2e-3;
  std::printf("  %-11s split %d: %.2e%s%s %s\n", name, nsplit, e, finite ? "" : " [non-finite]",
              errs ? " [address / coverage errors]" : "", ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

int case_emulate() {
  int fails = 0;
  uint32_t seed = 99;
  auto run = [&](const Problem& p, std::initializer_list<int> splits) {
    const HostProblem hp = make_host(p, seed++);
    const HostCache hc = make_cache(hp);
    const std::vector<double> ref = reference(hp);
    std::printf("-- heads %d/%d (G %d) D %d, M %d after %d keys\n", p.n_heads, p.n_kv, p.n_heads / p.n_kv, p.D, p.M,
                p.pos0);
    auto each = [&](auto tag, const char* name) {
      using C = typename decltype(tag)::type;
      if (p.n_heads / p.n_kv > C::ROWS) return;
      for (int s : splits) fails += emulate_one<C>(name, hp, hc, ref, s);
    };
    if (p.D == 128) for_each_variant<128>(each); else for_each_variant<64>(each);
    std::fflush(stdout);
  };
  for (int D : {128, 64})
    for (int G : {7, 2})
      for (int M : {2, 17, 100})
        for (int pos0 : {0, 37}) run(Problem{G == 7 ? 28 : 4, G == 7 ? 4 : 2, D, M, pos0}, {1, 2, 3, 8});
  run(Problem{28, 4, 128, 300, 140}, {1, 2, 3});
  for (const Problem& p : {Problem{16, 2, 128, 45, 32}, Problem{40, 8, 128, 100, 200}, Problem{12, 2, 128, 64, 236},
                           Problem{8, 8, 64, 100, 200}, Problem{14, 2, 64, 130, 3}})
    run(p, {1, 2, 5});
  std::printf("emulate: %d failure(s)\n", fails);
  return fails ? 1 : 0;
}

// ---- --case check -------------------------------------------------------------------------------------------
// Tolerance 2e-3, the product contract's (tests/test_gpu_kernels.py test_attention_prefill_vs_numpy): f16 K/V in
// the reference too; the tensor cores take q and P in f16 (2^-12 relative each), f32 accumulation and softmax, the
// output rounded to f16 (2^-12): ~1e-3 in all. The split merge adds f32 arithmetic only.
constexpr double kTol = 2e-3;

template <int D>
int check_one(const Problem& p, uint32_t seed, int* fails) {
  const HostProblem hp = make_host(p, seed);
  const std::vector<double> ref = reference(hp);
  DevProblem dp;
  upload(dp, hp);
  std::printf("-- heads %d/%d (G %d) D %d, M %d after %d keys\n", p.n_heads, p.n_kv, p.n_heads / p.n_kv, D, p.M, p.pos0);
  std::vector<float> prod;   // v1's output: the variants' max difference against it, for the record
  const double e1 = run_and_compare(dp, ref, [&] { return nq::v1::attention_prefill_v1(dp.args(), 0); }, &prod);
  std::printf("  v1 attn_prefill_kernel:      %.2e %s\n", e1, e1 >= 0 && e1 < kTol ? "ok" : "FAIL");
  if (!(e1 >= 0 && e1 < kTol)) ++*fails;
  const double ep = run_and_compare(dp, ref, [&] { return nq::attention(dp.args(), 0); });
  std::printf("  product nq::attention():     %.2e %s\n", ep, ep >= 0 && ep < kTol ? "ok" : "FAIL");
  if (!(ep >= 0 && ep < kTol)) ++*fails;
  for (const Variant& v : variants<D>()) {
    if (p.n_heads / p.n_kv > v.rows) continue;
    for (int s : {1, 2, 3, 4, 8}) {
      std::vector<float> got;
      const double e = run_and_compare(dp, ref, [&] { return v.launch(dp.args(), s, 0); }, &got);
      double dmax = 0.0;   // against v1, for the record
      for (size_t i = 0; i < got.size() && i < prod.size(); i++) dmax = std::max(dmax, (double)std::fabs(got[i] - prod[i]));
      const bool ok = e >= 0 && e < kTol;
      std::printf("  %-11s split %d: %.2e %s (max |fa - v1| %.1e)%s\n", v.name, s, e, ok ? "ok" : "FAIL", dmax,
                  e == -1 ? " [unwritten/non-finite output or write past M]" : e == -2 ? " [launch failed]" : "");
      if (!ok) ++*fails;
    }
  }
  return 0;
}

int case_check() {
  int fails = 0;
  uint32_t seed = 1234;
  for (int D : {128, 64})
    for (int G : {7, 2})
      for (int M : {2, 17, 100, 512})
        for (int pos0 : {0, 37}) {
          const Problem p{G == 7 ? 28 : 4, G == 7 ? 4 : 2, D, M, pos0};
          if (D == 128) check_one<128>(p, seed++, &fails); else check_one<64>(p, seed++, &fails);
        }
  // the product tests' other head layouts: G 8, 5, 6, 1
  for (const Problem& p : {Problem{16, 2, 128, 45, 32}, Problem{40, 8, 128, 100, 600}, Problem{12, 2, 128, 64, 236},
                           Problem{8, 8, 64, 100, 600}, Problem{14, 2, 64, 130, 3},
                           // past kPrefillLongKeys: the product's long build (split 2 on these small grids)
                           Problem{28, 4, 128, 100, 2000}, Problem{14, 2, 64, 512, 1700}})
    if (p.D == 128) check_one<128>(p, seed++, &fails); else check_one<64>(p, seed++, &fails);
  std::printf("check: %d failure(s)\n", fails);
  return fails ? 1 : 0;
}

// ---- --case time ------------------------------------------------------------------------------------------------
__global__ void fill_f32(float* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    p[i] = scale * ((float)(x >> 8) * (1.f / 8388608.f) - 1.f);   // uniform [-scale, scale)
  }
}
__global__ void fill_f16(__half* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    p[i] = __float2half_rn(scale * ((float)(x >> 8) * (1.f / 8388608.f) - 1.f));
  }
}

// A prompt of N tokens on the 7B shapes, all of it in the cache (as after rope_kv_write), q for all N tokens.
// chunk: tokens per launch (the session's prefill_chunk, 512: launch c serves tokens 512c .. at pos0 = 512c);
// chunk = N: one launch.
struct TimeProblem {
  DevProblem dp;
  int N = 0;
  TimeProblem(int N_, int chunk) : N(N_) {
    Problem& p = dp.p;
    p = Problem{28, 4, 128, chunk, 0};
    const int pages = (N + kPage - 1) / kPage, D = p.D;
    const size_t qkv_n = (size_t)N * p.stride(), cache = (size_t)pages * p.n_kv * kPage * D;
    DEV_CHECK(cudaMalloc(&dp.qkv, qkv_n * 4));
    DEV_CHECK(cudaMalloc(&dp.k, cache * 2));
    DEV_CHECK(cudaMalloc(&dp.v, cache * 2));
    fill_f32<<<1024, 256>>>(dp.qkv, qkv_n, 11u, 3.f);
    fill_f16<<<1024, 256>>>(dp.k, cache, 12u, 1.7f);
    fill_f16<<<1024, 256>>>(dp.v, cache, 13u, 1.7f);
    std::vector<int> pt(pages);
    for (int i = 0; i < pages; i++) pt[i] = pages - 1 - i;
    DEV_CHECK(cudaMalloc(&dp.pt, pages * 4));
    DEV_CHECK(cudaMemcpy(dp.pt, pt.data(), pages * 4, cudaMemcpyHostToDevice));
    const int nchunks = N / chunk;
    std::vector<int> pos(nchunks);
    for (int c = 0; c < nchunks; c++) pos[c] = c * chunk;
    DEV_CHECK(cudaMalloc(&dp.pos, nchunks * 4));
    DEV_CHECK(cudaMemcpy(dp.pos, pos.data(), nchunks * 4, cudaMemcpyHostToDevice));
    const std::vector<float2> rope = rope_table(N, D);
    DEV_CHECK(cudaMalloc(&dp.rope, rope.size() * sizeof(float2)));
    DEV_CHECK(cudaMemcpy(dp.rope, rope.data(), rope.size() * sizeof(float2), cudaMemcpyHostToDevice));
    DEV_CHECK(cudaMalloc(&dp.part_o, 4 * 64));
    DEV_CHECK(cudaMalloc(&dp.part_ml, 4 * 64));
    DEV_CHECK(cudaMalloc(&dp.counters, 4 * 64));
    dp.out_elems = (size_t)N * p.n_heads * D;
    DEV_CHECK(cudaMalloc(&dp.out, dp.out_elems * 2));
    DEV_CHECK(cudaDeviceSynchronize());
  }
  int nchunks() const { return N / dp.p.M; }
  double flops() const { return 4.0 * dp.p.n_heads * dp.p.D * ((double)N * (N + 1) / 2); }
};

int case_time() {
  cudaDeviceProp prop;
  DEV_CHECK(cudaGetDeviceProperties(&prop, 0));
  const std::vector<Variant> vs = variants<128>();
  for (const Variant& v : vs)
    std::printf("%-11s rows %3d: %d registers, %d bytes local (spill), %d B dynamic shared memory\n", v.name, v.rows,
                v.regs, v.spill, v.smem);
  struct Best { double us = 1e30; std::string what; double v1 = 0, prod = 0; };
  std::vector<std::pair<std::string, Best>> bests;
  for (int chunked : {1, 0})
    for (int N : {512, 2048, 8192, 32768}) {
      if (!chunked && N == 512) continue;   // the same launch as chunked
      const int chunk = chunked ? std::min(N, 512) : N;
      TimeProblem tp(N, chunk);
      const int nc = tp.nchunks();
      const int iters = N <= 512 ? 50 : N <= 2048 ? 10 : N <= 8192 ? 3 : 1, reps = N <= 8192 ? 11 : 5;
      auto per_layer = [&](const std::function<int(const AttnArgs&)>& one) {
        return median_us([&](int) {
          for (int c = 0; c < nc; c++) must(one(tp.dp.args(c)));
        }, iters, reps);
      };
      const std::string mode = chunked ? "chunks of 512" : "one launch";
      const double fl = tp.flops();
      const double u1 = per_layer([](const AttnArgs& a) { return nq::v1::attention_prefill_v1(a, 0); });
      const double up = per_layer([](const AttnArgs& a) { return nq::attention(a, 0); });
      std::printf("N %5d (%s, %d launch%s): v1 attn_prefill_kernel %9.1f us/layer %6.1f TFLOP/s\n", N, mode.c_str(), nc,
                  nc > 1 ? "es" : "", u1, fl / u1 * 1e-6);
      std::printf("N %5d (%s): product nq::attention() %9.1f us/layer %6.1f TFLOP/s  x%.2f vs v1\n", N, mode.c_str(), up,
                  fl / up * 1e-6, u1 / up);
      {
        int sms = 132;
        DEV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        using PL = nq::PrefillLong<128>;
        const int blocks = tp.dp.p.n_kv * ((tp.dp.p.M + PL::ROWS / 7 - 1) / (PL::ROWS / 7));
        int n_long = 0;
        for (int c = 0; c < nc; c++) n_long += tp.dp.args(c).max_keys >= nq::kPrefillLongKeys;
        std::printf("N %5d (%s): the product runs PrefillShort (w4m1k64s2q split 1) on %d launch(es), PrefillLong "
                    "(w4m2k32s3 split %d) on %d\n", N, mode.c_str(), nc - n_long, nq::pf::prefill_splits(blocks, sms),
                    n_long);
      }
      Best b;
      b.v1 = u1;
      b.prod = up;
      for (const Variant& v : vs)
        for (int s : {1, 2, 4}) {
          if (v.launch(tp.dp.args(0), s, 0) != NQ_OK || cudaDeviceSynchronize() != cudaSuccess) {   // refused: skip
            std::printf("N %5d (%s): %-11s split %d: launch failed (%s), skipped\n", N, mode.c_str(), v.name, s,
                        nq::last_error());
            (void)cudaGetLastError();
            continue;
          }
          const double us = per_layer([&](const AttnArgs& a) { return v.launch(a, s, 0); });
          std::printf("N %5d (%s): %-11s split %d %9.1f us/layer %6.1f TFLOP/s  x%.2f vs v1\n", N, mode.c_str(), v.name,
                      s, us, fl / us * 1e-6, u1 / us);
          if (us < b.us) { b.us = us; b.what = std::string(v.name) + " split " + std::to_string(s); }
        }
      bests.push_back({"N " + std::to_string(N) + " (" + mode + ")", b});
      std::fflush(stdout);
    }
  for (auto& [k, b] : bests)
    std::printf("best per prompt: %-26s %-20s %9.1f us/layer (v1 %9.1f: x%.2f; product %9.1f)\n", k.c_str(),
                b.what.c_str(), b.us, b.v1, b.v1 / b.us, b.prod);
  (void)prop;
  return 0;
}

}  // namespace fa

int main(int argc, char** argv) {
  const std::string c = argc > 2 && std::strcmp(argv[1], "--case") == 0 ? argv[2] : "";
  if (c == "emulate") return fa::case_emulate();
  if (c != "check" && c != "time") {
    std::printf("usage: attn_prefill_fa --case emulate|check|time\n");
    return 2;
  }
  cudaDeviceProp prop;
  DEV_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("== case %s on %s\n", c.c_str(), prop.name);
  return c == "check" ? fa::case_check() : fa::case_time();
}
