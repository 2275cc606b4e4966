// sm_90 synchronisation primitives (PTX), one home for every product kernel that uses them: mbarriers (the prefill
// GEMM's TMA ring in gemm_wgmma.cuh; the decode GEMV's split reduction in gemv_frag.cuh and the decode attention's
// cluster merge in attention.cu), thread-block-cluster barrier halves, and asynchronous stores into another cluster
// rank's shared memory. Addresses are shared::cta (smem_u32) or, where named, shared::cluster (map_cluster). Emitted
// only where called: the callers' kernel bodies are sm_90 code only.
// The push protocol of the GEMV and the attention (bench/NOTES.md "Session 23", "Session 24", "Session 25" §1): the
// receiver initialises its mbarrier (one arrival, its own, expecting the bytes it will receive) and publishes it by a
// cluster barrier early (before the PDL wait); each sender st.async's into the receiver's buffer, which signals
// complete-tx on the receiver's mbarrier (no fence); the receiver waits on its own mbarrier (acquire, cluster scope)
// and, waiting, cannot leave while others still write into it.
#pragma once
#include <cstdint>
#include "cp_async.cuh"   // smem_u32

namespace nq {

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// makes mbarrier_init visible to the cluster's other blocks and to the async proxy (TMA, st.async)
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// the shared::cluster address of p (this block's shared memory) in cluster rank `rank`'s shared memory
__device__ __forceinline__ uint32_t map_cluster(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
  return r;
}
// an asynchronous store of v at addr (another rank's shared memory) that signals complete-tx (4 bytes) on the mbarrier
// at remote_bar (in the same rank): no fence, unlike a store followed by a release arrival (MEMBAR.GPU in SASS)
__device__ __forceinline__ void st_async_f32(uint32_t addr, float v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr),
               "r"(__float_as_uint(v)), "r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void st_async_v2(uint32_t addr, float2 v, uint32_t remote_bar) {   // 8 bytes, as st_async_f32
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(addr),
               "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void st_async_v4(uint32_t addr, float4 v, uint32_t remote_bar) {   // 16 bytes
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(addr),
               "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
               "r"(__float_as_uint(v.w)), "r"(remote_bar)
               : "memory");
}
// this thread's arrival on bar, expecting `bytes` of complete-tx in the current phase
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// until the phase of parity `parity` completes (acquire: this CTA's view)
__device__ __forceinline__ void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// the same, acquiring at cluster scope (what other ranks pushed into this CTA's shared memory)
__device__ __forceinline__ void mbarrier_wait_parity_cluster(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
}

}  // namespace nq
