"""Where the batched Engine's time goes per decode step: the scheduler's Python, the backend call, and the rest.

`nanoqwen bench --concurrency` reports the Engine's step time; bench/batch_bench.py times the library's batched step
alone. Their difference is host work per step (session 8: 6.19 against 5.84 ms at 32 rows, 11.24 against 9.35 at 64).
This puts every stream in decode first (all prompts prefilled, no stream finishing), then times `steps` steady steps:
the wall time of each Engine.step(), the time inside the store's forward_decode (the backend call: on CUDA one
nq_decode_batch, graph replay included, so it holds the GPU time too), and a cProfile of the same steps (top
functions by own time). Run bench/profile_kernels.py for the GPU side of a step.

    PYTHONPATH=. python bench/profile_engine.py FILE.nanoqwen --streams 32 [--steps 64 --prompt-tokens 512]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time

import numpy as np


def profile_engine(path: str, streams: int, steps: int, prompt_tokens: int, device: str, top: int) -> dict:
    from nanoqwen_rt.engine import Engine
    from nanoqwen_rt.kv_pool import pages_for

    # the first streams decode while the others are prefilled (about one prompt per step): room for that ramp, the
    # warm-up and the timed steps, so that no stream finishes before the last one is timed
    new_tokens = steps + 4 * streams + 16
    max_context = prompt_tokens + new_tokens + 1
    eng = Engine(path, device=device, max_context=max_context, verify_checksums=False, max_batch=streams,
                 kv_pages=streams * pages_for(max_context))
    try:
        rng = np.random.default_rng(0)
        V = min(eng.config.vocab_rows, 151643)
        handles = [eng.submit(rng.integers(0, V, size=prompt_tokens).astype(np.int32).tolist(),
                              max_new_tokens=new_tokens, temperature=0.0, stop_token_ids=[]) for _ in range(streams)]
        started = [False] * streams
        guard = 0
        while not all(started):             # prefill everything; the first tokens come out
            eng.step()
            for i, h in enumerate(handles):
                if h.poll():
                    started[i] = True
            guard += 1
            if guard > 100 * streams + 1000:
                raise RuntimeError("the streams did not all start")
        for _ in range(4):                  # the batch size's graph: warm run, capture, replay
            eng.step()
            for h in handles:
                h.poll()

        # the sequence store whose forward_decode (one call), or launch_decode + wait_decode (pipelined: the wait
        # holds what of the device step the host did not overlap), runs the batched step: their time per step
        store = eng._scheduler.kv
        names = ["forward_decode", "launch_decode", "wait_decode"]
        inner = {n: getattr(store, n) for n in names}
        acc = [0.0]

        def timing(fn):
            def timed(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    acc[0] += time.perf_counter() - t
            return timed
        for n in names:
            setattr(store, n, timing(inner[n]))
        # every C entry point the steps call (CUDA backend: abi.call under check()): count, total and longest
        # call by name, so a host stall (a synchronising upload, a pool poison) shows by name
        abi = sys.modules.get("nanoqwen_rt.backends.cuda.abi")
        per_call: dict = {}
        if abi is not None:
            plain_call = abi.call

            def timed_call(lib, name, *args):
                t = time.perf_counter()
                try:
                    return plain_call(lib, name, *args)
                finally:
                    dt = time.perf_counter() - t
                    c = per_call.setdefault(name, [0, 0.0, 0.0])
                    c[0] += 1
                    c[1] += dt
                    c[2] = max(c[2], dt)
            abi.call = timed_call
        spent: list[float] = []
        walls, polls = [], []
        prof = cProfile.Profile()
        for _ in range(steps):
            t0 = time.perf_counter()
            acc[0] = 0.0
            prof.enable()
            k = eng.step()
            prof.disable()
            t1 = time.perf_counter()
            spent.append(acc[0])
            for h in handles:
                h.poll()
            polls.append(time.perf_counter() - t1)
            walls.append(t1 - t0)
            if k != streams:
                raise RuntimeError(f"a step sampled {k} tokens, not {streams}: not a steady decode step")
        for n in names:
            delattr(store, n)                # the class's methods again
        if abi is not None:
            abi.call = plain_call
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
        med = statistics.median
        out = {"backend": eng.backend.describe(), "streams": streams, "steps": steps,
               "pipelined": bool(getattr(store, "pipelines", False)),
               "step_ms": med(walls) * 1e3, "backend_call_ms": med(spent) * 1e3,
               "host_outside_call_ms": med(w - c for w, c in zip(walls, spent)) * 1e3,
               "consumer_ms": med(polls) * 1e3, "profile_tottime": s.getvalue(),
               "c_calls": {k: {"per_step": c / steps, "ms_per_step": t * 1e3 / steps, "max_ms": m * 1e3}
                           for k, (c, t, m) in sorted(per_call.items(), key=lambda kv: -kv[1][1])}}
        return out
    finally:
        eng.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", help="write the figures (without the profile text) here")
    a = ap.parse_args(argv)
    r = profile_engine(a.model, a.streams, a.steps, a.prompt_tokens, a.device, a.top)
    print(f"{r['backend']}: {r['streams']} streams, {r['steps']} steady steps (medians, ms)")
    call = "launch + wait (pipelined)" if r["pipelined"] else "forward_decode"
    print(f"  Engine.step {r['step_ms']:.3f}: {call} (the backend calls) {r['backend_call_ms']:.3f}, the scheduler "
          f"outside it {r['host_outside_call_ms']:.3f} (each a median);  handles' poll after the step {r['consumer_ms']:.3f}")
    if r["c_calls"]:
        print("  C entry points per step (count, ms, the longest call's ms):")
        for k, c in r["c_calls"].items():
            print(f"    {k:32s} {c['per_step']:6.2f} {c['ms_per_step']:8.3f} {c['max_ms']:8.3f}")
    print(r["profile_tottime"])
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({k: v for k, v in r.items() if k != "profile_tottime"}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
