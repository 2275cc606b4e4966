"""(Session 26 call 3: session 25 §8's script, the S = 1 anchor moved for the handed-over RMSNorm.) Experiment only, never main: instruments the product's decode GEMV (gemv_frag_kernel, csrc/src/gemv_frag.cuh) with
%globaltimer records of thread 0 of every block, and exports nq_frag_trace from csrc/src/gemv.cu. The records have
session 23's layout (bench/runs/2026-12-03_s23_call2/trace.py reads them): t[0] entry, t[1] after the PDL wait, t[2]
x staged, t[3] the warps' sums in shared memory (the dot's end), t[4] end, t[5] pushes issued (S > 1), t[6] the
owner's wait done (S > 1); kind = MODE << 28 | K / 128 << 14 | gridDim.x, block, sm (%smid), and in `pad` the block's
chunk count (its split's) so that the dot's time can be read against its work. Replaces session 23's trace.patch,
which no longer applies. Usage, in a scratch copy of the tree: python3 make_frag_trace.py csrc/src; then build."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # bench/
from trace_inject import device_decls, export_fn, replace_once  # noqa: E402

src = sys.argv[1].rstrip("/")


def edit(path, pairs):
    s = open(path).read()
    for a, b in pairs:
        s = replace_once(s, a, b, path)
    open(path, "w").write(s)


edit(f"{src}/gemv_frag.cuh", [
    ("""template <int SPG, int MODE, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, FragMinBlocks<SPG, MODE, WARPS>::value)
gemv_frag_kernel(const GemvArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
""", """// TRACE (experiment only, never main): see bench/runs/2026-12-03_s25_prep/make_frag_trace.py
""" + device_decls("frag", "Frag", "unsigned kind, block, sm, pad;") + """
template <int SPG, int MODE, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, FragMinBlocks<SPG, MODE, WARPS>::value)
gemv_frag_kernel(const GemvArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned long long tt[7] = {};
  tt[0] = frag_gtimer();
  const int trace_on = threadIdx.x == 0 ? g_frag_trace_on : 0;
  unsigned trace_chunks = 0;
  auto trace_end = [&]() {
    if (trace_on) {
      tt[4] = frag_gtimer();
      const unsigned i = atomicAdd(&g_frag_trace_n, 1u);
      if (i < kFragTraceMax) {
        FragTraceRec r;
        for (int q = 0; q < 7; q++) r.t[q] = tt[q];
        unsigned smid;
        asm volatile("mov.u32 %0, %smid;" : "=r"(smid));
        r.kind = (unsigned)MODE << 28 | (unsigned)(a.seg[0].K / 128) << 14 | (unsigned)gridDim.x;
        r.block = blockIdx.x + gridDim.x * blockIdx.y;
        r.sm = smid;
        r.pad = trace_chunks;
        g_frag_trace[i] = r;
      }
    }
  };
"""),
    ("""  pdl_wait();                                    // x / out were written by the previous kernel
""", """  pdl_wait();                                    // x / out were written by the previous kernel
  tt[1] = frag_gtimer();
  trace_chunks = (unsigned)nc;
"""),
    ("""               MODE == GEMV_SWIGLU ? x_f32 : nullptr);
""", """               MODE == GEMV_SWIGLU ? x_f32 : nullptr);
  tt[2] = frag_gtimer();
"""),
    ("""    for (int j = 0; j < 8; j++) warp_sums[warp][8 * j + g] = acc[j];
  __syncthreads();
""", """    for (int j = 0; j < 8; j++) warp_sums[warp][8 * j + g] = acc[j];
  __syncthreads();
  tt[3] = frag_gtimer();
"""),
    ("""      frag_hand_ssq<MODE>(a, b, o, per, sq);
    }
    return;
""", """      frag_hand_ssq<MODE>(a, b, o, per, sq);
    }
    trace_end();
    return;
"""),
    ("""    st_async_f32(map_cluster(&slots[s][i], owner), v, map_cluster(&slots_full, owner));
  }
  if (writes) {
    mbarrier_wait_parity_cluster(smem_u32(&slots_full), 0);   // every split's slots of this rank's outputs
""", """    st_async_f32(map_cluster(&slots[s][i], owner), v, map_cluster(&slots_full, owner));
  }
  tt[5] = frag_gtimer();
  if (writes) {
    mbarrier_wait_parity_cluster(smem_u32(&slots_full), 0);   // every split's slots of this rank's outputs
    tt[6] = frag_gtimer();
"""),
    ("""  // registers only (st.async), so a sender may leave once they are issued. racecheck and synccheck are clean
  // without it (bench/NOTES.md "Session 24" §3); it cost ~0.4 %.
""", """  // registers only (st.async), so a sender may leave once they are issued. racecheck and synccheck are clean
  // without it (bench/NOTES.md "Session 24" §3); it cost ~0.4 %.
  trace_end();
"""),
])
s = open(f"{src}/gemv.cu").read()
i = s.rindex("}  // namespace nq")
s = s[:i] + export_fn("frag", "Frag") + s[i:]
s = s.replace('#include "gemv_frag.cuh"\n', '#include "gemv_frag.cuh"\n#include <cstdio>\n#include <cstdlib>\n', 1)
open(f"{src}/gemv.cu", "w").write(s)
