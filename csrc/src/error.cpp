#include <mutex>
#include <unordered_set>
#include "common.h"
#include "launch.h"

namespace nq {
namespace {
thread_local std::string g_last_error;
}

int fail(int code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_last_error = buf;
  return code;
}

const char* last_error() { return g_last_error.c_str(); }

}  // namespace nq

namespace nq {
namespace {
// An attribute of the current device, or `fallback` where a query fails (its error cleared: a failed query must not
// surface as the next launch's error). Callers read it once, into a function-local static (thread-safe).
int current_device_attribute(cudaDeviceAttr attr, int fallback) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return fallback;
  }
  return v;
}
}  // namespace

// PDL on when the current device is sm_90+ (read once).
bool pdl_enabled() {
  static const bool on = current_device_attribute(cudaDevAttrComputeCapabilityMajor, 0) >= 9;
  return on;
}

namespace {
// kUniformSmemCarveoutPercent on sm_90 (launch.h), -1 elsewhere or where the query fails
int uniform_split_percent() {
  static const int percent =
      current_device_attribute(cudaDevAttrComputeCapabilityMajor, 0) == 9 ? kUniformSmemCarveoutPercent : -1;
  return percent;
}
std::mutex g_split_mutex;
std::unordered_set<const void*> g_split_set;   // kernels whose split was asked for, or kept (keep_driver_split)
}  // namespace

void prefer_uniform_split(const void* kernel) {
  const int percent = uniform_split_percent();
  if (percent < 0) return;
  std::lock_guard<std::mutex> lock(g_split_mutex);
  if (!g_split_set.insert(kernel).second) return;
  // a hint: a failure leaves the driver's split, which is correct, only slower
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent) != cudaSuccess)
    (void)cudaGetLastError();
}

void keep_driver_split(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_split_mutex);
  g_split_set.insert(kernel);
}

int device_sms() {
  static const int sms = [] {
    const int n = current_device_attribute(cudaDevAttrMultiProcessorCount, 0);
    return n < 1 ? 132 : n;
  }();
  return sms;
}
}  // namespace nq
