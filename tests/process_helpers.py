"""Helpers for the tests that signal a command line in a child process (the nanoqwen CLI, the converter)."""
import signal
import time


def as_from_a_terminal():
    """preexec_fn of the SIGINT tests' children: SIGINT unblocked and at its default disposition, as a shell in a
    terminal starts a command. Both are inherited through fork and exec, and within a full test session the
    runner's state is not that (the fresh-clone CI saw children ignore SIGINT there, never in a lone run)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_mapped(pid: int, needle: str, timeout: float) -> bool:
    """True once a shared object whose path contains `needle` is mapped into process `pid` (Linux /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                if needle in fh.read():
                    return True
        except OSError:
            return False
        time.sleep(0.01)
    return False
