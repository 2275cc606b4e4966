#!/usr/bin/env bash
# Quick start, command 1: set up .venv, convert the embedded model to INT4, verify it, generate from it.
source "$(dirname "$0")/_env.sh" demo
out="${NANOQWEN_DEMO_OUT:-$root/.out}"
mkdir -p "$out"
nanoqwen-convert models/tiny-py -o "$out/tiny-py.int4.nanoqwen" --force   # a re-run replaces the last one
nanoqwen-verify "$out/tiny-py.int4.nanoqwen" --source models/tiny-py
nanoqwen run "$out/tiny-py.int4.nanoqwen" -p "${1:-def fibonacci(n):}" --max-new-tokens "${2:-96}"
