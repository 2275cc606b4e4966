// graph_fork_pdl: does a side branch forked off a captured PDL chain keep the chain's programmatic edges, and what
// does the branch cost the chain? bench/NOTES.md "Session 34" §3: the l2side variant records an event on the decode
// stream between q/k/v's launch and the attention's (both launched with PDL, launch.h's launch_pdl), makes a second
// stream wait on it and launches a prefetch kernel there, joined at the capture's end. If the record turned the
// q/k/v -> attention edge into a full one, the attention would lose its early entry (~1 µs a 7B layer).
//
// Three captures of a chain of kLayers x (producer, consumer), every kernel launched by launch_pdl:
//   plain   the chain alone;
//   fork    an event recorded after each producer, a side stream waiting on it and running `side` (one block that
//           spins kSideNs), joined before the capture ends (l2side's form);
//   forkend the same, but the side kernels all forked after the chain's last kernel (the branch's launch cost
//           without its place in the chain).
// Printed per capture: the edges by type (default / programmatic; a programmatic edge comes from a kernel node's
// programmatic port), the producer -> consumer edges that are programmatic (of kLayers), and the graph's time a
// replay (mean over kReps, after a warm-up).
// Validation (validate_result's role): every consumer reads the value its producer wrote after its PDL wait (the
// chain's data dependency holds in every capture), checked on the host after the replays; plain has kLayers
// programmatic producer -> consumer edges (else PDL is off on this GPU and the question is moot).
//
// Prediction (written before any run): fork keeps all kLayers producer -> consumer edges programmatic (the event
// record adds no node; the consumer's launch takes the stream's last node with the programmatic type) and costs the
// chain < 1 µs a layer; if it reports 0 programmatic edges there, l2side measures the fork's cost, not the prefetch's.
#include "dev_common.cuh"   // DEV_CHECK, dev::spin_ns
#include "device_util.cuh"  // pdl_wait / pdl_trigger
#include "launch.h"         // launch_pdl

#include <cstdio>
#include <vector>

namespace {

constexpr int kLayers = 28;
constexpr int kBlocks = 132;
constexpr int kReps = 50;
constexpr unsigned kSpinNs = 3000;   // each producer and consumer block's own work (~3 µs)
constexpr unsigned kSideNs = 2000;

// writes token into val[layer] after its own work
__global__ void producer(int* val, int layer, int token) {
  nq::pdl_wait();
  nq::pdl_trigger();
  dev::spin_ns(kSpinNs);
  if (threadIdx.x == 0 && blockIdx.x == 0) val[layer] = token;
}
// after its wait, reads what its producer wrote; records it in seen[layer]
__global__ void consumer(const int* val, int* seen, int layer) {
  nq::pdl_wait();
  nq::pdl_trigger();
  if (threadIdx.x == 0 && blockIdx.x == 0) seen[layer] = val[layer];
  dev::spin_ns(kSpinNs);
}
__global__ void side() { dev::spin_ns(kSideNs); }

struct Capture {
  const char* name;
  int fork;   // 0 none, 1 after each producer, 2 all after the chain
};

struct Edges {
  int total = 0, programmatic = 0, prod_cons_programmatic = 0;
};

Edges count_edges(cudaGraph_t g) {
  size_t n = 0;
  DEV_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n) DEV_CHECK(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n));
  Edges e;
  e.total = (int)n;
  for (size_t i = 0; i < n; i++) {
    if (data[i].type != cudaGraphDependencyTypeProgrammatic) continue;
    e.programmatic++;
    cudaKernelNodeParams pf = {}, pt = {};
    if (cudaGraphKernelNodeGetParams(from[i], &pf) == cudaSuccess &&
        cudaGraphKernelNodeGetParams(to[i], &pt) == cudaSuccess && pf.func == (void*)producer &&
        pt.func == (void*)consumer)
      e.prod_cons_programmatic++;
  }
  return e;
}

}  // namespace

