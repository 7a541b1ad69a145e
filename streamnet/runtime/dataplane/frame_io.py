"""Frames on an upgraded stream socket: the tag that authenticates each one, the
receiving protocol that reads them into their own buffers, and a sender that hands
a frame's buffers to the kernel without joining them.

After its codec frame each frame carries TRAILER = sequence number (u64) | tag, under
the stream's key with AES-256-GMAC (AES-GCM with the data as associated data and
nothing to encrypt), the nonce being the sequence number and a part number:

    a frame without arrays:  tag = GMAC(nonce(seq, 0), prefix|header)
    a frame with arrays:     tag = GMAC(nonce(seq, 1), prefix|header|GMAC(nonce(seq, 2), payload))

The key is fresh for every stream and a (sequence number, part) pair never repeats on
one, so GCM's nonce rule holds; a relay without the key can neither alter, drop,
reorder nor inject a frame. The inner tag lets each side authenticate an array
payload in one call over its own buffer (no join, no copy): one call over 248 KB took
29 us against 51 us for the incremental form (which sets up a cipher context per
frame). GMAC runs at 6-13 GB/s here (AES-NI, carry-less multiply), against 0.5-1.2
GB/s for HMAC-SHA256, which capped the bulk rate before.

Receiving (`FrameReader`): the socket is read with recv_into. Small frames arrive
through a staging buffer, several per system call, and are copied out one by one;
a frame over DIRECT_BYTES gets a buffer of its own and the kernel writes its bytes
straight there (after a large frame the reader asks for the next prefix alone, so
a stream of large frames is never staged). Decoded arrays are read-only views of
that buffer. The reader checks each frame's sequence number and tag before the
frame is handed on. Frames wait for the consumer up to MAX_READY_BYTES; past that,
reading pauses and TCP pushes back on the sender. On a plain stream the socket's
SO_RCVLOWAT follows the rest of a large frame (up to LOWAT_MAX), so the reader wakes
once for it rather than for every 64 KB loopback delivers: two worker processes,
alternating with it off, 4 runs each, bulk 247 KB 2.06-2.38 -> 2.41-2.89 GB/s, a 248
KB round trip p50 0.525-0.600 -> 0.462-0.571 ms. (A peer that sends a frame's rest
slower than LOWAT_MAX per READ_TIMEOUT_S is cut off as stalled.) What of a large
frame the socket already holds once its prefix is parsed (or its body tagged) is read
in the same callback (`_read_now`) instead of after another pass of the loop: a 248 KB
hop between two worker processes, three runs alternating with the code before (AMD
EPYC), 0.523 / 0.590 / 0.532 -> 0.421 / 0.484 / 0.493 ms, to the ack 1.118 / 1.207 /
1.147 -> 0.921 / 1.029 / 1.071 ms.

Sending (`send_buffers`): one sendmsg gathers a frame's header, its arrays' own
buffers and its trailer. Both ends give the socket SOCKET_BUFFER of kernel buffer, so
that a large frame passes in one system call on each side. A large frame written from
the event loop's turn (transport.PeerLink.write_now) goes as its body, then its
trailer once tagged: the reader tags the body as soon as it is in (SO_RCVLOWAT at the
body's end first), while the sender tags it too, so the two tags of a frame overlap
rather than follow each other. A 248 KB hop between two worker processes (a tensor
emitted on one to its arrival in a bolt on the other, p50 of 2,700, three runs
alternating with the code before on a 2-vCPU AMD EPYC, where a tag takes ~55 us):
0.793 / 0.637 / 0.537 -> 0.721 / 0.550 / 0.467 ms; a round trip to the ack 1.713 /
1.370 / 1.124 -> 1.597 / 1.177 / 0.985 ms.
"""
from __future__ import annotations

import asyncio
import collections
import hmac
import os
import socket
import struct
import time

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .. import codec

TRAILER = struct.Struct(">Q16s")       # after each frame: sequence number, tag
STAGE_BYTES = 256 << 10                # the staging buffer of small frames
DIRECT_BYTES = 64 << 10                # frames larger than this are read into their own buffer
MAX_READY_BYTES = 4 << 20              # received frames waiting for the consumer; reading pauses past it
IOV_MAX = 1024
LOWAT_MAX = 256 << 10                  # the most of a large frame's rest a read waits for
SOCKET_BUFFER = 4 << 20                # SO_SNDBUF / SO_RCVBUF of a stream (the kernel caps it at *mem_max)


