"""Tuple streams between workers: one long-lived stream per (sender, receiver).

Both ends prove they hold the cluster secret, and every frame is authenticated:

    sender                                   receiver
    GET /hello?c=<client nonce>       ->
                                      <-     {nonce, worker, proof = MAC("hello"|nonce|c|receiver)}
    checks the proof: a receiver without the secret gets nothing
    POST /stream  X-Streamnet-Auth = MAC("stream"|nonce|sender|receiver),
                  Upgrade: streamnet-frames/4 (or streamnet-frames/4+tls)
                                             checks it (the nonce: issued here, fresh, unused)
                                      <-     101 Switching Protocols
    (+tls: a TLS handshake, certificates checked both ways; the frames go inside - tls.py)
    frames:  codec frame | seq (u64) | tag   tag = AES-GMAC(key, nonce = seq, frame)  (frame_io.py)
                                             key = MAC("key"|nonce|sender|receiver)

MAC is HMAC-SHA256 with the secret. After the 101 the connection carries frames
only, with no HTTP framing: the sender writes a frame's header and its arrays' own
buffers with one gathered system call, and the receiver reads a large frame straight
into a buffer of its own (frame_io.py) - neither copies the payload. The receiver
checks each frame's sequence number and tag before decoding it, so a relay without
the secret can neither alter, drop, reorder nor inject a frame (a forged ack). Small
tuples queued together go out as one frame. The receiver hands each message to the
worker: a bolt whose queue fills tells the sender to hold its tuples, and keeps what
comes for it meanwhile in an overflow (inbox.py, delivery.py), so the stream goes on
carrying everything else. The stream's task waits - and so TCP pushes back on the
sender - only for a message that cannot be placed at once: an overflow at its bound,
failed trees bound for a full link, a fenced instance's queue being handed over.

Neither end wakes a task per frame where it need not. The receiver delivers a
frame's messages from its socket's callback while nothing has to wait
(`dispatch_now`), else through the stream's task, in order. The sender writes a
frame from the turn of the event loop that queued its messages (PeerLink.write_now:
when a task is about to wait, or on the loop's next pass) while the link's task
waits idle on a plain stream; what the socket does not take at once, TLS, and
reconnecting stay with the task. perf/transport.py, two worker processes,
alternating with the code before, two runs each: the receiving side, small tuples
128k/116k -> 178k/145k a second (the round trip not told apart); then the sending
side, round trip p50 0.718/0.684 -> 0.484/0.440 ms (CPU per round trip, both ends,
0.865/0.820 -> 0.635/0.620 ms).

Challenges are stateless (time, random, and a MAC over both): /hello keeps no table
that a client without the secret could grow; a nonce is remembered once a stream
authenticated with it, until it expires, so none is used twice.

Time limits: the sender's handshake must finish within HANDSHAKE_TIMEOUT_S; an idle
sender sends an empty frame every HEARTBEAT_S; a receiver that is reading and gets
no byte for READ_TIMEOUT_S - a peer silent, or stopped inside a frame - closes the
stream (never while it has paused reading itself, to push back).

Anything wrong - a bad tag, a reused nonce, a malformed, oversized or undecodable
frame, a stalled peer - closes that one connection with a logged reason and counts
it (`rejected`); the worker goes on serving every other peer. A sender whose stream
breaks reconnects with exponential backoff; what was in flight is lost and replayed
by the spouts.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import socket
from typing import Awaitable, Callable
from urllib.parse import urlsplit

import aiohttp
import numpy as np
from aiohttp import web

from .. import codec
from ..control.election import LOCAL_ERRNOS, MAX_HELLO_BYTES
from ..http_body import read_bounded
from ..messages import DataMsg, Message, from_wire, to_wire_all
from .accept_shortage import HELP, short_of_files
from .frame_io import (DIRECT_BYTES, SOCKET_BUFFER, TRAILER, FrameAuth, FrameReader, SocketSender, StreamError,
                       TlsSender, WriteStalled, size_buffers)
from .handshake import Auth, PeerAuthError, clean
from .log_budget import LogBudget
from .tls import TlsConfig

__all__ = ["Auth", "FrameAuth", "PeerAuthError", "PeerLink", "StreamServer", "TRAILER"]

log = logging.getLogger(__name__)

HELLO, STREAM = "/hello", "/stream"
PROTOCOL = "streamnet-frames/4"    # what /stream upgrades to (3: runs of tuples; 4: holds, messages.py)
PROTOCOL_TLS = PROTOCOL + "+tls"   # ... and then runs TLS inside
HANDSHAKE_TIMEOUT_S = 10.0         # /hello, connecting, and the answer to the upgrade
HEARTBEAT_S = 5.0                  # an idle sender's empty frame
READ_TIMEOUT_S = 30.0              # no byte for this long while reading: the peer stalled
MAX_BATCH_MSGS = 512
#: arrays in one frame: a message is left for the next frame rather than take a frame
#: past this (one bigger message still goes alone). A quarter of the socket's buffer,
#: so that the next frame fits beside one the receiver has not read yet (loopback
#: counts about twice the payload against the buffer). perf/transport.py's bulk 247
#: KB tensors between two worker processes, 20,000 per run, two alternating runs each,
#: by cap: 8 in flight, 1.24 MB frames (1 MB checked after adding, as before) 1.9-2.15
#: GB/s, whole batches of 8 (4 MB) 1.68-1.78, 256 KB (a tensor a frame) 1.56-1.68,
#: 512 KB 2.45-2.66, 750 KB 2.58-2.69, 1 MB 2.97-3.01; 16 in flight, 512 KB
#: 2.63-2.66, 1 MB 2.85-3.15, 2 MB 1.78-2.06
MAX_BATCH_ARRAY_BYTES = SOCKET_BUFFER // 4
_CLOSE = object()


def _array_bytes(msg: Message) -> int:
    n = 0
    if type(msg) is DataMsg:
        for v in msg.values:            # a loop, not sum() over a generator: once per tuple
            if isinstance(v, np.ndarray):
                n += v.nbytes
    return n


class StreamServer:
    """The receiving half, mounted on the worker's aiohttp app."""

    def __init__(self, auth: Auth, dispatch: Callable[[Message, str], Awaitable[None]], limits: codec.Limits,
                 tls: TlsConfig | None = None, dispatch_now: Callable[[Message, str], bool] | None = None,
                 on_open: Callable[[str], None] | None = None):
        """dispatch_now, where given, delivers a message if it can without waiting
        (True), or does nothing (False: it goes through dispatch). on_open(sender) is
        called as a sender's new stream starts carrying frames."""
        self.auth, self.dispatch, self.limits, self.tls = auth, dispatch, limits, tls
        self.dispatch_now = dispatch_now
        self.on_open = on_open
        self.protocol = PROTOCOL if tls is None else PROTOCOL_TLS
        self.rejected = 0
        self.log_budget = LogBudget()
        self.frames_in = 0
        self.bytes_in = 0
        self.open_streams = 0

    def routes(self) -> list:
        return [web.get(HELLO, self.hello), web.post(STREAM, self.stream)]

    async def hello(self, request: web.Request) -> web.Response:
        """A challenge, and with ?c=CLIENT_NONCE this worker's proof that it holds the
        secret (the leader's liveness probe asks without one)."""
        nonce = self.auth.challenge()
        answer = {"nonce": nonce, "worker": self.auth.worker_id}
        client_nonce = request.query.get("c")
        if client_nonce is not None:
            if not (clean(client_nonce) and 16 <= len(client_nonce) <= 64):
                return web.Response(status=400, text="client nonce: 16 to 64 ASCII characters")
            answer["proof"] = self.auth.hello_proof(nonce, client_nonce, self.auth.worker_id)
        resp = web.json_response(answer)
        # one answer a connection: a client (anyone: this comes before the secret) that
        # pipelines thousands of requests gets one, and the connection closes once it is sent
        resp.force_close()
        return resp

    def _count(self, peer: str, reason: str) -> None:
        self.rejected += 1
        suffix = self.log_budget.allow()     # anyone can have streams refused: at most 20 lines a minute
        if suffix is not None:
            log.warning("closing stream from %s: %s%s", peer, reason, suffix)

    def _reject(self, peer: str, reason: str, status: int = 400) -> web.Response:
        self._count(peer, reason)
        resp = web.Response(status=status, text=reason)
        resp.force_close()
        return resp

    async def stream(self, request: web.Request) -> web.StreamResponse:
        sender = request.headers.get("X-Streamnet-From", "")
        peer = f"{sender or '?'}@{request.remote}"
        nonce = request.headers.get("X-Streamnet-Nonce", "")
        reason = self.auth.verify(nonce, sender, request.headers.get("X-Streamnet-Auth", ""))
        if reason:
            return self._reject(peer if clean(sender) else f"?@{request.remote}", reason, 403)
        if request.headers.get("Upgrade", "").lower() != self.protocol:
            why = " (this worker requires TLS: --tls-cert/--tls-key/--tls-ca)" if self.tls else ""
            return self._reject(peer, f"a stream must ask to upgrade to {self.protocol}{why}", 426)
        transport = request.transport
        if transport is None or transport.is_closing():
            return web.Response(text="bye")
        # From here the connection carries frames, read by our protocol (the client sends
        # nothing before it has the 101, so the HTTP parser holds none of them).
        sock = transport.get_extra_info("socket")
        if sock is not None:
            size_buffers(sock, socket.SO_RCVBUF)
        key = self.auth.session_key(nonce, sender, self.auth.worker_id)
        reader = FrameReader(transport, transport.get_protocol(), self.limits, FrameAuth(key), READ_TIMEOUT_S,
                             plain_sock=sock if self.tls is None else None)
        if self.dispatch_now is not None:
            reader.on_frame = functools.partial(self._at_once, reader, sender)
        transport.set_protocol(reader)
        transport.write(f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {self.protocol}\r\n"
                        "Connection: Upgrade\r\n\r\n".encode())
        if self.tls is not None:    # no await before this: no byte reaches the reader unencrypted
            try:
                transport = await asyncio.get_running_loop().start_tls(
                    transport, reader, self.tls.server, server_side=True, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
            # asyncio's TLS layer tells nobody of a connection it drops during the handshake
            # (a timeout): the reader is told here, and tells the connection guard, which held
            # the slot for good (after 512 such handshakes the worker refused every connection)
            except asyncio.CancelledError as e:
                transport.abort()
                reader.connection_lost(e)
                raise
            except Exception as e:  # noqa: BLE001 - ssl.SSLError, a timeout, a reset: refused
                self._count(peer, f"TLS handshake failed: {type(e).__name__}: {e}")
                transport.abort()
                reader.connection_lost(e)
                return web.Response(text="bye")
        self.open_streams += 1
        if self.on_open is not None:
            self.on_open(sender)
        try:
            reason = await self._frames(reader, sender)
        except asyncio.CancelledError:
            transport.abort()
            raise
        finally:
            self.open_streams -= 1
        if reason:
            self._count(peer, reason)
            transport.abort()
        else:
            transport.close()
        # nothing is written: the connection is no longer HTTP (aiohttp sees it closed)
        return web.Response(text="bye")

    async def _frames(self, reader: FrameReader, sender: str) -> str | None:
        """Decode and dispatch the frames the reader queued - every frame without a
        dispatch_now, else what _at_once left (the reader checked their sequence numbers
        and tags) - until the stream ends; the reason it must close, or None at a clean end."""
        while True:
            try:
                item = await reader.next_frame()
            except StreamError as e:
                return str(e)
            if item is None:
                return None
            if type(item) is _Rest:
                msgs = item
            else:
                try:
                    msgs = self._decode(item)
                except codec.CodecError as e:
                    return str(e)
            for msg in msgs:
                try:
                    await self.dispatch(from_wire(msg), sender)
                except codec.CodecError as e:
                    return f"bad message: {e}"
                except Exception as e:  # noqa: BLE001 - a bug here closes this stream, not the worker
                    log.exception("delivering a message from %s failed", sender)
                    return f"delivering a message failed: {type(e).__name__}: {e}"

    def _decode(self, frame) -> list:
        """A checked frame's messages (still as lists off the wire); counts it."""
        hlen, plen = codec.parse_prefix(frame[:codec.PREFIX.size], self.limits)
        end = codec.PREFIX.size + hlen + plen
        msgs = codec.decode_body(frame[codec.PREFIX.size:codec.PREFIX.size + hlen],
                                 frame[codec.PREFIX.size + hlen:end], self.limits)
        if not isinstance(msgs, list):
            raise codec.CodecError("a frame must hold a list of messages")
        self.frames_in += 1
        self.bytes_in += end
        return msgs

    def _at_once(self, reader: FrameReader, sender: str, frame):
        """A checked frame that came while the stream's task waits with nothing queued:
        its messages are delivered here, in the reader's callback, which spares the
        wake-up of the task and a pass of the event loop (~30 us a frame on host6),
        until one would have to wait (a full queue) or is malformed - that one and the
        rest go the task's way, in order. None when every message went; else what is
        left for the task."""
        try:
            msgs = self._decode(frame)
        except codec.CodecError:
            return frame            # the task decodes it again, and closes the stream with the reason
        for i, wire in enumerate(msgs):
            try:
                if self.dispatch_now(from_wire(wire), sender):
                    continue
            except codec.CodecError:
                pass                # the task finds it again, and says why
            except Exception as e:  # noqa: BLE001 - a bug here closes this stream, not the worker
                log.exception("delivering a message from %s failed", sender)
                reader.fail(f"delivering a message failed: {type(e).__name__}: {e}")
                return None
            return _Rest(msgs[i:])
        return None


class _Rest(list):
    """The messages of a decoded frame that _at_once left for the stream's task."""


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not a task it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _set(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _LinkQueue(asyncio.Queue):
    """A link's queue: also calls `on_put` on every put (Delivery puts without awaiting)."""

    def __init__(self, maxsize: int, on_put: Callable[[], None]):
        super().__init__(maxsize)
        self.on_put = on_put
        self.waiter: asyncio.Future | None = None     # the link's task waiting for messages

    def _put(self, item) -> None:
        super()._put(item)
        self.on_put()

    def wake(self) -> None:
        if self.waiter is not None:
            _set(self.waiter)

    def put_control(self, msg) -> None:
        """Queue a control message (a hold or a release: a few per task) even when the
        queue is full: it goes behind what is queued, but the caller - a bolt's queue
        being filled or taken from - must not wait for room. (Nobody calls get() on a
        link's queue, and nobody joins it: _put alone, and on_put, are what counts.)"""
        self._put(msg)

    def put_back(self, items: list) -> None:
        """Messages take() took, back at the front in their order (the next frame's)."""
        self._queue.extendleft(reversed(items))

    def take(self) -> list | None:
        """The messages for one frame (up to MAX_BATCH_MSGS, and MAX_BATCH_ARRAY_BYTES
        of arrays unless the first message alone holds more), taken at once rather than
        one get_nowait() each; None at _CLOSE."""
        items = self._queue
        if items[0] is _CLOSE:
            return None
        batch, budget = [], 0
        while items and len(batch) < MAX_BATCH_MSGS:
            if items[0] is _CLOSE:
                break                   # finish this batch, then stop
            size = _array_bytes(items[0])
            if batch and budget + size > MAX_BATCH_ARRAY_BYTES:
                break
            batch.append(items.popleft())
            budget += size
        for _ in batch:                 # room for blocked putters, as get_nowait() makes it
            if not self._putters:
                break
            self._wakeup_next(self._putters)
        return batch


CONNECT_FAILURES = 3   # refused connections in a row (about 0.35 s with the backoff) before reporting
MAX_BACKOFF_S = 2.0    # between a link's attempts to connect, at most
#: a peer that answers and says no: a wrong proof either way, an HTTP error status
REFUSALS = (PeerAuthError, aiohttp.ClientResponseError)
SMALL_FRAME = 64 << 10  # frames up to this size are joined into one buffer


def peer_refused(e: BaseException) -> bool:
    """Whether a failed connection attempt says something about the peer (refused,
    reset, no route) rather than about this process: out of descriptors, memory or local
    ports (LOCAL_ERRNOS) is no reason to report the peer."""
    if not isinstance(e, (aiohttp.ClientConnectorError, ConnectionRefusedError)):
        return False
    code = e.os_error.errno if isinstance(e, aiohttp.ClientConnectorError) else e.errno
    return code not in LOCAL_ERRNOS


_shortages: set[int] = set()     # local errnos already explained in this process


def _warn_if_short(sender: str, peer: str, e: BaseException) -> None:
    """Say once per process, with the limit, that connections fail for want of our own
    resources (the peer is not reported for it)."""
    code = getattr(getattr(e, "os_error", e), "errno", None)
    if code not in LOCAL_ERRNOS or code in _shortages:
        return
    _shortages.add(code)
    log.warning("worker %s cannot connect to %s: %s - %s, not a sign that %s is down; streams retry. %s",
                sender, peer, e, short_of_files(), peer, HELP)


class PeerLink:
    """The sending half: a bounded queue and one stream to one peer worker."""

    def __init__(self, *, sender: str, peer: str, url: str, auth: Auth, session: aiohttp.ClientSession,
                 limits: codec.Limits, max_queue: int = 1024, tls: TlsConfig | None = None):
        self.sender, self.peer, self.url, self.auth = sender, peer, url.rstrip("/"), auth
        self.tls = tls
        self.protocol = PROTOCOL if tls is None else PROTOCOL_TLS     # what the upgrade asks for
        self.session, self.limits = session, limits
        self.queue: asyncio.Queue = _LinkQueue(max_queue, self._queued)
        self.connected = False
        self.frames_out = self.bytes_out = self.msgs_out = self.dropped = self.reconnects = 0
        self.frames_now = 0         # of frames_out: those write_now() began to write (the task may finish one)
        self.last_error = ""
        self._warned = ""           # the refusal last logged as a warning (once per reason)
        self._task: asyncio.Task | None = None
        self._closing = False
        #: called with (peer, error) after CONNECT_FAILURES connection attempts in a row
        #: failed at the connection level (refused, reset): the peer is probably dead, and
        #: the worker reports it long before its ZooKeeper session ends; and with (peer,
        #: None) when a connection succeeds again
        self.on_unreachable = None
        self.connect_failures = 0
        self._plain = None          # the live stream's SocketSender, while it is up (not under TLS)
        self._auth: FrameAuth | None = None
        self._seq = 0               # the stream's next frame
        self._unsent: list = []     # the rest of a frame that write_now() left to the task
        self._broken: Exception | None = None   # what write_now() met, for the task to raise
        self.write_due = False      # messages were queued since write_now() last ran

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"link-{self.peer}")

    async def send(self, msg: Message) -> None:
        await self.queue.put(msg)

    def _queued(self) -> None:
        if self._plain is None:         # TLS, or no stream up: the task does it all, as it always did
            self.queue.wake()
        elif not self.write_due:
            self.write_due = True
            asyncio.get_running_loop().call_soon(self.write_now)

    def write_now(self) -> None:
        """Send what is queued now, from the caller's turn of the event loop, where the
        link's task waits idle on a plain stream: the frame is encoded, tagged and
        handed to the socket here, with no wake-up of the task. A put schedules this
        for the loop's next pass (so the messages queued meanwhile share a frame); a
        sender about to wait calls it sooner (Delivery.write_now). Whatever the socket
        does not take at once, and anything else, is left to the task."""
        self.write_due = False
        q = self.queue
        if q.empty():
            return
        out = self._plain
        if out is None or q.waiter is None or q.waiter.done() or out.closed.done() or q._queue[0] is _CLOSE:
            q.wake()
            return
        batch = q.take()
        try:
            body = self._body(batch)
            if body is not None:
                frame, seq, size = body
                self.frames_now += 1
                if size <= DIRECT_BYTES:
                    frame.append(self._trailer(seq, frame))
                    self._unsent = out.write_now(frame)
                else:
                    # the body first, then its tag: the receiver reads the body and tags it
                    # while this side tags it too (frame_io: FrameReader._direct_read)
                    unsent = out.write_now(frame)
                    trailer = self._trailer(seq, frame)
                    self._unsent = [*unsent, trailer] if unsent else out.write_now([trailer])
        except Exception as e:  # noqa: BLE001 - never raised in the caller's turn (a bolt about to wait)
            # the stream cannot go on (a broken socket, perhaps part of a frame written):
            # the task raises it and reconnects; the batch is lost with the stream, as what
            # is in flight on any broken stream is (the spouts replay it)
            self._broken = e
        if self._unsent or self._broken or not q.empty():
            q.wake()

    async def close(self, drain_s: float = 2.0) -> None:
        """Send what is queued (up to drain_s), then end the stream."""
        self._closing = True
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.queue.put(_CLOSE), drain_s)
            await asyncio.wait_for(asyncio.shield(self._task), drain_s)
        except asyncio.TimeoutError:
            pass
        except asyncio.CancelledError:
            if _cancelling():          # the caller is cancelled, not the link's task: it stops too
                self._task.cancel()
                raise
        if not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                if _cancelling():
                    raise
            except Exception:  # noqa: BLE001 - the link's own end, logged by it
                pass

    def abort(self) -> None:
        """Stop now, sending nothing more (a crash)."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        backoff = 0.05
        while not self._closing:
            try:
                await self._stream_once()
                if self._closing:
                    return
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure: back off and reconnect
                self.connected = False
                self.last_error = f"{type(e).__name__}: {e}"
                if peer_refused(e):
                    self.connect_failures += 1
                    if self.connect_failures == CONNECT_FAILURES and self.on_unreachable:
                        self.on_unreachable(self.peer, self.last_error)
                elif isinstance(e, WriteStalled):
                    # a peer that stopped reading without closing: a stopped process, a
                    # partition, or a receiver held up by a full task queue (README)
                    log.warning("link %s -> %s: %s; reconnecting", self.sender, self.peer, e)
                else:
                    _warn_if_short(self.sender, self.peer, e)
                if isinstance(e, REFUSALS) and self.last_error != self._warned:
                    # refused by the peer itself (its proof or ours is wrong, an HTTP error):
                    # no retry mends that, so say so here once, not only in /status
                    self._warned = self.last_error
                    log.warning("link %s -> %s: %s; retrying every %.0f s", self.sender, self.peer,
                                self.last_error, MAX_BACKOFF_S)
                log.debug("link %s -> %s failed: %s; retrying in %.2f s", self.sender, self.peer,
                          self.last_error, backoff)
            self.reconnects += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _stream_once(self) -> None:
        client_nonce = os.urandom(16).hex()
        async with self.session.get(self.url + HELLO, params={"c": client_nonce}, allow_redirects=False,
                                    timeout=aiohttp.ClientTimeout(total=HANDSHAKE_TIMEOUT_S)) as r:
            r.raise_for_status()
            body = await read_bounded(r.content, MAX_HELLO_BYTES)   # whoever answers at a peer's address: bounded
        try:
            hello = json.loads(body) if len(body) <= MAX_HELLO_BYTES else None
        except ValueError:
            hello = None
        if self.connect_failures >= CONNECT_FAILURES and self.on_unreachable:
            self.on_unreachable(self.peer, None)
        self.connect_failures = 0
        nonce = hello.get("nonce") if isinstance(hello, dict) else None
        if not (isinstance(hello, dict) and hello.get("worker") == self.peer and isinstance(nonce, str)
                and self.auth.check_proof(hello.get("proof"), nonce, client_nonce, self.peer)):
            raise PeerAuthError(f"{self.url} did not prove that it is worker {self.peer} of this cluster "
                                "(wrong cluster secret, or not a streamnet worker); sending it nothing")
        headers = {"X-Streamnet-From": self.sender, "X-Streamnet-Nonce": nonce,
                   "X-Streamnet-Auth": self.auth.sign(nonce, self.sender, self.peer)}
        sock = await asyncio.wait_for(self._upgrade(headers), HANDSHAKE_TIMEOUT_S)
        out = None
        try:
            if self.tls is None:
                out = SocketSender(sock)
            else:
                out = await TlsSender.start(sock, self.tls.client, urlsplit(self.url).hostname, HANDSHAKE_TIMEOUT_S)
            self.connected = True
            self._warned = ""
            await self._send_frames(out, FrameAuth(self.auth.session_key(nonce, self.sender, self.peer)))
            await out.end()                 # the receiver reads to the end of the last frame
        finally:
            if out is not None:
                out.close()
            sock.close()

    async def _upgrade(self, headers: dict) -> socket.socket:
        """A connection of our own to the peer's /stream, upgraded: the raw socket."""
        loop = asyncio.get_running_loop()
        url = urlsplit(self.url)
        host, port = url.hostname, url.port or 80
        if any(c in v for v in (*headers.values(), self.sender) for c in "\r\n"):
            raise ValueError("a header value holds a line break")
        sock, error = None, None
        for family, kind, proto, _, addr in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            size_buffers(sock, socket.SO_SNDBUF)
            try:
                await loop.sock_connect(sock, addr)
                break
            except OSError as e:
                sock.close()
                sock, error = None, e
            except BaseException:      # cancelled (the handshake's deadline): closed now, not by the GC
                sock.close()
                raise
        if sock is None:
            raise error or ConnectionError(f"no address for {host}")
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            await loop.sock_sendall(sock, (f"POST {STREAM} HTTP/1.1\r\nHost: {url.netloc}\r\n{head}"
                                           f"Connection: Upgrade\r\nUpgrade: {self.protocol}\r\n\r\n").encode())
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = await loop.sock_recv(sock, 4096)
                if not chunk or len(answer) > 65536:
                    break
                answer += chunk
            status_line, _, rest = answer.partition(b"\r\n")
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or parts[1] != b"101":
                body = rest.partition(b"\r\n\r\n")[2][:300].decode("ascii", "replace")
                raise ConnectionError(f"peer refused the stream: {b' '.join(parts[1:]).decode('ascii', 'replace')}"
                                      f" {body}".rstrip())
            if rest.partition(b"\r\n\r\n")[2]:
                raise ConnectionError("peer sent data after its 101")
            return sock
        except BaseException:
            sock.close()
            raise

    async def _next_batch(self, closed: asyncio.Future) -> list | None:
        """Queued messages for one frame: [] after HEARTBEAT_S idle (or when woken
        for the rest of a frame of write_now()'s), None to stop."""
        if closed.done():
            raise ConnectionResetError("the peer closed the stream")
        if self.queue.empty():
            # wait for a message, the peer closing, or the heartbeat - without a task per wait
            loop = asyncio.get_running_loop()
            wake = self.queue.waiter = loop.create_future()
            timer = loop.call_later(HEARTBEAT_S, _set, wake)
            closed.add_done_callback(wake_on_close := lambda _: _set(wake))
            try:
                await wake
            finally:
                timer.cancel()
                closed.remove_done_callback(wake_on_close)
                self.queue.waiter = None
            if self.queue.empty():
                if closed.done():
                    raise ConnectionResetError("the peer closed the stream")
                return []
        return self.queue.take()

    async def _send_frames(self, out, auth: FrameAuth) -> None:
        """Frames until the link closes; returns early (to reconnect) when `out` sees
        the peer close the stream."""
        self._seq, self._auth, self._unsent, self._broken = 0, auth, [], None
        self._plain = out if isinstance(out, SocketSender) else None
        try:
            while True:
                batch = await self._next_batch(out.closed)
                if self._broken is not None:
                    raise self._broken
                if self._unsent:    # write_now() wrote part of a frame while we waited: the rest first
                    unsent, self._unsent = self._unsent, []
                    await out.send(unsent)
                    if not batch:
                        continue    # woken for it: no heartbeat due
                if batch is None:
                    return
                body = self._body(batch)
                if body is not None:
                    frame, seq, _ = body
                    frame.append(self._trailer(seq, frame))
                    await out.send(frame)   # one write with the trailer: the receiver wakes once per frame
        finally:
            self._plain = None

    def _trailer(self, seq: int, buffers: list) -> bytes:
        return TRAILER.pack(seq, self._auth.tag(seq, buffers))

    def _body(self, batch: list) -> tuple[list, int, int] | None:
        """The next frame for a batch of messages, without its trailer: its buffers, its
        sequence number and its size (None: the message cannot be encoded, and is dropped
        with a logged error). A batch that cannot be encoded as one frame - a message
        that cannot be, or values besides arrays (which take() does not count) past the
        header's limit - goes in halves: its first half now, the rest back at the front of
        the queue, so that one bad message costs itself only, not up to MAX_BATCH_MSGS
        others. The caller adds _trailer(seq, buffers)."""
        try:
            buffers = codec.encode(to_wire_all(batch), self.limits)
        except codec.CodecError as e:
            if len(batch) > 1:
                half = len(batch) // 2
                self.queue.put_back(batch[half:])
                return self._body(batch[:half])
            self.dropped += 1
            log.error("dropping a message to %s that cannot be encoded: %s", self.peer, e)
            return None
        size = sum(len(b) for b in buffers)
        if size <= SMALL_FRAME:                 # small arrays: joined, tagged in one call
            buffers = [b"".join(buffers)]
        seq = self._seq
        self._seq += 1
        self.bytes_out += size + TRAILER.size
        self.frames_out += 1
        self.msgs_out += len(batch)
        return buffers, seq, size

    def status(self) -> dict:
        return {"connected": self.connected, "queued": self.queue.qsize(), "frames_out": self.frames_out,
                "frames_written_at_once": self.frames_now,
                "messages_out": self.msgs_out, "bytes_out": self.bytes_out, "reconnects": self.reconnects,
                "dropped": self.dropped, "last_error": self.last_error}
