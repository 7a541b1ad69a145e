"""Attacks of issue 15 against running workers (loopback only, bounded loops)."""
import asyncio
import json
import os
import socket
import time
import urllib.request

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from streamnet.examples import wordcount
from streamnet.runtime import LocalCluster, codec, wait_for
from streamnet.runtime.dataplane.transport import TRAILER, Auth, PeerLink, StreamServer
from streamnet.runtime.messages import AckMsg, DataMsg

from tests.unit.test_security_allow import popen_spec

pytestmark = pytest.mark.usefixtures("no_leaks")


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
        return json.load(r)


def test_a_spec_naming_popen_written_into_the_coordinator_is_refused_by_every_worker(tmp_path):
    marker = tmp_path / "popen-ran"
    with LocalCluster(workers=3) as c:
        c.state.submit_topology("evil", popen_spec(str(marker)))     # straight in: no client-side check
        wait_for(lambda: c.state.assignment("evil")[0] is not None, 20, "the leader to place evil")

        def refusals():
            return {k: v for k, v in c.state.results("evil").items() if k.startswith("refused.")}
        wait_for(lambda: len(refusals()) == 3, 20, "every worker to refuse evil")
        for w in c.workers:
            why = refusals()[f"refused.{w.id}"]
            assert "'subprocess:Popen' is not allowed" in why and "evil" not in w.runtimes
        assert not marker.exists()
        # the workers stay up and run what they may
        assert all(_status(w.port) for w in c.workers)
        results = c.run(wordcount.topology(count=500), timeout=60)
        assert wordcount.merge_counts(results) == wordcount.expected_counts(500, 0)
    assert not marker.exists()


# -- protected streams: a relay without the secret ---------------------------------------------
class Relay:
    """A TCP relay on loopback that passes a sender's connections on to a receiver,
    and may `tamper(bytes) -> bytes` with what the sender writes on each connection."""

    def __init__(self, target_port: int, tamper=None):
        self.target_port, self.tamper, self.tasks = target_port, tamper, set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader, writer, tamper):
        try:
            while data := await reader.read(1 << 16):
                writer.write(tamper(data) if tamper else data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader, writer):
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        state = {"head": b""}
        tamper = (lambda data: self.tamper(state, data)) if self.tamper else None
        for coro in (self._pipe(reader, up_w, tamper), self._pipe(up_r, writer, None)):
            t = asyncio.get_running_loop().create_task(coro)
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    async def close(self):
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()


