"""Tuple streams between workers: one long-lived HTTP stream per (sender, receiver).

Both ends prove they hold the cluster secret, and every frame is authenticated:

    sender                                   receiver
    GET /hello?c=<client nonce>       ->
                                      <-     {nonce, worker, proof = MAC("hello"|nonce|c|receiver)}
    checks the proof: a receiver without the secret gets nothing
    POST /stream  X-Streamnet-Auth = MAC("stream"|nonce|sender|receiver)
                                             checks it (the nonce: issued here, fresh, unused)
    frames:  codec frame | seq (u64) | tag   tag = HMAC-SHA256(key, seq | frame)[:16],
                                             key = MAC("key"|nonce|sender|receiver)

MAC is HMAC-SHA256 with the secret. The receiver checks each frame's sequence
number and tag before decoding it, so a relay without the secret can neither alter,
drop, reorder nor inject a frame (a forged ack). Small tuples queued together go out
as one frame. The receiver hands each message to the worker, whose bounded task
queues make a slow bolt push back through TCP on its senders.

Challenges are stateless (time, random, and a MAC over both): /hello keeps no table
that a client without the secret could grow; a nonce is remembered once a stream
authenticated with it, until it expires, so none is used twice.

Anything wrong - a bad MAC, a reused nonce, a malformed, oversized or undecodable
frame - closes that one connection with a logged reason and counts it (`rejected`);
the worker goes on serving every other peer. A sender whose stream breaks reconnects
with exponential backoff; what was in flight is lost and replayed by the spouts.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import struct
import time
from typing import Awaitable, Callable

import aiohttp
import numpy as np
from aiohttp import web

from .. import codec
from ..messages import DataMsg, Message, from_wire

log = logging.getLogger(__name__)

HELLO, STREAM = "/hello", "/stream"
NONCE_TTL_S = 30.0
MAX_BATCH_MSGS = 512
MAX_BATCH_ARRAY_BYTES = 1 << 20
_CLOSE = object()


TRAILER = struct.Struct(">Q16s")   # after each frame: sequence number, truncated HMAC-SHA256
MAX_AUTH_FIELD = 256               # characters in a nonce, worker id or MAC header


class PeerAuthError(ConnectionError):
    """The peer did not prove that it holds the cluster secret."""


def _clean(*values) -> bool:
    return all(isinstance(v, str) and v.isascii() and len(v) <= MAX_AUTH_FIELD for v in values)


class Auth:
    """What the cluster secret is used for on the data plane (see the module docstring)."""

    def __init__(self, secret: bytes, worker_id: str):
        if not secret:
            raise ValueError("a cluster secret is required")
        self._secret, self.worker_id = secret, worker_id
        self._nonce_key = hmac.new(secret, b"streamnet challenge", hashlib.sha256).digest()
        self._used: dict[str, float] = {}   # nonces streams authenticated with -> expiry

    def _mac(self, *parts: str) -> str:
        return hmac.new(self._secret, "|".join(parts).encode(), hashlib.sha256).hexdigest()

    def challenge(self) -> str:
        body = f"{time.monotonic_ns() // 1_000_000:x}.{os.urandom(12).hex()}"
        return f"{body}.{hmac.new(self._nonce_key, body.encode(), hashlib.sha256).hexdigest()[:32]}"

    def hello_proof(self, nonce: str, client_nonce: str, receiver: str) -> str:
        return self._mac("hello", nonce, client_nonce, receiver)

    def check_proof(self, proof, nonce: str, client_nonce: str, receiver: str) -> bool:
        return _clean(proof, nonce) and hmac.compare_digest(
            self.hello_proof(nonce, client_nonce, receiver).encode(), proof.encode())

    def sign(self, nonce: str, sender: str, receiver: str) -> str:
        return self._mac("stream", nonce, sender, receiver)

    def session_key(self, nonce: str, sender: str, receiver: str) -> bytes:
        return hmac.new(self._secret, f"key|{nonce}|{sender}|{receiver}".encode(), hashlib.sha256).digest()

    def verify(self, nonce: str, sender: str, mac: str) -> str | None:
        """None if good, else the reason it is not."""
        if not _clean(nonce, sender, mac):
            return "malformed authentication headers"
        body, _, tag = nonce.rpartition(".")
        good = hmac.new(self._nonce_key, body.encode(), hashlib.sha256).hexdigest()[:32]
        if not hmac.compare_digest(good.encode(), tag.encode()):
            return "unknown nonce"
        now = time.monotonic()
        expiry = int(body.partition(".")[0], 16) / 1000 + NONCE_TTL_S
        if expiry < now:
            return "expired nonce"
        for n, t in list(self._used.items()):      # in order of use: stop at the first still live
            if t >= now:
                break
            del self._used[n]
        if nonce in self._used:
            return "reused nonce"
        if not hmac.compare_digest(self.sign(nonce, sender, self.worker_id).encode(), mac.encode()):
            return "bad MAC (wrong cluster secret?)"
        self._used[nonce] = expiry     # only streams that proved the secret add here
        return None


def frame_tag(key: bytes, seq: int, buffers) -> bytes:
    m = hmac.new(key, seq.to_bytes(8, "big"), hashlib.sha256)
    for b in buffers:
        m.update(b)
    return m.digest()[:16]


def _array_bytes(msg: Message) -> int:
    if isinstance(msg, DataMsg):
        return sum(v.nbytes for v in msg.values if isinstance(v, np.ndarray))
    return 0


class StreamServer:
    """The receiving half, mounted on the worker's aiohttp app."""

    def __init__(self, auth: Auth, dispatch: Callable[[Message, str], Awaitable[None]], limits: codec.Limits):
        self.auth, self.dispatch, self.limits = auth, dispatch, limits
        self.rejected = 0
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
            if not (_clean(client_nonce) and 16 <= len(client_nonce) <= 64):
                return web.Response(status=400, text="client nonce: 16 to 64 ASCII characters")
            answer["proof"] = self.auth.hello_proof(nonce, client_nonce, self.auth.worker_id)
        return web.json_response(answer)

    def _reject(self, peer: str, reason: str, status: int = 400) -> web.Response:
        self.rejected += 1
        log.warning("closing stream from %s: %s", peer, reason)
        resp = web.Response(status=status, text=reason)
        resp.force_close()
        return resp

    async def stream(self, request: web.Request) -> web.StreamResponse:
        sender = request.headers.get("X-Streamnet-From", "")
        peer = f"{sender or '?'}@{request.remote}"
        nonce = request.headers.get("X-Streamnet-Nonce", "")
        reason = self.auth.verify(nonce, sender, request.headers.get("X-Streamnet-Auth", ""))
        if reason:
            return self._reject(peer if _clean(sender) else f"?@{request.remote}", reason, 403)
        key = self.auth.session_key(nonce, sender, self.auth.worker_id)
        seq = 0
        content = request.content
        self.open_streams += 1
        try:
            while True:
                try:
                    prefix = await content.readexactly(codec.PREFIX.size)
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        return self._reject(peer, f"stream ended inside a frame prefix ({len(e.partial)} bytes)")
                    return web.Response(text="bye")
                try:
                    hlen, plen = codec.parse_prefix(prefix, self.limits)
                    body = await content.readexactly(hlen + plen + TRAILER.size)
                    view = memoryview(body)
                    got_seq, tag = TRAILER.unpack(view[hlen + plen:])
                    if got_seq != seq:
                        return self._reject(peer, f"frame sequence number {got_seq}, expected {seq}")
                    if not hmac.compare_digest(tag, frame_tag(key, seq, (prefix, view[:hlen + plen]))):
                        return self._reject(peer, f"frame {seq}: bad MAC (altered or forged on the way)")
                    seq += 1
                    msgs = codec.decode_body(view[:hlen], view[hlen:hlen + plen], self.limits)
                    if not isinstance(msgs, list):
                        raise codec.CodecError("a frame must hold a list of messages")
                except codec.CodecError as e:
                    return self._reject(peer, str(e))
                except asyncio.IncompleteReadError:
                    return self._reject(peer, "stream ended inside a frame")
                self.frames_in += 1
                self.bytes_in += codec.PREFIX.size + hlen + plen
                for msg in msgs:
                    try:
                        await self.dispatch(from_wire(msg), sender)
                    except codec.CodecError as e:
                        return self._reject(peer, f"bad message: {e}")
        except (ConnectionResetError, aiohttp.ClientConnectionError):
            return web.Response(text="bye")
        finally:
            self.open_streams -= 1


