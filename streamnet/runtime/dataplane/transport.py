"""Tuple streams between workers: one long-lived HTTP stream per (sender, receiver).

A sender opens `GET /hello` for a one-time nonce, then `POST /stream` with
HMAC-SHA256(secret, nonce|sender|receiver) in its headers, and keeps the request
body open, writing frames (codec.py) as tuples come. Small tuples queued together
go out as one frame. The receiver reads frame by frame and hands each message to
the worker, whose bounded task queues make a slow bolt push back through TCP on
its senders.

Anything wrong - a bad MAC, a reused nonce, a malformed, oversized or
undecodable frame - closes that one connection with a logged reason; the worker
goes on serving every other peer. A sender whose stream breaks reconnects with
exponential backoff; what was in flight is lost and replayed by the spouts.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
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


class Auth:
    def __init__(self, secret: bytes, worker_id: str):
        if not secret:
            raise ValueError("a cluster secret is required")
        self._secret, self.worker_id = secret, worker_id
        self._nonces: dict[str, float] = {}

    def challenge(self) -> str:
        now = time.monotonic()
        if len(self._nonces) > 1024:  # forget expired challenges nobody answered
            self._nonces = {n: t for n, t in self._nonces.items() if t > now}
        nonce = os.urandom(16).hex()
        self._nonces[nonce] = now + NONCE_TTL_S
        return nonce

    def sign(self, nonce: str, sender: str, receiver: str) -> str:
        msg = f"stream|{nonce}|{sender}|{receiver}".encode()
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()

    def verify(self, nonce: str, sender: str, mac: str) -> str | None:
        """None if good, else the reason it is not."""
        expiry = self._nonces.pop(nonce, None)
        if expiry is None:
            return "unknown or reused nonce"
        if expiry < time.monotonic():
            return "expired nonce"
        if not hmac.compare_digest(self.sign(nonce, sender, self.worker_id), mac):
            return "bad MAC (wrong cluster secret?)"
        return None


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
        return web.json_response({"nonce": self.auth.challenge(), "worker": self.auth.worker_id})

    def _reject(self, peer: str, reason: str, status: int = 400) -> web.Response:
        self.rejected += 1
        log.warning("closing stream from %s: %s", peer, reason)
        resp = web.Response(status=status, text=reason)
        resp.force_close()
        return resp

    async def stream(self, request: web.Request) -> web.StreamResponse:
        sender = request.headers.get("X-Streamnet-From", "")
        peer = f"{sender or '?'}@{request.remote}"
        reason = self.auth.verify(request.headers.get("X-Streamnet-Nonce", ""), sender,
                                  request.headers.get("X-Streamnet-Auth", ""))
        if reason:
            return self._reject(peer, reason, 403)
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
                    body = await content.readexactly(hlen + plen)
                    view = memoryview(body)
                    msgs = codec.decode_body(view[:hlen], view[hlen:], self.limits)
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
        async with self.session.get(self.url + HELLO) as r:
            r.raise_for_status()
            nonce = (await r.json())["nonce"]
        if self.connect_failures >= CONNECT_FAILURES and self.on_unreachable:
            self.on_unreachable(self.peer, None)
        self.connect_failures = 0
        headers = {"X-Streamnet-From": self.sender, "X-Streamnet-Nonce": nonce,
                   "X-Streamnet-Auth": self.auth.sign(nonce, self.sender, self.peer),
                   "Content-Type": "application/x-streamnet-frames"}
        self.connected = True
        async with self.session.post(self.url + STREAM, data=self._body(), headers=headers) as resp:
            if resp.status != 200:
                raise ConnectionError(f"peer refused the stream: {resp.status} {await resp.text()}")

    async def _body(self):
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
            for buf in buffers:
                self.bytes_out += len(buf)
                yield buf
            self.frames_out += 1
            self.msgs_out += len(batch)

    def status(self) -> dict:
        return {"connected": self.connected, "queued": self.queue.qsize(), "frames_out": self.frames_out,
                "messages_out": self.msgs_out, "bytes_out": self.bytes_out, "reconnects": self.reconnects,
                "dropped": self.dropped, "last_error": self.last_error}
