"""The UI answers only requests whose Host header names it - an IP address, localhost,
this machine's names or one given with --allow-host - so that a page of another site,
its name made to resolve to this host (DNS rebinding), cannot read /api as its own."""
import asyncio
import socket

from aiohttp import web

from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.inprocess import InProcessServer
from streamnet.ui.server import Sampler, default_names, host_allowed, make_app


def test_which_host_headers_name_the_ui():
    names = default_names(["ui.example.org"])
    for ok in ("127.0.0.1:8080", "10.1.2.3", "[::1]:8080", "::1", "localhost:8080", "LOCALHOST",
               "ui.example.org:80", "ui.example.org.", f"{socket.gethostname()}:8080"):
        assert host_allowed(ok, names), ok
    for bad in ("evil.example:8080", "evil.example", "", "ui.example.org.evil.example", "localhost.evil.example"):
        assert not host_allowed(bad, names), bad


def test_a_request_by_another_name_is_refused_and_one_by_address_served():
    server = InProcessServer()
    state = ClusterState(server.session(), "c")

    async def go():
        runner = web.AppRunner(make_app(Sampler(state, poll_s=60), default_names()), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        answers = {}
        try:
            for host in ("evil.example", f"127.0.0.1:{port}", f"localhost:{port}"):
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(f"GET /api/cluster HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                await w.drain()
                answers[host] = await asyncio.wait_for(r.read(), 10)
                w.close()
        finally:
            await runner.cleanup()
        return answers
    try:
        answers = asyncio.run(go())
    finally:
        state.coord.close()
        server.shutdown()
    refused = answers.pop("evil.example")
    assert refused.startswith(b"HTTP/1.1 403") and b"--allow-host" in refused, refused[:200]
    for host, answer in answers.items():
        assert answer.startswith(b"HTTP/1.1 200"), (host, answer[:200])


def test_a_static_name_too_long_for_the_file_system_is_not_found_and_a_failed_pass_does_not_stop_sampling():
    """ENAMETOOLONG was a 500 with a traceback; an exception in a sampling pass (a status of
    a shape it did not expect) ended the sampler, and every page froze without a word."""
    import aiohttp
    server = InProcessServer()
    state = ClusterState(server.session(), "c")
    sampler = Sampler(state, poll_s=0.05)
    passes = []

    async def failing(session):
        passes.append(1)
        raise KeyError("threads")
    sampler.sample = failing

    async def go():
        runner = web.AppRunner(make_app(sampler, default_names()), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        task = asyncio.get_running_loop().create_task(sampler.run())
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/static/{'a' * 300}.js") as r:
                    assert r.status == 404
            deadline = asyncio.get_running_loop().time() + 10
            while len(passes) < 3 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            assert len(passes) >= 3 and not task.done()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await runner.cleanup()
    try:
        asyncio.run(go())
    finally:
        state.coord.close()
        server.shutdown()