CONNECT_FAILURES = 3   # refused connections in a row (about 0.35 s with the backoff) before reporting


class PeerLink:
    """The sending half: a bounded queue and one stream to one peer worker."""

    def __init__(self, *, sender: str, peer: str, url: str, auth: Auth, session: aiohttp.ClientSession,
                 limits: codec.Limits, max_queue: int = 1024):
        self.sender, self.peer, self.url, self.auth = sender, peer, url.rstrip("/"), auth
        self.session, self.limits = session, limits
        self.queue: asyncio.Queue = asyncio.Queue(max_queue)
        self.connected = False
        self.frames_out = self.bytes_out = self.msgs_out = self.dropped = self.reconnects = 0
        self.last_error = ""
        self._task: asyncio.Task | None = None
        self._closing = False
        #: called with (peer, error) after CONNECT_FAILURES connection attempts in a row
        #: failed at the connection level (refused, reset): the peer is probably dead, and
        #: the worker reports it long before its ZooKeeper session ends; and with (peer,
        #: None) when a connection succeeds again
        self.on_unreachable = None
        self.connect_failures = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"link-{self.peer}")

    async def send(self, msg: Message) -> None:
        await self.queue.put(msg)

    async def close(self, drain_s: float = 2.0) -> None:
        """Send what is queued (up to drain_s), then end the stream."""
        self._closing = True
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.queue.put(_CLOSE), drain_s)
            await asyncio.wait_for(asyncio.shield(self._task), drain_s)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
        if not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
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
                if isinstance(e, (aiohttp.ClientConnectorError, ConnectionRefusedError)):
                    self.connect_failures += 1
                    if self.connect_failures == CONNECT_FAILURES and self.on_unreachable:
                        self.on_unreachable(self.peer, self.last_error)
                log.debug("link %s -> %s failed: %s; retrying in %.2f s", self.sender, self.peer,
                          self.last_error, backoff)
            self.reconnects += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _stream_once(self) -> None:
        client_nonce = os.urandom(16).hex()
        async with self.session.get(self.url + HELLO, params={"c": client_nonce}) as r:
            r.raise_for_status()
            hello = await r.json()
        if self.connect_failures >= CONNECT_FAILURES and self.on_unreachable:
            self.on_unreachable(self.peer, None)
        self.connect_failures = 0
        nonce = hello.get("nonce") if isinstance(hello, dict) else None
        if not (hello.get("worker") == self.peer and isinstance(nonce, str)
                and self.auth.check_proof(hello.get("proof"), nonce, client_nonce, self.peer)):
            raise PeerAuthError(f"{self.url} did not prove that it is worker {self.peer} of this cluster "
                                "(wrong cluster secret, or not a streamnet worker); sending it nothing")
        headers = {"X-Streamnet-From": self.sender, "X-Streamnet-Nonce": nonce,
                   "X-Streamnet-Auth": self.auth.sign(nonce, self.sender, self.peer),
                   "Content-Type": "application/x-streamnet-frames"}
        self.connected = True
        key = self.auth.session_key(nonce, self.sender, self.peer)
        async with self.session.post(self.url + STREAM, data=self._body(key), headers=headers) as resp:
            if resp.status != 200:
                raise ConnectionError(f"peer refused the stream: {resp.status} {await resp.text()}")

    async def _body(self, key: bytes):
        seq = 0
        while True:
            first = await self.queue.get()
            if first is _CLOSE:
                return
            batch, budget = [first], _array_bytes(first)
            while len(batch) < MAX_BATCH_MSGS and budget < MAX_BATCH_ARRAY_BYTES and not self.queue.empty():
                msg = self.queue.get_nowait()
                if msg is _CLOSE:
                    self.queue.put_nowait(_CLOSE)  # finish this batch, then stop
                    break
                batch.append(msg)
                budget += _array_bytes(msg)
            try:
                buffers = codec.encode([m.to_wire() for m in batch], self.limits)
            except codec.CodecError as e:
                self.dropped += len(batch)
                log.error("dropping %d message(s) to %s that cannot be encoded: %s", len(batch), self.peer, e)
                continue
            trailer = TRAILER.pack(seq, frame_tag(key, seq, buffers))
            seq += 1
            for buf in buffers:
                self.bytes_out += len(buf)
                yield buf
            self.bytes_out += len(trailer)
            yield trailer
            self.frames_out += 1
            self.msgs_out += len(batch)

    def status(self) -> dict:
        return {"connected": self.connected, "queued": self.queue.qsize(), "frames_out": self.frames_out,
                "messages_out": self.msgs_out, "bytes_out": self.bytes_out, "reconnects": self.reconnects,
                "dropped": self.dropped, "last_error": self.last_error}
