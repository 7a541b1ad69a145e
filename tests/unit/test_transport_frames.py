"""frame_io: the frame tag, and the reader that takes frames off a stream socket into
buffers of their own (fed here by hand, as the event loop feeds it)."""
import asyncio
import os
import random

import numpy as np
import pytest

from streamnet.runtime import codec
from streamnet.runtime.dataplane import frame_io
from streamnet.runtime.dataplane.frame_io import TRAILER, FrameAuth, FrameReader, StreamError


def test_the_tag_is_one_gmac_however_the_frame_is_cut():
    auth = FrameAuth(os.urandom(32))
    frame = os.urandom(300_000)
    whole = auth.tag(7, [frame])
    assert auth.tag(7, [frame[:10], memoryview(frame)[10:200_000], frame[200_000:]]) == whole
    small = frame[:1000]
    assert auth.tag(7, [small]) == auth.tag(7, [small[:3], small[3:]])      # one-shot == incremental
    assert auth.tag(8, [frame]) != whole                                     # the sequence number is the nonce
    assert FrameAuth(os.urandom(32)).tag(7, [frame]) != whole                # another stream's key
    flipped = bytearray(frame)
    flipped[123_456] ^= 1
    assert auth.check(7, [frame], whole) and not auth.check(7, [bytes(flipped)], whole)


class FakeTransport:
    def __init__(self):
        self.paused = False
        self.pauses = 0

    def pause_reading(self):
        self.paused = True
        self.pauses += 1

    def resume_reading(self):
        self.paused = False


class Previous:
    lost = None

    def connection_lost(self, exc):
        self.lost = ("lost", exc)


KEY = os.urandom(32)


def _reader(timeout=30.0):
    return FrameReader(FakeTransport(), Previous(), codec.DEFAULT_LIMITS, FrameAuth(KEY), timeout)


def _wire(obj, seq=0, key=KEY) -> bytes:
    body = codec.encode_bytes(obj)
    return body + TRAILER.pack(seq, FrameAuth(key).tag(seq, [body]))


def _feed(reader: FrameReader, data: bytes, rng: random.Random) -> None:
    """As the event loop does: get_buffer, the kernel writes some bytes, buffer_updated."""
    i = 0
    while i < len(data):
        buf = reader.get_buffer(-1)
        assert len(buf) > 0
        n = min(len(buf), len(data) - i, rng.choice([1, 7, 100, 5000, 70_000, 1 << 20]))
        buf[:n] = data[i:i + n]
        reader.buffer_updated(n)
        i += n


def _decode(frame):
    hlen, plen = codec.parse_prefix(bytes(frame[:codec.PREFIX.size]))
    return codec.decode_body(frame[codec.PREFIX.size:codec.PREFIX.size + hlen],
                             frame[codec.PREFIX.size + hlen:codec.PREFIX.size + hlen + plen])


@pytest.mark.parametrize("seed", range(4))
def test_frames_of_every_size_arrive_whole_and_in_order_however_the_bytes_are_cut(seed):
    rng = random.Random(seed)
    sizes = [1, 300, 20_000, 62_000, 2_500_000, 3, 16_383, 70_000, 5]        # float32 values: 4 B to 10 MB
    sent = [[i, np.arange(n, dtype=np.float32) * (i + 1)] for i, n in enumerate(sizes)]
    sent.insert(3, [])                                                        # an empty frame: a heartbeat
    reader = _reader()

    async def go():
        _feed(reader, b"".join(_wire(obj, i) for i, obj in enumerate(sent)), rng)
        reader.eof_received()
        got = []
        while (frame := await reader.next_frame()) is not None:
            got.append(frame)
        return got
    frames = asyncio.run(go())
    assert len(frames) == len(sent)
    for obj, frame in zip(sent, frames):
        decoded = _decode(frame)
        assert len(decoded) == len(obj)
        if obj:
            assert decoded[0] == obj[0] and np.array_equal(decoded[1], obj[1])
            assert not decoded[1].flags.writeable                            # read-only views, as before
        if len(frame) > frame_io.DIRECT_BYTES:
            assert isinstance(frame, memoryview) and frame.readonly          # its own buffer, not the stage


def test_a_large_frame_is_read_straight_into_its_own_buffer():
    reader = _reader()
    data = _wire([np.ones(1_000_000, np.float32)])
    head = reader.get_buffer(-1)
    head[:codec.PREFIX.size] = data[:codec.PREFIX.size]
    reader.buffer_updated(codec.PREFIX.size)
    rest = reader.get_buffer(-1)                    # where the kernel writes the remaining bytes
    assert len(rest) == len(data) - codec.PREFIX.size
    rest[:] = data[codec.PREFIX.size:]
    reader.buffer_updated(len(rest))
    frame = reader.ready[0]
    assert frame.obj is rest.obj                    # the same buffer: no copy after the read
    # and after a large frame the next read asks for a prefix alone: nothing is staged
    assert len(reader.get_buffer(-1)) == codec.PREFIX.size


