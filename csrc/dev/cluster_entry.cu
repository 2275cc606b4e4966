// cluster_entry: when do a dependent kernel's blocks enter under programmatic dependent launch (PDL), launched plain
// or in thread-block clusters, behind a predecessor whose blocks fill the SMs? bench/NOTES.md "Session 32" §2: the
// decode attention launched in clusters (of 4 or 8) cost ~2.5 µs a 7B layer at 8K against the same work launched
// plain, whatever its merge; the suspect is the clusters' entry beside the q/k/v GEMV's retiring blocks (a cluster
// needs C SMs of one GPC with room at once, a plain block one SM).
//
// Producer (standing in for q/k/v): P blocks of 128 threads, each holding kProdSmem bytes of dynamic shared memory
// (the residency limit: 3 an SM, as q/k/v's 288 blocks sit 2-3 an SM by registers), each triggers its dependents at
// entry (griddepcontrol.launch_dependents), spins for its own time (uniform in [lo, hi] µs by a hash of its index:
// ragged ends, as q/k/v's), and records its end.
// Consumer (standing in for the attention): 128 blocks of 256 threads along y (the 7B's 4 KV heads x 32 splits),
// each holding `cons_smem` bytes, in clusters of C along y (1: plain), launched with PDL right after the
// producer; each block records %globaltimer at entry, waits (griddepcontrol.wait), records the wait's resolution.
// cons_smem 100 KB fits beside one producer block, not two (the 8-warp attention's 41.5 K registers beside q/k/v's
// 16 K blocks); 80 KB beside two (the attention at 128 registers: session 32 §5's hl128).
//
// Printed per (C, cons_smem), mean over the repeats: the consumer blocks' entries against the producer's last end E
// (first / mean / last, µs), how many entered before E, and the last wait's resolution after E.
// Validation (validate_result's role; what the measurement rests on): every block recorded exactly once, every
// consumer's wait resolved at or after E (PDL's guarantee), every producer block spun at least its own time. The
// entry times are the measurement, not validated.
//
// Prediction (written before any run): plain blocks enter as single SMs drain (mean entry 1-3 µs before E, as the
// product's plain attention at 8K: -2.1, session 30 §5); clusters of 100 KB enter later as C grows (mean near or after
// E at C = 8) and clusters of 80 KB enter as early as plain ones. If clusters of 80 KB also enter late, the cost is
// the cluster scheduling itself, not the room beside the producer.
#include "dev_common.cuh"   // DEV_CHECK

namespace {

constexpr int kProdBlocks = 288;               // the 7B's q/k/v GEMV: 72 tiles x 4 splits
constexpr int kProdThreads = 128;
constexpr size_t kProdSmem = 70 * 1024;        // 3 an SM (with the 1 KB reservation each: 213 of 228 KB)
constexpr int kConsBlocks = 128;               // the 7B's decode attention: 4 KV heads x 32 splits
constexpr int kConsThreads = 256;
constexpr int kRepeats = 20;

__device__ __forceinline__ unsigned hash32(unsigned x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}

// prod_rec[b] = {entry, end, spun ns target}
__global__ void __launch_bounds__(kProdThreads) producer(unsigned long long* rec, unsigned lo_ns, unsigned hi_ns,
                                                        unsigned seed) {
  extern __shared__ unsigned char smem[];
  const unsigned long long t0 = dev::globaltimer();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const unsigned spin = lo_ns + hash32(blockIdx.x * 2654435761u + seed) % (hi_ns - lo_ns + 1);
  unsigned long long t = t0;
  while (t - t0 < spin) t = dev::globaltimer();
  if (threadIdx.x == 0) {
    smem[0] = (unsigned char)t;   // the dynamic shared memory is the residency limit; touch it once
    rec[3 * blockIdx.x] = t0;
    rec[3 * blockIdx.x + 1] = t;
    rec[3 * blockIdx.x + 2] = spin;
  }
}

// cons_rec[b] = {entry, wait resolved, smid}
__global__ void __launch_bounds__(kConsThreads) consumer(unsigned long long* rec) {
  extern __shared__ unsigned char smem[];
  const unsigned long long t0 = dev::globaltimer();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const unsigned long long t1 = dev::globaltimer();
  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    smem[0] = (unsigned char)sm;
    const unsigned b = blockIdx.y;
    rec[3 * b] = t0;
    rec[3 * b + 1] = t1;
    rec[3 * b + 2] = sm;
  }
}

struct Stats {
  double first = 0, mean = 0, last = 0, before = 0, wait_last = 0;
};

}  // namespace

