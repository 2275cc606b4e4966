// The library's gemv_int4 (one 32-bit unit cursor per side, no per-unit index arithmetic or bounds checks in full
// steps) against gemv_int4_v2 (the index-based kernel it replaced: gemv_int4_v2.cuh), same run, same weights.
// ncu counted 113 warp instructions per 16-byte unit and row in v2, 39 of them bookkeeping (bench/NOTES.md "Session
// 4"); the SASS of the library kernel's main loop has ~75. Both validate against the CPU reference (x rounded to
// f16), then each shape is timed; first, time-only diagnostics: the read-only stream over the same bytes and the
// library kernel's loads and bookkeeping alone (LoadsOnly: the arithmetic replaced by an XOR of the words).
//   make -C csrc/dev && build/dev/gemv_int4_vs_v2
#include "gemv_dev.cuh"
#include "gemv_int4_v2.cuh"

namespace nq {
namespace {
// Diagnostic arithmetic for the library's gemv_int4 (time only, the results are not a GEMV).
struct LoadsOnlyUnits {
  static constexpr int kUnroll = F16Units::kUnroll;
  __device__ static void stage(const GemvArgs& a, int K, uint4* smem, float* red) { F16Units::stage(a, K, smem, red); }
  __device__ static float fma(const uint4 w, __half s, const uint4*, int, float acc) {
    return acc + __uint_as_float((w.x ^ w.y ^ w.z ^ w.w) & 0x3f7fffffu) * __half2float(s);
  }
};
// The library's arithmetic with 3 or 4 units per lane and row per pipeline stage (more bytes in flight per warp).
template <int U_>
struct F16UnitsU : F16Units {
  static constexpr int kUnroll = U_;
};

// The library's launch with the split factor forced (the library picks it with plan_split's cost model).
template <class Units = F16Units>
int launch_forced_split(const GemvArgs& a, int rows, int sm_count, int ks_log2) {
  const int ntasks = (rows + 1) / 2;
  const int G = kWarps >> ks_log2;
  const int grid = std::max(1, std::min((ntasks + G - 1) / G, sm_count * 2));
  const int rounds = (ntasks + grid * G - 1) / (grid * G);
  const size_t smem = (size_t)a.seg[0].K * 2 + (size_t)kWarps * rounds * 2 * sizeof(float);
  return launch_pdl("gemv_int4", gemv_int4<GEMV_STORE, 2, Units>, dim3(grid), dim3(kThreads), smem, (cudaStream_t)0, a,
                    rows, ntasks, ks_log2, rounds);
}
}  // namespace
}  // namespace nq

// Same bound as tests/test_gpu_kernels.py: x in f16, f16 partial sums of at most 16 products, f32 above.
constexpr double kTolF16Unpack = 3e-3;

int main() {
  dev::raise_smem(nq::gemv_int4<nq::GEMV_STORE, 2>);
  dev::raise_smem(nq::gemv_int4<nq::GEMV_STORE, 2, nq::LoadsOnlyUnits>);
  dev::raise_smem(nq::gemv_int4_v2<nq::GEMV_STORE, 2>);
  dev::raise_smem(nq::gemv_int4<nq::GEMV_STORE, 2, nq::F16UnitsU<3>>);
  dev::raise_smem(nq::gemv_int4<nq::GEMV_STORE, 2, nq::F16UnitsU<4>>);
  const int sms = dev::sm_count();
  std::vector<dev::Shape> shapes = dev::qwen7b_gemv_shapes();
  shapes.push_back({"7B gate+up", 2 * 18944, 3584});
  shapes.push_back({"0.5B qkv", 1152, 896});
  shapes.push_back({"0.5B down", 896, 4864});
  dev::time_diagnostics("diagnostics", shapes, sms, {
      {"loads only", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4<nq::GEMV_STORE, 2, nq::LoadsOnlyUnits>(a, r, sms, 0); }},
  });

  struct V { const char* name; std::function<int(const nq::GemvArgs&, int)> f; };
  const std::vector<V> variants = {
      {"library gemv_int4 (cursors)", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4<nq::GEMV_STORE, 2>(a, r, sms, 0); }},
      {"gemv_int4_v2 (indices)", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4_v2<nq::GEMV_STORE, 2>(a, r, sms, 0); }},
      {"library gemv_int4, 3 units per stage", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4<nq::GEMV_STORE, 2, nq::F16UnitsU<3>>(a, r, sms, 0); }},
      {"library gemv_int4, 4 units per stage", [&](const nq::GemvArgs& a, int r) { return nq::launch_gemv_int4<nq::GEMV_STORE, 2, nq::F16UnitsU<4>>(a, r, sms, 0); }},
      {"library gemv_int4, split 1", [&](const nq::GemvArgs& a, int r) { return nq::launch_forced_split(a, r, sms, 0); }},
      {"library gemv_int4, split 2", [&](const nq::GemvArgs& a, int r) { return nq::launch_forced_split(a, r, sms, 1); }},
      {"library gemv_int4, split 4", [&](const nq::GemvArgs& a, int r) { return nq::launch_forced_split(a, r, sms, 2); }},
  };
  for (const V& v : variants) {
    const int rc = dev::run_gemv_shapes(v.name, [&](const nq::GemvArgs& a, int rows) {
      const int st = v.f(a, rows);
      if (st != NQ_OK) std::printf("    (launch refused: %s)\n", nq::last_error());
    }, kTolF16Unpack, true, shapes);
    if (rc) return rc;
  }
  return 0;
}
