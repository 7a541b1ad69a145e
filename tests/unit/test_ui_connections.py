"""The UI's connections are bounded in number and in time, as a worker's are: clients
that open connections and never finish a request cannot take its file descriptors,
and a browser's requests are still answered."""
import asyncio
import json

from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.inprocess import InProcessServer
from streamnet.runtime.dataplane.guard import ConnectionGuard
from streamnet.ui.server import serve


async def _half_open(port: int):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"GET /api/cluster HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")     # and never the rest
    await w.drain()
    return r, w


async def _get(port: int, path: str) -> tuple[int, bytes]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        await w.drain()
        reply = await asyncio.wait_for(r.read(), 10)
    finally:
        w.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_half_sent_requests_are_bounded_and_timed_out_and_the_ui_still_answers():
    server = InProcessServer()
    state = ClusterState(server.session(), "c")
    guard = ConnectionGuard(max_connections=32, max_per_address=8, stuck_after_s=1.0)

    async def go():
        runner, port = await serve(state, "127.0.0.1", 0, poll_s=60, header_timeout_s=1.0, guard=guard)
        conns = []
        try:
            for _ in range(40):
                conns.append(await _half_open(port))
            # admitting each connection past the limit evicted the oldest half-sent one
            assert guard.status()["open"] <= 8 and guard.evicted >= 32, guard.status()
            status, body = await _get(port, "/api/cluster")
            assert status == 200 and "workers" in json.loads(body)
            # the newest half-sent request is closed when its header time is up
            reader, _ = conns[-1]
            reply = await asyncio.wait_for(reader.read(1024), 10)    # 10x the header time
            assert reply == b"" or reply.startswith(b"HTTP/1.1 408"), reply[:100]
        finally:
            for _, w in conns:
                w.close()
            await runner.cleanup()
    asyncio.run(go())