def size_buffers(sock, option: int) -> None:
    """Give a stream socket a kernel buffer that holds whole large frames: with
    loopback's initial 128 KB receive buffer a 248 KB frame took two hand-offs
    between the processes (send, wait for the reader, send the rest)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
    except OSError:
        pass        # a platform that refuses keeps its default: slower, not wrong


class FrameAuth:
    """The tag of a frame under one stream's key (see the module docstring)."""

    def __init__(self, key: bytes):
        if len(key) != 32:
            raise ValueError("a stream key is 32 bytes")
        self._aead, self._aes = AESGCM(key), algorithms.AES(key)

    def tag(self, seq: int, buffers) -> bytes:
        """The tag of the frame that `buffers` hold in order (the split between its
        header and its payload is read from its prefix)."""
        total = sum(len(b) for b in buffers)
        first = buffers[0]
        split = total
        if total >= codec.PREFIX.size:
            if len(first) < codec.PREFIX.size:  # a caller's odd split: join it
                first = b"".join(bytes(b) for b in buffers)
                buffers = [first]
            split = codec.PREFIX.size + _HLEN.unpack_from(first, 4)[0]
        if split >= total:
            return self._gmac(_nonce(seq, 0), buffers)
        if len(first) < split:                  # the header spans buffers: join it
            first = b"".join(bytes(b) for b in buffers)
            buffers = [first]
        rest = [memoryview(first)[split:], *buffers[1:]] if len(first) > split else buffers[1:]
        inner = self._gmac(_nonce(seq, 2), [b for b in rest if len(b)])
        return self._aead.encrypt(_nonce(seq, 1), b"", bytes(memoryview(first)[:split]) + inner)

    def _gmac(self, nonce: bytes, buffers) -> bytes:
        if len(buffers) == 1:
            return self._aead.encrypt(nonce, b"", buffers[0])
        e = Cipher(self._aes, modes.GCM(nonce)).encryptor()
        for b in buffers:
            e.authenticate_additional_data(b)
        e.finalize()
        return e.tag

    def check(self, seq: int, buffers, tag: bytes) -> bool:
        return hmac.compare_digest(self.tag(seq, buffers), tag)


_HLEN = struct.Struct(">I")


def _nonce(seq: int, part: int) -> bytes:
    return part.to_bytes(4, "big") + seq.to_bytes(8, "big")


class StreamError(ConnectionError):
    """The stream must close: malformed framing, a silent peer, or a lost connection."""


