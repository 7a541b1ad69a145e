"""Refusals that strangers can cause are logged within a budget: `burst` lines a
window, the rest counted and named by the next line that goes through."""
import asyncio
import logging
import os

import aiohttp
from aiohttp import web

from streamnet.runtime import codec
from streamnet.runtime.dataplane.handshake import Auth
from streamnet.runtime.dataplane.log_budget import LogBudget
from streamnet.runtime.dataplane.transport import StreamServer


def test_a_budget_lets_a_burst_through_a_window_and_names_what_it_left_out():
    now = [0.0]
    budget = LogBudget(burst=2, window_s=10.0, clock=lambda: now[0])
    assert [budget.allow() for _ in range(5)] == ["", "", None, None, None]
    now[0] = 10.0                                     # the next window
    assert budget.allow() == " (3 more like it not logged before this)"
    assert budget.allow() == "" and budget.allow() is None


def test_a_flood_of_refused_streams_logs_a_bounded_number_of_lines(caplog):
    server = StreamServer(Auth(os.urandom(32), "w1"), None, codec.DEFAULT_LIMITS)

    async def go():
        app = web.Application()
        app.add_routes(server.routes())
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as s:
                for i in range(60):                   # no secret: each one refused
                    async with s.post(f"http://127.0.0.1:{port}/stream",
                                      headers={"X-Streamnet-From": f"x{i}", "X-Streamnet-Nonce": "n",
                                               "X-Streamnet-Auth": "m"}) as r:
                        assert r.status == 403
        finally:
            await runner.cleanup()
    with caplog.at_level(logging.WARNING, logger="streamnet.runtime.dataplane.transport"):
        asyncio.run(go())
    lines = [r for r in caplog.records if "closing stream" in r.getMessage()]
    assert server.rejected == 60 and len(lines) == server.log_budget.burst == 20