async def _wait(cond, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def _through_relay(tamper, messages):
    """A receiver (the StreamServer a worker mounts) recording what it dispatches, a
    sender's PeerLink that reaches it through a relay; send `messages`, one at a time."""
    secret = os.urandom(32)
    got = []

    async def dispatch(msg, sender):
        got.append(msg)
    server = StreamServer(Auth(secret, "w1"), dispatch, codec.DEFAULT_LIMITS)
    app = web.Application()
    app.add_routes(server.routes())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    relay = Relay(site._server.sockets[0].getsockname()[1], tamper)
    port = await relay.start()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    link = PeerLink(sender="w0", peer="w1", url=f"http://127.0.0.1:{port}", auth=Auth(secret, "w0"),
                    session=session, limits=codec.DEFAULT_LIMITS)
    link.start()
    try:
        outcomes = []
        for msg in messages:
            before = (len(got), server.rejected)
            await link.send(msg)
            await _wait(lambda: (len(got), server.rejected) != before, "the message or its rejection")
            outcomes.append((got[before[0]:], server.rejected - before[1]))
        return outcomes
    finally:
        await link.close(0.5)
        await session.close()
        await relay.close()
        await runner.cleanup()


def _data(fill: int) -> DataMsg:
    return DataMsg("t", 3, "default", 1, [np.full(4096, fill, np.uint8)], [], 1)


def test_a_relay_that_flips_one_payload_byte_gets_the_stream_closed_and_nothing_delivered():
    def flip_once(state, data):
        i = data.find(b"\xab" * 64)
        if i >= 0 and not state.get("done"):
            state["done"] = True
            data = data[:i + 10] + bytes([data[i + 10] ^ 1]) + data[i + 11:]
        return data
    (first, rejected1), (second, rejected2) = asyncio.run(_through_relay(flip_once, [_data(0xAB), _data(0xCD)]))
    assert first == [] and rejected1 == 1                      # altered: refused before decoding
    # the sender reconnects; an untouched frame arrives intact
    assert rejected2 == 0 and len(second) == 1 and np.all(second[0].values[0] == 0xCD)


def test_a_relay_that_injects_a_forged_ack_gets_the_stream_closed_and_nothing_delivered():
    forged = codec.encode_bytes([AckMsg("t", 0, 12345, 6789).to_wire()])

    injected = []

    def inject_once(state, data):
        """On the first POST /stream: a chunk of its own before the sender's first frame."""
        if state.get("passed"):
            return data
        state["head"] += data
        head = state["head"]
        if not b"POST /stream".startswith(head[:12]) or b"\r\n\r\n" in head:
            state["passed"] = True
            if head.startswith(b"POST /stream") and not injected:
                injected.append(1)
                headers, _, rest = head.partition(b"\r\n\r\n")
                chunk = forged + TRAILER.pack(0, os.urandom(16))     # no key: a guessed tag
                return headers + b"\r\n\r\n" + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" + rest
            return head
        return b""
    (first, rejected1), (second, rejected2) = asyncio.run(_through_relay(inject_once, [_data(1), _data(2)]))
    assert not any(isinstance(m, AckMsg) for m in first + second)
    assert first == [] and rejected1 == 1
    assert rejected2 == 0 and [int(m.values[0][0]) for m in second] == [2]


def test_a_receiver_without_the_secret_gets_nothing():
    async def go():
        posted = []

        async def hello(request):
            return web.json_response({"nonce": "n" * 20, "worker": "w1", "proof": "0" * 64})

        async def stream(request):
            posted.append(await request.read())
            return web.Response(text="bye")
        app = web.Application()
        app.add_routes([web.get("/hello", hello), web.post("/stream", stream)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        link = PeerLink(sender="w0", peer="w1", url=f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}",
                        auth=Auth(os.urandom(32), "w0"), session=session, limits=codec.DEFAULT_LIMITS)
        link.start()
        await link.send(_data(7))
        try:
            await _wait(lambda: link.reconnects >= 2, "the link to give up on that receiver twice")
            return posted, link.last_error
        finally:
            await link.close(0.2)
            await session.close()
            await runner.cleanup()
    posted, error = asyncio.run(go())
    assert posted == [] and "did not prove that it is worker w1" in error


# -- clients without the secret -------------------------------------------------------------------
def _half_open(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ")      # and never the rest
    return s


def test_half_open_connections_and_a_hello_flood_do_not_take_a_worker_offline(monkeypatch):
    from streamnet.runtime import worker as worker_module
    monkeypatch.setattr(worker_module, "HEADER_TIMEOUT_S", 2.0)
    n = 5000
    with LocalCluster(workers=2) as c:
        target = c.workers[1]
        c.submit(wordcount.topology(count=n, split=2, counters=2))
        socks = []
        try:
            for i in range(1100):                                      # the review's 1,100
                socks.append(_half_open(target.port))
                if i % 100 == 99:
                    assert _status(target.port)["worker"] == target.id
            conns = target.guard.status()
            assert conns["open"] <= target.guard.max_per_address and conns["evicted"] > 0
            # a half-sent request is closed when its header time is up
            s = _half_open(target.port)
            socks.append(s)
            s.settimeout(10)                                           # 5x the header time
            reply = s.recv(1024)
            assert reply == b"" or reply.startswith(b"HTTP/1.1 408"), reply[:100]
        finally:
            for s in socks:
                s.close()

        async def flood(count):
            async with aiohttp.ClientSession() as session:
                for i in range(count):
                    async with session.get(f"http://127.0.0.1:{target.port}/hello") as r:
                        assert r.status == 200
                    if i % 500 == 499:
                        async with session.get(f"http://127.0.0.1:{target.port}/status") as r:
                            assert r.status == 200
        asyncio.run(flood(3000))
        assert len(target.auth._used) <= 4                      # /hello keeps no per-call state
        c.wait_done("wordcount", 120)
        results = c.kill("wordcount")
        assert _status(target.port)["worker"] == target.id
    assert wordcount.merge_counts(results) == wordcount.expected_counts(n, 0)


def test_a_non_ascii_auth_header_is_refused_not_a_500():
    with LocalCluster(workers=1) as c:
        port = c.workers[0].port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello", timeout=5) as r:
            nonce = json.load(r)["nonce"]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /stream HTTP/1.1\r\nHost: x\r\nX-Streamnet-From: w9\r\nX-Streamnet-Nonce: "
                      + nonce.encode() + b"\r\nX-Streamnet-Auth: \xc3\xa9\xc3\xa9\r\nContent-Length: 0\r\n\r\n")
            reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 403"), reply[:200]
        assert c.workers[0].stream_server.rejected == 1
