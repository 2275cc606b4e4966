#!/usr/bin/env bash
# Quick start, command 1: set up .venv, convert the embedded model to INT4, verify it, generate from it: a
# completion of "PROMPT" ($1, N = $2 new tokens), then a fill-in-the-middle completion (the code between a prefix
# and a suffix, through the model's FIM tokens; stdout is the middle alone). The toy model seldom ends a middle by
# itself, so the FIM step asks for one line, as an editor's inline completion does (--stop at the newline).
source "$(dirname "$0")/_env.sh" demo
out="${NANOQWEN_DEMO_OUT:-$root/.out}"
mkdir -p "$out"
nanoqwen-convert models/tiny-py -o "$out/tiny-py.int4.nanoqwen" --force   # a re-run replaces the last one
nanoqwen-verify "$out/tiny-py.int4.nanoqwen" --source models/tiny-py
nanoqwen run "$out/tiny-py.int4.nanoqwen" -p "${1:-def fibonacci(n):}" --max-new-tokens "${2:-96}"
prefix=$'class Point:\n    def __init__(self, x, y):\n        '
suffix=$'\n        self.y = y\n'
echo "[nanoqwen] fill in the middle: prefix $(printf %q "$prefix"), suffix $(printf %q "$suffix"); the middle:" >&2
nanoqwen run "$out/tiny-py.int4.nanoqwen" -p "$prefix" --suffix "$suffix" --max-new-tokens 24 --stop $'\n'