class FrameReader(asyncio.BufferedProtocol):
    """Reads whole frames (codec frame + trailer) off a stream socket and checks their
    sequence numbers and tags; the good ones go, in order, to `on_frame` where the
    consumer set one and waits with nothing queued, else out of `next_frame()`.
    It replaces the HTTP server's protocol on the transport once the stream is
    upgraded, and passes the connection's end on to it."""

    def __init__(self, transport, previous, limits: codec.Limits, auth: FrameAuth, read_timeout_s: float,
                 plain_sock=None):
        self.transport, self.previous, self.limits, self.auth = transport, previous, limits, auth
        # a plain stream's socket (None under TLS): its SO_RCVLOWAT follows the rest of a
        # large frame, and what of that rest it already holds is read at once (_read_now)
        self.plain_sock = plain_sock
        self.lowat = 1                      # 0: the platform has no SO_RCVLOWAT
        self.read_timeout_s = read_timeout_s
        self.seq = 0                        # the next frame's sequence number
        # np.empty, not bytearray (which zeroes it): only the pages the kernel writes to
        # become resident, and a stream of small frames starts again at the buffer's head
        # whenever it has parsed all it read - so a light stream holds a few KB, not 256
        # (100 embedded workers hold 9,900 streams: 2.5 GB zeroed)
        self.stage = np.empty(STAGE_BYTES, np.uint8)
        self.view = memoryview(self.stage)
        self.start = self.end = 0           # unparsed bytes: stage[start:end]
        self.direct = None                  # (buffer, filled) of a large frame being read
        self.body_tag: bytes | None = None  # ... and its tag, once its body is in
        self.prefix_only = False            # after a large frame: read the next prefix alone
        self.ready: collections.deque = collections.deque()    # frames (or what on_frame left of them)
        self.sizes: collections.deque = collections.deque()    # ... and the bytes each came as
        self.ready_bytes = 0
        #: the consumer may set this: called with a checked frame that arrives while the
        #: consumer waits in next_frame() with nothing queued, it deals with the frame
        #: there and then (returns None) or gives back what is left of it to queue, which
        #: next_frame() hands out in order
        self.on_frame = None
        self.paused = False
        self.error: str | None = None
        self.eof = False
        self.last_data = time.monotonic()
        self._waiter: asyncio.Future | None = None

    # -- the transport's side ------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport          # a TLS stream's, once its handshake is done (tls.py)

    def get_buffer(self, sizehint: int):
        if self.direct is not None:
            buf, filled = self.direct
            return buf[filled:]
        if self.prefix_only and self.end - self.start < codec.PREFIX.size:
            if self.start + codec.PREFIX.size > len(self.stage):
                self._compact()
            return self.view[self.end:self.start + codec.PREFIX.size]
        if self.end == len(self.stage):
            self._compact()
        return self.view[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_data = time.monotonic()
        if self.direct is not None:
            buf, filled = self.direct
            self.direct = (buf, filled + nbytes)
            self._direct_read()
            return
        self.end += nbytes
        self._parse()

    def eof_received(self):
        self.eof = True
        self._wake()
        return False                        # the transport closes itself

    def connection_lost(self, exc) -> None:
        self.eof = True
        self._wake()
        previous, self.previous = self.previous, None
        if previous is not None:            # the HTTP server's protocol: its connection ended
            previous.connection_lost(exc)

    # -- framing ---------------------------------------------------------------------------
    def _compact(self) -> None:
        n = self.end - self.start
        self.view[:n] = self.view[self.start:self.end]
        self.start, self.end = 0, n

    def _parse(self) -> None:
        while self.error is None:
            avail = self.end - self.start
            if avail < codec.PREFIX.size:
                break
            try:
                hlen, plen = codec.parse_prefix(bytes(self.view[self.start:self.start + codec.PREFIX.size]),
                                                self.limits)
            except codec.CodecError as e:
                self.fail(str(e))
                return
            total = codec.PREFIX.size + hlen + plen + TRAILER.size
            if total > DIRECT_BYTES:
                buf = memoryview(np.empty(total, np.uint8))
                take = min(avail, total)
                buf[:take] = self.view[self.start:self.start + take]
                self.start += take
                self.prefix_only = True
                self.direct = (buf, take)
                if not self._direct_read():
                    break                   # the stage is empty now: the rest goes straight there
                continue
            if avail < total:
                if self.start + total > len(self.stage):
                    self._compact()
                self.prefix_only = False
                break
            frame = bytes(self.view[self.start:self.start + total])
            self.start += total
            self.prefix_only = False
            body = len(frame) - TRAILER.size
            self._accept(frame, self.auth.tag(self.seq, [memoryview(frame)[:body]]))
        if self.start == self.end:
            self.start = self.end = 0

    def _direct_read(self) -> bool:
        """A large frame's bytes came: its tag is computed as soon as its body is in
        (a sender writes the trailer after the body, tagging meanwhile: the two tags
        overlap, see PeerLink.write_now); the frame is accepted or refused once its
        trailer is in too. True when the frame is done."""
        buf, filled = self.direct
        body = len(buf) - TRAILER.size
        while True:
            if filled >= body and self.body_tag is None:
                self.body_tag = self.auth.tag(self.seq, [buf[:body]])
            if filled == len(buf):
                break
            more = self._read_now(buf[filled:])
            if not more:
                self.direct = (buf, filled)
                self._wake_at(body - filled if filled < body else len(buf) - filled)
                return False
            filled += more
        tag, self.body_tag, self.direct = self.body_tag, None, None
        self._wake_at(1)
        self._accept(buf.toreadonly(), tag)
        return True

    def _read_now(self, view) -> int:
        """On a plain stream, what of the rest of a large frame is already in the socket,
        read here rather than after another pass of the event loop (the prefix, the body
        and the trailer came in three wake-ups, though a sender on loopback has usually
        written the body by the time the prefix is read). 0 when nothing is there, or on
        an error or the stream's end, which the transport's next read meets itself. (The
        socket is non-blocking, as asyncio keeps it; its transport gives a wrapper without
        recv_into, so the descriptor is read.)"""
        if self.plain_sock is None or self.paused or self.error is not None:
            return 0
        try:
            n = os.readv(self.plain_sock.fileno(), [view])
        except OSError:             # BlockingIOError included: nothing there yet
            return 0
        if n:
            self.last_data = time.monotonic()
        return n

    def _wake_at(self, nbytes: int) -> None:
        """Have the socket report readable only once `nbytes` are there (at most
        LOWAT_MAX): the rest of a large frame arrives in one wake-up and one read, not
        one per 64 KB that loopback delivers at a time."""
        n = max(1, min(nbytes, LOWAT_MAX))
        if self.plain_sock is None or not self.lowat or n == self.lowat:
            return
        try:
            self.plain_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)
            self.lowat = n
        except OSError:
            self.lowat = 0              # a platform without it: a wake-up per segment, as before

    def _accept(self, frame, tag: bytes) -> None:
        """A whole frame whose tag, computed here, is `tag`: ready if its trailer agrees."""
        got_seq, got_tag = TRAILER.unpack(frame[len(frame) - TRAILER.size:])
        if got_seq != self.seq:
            self.fail(f"frame sequence number {got_seq}, expected {self.seq}")
        elif not hmac.compare_digest(got_tag, tag):
            self.fail(f"frame {self.seq}: bad MAC (altered or forged on the way)")
        else:
            self.seq += 1
            self._push(frame)

    def _push(self, frame) -> None:
        item = frame
        if self.on_frame is not None and self._waiter is not None and not self.ready:
            item = self.on_frame(frame)
            if item is None:
                return
        self.ready.append(item)
        self.sizes.append(len(frame))
        self.ready_bytes += len(frame)
        if self.ready_bytes >= MAX_READY_BYTES and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def fail(self, reason: str) -> None:
        """Stop reading: the consumer's next_frame() raises StreamError(reason)."""
        self.error = reason
        self.transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def pending(self) -> int:
        """Bytes of a frame not yet complete."""
        if self.direct is not None:
            return self.direct[1]
        return self.end - self.start

    # -- the consumer's side ---------------------------------------------------------------
    async def next_frame(self):
        """The next whole frame (a read-only buffer; or what on_frame left of one), or
        None at a clean end of the stream; raises StreamError when the stream must close."""
        while not self.ready:
            if self.error is not None:
                raise StreamError(self.error)
            if self.eof:
                partial = self.pending()
                if partial == 0:
                    return None
                if self.direct is None and partial < codec.PREFIX.size:
                    raise StreamError(f"stream ended inside a frame prefix ({partial} bytes)")
                raise StreamError("stream ended inside a frame")
            loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            timer = loop.call_later(self.read_timeout_s, self._wake)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None
            silent = time.monotonic() - self.last_data
            if not (self.ready or self.error or self.eof) and silent >= self.read_timeout_s:
                where = f"inside a frame ({self.pending()} bytes of it read)" if self.pending() else \
                    "between frames"
                raise StreamError(f"no data for {silent:.0f} s {where}: the peer stalled")
        frame = self.ready.popleft()
        self.ready_bytes -= self.sizes.popleft()
        if self.paused and self.ready_bytes < MAX_READY_BYTES // 2:
            self.paused = False
            self.transport.resume_reading()
        return frame


