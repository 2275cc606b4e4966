"""The `nanoqwen` command line (run, chat, info, bench, serve): `commands.py`; the `info` renderer and the chat
prompt's line reader are their own modules."""
from .commands import EXIT_INTERRUPTED, main

__all__ = ["main", "EXIT_INTERRUPTED"]
