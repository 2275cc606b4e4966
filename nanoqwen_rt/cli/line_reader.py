"""The chat prompt's line reader: lines from stdin, read so that Ctrl-C at the prompt is seen at once."""
from __future__ import annotations

import sys

# How often the chat prompt wakes up while waiting for input, so that a Ctrl-C is seen at once (see LineReader).
INPUT_POLL_S = 0.2


class LineReader:
    """Lines from a file descriptor, read so that Ctrl-C at the prompt always works.

    A plain blocking input() can miss SIGINT: the engine's numba worker threads may receive the signal instead
    of the main thread, which then stays blocked in read() until Enter. Here the main thread waits in select()
    with a timeout, so it runs Python code (and raises KeyboardInterrupt) within INPUT_POLL_S. Our own byte
    buffer (not sys.stdin's) keeps select() truthful about lines already received.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = b""
        self.eof = False

    def readline(self, prompt: str) -> str:
        import os
        import select
        sys.stdout.write(prompt)
        sys.stdout.flush()
        while b"\n" not in self.buf and not self.eof:
            ready, _, _ = select.select([self.fd], [], [], INPUT_POLL_S)
            if ready:
                chunk = os.read(self.fd, 65536)
                if chunk:
                    self.buf += chunk
                else:
                    self.eof = True
        if not self.buf:
            raise EOFError
        line, sep, rest = self.buf.partition(b"\n")
        self.buf = rest
        return line.decode("utf-8", errors="replace").rstrip("\r")


def input_function():
    """_LineReader on a real stdin descriptor, else the builtin input() (e.g. under click's CliRunner)."""
    try:
        fd = sys.stdin.fileno()
        import select
        select.select([fd], [], [], 0)
    except Exception:          # no descriptor (in-memory stdin) or not selectable: plain input()
        return input
    return LineReader(fd).readline
