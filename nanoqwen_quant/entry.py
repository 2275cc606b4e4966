"""The console entry points of `nanoqwen-convert` and `nanoqwen-verify` (pyproject.toml's [project.scripts]).

Each imports its command (numpy, numba, the format package: ~0.5 s) inside its own Ctrl-C handler, so an interrupt
during start-up ends with one line and exit 130 too, not an import traceback (nanoqwen_rt.cli.main does the same
for `nanoqwen`). This module imports nothing heavy itself.
"""
from __future__ import annotations

import importlib
import sys

EXIT_INTERRUPTED = 130       # 128 + SIGINT, the shell convention (one_line_errors' commands exit with it too)


def _command(module: str, prog: str):
    try:
        return importlib.import_module(module).main
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)


def convert(args=None):
    """nanoqwen-convert"""
    return _command("nanoqwen_quant.convert", "nanoqwen-convert")(args)


def verify(args=None):
    """nanoqwen-verify"""
    return _command("nanoqwen_quant.verify", "nanoqwen-verify")(args)
