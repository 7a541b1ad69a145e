"""Connections from anyone: bounded in number and in time, so that clients without the
cluster secret cannot take a worker's file descriptors (1,100 half-sent requests did,
before: /status stopped answering and a checkpoint open() failed with EMFILE).
"""
from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0      # to send a request's headers, and longest idle keep-alive
MAX_CONNECTIONS = 512        # at once, all addresses (a systemd unit's 1,024 descriptors hold them)
MAX_PER_ADDRESS = 256


class ConnectionGuard:
    """Bounds the worker's HTTP connections: at most MAX_CONNECTIONS at once and
    MAX_PER_ADDRESS from one address. A connection over a limit makes room by closing
    the oldest one (of that address, for the per-address limit) that has not finished
    sending its request headers, or else one idle between requests, or else one that
    is not a stream and has been open for `stuck_after_s`; if there is none it is
    refused. So 1,100 half-sent requests cost at most the limits in descriptors and
    each at most HEADER_TIMEOUT_S (aiohttp's keep-alive timer, which runs from the
    connection's start), while a client that sends its request at once - the
    monitoring, a peer - is served. Peers' streams are long requests, never idle, and
    never evicted. The last rule is for a client that pipelines requests and never
    reads the answers: its handler waits on a full socket for good (aiohttp has no
    write timeout), neither half-sent nor idle, and without the secret 2 x 256 such
    connections held a worker's every slot."""

    def __init__(self, max_connections: int = MAX_CONNECTIONS, max_per_address: int = MAX_PER_ADDRESS,
                 stuck_after_s: float = HEADER_TIMEOUT_S):
        self.max_connections, self.max_per_address = max_connections, max_per_address
        self.stuck_after_s = stuck_after_s
        self.open: dict["_Guarded", None] = {}          # in order of arrival
        self.by_address: dict[str, dict["_Guarded", None]] = {}
        self.evicted = self.refused = 0

    def wrap(self, server):
        return _GuardedServer(server, self)

    def admit(self, conn: "_Guarded") -> bool:
        for pool, limit in ((self.by_address.get(conn.address, {}), self.max_per_address),
                            (self.open, self.max_connections)):
            if len(pool) >= limit:
                victim = (next((c for c in pool if c.pending), None) or next((c for c in pool if c.idle()), None)
                          or next((c for c in pool if c.stuck(self.stuck_after_s)), None))
                if victim is None:
                    self.refused += 1
                    log.warning("refusing a connection from %s: %d open (limit %d), none half-sent or idle",
                                conn.address, len(pool), limit)
                    return False
                self.evicted += 1
                victim.close()      # forgets it now: its address's entry may go with it
        self.open[conn] = None
        self.by_address.setdefault(conn.address, {})[conn] = None
        return True

    def forget(self, conn: "_Guarded") -> None:
        self.open.pop(conn, None)
        mine = self.by_address.get(conn.address)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.by_address[conn.address]

    def status(self) -> dict:
        return {"open": len(self.open), "evicted": self.evicted, "refused": self.refused,
                "half_sent": sum(1 for c in self.open if c.pending)}


class GuardedRunner(web.AppRunner):
    """web.AppRunner whose connections pass the guard first.

    A request whose body its handler did not read is closed once it is answered
    (`lingering_time` 0), not drained for aiohttp's default 10 s: while it drained,
    the connection was neither half-sent nor idle, so the guard could not evict it,
    and 3 connections a second declaring a large body it never sent held 30 slots
    (512, the whole worker, at 51 a second) - peers' streams and probes refused."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs):
        kwargs.setdefault("lingering_time", 0.0)
        super().__init__(app, **kwargs)
        self.guard = guard

    async def _make_server(self):
        return self.guard.wrap(await super()._make_server())


class _GuardedServer:
    """aiohttp's Server (the protocol factory), each protocol behind the guard."""

    def __init__(self, server, guard: ConnectionGuard):
        self._server, self._guard = server, guard

    def __call__(self):
        return _Guarded(self._guard, self._server())

    def __getattr__(self, name):
        return getattr(self._server, name)


class _Guarded(asyncio.Protocol):
    """One connection: aiohttp's request handler, admitted by the guard, watched until
    its first request's headers are complete (an empty line)."""

    def __init__(self, guard: ConnectionGuard, inner):
        self.guard, self.inner = guard, inner
        self.pending, self.admitted = True, False
        self.address, self.transport, self._tail = "?", None, b""
        self.opened = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.opened = time.monotonic()
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if peer else "?"
        if not self.guard.admit(self):
            transport.abort()
            return
        self.admitted = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.pending:
            seen = self._tail + data[:65536]
            if b"\r\n\r\n" in seen:
                self.pending = False
            self._tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc) -> None:
        if self.admitted:
            self.guard.forget(self)
            self.inner.connection_lost(exc)

    def idle(self) -> bool:
        # aiohttp's handler waits on _waiter between requests (its keep-alive check uses it)
        waiter = getattr(self.inner, "_waiter", None)
        return not self.pending and waiter is not None and not waiter.done()

    def stuck(self, after_s: float) -> bool:
        """Open for `after_s` and not a stream: a stream's handler takes the connection's
        protocol over (transport.py), so the transport no longer reports this one."""
        return time.monotonic() - self.opened >= after_s and self.transport.get_protocol() is self

    def close(self) -> None:
        """Evicted: out of the counts now (the transport reports its loss later)."""
        self.pending = False
        self.guard.forget(self)
        self.transport.abort()