def test_reading_pauses_while_frames_wait_and_resumes_as_they_are_taken():
    reader = _reader()
    frame = _wire([np.zeros(300_000, np.float32)])
    rng = random.Random(0)
    n = frame_io.MAX_READY_BYTES // len(frame) + 2
    _feed(reader, b"".join(_wire([np.zeros(300_000, np.float32)], i) for i in range(n)), rng)
    assert reader.transport.paused

    async def take_all():
        for _ in range(n):
            await reader.next_frame()
    asyncio.run(take_all())
    assert not reader.transport.paused and reader.transport.pauses == 1


@pytest.mark.parametrize("size", [100, 1_000_000])         # staged, and read into its own buffer
@pytest.mark.parametrize("wrong", ["a flipped byte", "another key", "a replayed frame", "a skipped frame"])
def test_a_frame_whose_tag_or_sequence_number_is_wrong_ends_the_stream_before_it_is_served(size, wrong):
    good = _wire([np.zeros(size, np.float32)], 0)
    bad = {"a flipped byte": lambda: bytearray(_wire([np.zeros(size, np.float32)], 1)),
           "another key": lambda: _wire([np.zeros(size, np.float32)], 1, key=os.urandom(32)),
           "a replayed frame": lambda: good,
           "a skipped frame": lambda: _wire([np.zeros(size, np.float32)], 2)}[wrong]()
    if wrong == "a flipped byte":
        bad[len(bad) // 2] ^= 1
    reader = _reader()
    _feed(reader, good + bytes(bad) + _wire([1], 2), random.Random(0))
    reason = "frame sequence number" if wrong in ("a replayed frame", "a skipped frame") else "frame 1: bad MAC"

    async def go():
        assert _decode(await reader.next_frame())[0].shape == (size,)
        with pytest.raises(StreamError, match=reason):
            await reader.next_frame()
    asyncio.run(go())
    assert len(reader.ready) == 0


def test_a_bad_prefix_ends_the_stream_with_its_reason():
    reader = _reader()
    _feed(reader, _wire([1]) + b"XXXX" + b"\0" * 40, random.Random(0))

    async def go():
        assert _decode(await reader.next_frame()) == [1]      # what came before it is still served
        with pytest.raises(StreamError, match="bad frame magic"):
            await reader.next_frame()
    asyncio.run(go())
    assert reader.transport.paused                              # nothing more is read


@pytest.mark.parametrize("cut, reason", [(5, "inside a frame prefix"), (40, "inside a frame"),
                                         (100_000, "inside a frame")])
def test_a_stream_that_ends_inside_a_frame_is_an_error(cut, reason):
    reader = _reader()
    _feed(reader, _wire([np.zeros(100_000, np.float32)])[:cut], random.Random(0))
    reader.connection_lost(None)
    with pytest.raises(StreamError, match=reason):
        asyncio.run(reader.next_frame())
    assert reader.previous is None                              # the connection's end was passed on


@pytest.mark.parametrize("cut", [0, 30, 100_000])
def test_a_peer_silent_between_frames_or_inside_one_is_cut_off(cut):
    reader = _reader(timeout=0.3)
    _feed(reader, _wire([np.zeros(100_000, np.float32)])[:cut], random.Random(0))
    reader.last_data -= 0.3                         # as if its bytes had come that long ago
    where = "inside a frame" if cut else "between frames"
    with pytest.raises(StreamError, match=f"no data for .* {where}"):
        asyncio.run(reader.next_frame())


def test_a_peer_that_keeps_sending_is_not_cut_off():
    reader = _reader(timeout=0.4)
    data = _wire([np.zeros(100_000, np.float32)])

    async def go():
        loop = asyncio.get_running_loop()
        for i in range(10):     # a byte every 0.1 s: 1.1 s in all, well past the timeout
            loop.call_later(0.1 * (i + 1), _feed, reader, data[i:i + 1], random.Random(0))
        loop.call_later(1.1, _feed, reader, data[10:], random.Random(0))
        return await reader.next_frame()
    assert _decode(asyncio.run(go()))[0].shape == (100_000,)


def test_a_frame_with_arrays_is_tagged_over_header_and_payload_wherever_its_buffers_split():
    auth = FrameAuth(os.urandom(32))
    buffers = codec.encode([[1, np.arange(70_001, dtype=np.float32)]])     # header, array, padding
    joined = b"".join(bytes(b) for b in buffers)
    tag = auth.tag(3, buffers)
    assert auth.tag(3, [joined]) == tag == auth.tag(3, [joined[:7], joined[7:]])
    head = len(buffers[0])
    for at in (5, head - 1, head + 9, len(joined) - 1):      # prefix, header, payload, padding
        altered = bytearray(joined)
        altered[at] ^= 1
        assert auth.tag(3, [bytes(altered)]) != tag, at
    assert auth.tag(4, buffers) != tag


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_a_stream_of_small_frames_keeps_only_the_stage_it_writes_resident():
    """An embedded cluster of 100 workers holds 9,900 streams: a stage each that the
    reader zeroed (256 KB resident apiece, 2.5 GB) grew memory past what the run needs."""
    n = 400
    before = _resident_bytes()
    readers = []
    for _ in range(n):
        r = _reader()
        data = b"".join(_wire({"i": i}, seq=i) for i in range(3))
        r.get_buffer(len(data))[:len(data)] = data
        r.buffer_updated(len(data))
        assert len(r.ready) == 3
        readers.append(r)
    grown = _resident_bytes() - before
    assert grown < n * frame_io.STAGE_BYTES // 4, f"{grown / n / 1024:.0f} KB resident per reader"


def test_a_plain_stream_wakes_once_for_the_rest_of_a_large_frame():
    """SO_RCVLOWAT follows what a large frame still lacks (capped at LOWAT_MAX) and is
    back to 1 once it is whole; small frames leave it alone. On a real socket."""
    import socket
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    conn.setblocking(False)                 # as asyncio keeps a stream's socket
    try:
        lowat = lambda: conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)  # noqa: E731
        reader = FrameReader(FakeTransport(), Previous(), codec.DEFAULT_LIMITS, FrameAuth(KEY), 30.0,
                             plain_sock=conn)
        small, large = _wire([1, np.ones(100, np.float32)], 0), _wire([np.ones(200_000, np.float32)], 1)
        buf = reader.get_buffer(-1)
        buf[:len(small)] = small
        reader.buffer_updated(len(small))
        assert len(reader.ready) == 1 and lowat() == 1
        reader.get_buffer(-1)[:codec.PREFIX.size] = large[:codec.PREFIX.size]
        reader.buffer_updated(codec.PREFIX.size)
        left = len(large) - codec.PREFIX.size
        assert lowat() == min(left, frame_io.LOWAT_MAX)
        rest = reader.get_buffer(-1)
        rest[:600_000] = large[codec.PREFIX.size:codec.PREFIX.size + 600_000]
        reader.buffer_updated(600_000)
        body = len(large) - TRAILER.size        # the body first: its tag is made before the trailer comes
        assert lowat() == body - codec.PREFIX.size - 600_000 < frame_io.LOWAT_MAX
        rest = reader.get_buffer(-1)
        rest[:body - codec.PREFIX.size - 600_000] = large[codec.PREFIX.size + 600_000:body]
        reader.buffer_updated(body - codec.PREFIX.size - 600_000)
        assert lowat() == TRAILER.size and len(reader.ready) == 1 and reader.body_tag is not None
        rest = reader.get_buffer(-1)
        rest[:] = large[body:]
        reader.buffer_updated(len(rest))
        assert len(reader.ready) == 2 and reader.error is None and reader.body_tag is None
        assert lowat() == 1
    finally:
        for s in (client, conn, server):
            s.close()


