// Kernel launch with programmatic dependent launch (PDL) when the device supports it (sm_90+). Kernels launched
// here must call pdl_wait() before reading earlier results.
#pragma once
#include <utility>
#include "common.h"

namespace nq {

bool pdl_enabled();

// The current device's SM count, read once per process (the library runs on one device); 132 (H100/H200) where the
// query fails.
int device_sms();

// The split of an SM's unified 256 KB between shared memory and L1 that kernels ask for
// (cudaFuncAttributePreferredSharedMemoryCarveout, a percentage of the SM's 228 KB). Left to itself the driver picks a
// split per launch (for the 7B's decode: 100, 164, 64, 164 and 100 KB of shared memory for q/k/v, attention, o, gate/up
// and down) and an SM holds one at a time. On sm_90 every kernel launched here asks for kUniformSmemCarveoutPercent.
// The driver rounds a percentage up to the next split it has, so 72 % (164.2 KB) gives every decode kernel of the 7B
// 196 KB of shared memory and 60 KB of L1, cluster launches included (ncu on the H200, bench/NOTES.md "Session 30" §1).
// Measured there against the driver's splits (NOTES "Session 29" §2-4): 7B decode -1.0 %, 0.5B -0.7 %, 14B -0.75 %;
// every kernel at 228 KB (28 KB of L1) +3.5 to +4.1 %. 71 % (164 KB, cluster launches 196) ran within 0.2 % of 72 %,
// and 57 % (132 KB, cluster launches and attention 164) within 0.4 % once gate/up's shared memory was cut to keep its
// 5 blocks an SM (as is, 57 % leaves it 4: +10 %) ("Session 30" §1): between 60 and 124 KB the L1 size does not
// matter here. The dense lm_head GEMV (keep_driver_split) streams through L1 and keeps the driver's split (on the 0.5B
// 32 KB; at 72 % the 0.5B's decode took 3 % longer). Elsewhere (not measured) the driver's split.
constexpr int kUniformSmemCarveoutPercent = 72;
// Asks for the uniform split on `kernel` the first time it is launched (thread-safe; nothing off sm_90).
void prefer_uniform_split(const void* kernel);
// Leaves `kernel` at the driver's split (call before its first launch).
void keep_driver_split(const void* kernel);

// The one launcher: the PDL attribute where the device supports it, a thread-block cluster shape where `cluster`
// is given, and the uniform shared-memory split (above).
template <typename... KArgs, typename... Args>
int launch_ex(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, const dim3* cluster, size_t smem,
              cudaStream_t st, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster->x;
    attr[n].val.clusterDim.y = cluster->y;
    attr[n].val.clusterDim.z = cluster->z;
    n++;
  }
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    n++;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  prefer_uniform_split(reinterpret_cast<const void*>(kernel));
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) return fail(cuda_status(e), "launch of %s failed: %s", name, cudaGetErrorString(e));
  NQ_LAUNCH_CHECK(name);
  return NQ_OK;
}

template <typename... KArgs, typename... Args>
int launch_pdl(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
               Args&&... args) {
  return launch_ex(name, kernel, grid, block, nullptr, smem, st, std::forward<Args>(args)...);
}

// launch_pdl for a kernel whose blocks form thread-block clusters of `cluster` (sm_90+; the grid a multiple of it in
// every dimension). Clusters above 8 blocks need cudaFuncAttributeNonPortableClusterSizeAllowed set on the kernel
// beforehand; a cluster the GPU cannot make co-resident is a launch error (reported, as every launch error).
template <typename... KArgs, typename... Args>
int launch_pdl_cluster(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, dim3 cluster, size_t smem,
                       cudaStream_t st, Args&&... args) {
  return launch_ex(name, kernel, grid, block, &cluster, smem, st, std::forward<Args>(args)...);
}

}  // namespace nq