int main() {
  int dev = 0, sms = 0;
  DEV_CHECK(cudaSetDevice(dev));
  DEV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  DEV_CHECK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major < 9) {
    std::printf("cluster_entry: needs sm_90 (clusters, PDL); this GPU is sm_%d%d\n", prop.major, prop.minor);
    return 0;
  }
  std::printf("cluster_entry on %s (%d SMs): producer %d blocks x %d threads x %zu KB, consumer %d blocks x %d threads\n",
              prop.name, sms, kProdBlocks, kProdThreads, kProdSmem / 1024, kConsBlocks, kConsThreads);
  DEV_CHECK(cudaFuncSetAttribute(producer, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kProdSmem));
  DEV_CHECK(cudaFuncSetAttribute(producer, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  DEV_CHECK(cudaFuncSetAttribute(consumer, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  DEV_CHECK(cudaFuncSetAttribute(consumer, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  unsigned long long *d_prod, *d_cons;
  DEV_CHECK(cudaMalloc(&d_prod, 3 * kProdBlocks * sizeof(unsigned long long)));
  DEV_CHECK(cudaMalloc(&d_cons, 3 * kConsBlocks * sizeof(unsigned long long)));
  cudaStream_t st;
  DEV_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const unsigned lo_ns = 4000, hi_ns = 6000;   // q/k/v's blocks end over ~2 µs (session 30 §5: first block 2.0 µs before the last)
  std::vector<unsigned long long> prod(3 * kProdBlocks), cons(3 * kConsBlocks);
  int failures = 0;
  std::printf("%-8s %-9s %9s %9s %9s %10s %12s  (µs against the producer's last end E; mean of %d)\n", "cluster",
              "cons smem", "first", "mean", "last", "before E", "wait - E", kRepeats);
  for (size_t cons_kb : {100, 80}) {
    for (int C : {1, 2, 4, 8}) {
      Stats s;
      for (int r = 0; r < kRepeats + 1; r++) {   // repeat 0: warm-up, not counted
        DEV_CHECK(cudaMemset(d_prod, 0xFF, 3 * kProdBlocks * sizeof(unsigned long long)));   // poisoned
        DEV_CHECK(cudaMemset(d_cons, 0xFF, 3 * kConsBlocks * sizeof(unsigned long long)));
        DEV_CHECK(cudaStreamSynchronize(0));
        producer<<<kProdBlocks, kProdThreads, kProdSmem, st>>>(d_prod, lo_ns, hi_ns, 977u * r + (unsigned)C);
        DEV_CHECK(cudaGetLastError());
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1, kConsBlocks, 1);
        cfg.blockDim = dim3(kConsThreads);
        cfg.dynamicSmemBytes = cons_kb * 1024;
        cfg.stream = st;
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        attr[1].id = cudaLaunchAttributeClusterDimension;
        attr[1].val.clusterDim.x = 1; attr[1].val.clusterDim.y = C; attr[1].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = C > 1 ? 2 : 1;
        DEV_CHECK(cudaLaunchKernelEx(&cfg, consumer, d_cons));
        DEV_CHECK(cudaStreamSynchronize(st));
        DEV_CHECK(cudaMemcpy(prod.data(), d_prod, prod.size() * 8, cudaMemcpyDeviceToHost));
        DEV_CHECK(cudaMemcpy(cons.data(), d_cons, cons.size() * 8, cudaMemcpyDeviceToHost));
        // validation: every block recorded (no poison left), producers spun their time, waits resolved after E
        unsigned long long E = 0;
        for (int b = 0; b < kProdBlocks; b++) {
          const unsigned long long t0 = prod[3 * b], t1 = prod[3 * b + 1], spin = prod[3 * b + 2];
          if (t0 == ~0ull || t1 == ~0ull || t1 < t0 + spin) {
            if (failures++ < 5) std::printf("  producer block %d: record missing or short\n", b);
            continue;
          }
          E = std::max(E, t1);
        }
        double first = 1e30, last = -1e30, sum = 0, before = 0, wait_last = -1e30;
        for (int b = 0; b < kConsBlocks; b++) {
          const unsigned long long t0 = cons[3 * b], t1 = cons[3 * b + 1];
          if (t0 == ~0ull || t1 == ~0ull || t1 < E) {
            if (failures++ < 5) std::printf("  consumer block %d (C %d): record missing or wait before E\n", b, C);
            continue;
          }
          const double e = ((double)t0 - (double)E) / 1e3;
          first = std::min(first, e); last = std::max(last, e); sum += e; before += t0 < E;
          wait_last = std::max(wait_last, ((double)t1 - (double)E) / 1e3);
        }
        if (r == 0) continue;
        s.first += first / kRepeats; s.last += last / kRepeats; s.mean += sum / kConsBlocks / kRepeats;
        s.before += before / kRepeats; s.wait_last += wait_last / kRepeats;
      }
      std::printf("%-8d %6zu KB %9.2f %9.2f %9.2f %10.1f %12.2f\n", C, cons_kb, s.first, s.mean, s.last, s.before,
                  s.wait_last);
    }
  }
  DEV_CHECK(cudaFree(d_prod));
  DEV_CHECK(cudaFree(d_cons));
  if (failures) {
    std::printf("cluster_entry: %d validation failures\n", failures);
    return 1;
  }
  std::printf("cluster_entry: every record present, every wait resolved after the producer's end\n");
  return 0;
}
