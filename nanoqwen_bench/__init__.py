"""nanoqwen_bench: `nanoqwen bench FILE` and `python -m nanoqwen_bench FILE`. Measures an Engine (load, TTFT,
decode, bytes per token, MBU against a read-bandwidth ceiling) and the torch peers on the same shapes.

Apart from the runtime on purpose: it needs torch, and nanoqwen_rt never imports it (the CLI's `bench` command
imports it when run). Modules: measure.py (the run and its table), peers.py (the torch chains).
"""