def test_a_large_frame_tagged_before_its_trailer_comes_is_still_refused_if_altered():
    """The reader tags a large frame's body as soon as it is in; an altered body whose
    trailer comes later, on its own, is refused all the same, and nothing is handed on."""
    reader = FrameReader(FakeTransport(), Previous(), codec.DEFAULT_LIMITS, FrameAuth(KEY), 30.0)
    large = bytearray(_wire([np.ones(100_000, np.float32)], 0))
    large[1000] ^= 1
    body = len(large) - TRAILER.size
    for part in (large[:codec.PREFIX.size], large[codec.PREFIX.size:body], large[body:]):
        buf = reader.get_buffer(-1)
        buf[:len(part)] = part
        reader.buffer_updated(len(part))
    assert reader.error is not None and "bad MAC" in reader.error and not reader.ready


def test_the_rest_of_a_large_frame_already_in_the_socket_is_read_in_the_same_callback():
    """Once a large frame's prefix is parsed, what of the frame the socket already holds is
    read there and then, not after further wake-ups: here the whole frame, in one callback."""
    import socket

    from streamnet.runtime import wait_for
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    conn.setblocking(False)
    try:
        frame_io.size_buffers(conn, socket.SO_RCVBUF)
        frame_io.size_buffers(client, socket.SO_SNDBUF)
        reader = FrameReader(FakeTransport(), Previous(), codec.DEFAULT_LIMITS, FrameAuth(KEY), 30.0,
                             plain_sock=conn)
        large = _wire([np.arange(100_000, dtype=np.float32)], 0)
        client.sendall(large[codec.PREFIX.size:])
        wait_for(lambda: len(conn.recv(len(large), socket.MSG_PEEK)) == len(large) - codec.PREFIX.size, 10,
                 "the frame's rest to reach the socket", interval=0.001)
        reader.get_buffer(-1)[:codec.PREFIX.size] = large[:codec.PREFIX.size]
        reader.buffer_updated(codec.PREFIX.size)
        assert len(reader.ready) == 1 and reader.error is None and reader.direct is None
        assert bytes(reader.ready[0]) == large
        assert reader.lowat == 1
    finally:
        for s in (client, conn, server):
            s.close()