def write_some(sock: socket.socket, views: list) -> list:
    """Write what a non-blocking socket takes now of `views` (byte memoryviews), in
    order and gathered (sendmsg), without joining or copying them: the views left."""
    i = 0
    while i < len(views):
        try:
            sent = sock.sendmsg(views[i:i + IOV_MAX])
        except (BlockingIOError, InterruptedError):
            break
        while sent:
            n = len(views[i])
            if sent >= n:
                sent -= n
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0
    return views[i:]


def byte_views(buffers) -> list:
    return [memoryview(b).cast("B") for b in buffers if len(b)]


#: a peer that takes no byte of a frame for this long has stalled (stopped reading without
#: closing: a SIGSTOPped process, a partition): the stream is given up and the link
#: reconnects, as a reader gives up on a silent sender (transport.READ_TIMEOUT_S)
WRITE_STALL_S = 30.0


async def send_buffers(sock: socket.socket, buffers, stall_s: float = WRITE_STALL_S) -> None:
    """Write buffers to a non-blocking socket in order (write_some), waiting for room
    when the socket is full; TimeoutError when it stays full for `stall_s`."""
    views = byte_views(buffers)
    while views := write_some(sock, views):
        await _writable(asyncio.get_running_loop(), sock, stall_s)


async def _writable(loop, sock: socket.socket, stall_s: float) -> None:
    fut = loop.create_future()
    fd = sock.fileno()
    loop.add_writer(fd, lambda: fut.done() or fut.set_result(None))
    try:
        await _unless_stalled(fut, stall_s)
    finally:
        loop.remove_writer(fd)


