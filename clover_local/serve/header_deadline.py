"""A deadline for a request's headers: uvicorn times out neither a new connection that has not finished its
headers nor a kept-alive one that started the next request and stalled (its keep-alive timer stops at the first
byte), so a sender that trickles header bytes (slowloris) held its connection, and one of the server's 256, for
ever. h11 already bounds how many header bytes one connection may buffer (uvicorn's
``h11_max_incomplete_event_size``, 16 KiB: past it a 400); this bounds the time.

The deadline counts from the connection's start, then from the end of each reply, and holds however the bytes
arrive: a byte now and then does not extend it. When it passes and the request's headers are still not all
there, the client gets 408 and the connection is closed. A request whose headers arrived is not its business
(the body has ``request_guard.RequestGuard``'s deadline; the reply, ``ApiConfig.max_request_s``)."""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from clover_local.serve.api_errors import error_body

HEADER_TIMEOUT_S = 10.0
"""Longest a request's headers may take to arrive: a client sends them in one write (a few hundred bytes), so
this is for a slow network, not a slow client."""


def timeout_reply(timeout_s: float) -> bytes:
    """The whole 408 response, written straight to the socket (h11 has no request to answer yet)."""
    body = json.dumps(
        error_body(
            f"The request headers did not arrive within {timeout_s:g} s; the connection is closed.",
            code="request_timeout",
        )
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def header_deadline_protocol(timeout_s: float = HEADER_TIMEOUT_S) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header deadline of ``timeout_s``: the class to pass as ``http=``."""

    reply = timeout_reply(timeout_s)

    class HeaderDeadlineProtocol(H11Protocol):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()  # the next request on this connection gets its own deadline

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            self._header_deadline = self.loop.call_later(timeout_s, self._headers_due)

        def _headers_due(self) -> None:
            """Close the connection when a request was begun and its headers are still not complete. Idle
            between requests (no byte yet) is the keep-alive timer's to end."""
            self._header_deadline = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if not self.conn.trailing_data[0] and self.cycle is not None:
                return  # kept alive, nothing sent yet: the keep-alive timer closes it
            self.transport.write(reply)
            self.transport.close()

    return HeaderDeadlineProtocol
