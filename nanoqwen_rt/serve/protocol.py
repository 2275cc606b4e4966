"""uvicorn's h11 protocol with a deadline for a request's headers.

uvicorn (0.54) times out an idle keep-alive connection, but any byte cancels that timer and nothing bounds how
long the request line and headers may take: a client that sends one header byte a minute holds a connection
(and its memory) forever. `HeaderDeadlineH11Protocol` closes a connection whose next request's headers have
not all arrived `header_timeout_s` after the connection opened or after the previous response ended. The
body's deadline is the app's (serve/app.py, `_Server.read_json`): the app reads the body itself.
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

# Seconds a client has to send a request's line and headers: a real client sends them in one write.
DEFAULT_HEADER_TIMEOUT_S = 30.0


class HeaderDeadlineH11Protocol(H11Protocol):
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S

    @classmethod
    def with_timeout(cls, seconds: float) -> type["HeaderDeadlineH11Protocol"]:
        """This protocol class with its own header deadline (uvicorn takes a class, not an instance)."""
        return type(cls.__name__, (cls,), {"header_timeout_s": float(seconds)})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_deadline(self.cycle)

    def _arm_header_deadline(self, waiting_after) -> None:
        """Close the connection unless a request newer than `waiting_after` (a cycle, or None) has started
        within header_timeout_s."""
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_deadline, waiting_after)

    def _header_deadline(self, waiting_after) -> None:
        self._header_timer = None
        if self.cycle is waiting_after and not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        done = self.cycle
        super().on_response_complete()          # may start a pipelined request (a new cycle) at once
        if self.cycle is done and not self.transport.is_closing():
            self._arm_header_deadline(done)

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)
