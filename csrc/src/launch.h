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

// The one launcher: the PDL attribute where the device supports it, and a thread-block cluster shape where `cluster`
// is given.
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