class WriteStalled(asyncio.TimeoutError):
    """The peer took no byte for the stall time (stopped reading without closing)."""


async def _unless_stalled(room, stall_s: float) -> None:
    """Wait for `room` (the socket can take bytes again); WriteStalled when it has not
    come in `stall_s`."""
    try:
        await asyncio.wait_for(room, stall_s)
    except asyncio.TimeoutError:
        raise WriteStalled(f"the peer took no byte for {stall_s:.0f} s (stalled)") from None


class SocketSender:
    """A stream's sending end on its plain socket. The receiver sends nothing after its
    101: the socket turns readable only when the peer closes it (a rejected frame, a
    restart), which sets `closed` - the sender then reconnects at once."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.closed = self.loop.create_future()
        self.loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        self.loop.remove_reader(self.sock.fileno())     # level-triggered: once is enough
        if not self.closed.done():
            self.closed.set_result(None)

    async def send(self, buffers) -> None:
        await send_buffers(self.sock, buffers)

    def write_now(self, buffers) -> list:
        """What the socket takes of `buffers` now, without waiting: the views left,
        for send()."""
        return write_some(self.sock, byte_views(buffers))

    async def end(self) -> None:
        """After the last frame: the receiver reads to its end, then sees ours."""
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


class TlsSender(asyncio.Protocol):
    """A stream's sending end inside TLS (tls.py), on the upgraded socket: the same
    frames, written through the TLS transport (which encrypts, so copies, anyway)."""

    END_S = 2.0      # end(): how long the last frames may take to leave

    def __init__(self):
        self.loop = asyncio.get_running_loop()
        self.closed = self.loop.create_future()
        self.transport = None
        self._room: asyncio.Future | None = None

    @classmethod
    async def start(cls, sock: socket.socket, context, host: str, timeout_s: float) -> "TlsSender":
        """The TLS handshake on `sock`: the receiver's certificate must be signed by the
        CA in `context` and name `host`; ours goes to it."""
        loop = asyncio.get_running_loop()
        _, sender = await loop.create_connection(cls, sock=sock, ssl=context, server_hostname=host,
                                                 ssl_handshake_timeout=timeout_s)
        return sender

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data) -> None:
        self.connection_lost(None)          # the receiver sends nothing: treat it as its end

    def eof_received(self):
        self.connection_lost(None)
        return False

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.resume_writing()

    def pause_writing(self) -> None:
        if self._room is None:
            self._room = self.loop.create_future()

    def resume_writing(self) -> None:
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)

    async def send(self, buffers) -> None:
        if self.closed.done():
            raise ConnectionResetError("the peer closed the stream")
        self.transport.writelines(buffers)      # encrypted (copied) before this returns
        if self._room is not None:              # backpressure: the socket is full
            await _unless_stalled(asyncio.shield(self._room), WRITE_STALL_S)

    async def end(self) -> None:
        self.transport.close()                  # what is buffered goes first, then close_notify
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), self.END_S)
        except asyncio.TimeoutError:
            pass

    def close(self) -> None:
        if self.transport is not None and not self.closed.done():
            self.transport.abort()
