"""A PeerLink streaming to a StreamServer on loopback (behind the worker's connection
guard): what goes in comes out, read-only; silent and stalled peers are cut off; an
idle stream stays open on heartbeats; a hung handshake is given up."""
import asyncio
import contextlib
import logging
import os
import socket

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from streamnet.runtime import codec
from streamnet.runtime.dataplane import frame_io, transport
from streamnet.runtime.dataplane.guard import ConnectionGuard, GuardedRunner
from streamnet.runtime.dataplane.transport import PROTOCOL, Auth, PeerLink, StreamServer
from streamnet.runtime.messages import AckMsg, DataMsg, DataRun, HoldMsg
from streamnet.testing import until

pytestmark = pytest.mark.usefixtures("no_leaks")


class Receiver:
    """A StreamServer on an aiohttp app behind a ConnectionGuard, recording what it gets."""

    def __init__(self, secret: bytes, now=None):
        """now(msg): whether a dispatch_now takes msg at once (None: the server has none)."""
        self.got = []
        self.now, self.at_once = now, 0
        self.opened = []        # the senders of the streams opened, in order
        self.server = StreamServer(Auth(secret, "w1"), self._dispatch, codec.DEFAULT_LIMITS,
                                   dispatch_now=self._dispatch_now if now else None, on_open=self.opened.append)
        self.guard = ConnectionGuard()

    async def _dispatch(self, msg, sender):
        if self.now is not None:
            await asyncio.sleep(0)     # what dispatch_now refused waits (for room in a queue)
        self._record(msg, sender)

    def _dispatch_now(self, msg, sender):
        if not self.now(msg):
            return False
        self.at_once += 1
        self._record(msg, sender)
        return True

    def _record(self, msg, sender):
        if isinstance(msg, DataRun):     # tuples that went as one run: one message each here
            self.got += [(DataMsg(msg.topology, msg.target, msg.stream, msg.source, v, a, msg.version), sender)
                         for v, a in zip(msg.values, msg.anchors)]
        else:
            self.got.append((msg, sender))

    async def __aenter__(self):
        app = web.Application()
        app.add_routes(self.server.routes())
        self.runner = GuardedRunner(app, self.guard, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


@contextlib.asynccontextmanager
async def _linked(secret: bytes, port: int, close_s: float = 1.0):
    """A started PeerLink from w0 to the receiver on `port`; closed with its session on exit."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    link = PeerLink(sender="w0", peer="w1", url=f"http://127.0.0.1:{port}", auth=Auth(secret, "w0"),
                    session=session, limits=codec.DEFAULT_LIMITS)
    link.start()
    try:
        yield link
    finally:
        await link.close(close_s)
        await session.close()


@contextlib.asynccontextmanager
async def _streaming(secret: bytes):
    """A Receiver and a PeerLink to it whose stream is up: a first message went through."""
    async with Receiver(secret) as rx, _linked(secret, rx.port) as link:
        await link.send(AckMsg("t", 0, 1, 1))
        await until(lambda: len(rx.got) == 1, "the first message")
        yield rx, link


def test_tuples_and_tensors_of_every_size_arrive_intact_and_read_only():
    secret = os.urandom(32)
    sizes = [0, 1, 1000, 62_000, 2_621_440]            # float32: up to a 10 MB tensor

    async def go():
        async with Receiver(secret) as rx, _linked(secret, rx.port) as link:
            for i in range(300):                  # small tuples, queued together: batched frames
                await link.send(DataMsg("t", 1, "default", 0, [i, "x"], [[i, i + 1]], 3))
            for n in sizes:
                await link.send(DataMsg("t", 1, "default", 0, [np.arange(n, dtype=np.float32)], [], 3))
            await link.send(AckMsg("t", 0, 5, 6))
            link.queue.put_control(HoldMsg("t", 1, True))       # past the queue's bound, in order
            await until(lambda: len(rx.got) == 300 + len(sizes) + 2, "every message")
            assert rx.guard.status()["open"] == 1 and rx.server.open_streams == 1
            return [m for m, _ in rx.got], link.frames_out, rx.server.rejected
    got, frames, rejected = asyncio.run(go())
    assert rejected == 0 and frames < 300 + len(sizes) + 2
    assert [m.values for m in got[:300]] == [[i, "x"] for i in range(300)]
    assert [m.anchors for m in got[:300]] == [[[i, i + 1]] for i in range(300)]
    for n, m in zip(sizes, got[300:]):
        (x,) = m.values
        assert x.dtype == np.float32 and np.array_equal(x, np.arange(n, dtype=np.float32))
        assert not x.flags.writeable
    assert got[-2:] == [AckMsg("t", 0, 5, 6), HoldMsg("t", 1, True)]


def _refuse_every_50th(msg) -> bool:
    """A dispatch_now's answer: it takes a message unless a tuple of it is a multiple of 50."""
    values = msg.values if isinstance(msg, DataRun) else [msg.values] if isinstance(msg, DataMsg) else []
    return not any(isinstance(v[0], int) and v[0] % 50 == 0 for v in values)


@pytest.mark.parametrize("case", ["one message cannot be encoded", "the batch's values overflow a header"])
def test_a_batch_that_cannot_be_one_frame_loses_only_what_cannot_be_sent(case):
    """All the messages a frame took were dropped when one of them could not be encoded,
    or when their values besides arrays (which the batching does not count) made a header
    past the limit: up to 512 tuples and acks of every task on that link."""
    secret = os.urandom(32)
    bad = 150 if case == "one message cannot be encoded" else None
    # with a 64 KB header limit, 300 tuples of 100 floats each cannot share one frame
    limits = codec.Limits(max_header=64 << 10) if bad is None else codec.DEFAULT_LIMITS

    async def go():
        async with Receiver(secret) as rx:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
            link = PeerLink(sender="w0", peer="w1", url=f"http://127.0.0.1:{rx.port}", auth=Auth(secret, "w0"),
                            session=session, limits=limits)
            link.start()
            try:
                await link.send(AckMsg("t", 0, 1, 1))
                await until(lambda: len(rx.got) == 1, "the stream to be up")
                for i in range(300):          # queued in one turn of the loop: one batch
                    values = [i, object()] if i == bad else [i, [0.5] * 100]
                    await link.send(DataMsg("t", 1, "default", 0, values, [], 3))
                await link.send(AckMsg("t", 0, 5, 6))
                want = 1 + 300 - (bad is not None) + 1
                await until(lambda: len(rx.got) == want, "every message that can be sent")
                return [m for m, _ in rx.got[1:]], link.dropped, rx.server.rejected
            finally:
                await link.close(1.0)
                await session.close()
    got, dropped, rejected = asyncio.run(go())
    assert rejected == 0 and dropped == (bad is not None)
    assert [m.values[0] for m in got[:-1]] == [i for i in range(300) if i != bad]       # in order
    assert got[-1] == AckMsg("t", 0, 5, 6)


def test_messages_go_at_once_from_the_socket_callback_and_in_order_when_some_must_wait():
    secret = os.urandom(32)

    async def go():
        async with Receiver(secret, now=_refuse_every_50th) as rx, _linked(secret, rx.port) as link:
            # the stream up first: bytes that came with the upgrade (a loaded machine let all
            # 1,010 messages come so) are read by the stream's task, not the socket's callback
            await link.send(DataMsg("t", 1, "default", 0, [0], [], 3))
            await until(lambda: len(rx.got) == 1, "the first message")
            for i in range(1, 1001):
                await link.send(DataMsg("t", 1, "default", 0, [i], [], 3))
                if i % 100 == 0:          # now and then a tensor (a frame read into its own buffer)
                    await link.send(DataMsg("t", 1, "default", 0, [np.full(100_000, i, np.float32)], [], 3))
                if i % 7 == 0:
                    await asyncio.sleep(0)   # let some frames leave alone, others together
            await until(lambda: len(rx.got) == 1011, "every message")
            return [m.values[0] for m, _ in rx.got[1:]], rx.at_once, rx.server.rejected
    got, at_once, rejected = asyncio.run(go())
    expected = []
    for i in range(1, 1001):
        expected.append(i)
        if i % 100 == 0:
            expected.append(("tensor", i))
    assert [("tensor", int(v[0])) if isinstance(v, np.ndarray) else v for v in got] == expected
    assert rejected == 0
    assert 0 < at_once < 1010          # most went from the callback, the refused ones (and what
    #                                    came behind them) through the stream's task


def test_a_delivery_that_raises_in_the_socket_callback_closes_that_stream_only(caplog):
    secret = os.urandom(32)

    def now(msg):
        if isinstance(msg, DataMsg) and msg.values == ["boom"]:
            raise RuntimeError("a bug in delivery")
        return True

    async def go():
        async with Receiver(secret, now=now) as rx, _linked(secret, rx.port) as link:
            await link.send(DataMsg("t", 1, "default", 0, [1], [], 3))
            await until(lambda: len(rx.got) == 1, "the first message")
            await link.send(DataMsg("t", 1, "default", 0, ["boom"], [], 3))
            await until(lambda: rx.server.rejected == 1, "the stream to close")
            # sent before the link has seen its stream close, a frame is lost with the stream
            await until(lambda: link.reconnects == 1 and link.connected, "the link to reconnect")
            await link.send(DataMsg("t", 1, "default", 0, [2], [], 3))   # on the new stream
            await until(lambda: len(rx.got) == 2, "a message after it")
            return [m.values for m, _ in rx.got], link.reconnects
    got, reconnects = asyncio.run(go())
    assert got == [[1], [2]] and reconnects == 1
    assert any("delivering a message failed: RuntimeError: a bug in delivery" in r.getMessage()
               for r in caplog.records)


def test_frames_written_at_once_and_by_the_links_task_arrive_whole_and_in_order():
    """write_now() hands an idle link's frame to the socket from the caller's turn; what
    the socket does not take (a 64 MB tensor is more than it buffers) is finished by
    the link's task before anything queued after it. The receiver checks each frame's
    sequence number and tag, so a frame out of order would close the stream."""
    secret = os.urandom(32)
    big = np.arange(16 << 20, dtype=np.float32)     # 64 MB: more than both sockets buffer

    async def go():
        async with _streaming(secret) as (rx, link):
            link.write_now()                        # nothing queued: nothing written
            assert link.frames_now == 0
            await link.send(DataMsg("t", 1, "default", 0, [big], [], 3))
            def idle():
                return link.queue.waiter is not None and not link.queue.waiter.done()
            await until(idle, "the link's task to wait")
            link.write_now()                        # idle: written here, in part
            assert link.frames_now == 1 and link._unsent
            await link.send(DataMsg("t", 1, "default", 0, [-1], [], 3))   # behind the rest of it
            link.write_now()                        # the task is woken for that rest: left to it
            assert link.frames_now == 1
            await until(idle, "the link's task to wait again")
            for i in range(200):
                await link.send(DataMsg("t", 1, "default", 0, [i], [], 3))
                if i % 10 == 0:
                    link.write_now()
                if i % 20 == 0:
                    await asyncio.sleep(0)
            await until(lambda: len(rx.got) == 203, "every message")
            return rx.got[1:], link.frames_now, link.reconnects, rx.server.rejected
    got, frames_now, reconnects, rejected = asyncio.run(go())
    assert rejected == 0 and reconnects == 0
    assert np.array_equal(got[0][0].values[0], big)
    assert [m.values[0] for m, _ in got[1:]] == list(range(-1, 200))
    assert frames_now > 1


def test_a_socket_error_while_writing_at_once_is_left_to_the_links_task():
    """write_now() runs on its caller's turn (a bolt about to wait): an error there (a
    broken socket, perhaps after part of a frame went) must not raise in the caller. The
    link's task raises it and reconnects, as on any broken stream; the frame is lost
    with the stream (spouts replay what was in flight), and later messages go."""
    secret = os.urandom(32)

    async def go():
        async with _streaming(secret) as (rx, link):
            await until(lambda: link.queue.waiter is not None and not link.queue.waiter.done(), "an idle link")

            def broken(buffers):
                raise ConnectionResetError(104, "Connection reset by peer")
            link._plain.write_now = broken
            await link.send(DataMsg("t", 1, "default", 0, [7], [], 3))
            link.write_now()                        # must not raise
            await until(lambda: link.reconnects == 1 and link.connected, "the link to reconnect")
            await link.send(DataMsg("t", 1, "default", 0, [8], [], 3))
            await until(lambda: len(rx.got) == 2, "the message after it")
            return rx.got[1][0].values, rx.server.rejected, link.last_error
    values, rejected, error = asyncio.run(go())
    assert values == [8] and rejected == 0
    assert error.startswith("ConnectionResetError")


async def _upgraded(port: int, secret: bytes, sender: str = "w0"):
    """A raw connection that authenticates as `sender` and is upgraded: (reader, writer, key)."""
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/hello") as r:
            nonce = (await r.json())["nonce"]
    auth = Auth(secret, sender)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /stream HTTP/1.1\r\nHost: x\r\nX-Streamnet-From: {sender}\r\nX-Streamnet-Nonce: {nonce}\r\n"
                 f"X-Streamnet-Auth: {auth.sign(nonce, sender, 'w1')}\r\nConnection: Upgrade\r\n"
                 f"Upgrade: {PROTOCOL}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer, auth.session_key(nonce, sender, "w1")


@pytest.mark.parametrize("sent", ["nothing", "half a frame"])
def test_a_peer_that_goes_silent_or_stops_inside_a_frame_is_cut_off(monkeypatch, caplog, sent):
    monkeypatch.setattr(transport, "READ_TIMEOUT_S", 0.5)
    secret = os.urandom(32)

    async def go():
        async with Receiver(secret) as rx:
            reader, writer, _ = await _upgraded(rx.port, secret)
            try:
                if sent == "half a frame":
                    frame = codec.encode_bytes([DataMsg("t", 1, "s", 0, [np.zeros(50_000, np.float32)], [], 1)
                                                .to_wire()])
                    writer.write(frame[:len(frame) // 2])
                    await writer.drain()
                await until(lambda: rx.server.open_streams == 1, "the stream to open")
                # then nothing more: the worker closes the connection and forgets it
                assert await asyncio.wait_for(reader.read(), 10) == b""
                await until(lambda: rx.guard.status()["open"] == 0, "the guard to forget the connection")
                return rx.server.rejected, rx.server.open_streams, rx.got
            finally:
                writer.close()
    caplog.set_level("WARNING", logger="streamnet.runtime.dataplane.transport")
    rejected, still_open, got = asyncio.run(go())
    assert rejected == 1 and still_open == 0 and got == []
    where = "inside a frame" if sent == "half a frame" else "between frames"
    assert any("no data for" in r.getMessage() and where in r.getMessage() for r in caplog.records)


def test_an_idle_link_keeps_its_stream_open_with_heartbeats(monkeypatch):
    # a timeout 20 heartbeats long: a stall of the (shared) event loop under 2 s is no cut
    monkeypatch.setattr(transport, "READ_TIMEOUT_S", 2.0)
    monkeypatch.setattr(transport, "HEARTBEAT_S", 0.1)
    secret = os.urandom(32)

    async def go():
        async with _streaming(secret) as (rx, link):
            frames = rx.server.frames_in
            await until(lambda: rx.server.frames_in >= frames + 50, "5 s of heartbeats (2.5x the timeout)")
            await link.send(AckMsg("t", 0, 2, 2))
            await until(lambda: len(rx.got) == 2, "the second message")
            return rx.server.rejected, link.reconnects, [m for m, _ in rx.got]
    rejected, reconnects, got = asyncio.run(go())
    assert rejected == 0 and reconnects == 0        # one stream throughout
    assert got == [AckMsg("t", 0, 1, 1), AckMsg("t", 0, 2, 2)]


def test_a_receiver_that_never_answers_the_upgrade_is_given_up(monkeypatch):
    monkeypatch.setattr(transport, "HANDSHAKE_TIMEOUT_S", 0.3)
    secret = os.urandom(32)

    async def go():
        receiver_auth = Auth(secret, "w1")
        answered = asyncio.Event()

        async def hello(request):      # a genuine proof, then a /stream that never answers
            nonce = receiver_auth.challenge()
            return web.json_response({"nonce": nonce, "worker": "w1",
                                      "proof": receiver_auth.hello_proof(nonce, request.query["c"], "w1")})

        async def stream(request):
            await answered.wait()
            return web.Response(text="never")
        app = web.Application()
        app.add_routes([web.get("/hello", hello), web.post("/stream", stream)])
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            async with _linked(secret, site._server.sockets[0].getsockname()[1], close_s=0.2) as link:
                try:
                    await link.send(AckMsg("t", 0, 1, 1))
                    await until(lambda: link.reconnects >= 2, "the link to give up twice and try again")
                    return link.last_error, link.connected
                finally:
                    answered.set()
        finally:
            await runner.cleanup()
    error, connected = asyncio.run(go())
    assert error.startswith("TimeoutError") and not connected


def test_the_sender_reconnects_at_once_when_the_receiver_closes_the_stream():
    secret = os.urandom(32)

    async def go():
        async with _streaming(secret) as (rx, link):
            # the receiver ends the connection (as a rejected frame or a restart would)
            for proto in list(rx.guard.open):
                proto.transport.abort()
            await until(lambda: link.reconnects == 1 and link.connected, "the link to reconnect")
            await link.send(AckMsg("t", 0, 2, 2))   # not written into the dead socket
            await until(lambda: len(rx.got) == 2, "the second message")
            return [m for m, _ in rx.got], rx.opened
    got, opened = asyncio.run(go())
    assert got == [AckMsg("t", 0, 1, 1), AckMsg("t", 0, 2, 2)]
    assert opened == ["w0", "w0"]           # each stream told (its holds may have been lost with the old one)


def test_a_stream_that_does_not_ask_to_upgrade_is_refused():
    secret = os.urandom(32)

    async def go():
        async with Receiver(secret) as rx:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{rx.port}/hello") as r:
                    nonce = (await r.json())["nonce"]
                auth = Auth(secret, "w0")
                headers = {"X-Streamnet-From": "w0", "X-Streamnet-Nonce": nonce,
                           "X-Streamnet-Auth": auth.sign(nonce, "w0", "w1")}
                async with s.post(f"http://127.0.0.1:{rx.port}/stream", data=b"x", headers=headers) as r:
                    return r.status, await r.text(), rx.server.rejected
    status, text, rejected = asyncio.run(go())
    assert status == 426 and PROTOCOL in text and rejected == 1


def test_send_buffers_writes_everything_in_order_through_a_full_socket():
    async def go():
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        loop = asyncio.get_running_loop()
        parts = [os.urandom(n) for n in (10, 3_000_000, 0, 1, 700_000)] + [b"x"] * 2000   # > IOV_MAX buffers
        received = bytearray()

        async def drain():
            while len(received) < sum(map(len, parts)):
                received.extend(await loop.sock_recv(b, 1 << 16))
        try:
            # bytes lost fail the wait instead of hanging the suite
            await asyncio.wait_for(asyncio.gather(frame_io.send_buffers(a, parts), drain()), 60)
        finally:
            a.close()
            b.close()
        return bytes(received), b"".join(parts)
    got, want = asyncio.run(go())
    assert got == want


def test_a_peer_that_stops_reading_fails_the_write_after_the_stall_time():
    """A peer that stopped reading without closing (SIGSTOP, a partition) held the link's
    write for good: heartbeats stopped and its queue filled until senders blocked."""
    async def go():
        a, b = socket.socketpair()                       # b never reads
        a.setblocking(False)
        try:
            with pytest.raises(frame_io.WriteStalled, match="took no byte for 0 s"):
                await asyncio.wait_for(frame_io.send_buffers(a, [bytes(32 << 20)], stall_s=0.3), 30)
        finally:
            a.close()
            b.close()
    asyncio.run(go())


def test_a_stream_is_never_taken_for_a_connection_stuck_on_its_answer():
    secret = os.urandom(32)

    async def go():
        async with _streaming(secret) as (rx, link):
            rx.guard.max_connections, rx.guard.stuck_after_s = 1, 0.0     # the stream holds the only slot
            r, w = await asyncio.open_connection("127.0.0.1", rx.port)
            answer = await asyncio.wait_for(r.read(), 10)                  # refused: closed unanswered
            w.close()
            await link.send(AckMsg("t", 0, 2, 2))
            await until(lambda: len(rx.got) == 2, "a message on the stream after the refusal")
            return answer, rx.guard.status()
    answer, status = asyncio.run(go())
    assert answer == b"" and status["refused"] == 1 and status["evicted"] == 0


def test_a_cancelled_close_is_cancelled_and_still_stops_the_link():
    """close() swallowed its caller's cancellation, so a cancelled worker stop carried on."""
    async def go():
        async with aiohttp.ClientSession() as session:
            link = PeerLink(sender="w0", peer="w1", url="http://127.0.0.1:1", auth=Auth(os.urandom(32), "w0"),
                            session=session, limits=codec.DEFAULT_LIMITS)
            link.start()
            await link.send(AckMsg("t", 0, 1, 1))        # never delivered: nobody listens there
            closing = asyncio.get_running_loop().create_task(link.close(30.0))
            await until(lambda: link.queue.qsize() == 2, "close to queue its end")
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            await until(lambda: link._task.done(), "the link's task to stop", timeout=10)
            return closing.cancelled()
    assert asyncio.run(go())


def test_a_stalled_link_says_so_at_warning_level(caplog):
    """It was logged at debug: a link cut every 30 s for a peer that stopped reading went
    unseen in a worker's log."""
    async def go():
        async with aiohttp.ClientSession() as session:
            link = PeerLink(sender="w0", peer="w1", url="http://127.0.0.1:1", auth=Auth(os.urandom(32), "w0"),
                            session=session, limits=codec.DEFAULT_LIMITS)

            async def stalled():
                link._closing = True
                raise frame_io.WriteStalled("the peer took no byte for 30 s (stalled)")
            link._stream_once = stalled
            with caplog.at_level(logging.WARNING):
                await asyncio.wait_for(link._run(), 10)
    asyncio.run(go())
    assert "link w0 -> w1: the peer took no byte for 30 s (stalled); reconnecting" in caplog.text
