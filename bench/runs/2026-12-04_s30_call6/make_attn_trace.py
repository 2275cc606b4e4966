"""Session 30 call 6 (experiment, never main; replaces session 25 call 4's make_trace.py, whose anchors no longer
matched, with t[5] now the warps' O in shared memory): instruments attn_decode_kernel (csrc/src/attention.cu as of
d9bb5a3, as of 4c0c86f: the hierarchical merge moved three anchors, and as of 3de48ba: the merge in a kernel of its
own, the block's end after its partial; each edit takes whichever form the source has)
with %globaltimer records of thread 0 of every block with keys (t[0] entry, t[1] the cluster prologue done,
t[2] the PDL wait resolved, t[3] q staged, t[4] tiles done, t[5] the warps' O in shared memory, t[6] end), and
exports nq_attn_trace. Run in a scratch worktree: python3 make_attn_trace.py path/to/attention.cu; then build;
chain_trace.py reads the records."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # bench/
from trace_inject import SourceEdit, device_decls, export_fn  # noqa: E402

src = SourceEdit(sys.argv[1])
rep = src.rep


def rep_either(*pairs):
    """the first (old, new) pair whose anchor the source has (the kernel before and after 4c0c86f)"""
    for old, new in pairs:
        if old in src.s:
            return rep(old, new)
    rep(*pairs[0])   # none: fails loudly on the first anchor


rep("""template <int D, int WARPS, bool CLUSTER>
__global__ void __launch_bounds__(WARPS * 32) attn_decode_kernel(const AttnArgs a) {
""", """// TRACE (dev only, never main): thread 0 of every block with keys records %globaltimer at entry, after the cluster
// prologue, after the PDL wait, q staged, tiles done, block merge done, end
""" + device_decls("attn", "Attn", "unsigned h, split, sm, flags;") + """
template <int D, int WARPS, bool CLUSTER>
__global__ void __launch_bounds__(WARPS * 32) attn_decode_kernel(const AttnArgs a) {
  unsigned long long tt[7] = {};
  tt[0] = attn_gtimer();
  const int trace_on = threadIdx.x == 0 ? g_attn_trace_on : 0;
  unsigned trace_flags = 0;
  auto trace_end = [&]() {
    if (trace_on) {
      tt[6] = attn_gtimer();
      const unsigned i = atomicAdd(&g_attn_trace_n, 1u);
      if (i < kAttnTraceMax) {
        AttnTraceRec r;
        for (int q = 0; q < 7; q++) r.t[q] = tt[q];
        unsigned smid;
        asm volatile("mov.u32 %0, %smid;" : "=r"(smid));
        r.h = blockIdx.x; r.split = blockIdx.y; r.sm = smid; r.flags = trace_flags;
        g_attn_trace[i] = r;
      }
    }
  };
""")
rep_either(("""  if (split >= (dsmem ? C : n_used)) return;     // uniform per block: no barrier is skipped by part of it
""", """  if (split >= (dsmem ? C : n_used)) return;     // uniform per block: no barrier is skipped by part of it
  trace_flags = (unsigned)n_used | (dsmem ? 256u : 0u) | ((unsigned)C << 9) | ((unsigned)WARPS << 14) |
                ((unsigned)n_keys << 18);
"""), ("""  if (split >= (hier ? n_parts * C : dsmem ? C : n_used)) return;
""", """  if (split >= (hier ? n_parts * C : dsmem ? C : n_used)) return;
  trace_flags = (unsigned)n_used | (dsmem ? 256u : 0u) | ((unsigned)C << 9) | ((unsigned)WARPS << 14) |
                ((unsigned)n_keys << 18);
"""), ("""  if (split >= (dsmem ? C : n_used)) return;
""", """  if (split >= (dsmem ? C : n_used)) return;
  trace_flags = (unsigned)n_used | (dsmem ? 256u : 0u) | ((unsigned)C << 9) | ((unsigned)WARPS << 14) |
                ((unsigned)n_keys << 18);
"""))
rep("""    cluster_wait();
  }
#endif
  const int k0 = split * kps""", """    cluster_wait();
  }
#endif
  tt[1] = attn_gtimer();
  const int k0 = split * kps""")
rep("""  if (a.write_kv) {   // q, k and v of this step come from the kernel before
    pdl_wait();
    pdl_trigger();
  }
""", """  if (a.write_kv) {   // q, k and v of this step come from the kernel before
    pdl_wait();
    pdl_trigger();
  }
  tt[2] = attn_gtimer();
""")
rep("""  __syncthreads();   // q, knew, vnew staged
""", """  __syncthreads();   // q, knew, vnew staged
  tt[3] = attn_gtimer();
""")
rep("""  __syncthreads();   // every warp is done with its ring: obuf may overwrite it
""", """  __syncthreads();   // every warp is done with its ring: obuf may overwrite it
  tt[4] = attn_gtimer();
""")
rep("""  __syncthreads();   // the warps' O in obuf
""", """  __syncthreads();   // the warps' O in obuf
  tt[5] = attn_gtimer();
""")
merge_kernel = "attn_merge_kernel(" in src.s   # 3de48ba on: the plain block ends after its partial
if not merge_kernel:
    rep("""  if (n_used == 1) return;
""", """  if (n_used == 1) { trace_end(); return; }
""")
if "    if (!hier || attn_merge_items(items, C, z) == 0) return;" in src.s:   # 4c0c86f on: the cluster path's two ends
    rep("""    if (!hier || attn_merge_items(items, C, z) == 0) return;   // block-uniform
""", """    if (!hier || attn_merge_items(items, C, z) == 0) { trace_end(); return; }   // block-uniform
""")
    rep("""                                 out, S.u.mw, S.inv, S.last);
    return;
  }
#endif""", """                                 out, S.u.mw, S.inv, S.last);
    trace_end();
    return;
  }
#endif""")
else:
    rep("""      o2[1] = __floats2half2_rn(acc.z * iv, acc.w * iv);
    }
    return;
  }
#endif""", """      o2[1] = __floats2half2_rn(acc.z * iv, acc.w * iv);
    }
    trace_end();
    return;
  }
#endif""")
if merge_kernel:   # the plain block's end: its (m, l) stored
    rep("""    a.part_ml[(ph0 + (size_t)tid * a.n_split + split) * 2 + 1] = S.inv[tid];
  }
}""", """    a.part_ml[(ph0 + (size_t)tid * a.n_split + split) * 2 + 1] = S.inv[tid];
  }
  trace_end();
}""")
else:   # the kernel's last statement, the global merge call (its arguments differ between main, merge_staged.patch
    # and 4c0c86f on)
    _i = src.s.index("  merge_last_split<D, THREADS>(a, t, h, G, n_used, ")
    _j = src.s.index(");\n}", _i) + 2
    src.s = src.s[:_j] + "\n  trace_end();" + src.s[_j:]
i = src.s.rindex("}  // namespace nq")
src.s = src.s[:i] + export_fn("attn", "Attn") + src.s[i:]
src.s = src.s.replace("#include <type_traits>\n", "#include <type_traits>\n#include <cstdio>\n#include <cstdlib>\n", 1)
src.save()
