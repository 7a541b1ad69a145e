"""The monitor token on /status and /metrics, and its file's checks."""
import asyncio

import pytest
from aiohttp import web

from streamnet.errors import StreamnetError
from streamnet.runtime import monitor

TOKEN = "t0ken-of-at-least-16-chars"


def _token_file(tmp_path, text=TOKEN, mode=0o600):
    p = tmp_path / "token"
    p.write_text(text + "\n")
    p.chmod(mode)
    return str(p)


def test_the_token_file_is_checked_like_the_secret(tmp_path):
    assert monitor.read_token(_token_file(tmp_path)) == TOKEN
    with pytest.raises(StreamnetError, match="chmod 600"):
        monitor.read_token(_token_file(tmp_path, mode=0o644))
    with pytest.raises(StreamnetError, match="at least 16"):
        monitor.read_token(_token_file(tmp_path, "short"))
    with pytest.raises(StreamnetError, match="does not exist"):
        monitor.read_token(str(tmp_path / "none"))


def test_status_needs_the_token_when_one_is_set():
    async def main(token):
        async def status(request):
            return monitor.refusal(request, token) or web.json_response({"ok": 1})
        app = web.Application()
        app.add_routes([web.get("/status", status)])
        from aiohttp.test_utils import TestClient, TestServer
        async with TestClient(TestServer(app)) as client:
            out = []
            for headers in ({}, {"Authorization": "Bearer wrong-token-but-long"}, monitor.headers(TOKEN),
                            {"Authorization": f"bearer {TOKEN}"}, {"Authorization": "Bearer \u00e9t\u00e9"}):
                r = await client.get("/status", headers=headers)
                out.append((r.status, await r.text(), r.headers.get("WWW-Authenticate")))
            return out
    no, wrong, right, lower, odd = asyncio.run(main(TOKEN))
    assert no[0] == 401 and "/status needs the monitor token" in no[1] and no[2] == 'Bearer realm="streamnet"'
    assert wrong[0] == 401 and odd[0] == 401
    assert right[0] == 200 and lower[0] == 200
    assert [r[0] for r in asyncio.run(main(None))] == [200] * 5      # no token set: open, as before


STATUS = {"worker": "w0", "threads": 1, "busy_fraction": 0.0, "topologies": {}}    # a worker's, as readers check it


def test_the_ui_reads_workers_that_require_the_token():
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer
    from streamnet.ui.server import Sampler

    class State:            # the coordinator as the sampler reads it: one worker, no topology
        def __init__(self, port):
            self.port = port

        def workers(self):
            return {"w0": {"host": "127.0.0.1", "port": self.port}}

        def topology_names(self):
            return []

    async def main():
        async def status(request):
            return monitor.refusal(request, TOKEN) or web.json_response(STATUS)
        app = web.Application()
        app.add_routes([web.get("/status", status)])
        async with TestServer(app) as server, ClientSession() as session:
            seen = []
            for token in (None, TOKEN):
                sampler = Sampler(State(server.port), token=token)
                try:
                    await sampler.sample(session)
                finally:
                    sampler.close()
                seen.append((sampler.snapshot.statuses, sampler.snapshot.unreachable))
            return seen
    (without, why), (with_token, none) = asyncio.run(main())
    assert without == {} and "401" in why["w0"]
    assert with_token == {"w0": STATUS} and none == {}
