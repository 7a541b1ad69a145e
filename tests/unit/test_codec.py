import random

import msgpack
import numpy as np
import pytest

from streamnet.runtime.codec import ARRAY_EXT, MAGIC, PREFIX, CodecError, Limits, array_bytes, decode, encode_bytes


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4",
                                   "<u8", "|b1"])
def test_round_trip_every_allowed_dtype(dtype):
    a = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    out = decode(encode_bytes({"a": a, "n": [1, "x", None, 2.5, b"raw"]}))
    assert out["a"].dtype == a.dtype and out["a"].shape == a.shape
    np.testing.assert_array_equal(out["a"], a)
    assert out["n"] == [1, "x", None, 2.5, b"raw"]


def test_decoded_arrays_are_views_of_the_frame():
    a = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    frame = encode_bytes([a, a[::2], np.zeros((0, 3), np.float32)])
    out = decode(frame)
    buf = np.frombuffer(frame, np.uint8)
    assert np.shares_memory(out[0], buf) and not out[0].flags.writeable
    np.testing.assert_array_equal(out[1], a[::2])   # non-contiguous input is made contiguous
    assert out[2].shape == (0, 3)


def test_big_endian_arrays_are_converted_and_object_arrays_refused():
    out = decode(encode_bytes(np.arange(4, dtype=">i4")))
    assert out.dtype == np.dtype("<i4") and out.tolist() == [0, 1, 2, 3]
    with pytest.raises(CodecError, match="not allowed on the wire"):
        encode_bytes(np.array([object()]))
    with pytest.raises(CodecError, match="cannot encode a value of type"):
        encode_bytes({"f": lambda: 1})


def test_frame_limits():
    small = Limits(max_frame=1000, max_header=100)
    with pytest.raises(CodecError, match="exceeds the limit"):
        encode_bytes(np.zeros(1000, np.float32), small)
    with pytest.raises(CodecError, match="exceeds the limit"):
        decode(PREFIX.pack(MAGIC, 10, 2 ** 40) + b"x" * 10)
    with pytest.raises(CodecError, match="header length"):
        decode(PREFIX.pack(MAGIC, 200, 0) + b"x" * 200, small)


def frame_with_ext(code, meta, payload=b""):
    header = msgpack.packb([msgpack.ExtType(code, msgpack.packb(meta))])
    return PREFIX.pack(MAGIC, len(header), len(payload)) + header + payload


@pytest.mark.parametrize("frame,message", [
    (frame_with_ext(7, ["<f4", [1], 0, 4], b"\0" * 8), "unknown ext code 7"),
    (frame_with_ext(ARRAY_EXT, ["|O", [1], 0, 8], b"\0" * 8), "not allowed on the wire"),
    (frame_with_ext(ARRAY_EXT, ["<f4", [10], 0, 8], b"\0" * 8), "needs 40 bytes, descriptor says 8"),
    (frame_with_ext(ARRAY_EXT, ["<f4", [4], 4, 16], b"\0" * 16), "run past the payload"),
    (frame_with_ext(ARRAY_EXT, ["<f4", [-1], 0, 4], b"\0" * 8), "bad array shape"),
    (frame_with_ext(ARRAY_EXT, "nonsense", b""), "malformed array descriptor"),
    (b"XXXX" + bytes(12), "bad frame magic"),
    (PREFIX.pack(MAGIC, 5, 0) + b"\xc1\xc1\xc1\xc1\xc1", "malformed frame header"),
    (PREFIX.pack(MAGIC, 4, 0) + b"\x01", "prefix says"),
])
def test_bad_frames_raise_codec_error(frame, message):
    with pytest.raises(CodecError, match=message):
        decode(frame)


def test_fuzz_decoder_with_random_and_mutated_frames():
    """A bounded fuzz: random bytes, and valid frames with bytes flipped, cut or
    extended. The decoder returns a value or raises CodecError - nothing else."""
    rng = random.Random(1234)
    good = [encode_bytes({"v": [1, "a"], "x": np.arange(6, dtype=np.float32).reshape(2, 3)}),
            encode_bytes([np.ones(3, np.int64), {"k": b"b" * 40}]), encode_bytes("hello")]
    outcomes = {"ok": 0, "error": 0}
    for i in range(6000):
        if i % 3 == 0:
            data = rng.randbytes(rng.randint(0, 200))
            if rng.random() < 0.5:  # a valid prefix in front of garbage reaches the msgpack layer
                data = PREFIX.pack(MAGIC, len(data), 0) + data
        else:
            data = bytearray(rng.choice(good))
            for _ in range(rng.randint(1, 4)):
                op = rng.random()
                if op < 0.6 and data:
                    data[rng.randrange(len(data))] = rng.randrange(256)
                elif op < 0.8:
                    data = data[: rng.randrange(len(data) + 1)]
                else:
                    data += rng.randbytes(rng.randint(1, 8))
            data = bytes(data)
        try:
            decode(data)
            outcomes["ok"] += 1
        except CodecError:
            outcomes["error"] += 1
    assert outcomes["error"] > 3000 and outcomes["ok"] > 0


def test_a_header_nested_too_deep_says_so():
    header = b"\x91" * 5000 + b"\xc0"                  # 5,000 lists, each in the one before
    with pytest.raises(CodecError, match="malformed frame header: StackError: nested too deep"):
        decode(PREFIX.pack(MAGIC, len(header), 0) + header)      # the message was empty after "StackError: "


def test_array_bytes_counts_the_arrays_at_any_depth():
    value = [np.zeros(3, np.float32), {"a": [np.zeros((2, 2), np.float64)], "b": "x"}, (np.zeros(1, np.int8),), 7]
    assert array_bytes(value) == 12 + 32 + 1
    deep = [np.zeros(2, np.float32)]
    for _ in range(5000):                            # deeper than Python's recursion limit
        deep = [deep]
    assert array_bytes(deep) == 8 and array_bytes([]) == 0


def _frame_of_header(header: bytes) -> bytes:
    return PREFIX.pack(MAGIC, len(header), 0) + header


@pytest.mark.parametrize("value", [msgpack.Timestamp(5, 0), [1, {"t": msgpack.Timestamp(2 ** 40, 7)}],
                                   {msgpack.Timestamp(1, 0): 1}, [msgpack.Timestamp(2 ** 35, 1)]])
def test_a_msgpack_timestamp_is_refused_as_an_unknown_ext(value):
    """msgpack decodes its timestamp (ext -1) without asking ext_hook: it is refused all the same."""
    with pytest.raises(CodecError, match="unknown ext code -1"):
        decode(_frame_of_header(msgpack.packb(value)))


def test_bytes_that_only_look_like_a_timestamp_decode():
    value = [b"\xd6\xff\x00\x00\x00\x05", "\xff", 0xd6ff]
    assert decode(_frame_of_header(msgpack.packb(value, use_bin_type=True))) == value
