"""A client that declares a request body and never sends it holds no guarded slot
after its answer: the connection is closed, not drained for seconds, so such
clients cannot fill the guard and lock out everyone else."""
import asyncio

from aiohttp import web

from streamnet.runtime.dataplane.guard import ConnectionGuard, GuardedRunner

UNSENT_BODY = b"GET /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\nx"


async def _hello(request):
    return web.json_response({"ok": 1})


def test_answered_requests_with_unread_bodies_free_their_slots():
    async def go():
        app = web.Application()
        app.add_routes([web.get("/hello", _hello)])
        guard = ConnectionGuard(max_connections=3, max_per_address=3)
        runner = GuardedRunner(app, guard, access_log=None, keepalive_timeout=10.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        held = []
        try:
            for _ in range(3):                     # as many as the guard admits
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(UNSENT_BODY)
                await w.drain()
                held.append(w)
                answer = await asyncio.wait_for(r.read(), 5)     # answered, then closed by the worker
                assert answer.startswith(b"HTTP/1.1 200"), answer[:60]
            r, w = await asyncio.open_connection("127.0.0.1", port)
            held.append(w)
            w.write(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await w.drain()
            honest = await asyncio.wait_for(r.read(), 5)
            return honest, guard.status()
        finally:
            for w in held:
                w.close()
            await runner.cleanup()
    honest, status = asyncio.run(go())
    assert honest.startswith(b"HTTP/1.1 200"), honest[:60]
    assert status["refused"] == 0
