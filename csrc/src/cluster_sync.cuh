// Thread-block-cluster synchronisation (sm_90 PTX) for kernels whose clusters merge partial results through
// distributed shared memory by pushing them (gemv_frag.cuh's split reduction): cluster barrier halves, mbarriers
// arrived on across the cluster, and stores into another rank's shared memory. The protocol (bench/NOTES.md
// "Session 23"): the receiver's mbarrier is initialised and published by a cluster barrier early (before the PDL
// wait); each sender stores into the receiver's buffer and arrives on its mbarrier (release, cluster scope); the
// receiver waits on its own mbarrier (acquire); a second cluster barrier, arrived at after the pushes and waited for
// at exit, keeps every block alive while others may still write into it (the CUDA guide's rule for distributed shared
// memory, which compute-sanitizer racecheck checks).
#pragma once
#include <cstdint>
#include "cp_async.cuh"   // smem_u32

namespace nq {

__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// makes mbarrier_init visible to the cluster's other blocks (then a cluster barrier before any of them arrives)
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// the shared::cluster address of p (this block's shared memory) in cluster rank `rank`'s shared memory
__device__ __forceinline__ uint32_t map_cluster(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_cluster_f32(uint32_t addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}
// an asynchronous store of v at addr (another rank's shared memory) that signals complete-tx (4 bytes) on the mbarrier
// at remote_bar (in the same rank): no fence, unlike a store followed by a release arrival (MEMBAR.GPU in SASS)
__device__ __forceinline__ void st_async_f32(uint32_t addr, float v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr),
               "r"(__float_as_uint(v)), "r"(remote_bar)
               : "memory");
}
// this thread's arrival on bar (shared::cta), expecting `bytes` of complete-tx in the current phase
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned long long* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_wait_parity_cluster(unsigned long long* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
}

}  // namespace nq