int main() {
  cudaStream_t st, sd;
  DEV_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  DEV_CHECK(cudaStreamCreateWithFlags(&sd, cudaStreamNonBlocking));
  cudaEvent_t ev_fork, ev_join, t0, t1;
  DEV_CHECK(cudaEventCreateWithFlags(&ev_fork, cudaEventDisableTiming));
  DEV_CHECK(cudaEventCreateWithFlags(&ev_join, cudaEventDisableTiming));
  DEV_CHECK(cudaEventCreate(&t0));
  DEV_CHECK(cudaEventCreate(&t1));
  int *val, *seen;
  DEV_CHECK(cudaMalloc(&val, kLayers * sizeof(int)));
  DEV_CHECK(cudaMalloc(&seen, kLayers * sizeof(int)));

  const Capture caps[] = {{"plain", 0}, {"fork", 1}, {"forkend", 2}};
  bool ok = true;
  int token = 1;
  for (const Capture& c : caps) {
    DEV_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    const int tok = token++;
    bool launched = true;
    for (int l = 0; l < kLayers; l++) {
      launched &= nq::launch_pdl("producer", producer, dim3(kBlocks), dim3(128), 0, st, val, l, tok) == 0;
      if (c.fork == 1) {
        DEV_CHECK(cudaEventRecord(ev_fork, st));
        DEV_CHECK(cudaStreamWaitEvent(sd, ev_fork, 0));
        side<<<1, 32, 0, sd>>>();
      }
      launched &= nq::launch_pdl("consumer", consumer, dim3(kBlocks), dim3(128), 0, st, (const int*)val, seen, l) == 0;
    }
    if (c.fork == 2) {
      DEV_CHECK(cudaEventRecord(ev_fork, st));
      DEV_CHECK(cudaStreamWaitEvent(sd, ev_fork, 0));
      for (int l = 0; l < kLayers; l++) side<<<1, 32, 0, sd>>>();
    }
    if (c.fork) {
      DEV_CHECK(cudaEventRecord(ev_join, sd));
      DEV_CHECK(cudaStreamWaitEvent(st, ev_join, 0));
    }
    cudaGraph_t g;
    DEV_CHECK(cudaStreamEndCapture(st, &g));
    if (!launched) {
      std::printf("%s: a launch failed\n", c.name);
      return 1;
    }
    const Edges e = count_edges(g);
    cudaGraphExec_t ex;
    DEV_CHECK(cudaGraphInstantiate(&ex, g, 0));
    DEV_CHECK(cudaMemsetAsync(seen, 0, kLayers * sizeof(int), st));
    DEV_CHECK(cudaGraphLaunch(ex, st));   // warm-up
    DEV_CHECK(cudaEventRecord(t0, st));
    for (int r = 0; r < kReps; r++) DEV_CHECK(cudaGraphLaunch(ex, st));
    DEV_CHECK(cudaEventRecord(t1, st));
    DEV_CHECK(cudaStreamSynchronize(st));
    float ms = 0.f;
    DEV_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    std::vector<int> h(kLayers);
    DEV_CHECK(cudaMemcpy(h.data(), seen, kLayers * sizeof(int), cudaMemcpyDeviceToHost));
    int good = 0;
    for (int l = 0; l < kLayers; l++) good += h[l] == tok;
    std::printf("%-8s edges %3d, programmatic %3d, producer -> consumer programmatic %2d of %d; %.2f us a replay "
                "(%.3f a layer); consumers saw their producer's value: %d of %d\n",
                c.name, e.total, e.programmatic, e.prod_cons_programmatic, kLayers, 1000.f * ms / kReps,
                1000.f * ms / kReps / kLayers, good, kLayers);
    ok &= good == kLayers;
    if (c.fork == 0 && e.prod_cons_programmatic != kLayers) {
      std::printf("plain: PDL edges missing (PDL off on this GPU?): the question is moot\n");
      ok = false;
    }
    DEV_CHECK(cudaGraphExecDestroy(ex));
    DEV_CHECK(cudaGraphDestroy(g));
  }
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
