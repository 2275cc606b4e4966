// Error plumbing shared by every translation unit: a thread-local message and CUDA-checking macros.
#pragma once
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdarg>
#include <string>
#include "nanoqwen.h"

namespace nq {

// Sets the thread-local last-error message and returns `code` (so: `return fail(NQ_E_IO, "...")`).
int fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
const char* last_error();

// The status of a failed CUDA call: NQ_E_OUT_OF_MEMORY for an allocation failure, else NQ_E_CUDA.
inline int cuda_status(cudaError_t e) { return e == cudaErrorMemoryAllocation ? NQ_E_OUT_OF_MEMORY : NQ_E_CUDA; }

// cudaMalloc of n elements (at least one) with a named error.
template <class T>
int dalloc(T** p, size_t n, const char* what) {
  const size_t bytes = (n > 0 ? n : 1) * sizeof(T);
  cudaError_t e = cudaMalloc(reinterpret_cast<void**>(p), bytes);
  if (e != cudaSuccess)
    return fail(cuda_status(e), "cudaMalloc for %s (%zu bytes): %s", what, bytes, cudaGetErrorString(e));
  return NQ_OK;
}

}  // namespace nq

// Evaluate a CUDA runtime call; on error record "<what>: <cuda message>" and return NQ_E_CUDA
// (NQ_E_OUT_OF_MEMORY when the device or pinned host memory is exhausted).
#define NQ_CUDA(call)                                                                                   \
  do {                                                                                                  \
    cudaError_t nq_err_ = (call);                                                                       \
    if (nq_err_ != cudaSuccess)                                                                         \
      return ::nq::fail(::nq::cuda_status(nq_err_), "%s failed at %s:%d: %s", #call, __FILE__, __LINE__, \
                        cudaGetErrorString(nq_err_));                                                   \
  } while (0)

// After a kernel launch: check the launch error.
#define NQ_LAUNCH_CHECK(name)                                                                           \
  do {                                                                                                  \
    cudaError_t nq_err_ = cudaGetLastError();                                                           \
    if (nq_err_ != cudaSuccess)                                                                         \
      return ::nq::fail(::nq::cuda_status(nq_err_), "launch of %s failed at %s:%d: %s", name, __FILE__, \
                        __LINE__,                                                                       \
                        cudaGetErrorString(nq_err_));                                                   \
  } while (0)

// Propagate a nonzero status.
#define NQ_TRY(expr)            \
  do {                          \
    int nq_rc_ = (expr);        \
    if (nq_rc_ != NQ_OK) return nq_rc_; \
  } while (0)
