"""Clients that pipeline requests and never read the answers cannot hold a worker's
connection slots: their handlers wait on a full socket, neither half-sent nor idle,
so the guard evicts such a connection once it has been open past `stuck_after_s`
(never a stream); and /hello answers once a connection, then closes it."""
import asyncio
import os

from aiohttp import web

from streamnet.runtime import codec
from streamnet.runtime.dataplane.guard import ConnectionGuard, GuardedRunner
from streamnet.runtime.dataplane.handshake import Auth
from streamnet.runtime.dataplane.transport import StreamServer
from streamnet.testing import until

PIPELINED = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" * 40_000     # ~1.2 MB of requests, ~4 MB of answers


async def _serve(app, guard):
    runner = GuardedRunner(app, guard, access_log=None, keepalive_timeout=10.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


def test_connections_stuck_on_answers_nobody_reads_are_evicted_for_a_client_that_asks():
    async def hello(request):
        return web.json_response({"nonce": "x" * 100})

    async def go():
        app = web.Application()
        app.add_routes([web.get("/hello", hello)])
        guard = ConnectionGuard(max_connections=2, max_per_address=2, stuck_after_s=0.5)
        runner, port = await _serve(app, guard)
        held = []
        try:
            for _ in range(2):                     # as many as the guard admits
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(PIPELINED)                 # and never read
                held.append(w)
            # both are past their headers, and their handlers wait on a full socket, not between requests
            await until(lambda: len(guard.open) == 2 and not any(c.pending or c.idle() for c in guard.open),
                        "two connections waiting on their answers")
            await until(lambda: all(c.stuck(guard.stuck_after_s) for c in guard.open), "them to be open 0.5 s")
            r, w = await asyncio.open_connection("127.0.0.1", port)
            held.append(w)
            w.write(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await w.drain()
            answer = await asyncio.wait_for(r.read(), 10)
            return answer, guard.status()
        finally:
            for w in held:
                w.close()
            await runner.cleanup()
    answer, status = asyncio.run(go())
    assert answer.startswith(b"HTTP/1.1 200"), answer[:60]
    assert status["evicted"] >= 1 and status["refused"] == 0


def test_hello_answers_once_a_connection_then_closes_it():
    async def go():
        server = StreamServer(Auth(os.urandom(32), "w1"), None, codec.DEFAULT_LIMITS)
        app = web.Application()
        app.add_routes(server.routes())
        runner, port = await _serve(app, ConnectionGuard())
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" * 5)
            await w.drain()
            answer = await asyncio.wait_for(r.read(), 10)     # EOF: the worker closed the connection
            w.close()
            return answer
        finally:
            await runner.cleanup()
    answer = asyncio.run(go())
    assert answer.count(b"HTTP/1.1 200") == 1 and b'"worker": "w1"' in answer, answer[:300]
