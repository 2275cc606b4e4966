// The library's gemm_int4_mma in the builds it beat: 4 cp.async stages at 1 block/SM (163 registers, no spills, no
// split-K) and 3 stages at 2 blocks/SM without split-K. 7B at M = 512, us: gate+up 544.9 (4 stages) / 448.5 (no
// split) vs 448.6, down 310.9 / 322.6 vs 278.2 (7 splits), per layer 1103 / 1026 vs 992 (bench/NOTES.md, "Prefill
// GEMM v2"); split-K loses on q/o alone (64.8 unsplit vs 71.7) but wins the layer.
//   make -C csrc/dev && build/dev/gemm_int4_mma_variants
#include "gemm_dev.cuh"

int main() {
  dev::run_gemm_shapes("gemm_int4_mma, 4 stages, 1 block/SM, no split-K", [](const nq::LinW& W, const __half* A, int M,
                                                                           float* C) {
    const nq::GemmGroup g = dev::single(W, C, nq::MM_BN);
    dev::must(nq::launch_int4_mma<4, 1>(g, g.tiles0, A, W.K, M, W.N, false, /*allow_split=*/false, 0));
  });
  return dev::run_gemm_shapes("gemm_int4_mma, 3 stages, 2 blocks/SM, no split-K", [](const nq::LinW& W,
                                                                                   const __half* A, int M, float* C) {
    const nq::GemmGroup g = dev::single(W, C, nq::MM_BN);
    dev::must(nq::launch_int4_mma<3, 2>(g, g.tiles0, A, W.K, M, W.N, false, /*allow_split=*/false, 0));
  });
}
