"""The `nanoqwen` command line (run, chat, info, bench, serve): `commands.py`; the `info` renderer and the chat
prompt's line reader are their own modules.

`main` here is the console script's entry point: it imports the commands (click, the server's modules) inside
its own Ctrl-C handler, so an interrupt during start-up ends with one line too, not an import traceback.
"""
from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130       # 128 + SIGINT, the shell convention (commands.py uses the same value)

__all__ = ["main", "EXIT_INTERRUPTED"]


def main(args=None, prog_name: str = "nanoqwen", **extra):
    try:
        from .commands import main as commands_main
    except KeyboardInterrupt:
        sys.stderr.write("\nnanoqwen: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    return commands_main(args, prog_name=prog_name, **extra)
