"""Clients that misbehave cannot hold the guard's connection slots and lock out everyone
else: one that declares a request body and never sends it is closed once answered (not
drained for seconds); ones that pipeline requests and never read the answers - their
handlers wait on a full socket, neither half-sent nor idle - are evicted once open past
`stuck_after_s` (never a stream: test_transport_stream); and /hello answers once a
connection, then closes it."""
import asyncio
import contextlib
import os

from aiohttp import web

from streamnet.runtime import codec
from streamnet.runtime.dataplane.guard import ConnectionGuard, GuardedRunner
from streamnet.runtime.dataplane.handshake import Auth
from streamnet.runtime.dataplane.transport import StreamServer
from streamnet.testing import until

UNSENT_BODY = b"GET /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\nx"
PIPELINED = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" * 40_000     # ~1.2 MB of requests, ~4 MB of answers


async def _hello(request):
    return web.json_response({"nonce": "x" * 100})


@contextlib.asynccontextmanager
async def _serving(guard, app=None):
    """A GuardedRunner (a worker's) on a free port: yields (port, a list for the clients'
    writers); the clients and the server are closed on exit."""
    if app is None:
        app = web.Application()
        app.add_routes([web.get("/hello", _hello)])
    runner = GuardedRunner(app, guard, access_log=None, keepalive_timeout=10.0)
    await runner.setup()
    held = []
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield site._server.sockets[0].getsockname()[1], held
    finally:
        for w in held:
            w.close()
        await runner.cleanup()


async def _ask(port: int, held: list, request: bytes = b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):
    """A client that sends `request` at once and reads until the connection closes."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    held.append(w)
    w.write(request)
    await w.drain()
    return await asyncio.wait_for(r.read(), 10)


def test_answered_requests_with_unread_bodies_free_their_slots():
    async def go():
        guard = ConnectionGuard(max_connections=3, max_per_address=3)
        async with _serving(guard) as (port, held):
            for _ in range(3):                     # as many as the guard admits
                answer = await _ask(port, held, UNSENT_BODY)     # answered, then closed by the worker
                assert answer.startswith(b"HTTP/1.1 200"), answer[:60]
            return await _ask(port, held), guard.status()
    honest, status = asyncio.run(go())
    assert honest.startswith(b"HTTP/1.1 200"), honest[:60]
    assert status["refused"] == 0


def test_connections_stuck_on_answers_nobody_reads_are_evicted_for_a_client_that_asks():
    async def go():
        guard = ConnectionGuard(max_connections=2, max_per_address=2, stuck_after_s=0.5)
        async with _serving(guard) as (port, held):
            for _ in range(2):                     # as many as the guard admits
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(PIPELINED)                 # and never read
                held.append(w)
            # both are past their headers, and their handlers wait on a full socket, not between requests
            await until(lambda: len(guard.open) == 2 and not any(c.pending or c.idle() for c in guard.open),
                        "two connections waiting on their answers")
            await until(lambda: all(c.stuck(guard.stuck_after_s) for c in guard.open), "them to be open 0.5 s")
            return await _ask(port, held), guard.status()
    answer, status = asyncio.run(go())
    assert answer.startswith(b"HTTP/1.1 200"), answer[:60]
    assert status["evicted"] >= 1 and status["refused"] == 0


def test_hello_answers_once_a_connection_then_closes_it():
    async def go():
        server = StreamServer(Auth(os.urandom(32), "w1"), None, codec.DEFAULT_LIMITS)
        app = web.Application()
        app.add_routes(server.routes())
        async with _serving(ConnectionGuard(), app) as (port, held):
            return await _ask(port, held, b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" * 5)   # EOF: closed by the worker
    answer = asyncio.run(go())
    assert answer.count(b"HTTP/1.1 200") == 1 and b'"worker": "w1"' in answer, answer[:300]


class _Conn:
    """What the guard reads of a connection; closing it forgets it at once, as _Guarded's does."""

    def __init__(self, guard, address, pending):
        self.guard, self.address, self.pending = guard, address, pending

    def idle(self):
        return False

    def stuck(self, after_s):
        return False

    def close(self):
        self.pending = False
        self.guard.forget(self)


def test_a_connection_admitted_by_evicting_its_own_address_last_one_is_counted_for_that_address():
    """Evicting an address's only connection dropped the address's entry, and the one
    admitted in its place went into that detached entry: the address's count missed it."""
    guard = ConnectionGuard(max_connections=2, max_per_address=2)
    first = _Conn(guard, "10.0.0.1", pending=True)        # half-sent: the one evicted
    other = _Conn(guard, "10.0.0.2", pending=False)
    assert guard.admit(first) and guard.admit(other)
    new = _Conn(guard, "10.0.0.1", pending=True)
    assert guard.admit(new)
    assert list(guard.open) == [other, new] and guard.evicted == 1
    assert list(guard.by_address["10.0.0.1"]) == [new]
    guard.forget(new)
    assert "10.0.0.1" not in guard.by_address
