"""The leader's liveness probe counts only an authenticated /hello from the worker it asks."""
import asyncio
import socket

from aiohttp import web

from streamnet.runtime import codec
from streamnet.runtime.control.election import probe
from streamnet.runtime.dataplane.transport import Auth, StreamServer

SECRET = b"k" * 32


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


def _hello_app(secret: bytes, worker: str) -> web.Application:
    async def dispatch(msg, peer):
        pass
    app = web.Application()
    app.add_routes(StreamServer(Auth(secret, worker), dispatch, codec.DEFAULT_LIMITS).routes())
    return app


def _error_app() -> web.Application:
    async def hello(request):
        return web.Response(status=500, text="another program")
    app = web.Application()
    app.add_routes([web.get("/hello", hello)])
    return app


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_only_the_named_worker_proving_the_secret_counts_as_alive():
    me = Auth(SECRET, "w0")

    async def main():
        runners, ports = [], {}
        try:
            for name, app in (("w1", _hello_app(SECRET, "w1")), ("other", _hello_app(b"o" * 32, "w1")),
                              ("error", _error_app())):
                runner, ports[name] = await _serve(app)
                runners.append(runner)

            def ask(port, worker="w1"):
                return asyncio.to_thread(probe, {"host": "127.0.0.1", "port": port}, worker, me)
            return (await ask(ports["w1"]), await ask(ports["w1"], "w2"), await ask(ports["other"]),
                    await ask(ports["error"]), await ask(_closed_port()))
        finally:
            for r in runners:
                await r.cleanup()
    alive, wrong_name, wrong_secret, error, closed = asyncio.run(main())
    assert alive is None
    assert wrong_name == "another program answers there (not worker w2)"
    assert wrong_secret == "its hello does not prove the cluster secret"
    assert error == "it answered HTTP 500, not a worker's hello"
    assert closed is not None and "Connection refused" in closed
