"""Frames: msgpack headers with ndarrays carried beside them as raw bytes.

Wire layout of one frame:

    magic "SNF1" | header length (u32, big-endian) | payload length (u64) | header | payload

The header is msgpack. An ndarray inside it is an ext value (code ARRAY_EXT) that
holds [dtype, shape, offset, nbytes] pointing into the payload, where the array's
raw bytes lie (8-byte aligned). Sending writes the arrays' own buffers after the
header, so a 10 MB tensor is never copied into a msgpack buffer; receiving reads
one frame into one buffer and decodes arrays with `np.frombuffer` - no copy, and
the arrays are read-only views of that buffer.

Only whitelisted dtypes and ext codes are accepted, every length is checked
before it is used, and any malformed input raises CodecError (never anything
else), so a bad frame costs one connection, not the worker. A header decodes to
at most `max_header_items` list and map entries in all (each byte of msgpack
can become a 60-byte Python object: a 4 MiB header of empty lists would be
259 MiB), and the payload must be exactly its arrays' padded bytes (a 4-byte
array cannot keep a 64 MiB buffer alive).
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import msgpack
import numpy as np

from ..errors import StreamnetError

MAGIC = b"SNF1"
PREFIX = struct.Struct(">4sIQ")
ARRAY_EXT = 1
ALIGN = 8
DTYPES = frozenset(np.dtype(t).str for t in (
    "<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1"))
MAX_DIMS = 16


class CodecError(StreamnetError):
    """A frame or value that cannot be (de)serialised safely."""


@dataclass(frozen=True)
class Limits:
    max_frame: int = 256 << 20    # header + payload
    max_header: int = 16 << 20
    max_arrays: int = 4096
    max_header_items: int = 1 << 20   # list and map entries in one header, all levels together


DEFAULT_LIMITS = Limits()


def _pad(n: int) -> int:
    return (-n) % ALIGN


def encode(obj, limits: Limits = DEFAULT_LIMITS) -> list:
    """Encode obj into a list of buffers to write in order (prefix+header first)."""
    arrays: list[np.ndarray] = []
    offset = 0

    def default(value):
        nonlocal offset
        if isinstance(value, np.ndarray):
            if value.dtype.str not in DTYPES:
                # accept native big-endian twins by converting; refuse the rest
                le = value.dtype.newbyteorder("<")
                if le.str not in DTYPES:
                    raise CodecError(f"dtype {value.dtype} is not allowed on the wire; allowed: "
                                     + ", ".join(sorted(DTYPES)))
                value = value.astype(le)
            if value.ndim > MAX_DIMS:
                raise CodecError(f"array has {value.ndim} dimensions; at most {MAX_DIMS}")
            arr = np.ascontiguousarray(value)
            arrays.append(arr)
            meta = msgpack.packb([arr.dtype.str, list(arr.shape), offset, arr.nbytes])
            offset += arr.nbytes + _pad(arr.nbytes)
            return msgpack.ExtType(ARRAY_EXT, meta)
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, (set, frozenset)):
            return sorted(value)
        raise CodecError(f"cannot encode a value of type {type(value).__name__}")

    try:
        header = msgpack.packb(obj, default=default, use_bin_type=True)
    except CodecError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise CodecError(f"cannot encode: {e}") from None
    if len(arrays) > limits.max_arrays:
        raise CodecError(f"{len(arrays)} arrays in one frame; at most {limits.max_arrays}")
    if len(header) > limits.max_header:
        raise CodecError(f"header of {len(header)} bytes exceeds the limit of {limits.max_header}")
    if len(header) + offset > limits.max_frame:
        raise CodecError(f"frame of {len(header) + offset} bytes exceeds the limit of {limits.max_frame}")
    out: list = [PREFIX.pack(MAGIC, len(header), offset) + header]
    for arr in arrays:
        out.append(memoryview(arr).cast("B") if arr.nbytes else b"")
        if _pad(arr.nbytes):
            out.append(b"\0" * _pad(arr.nbytes))
    return out


def array_bytes(obj) -> int:
    """The bytes of the arrays inside obj (lists, tuples and dicts, at any depth):
    what a decoded value holds of its frame's payload (its arrays are views of it)."""
    return sum(value.nbytes for value in _parts(obj) if isinstance(value, np.ndarray))


def held_bytes(obj) -> int:
    """The bytes the arrays inside obj keep alive: a decoded array is a view of its whole
    frame (each frame counted once), an array of its own its own bytes."""
    seen, total = set(), 0
    for value in _parts(obj):
        if not isinstance(value, np.ndarray):
            continue
        root = value
        while isinstance(root, np.ndarray) and root.base is not None:
            root = root.base
        if isinstance(root, memoryview):
            root = root.obj
        if id(root) in seen:
            continue
        seen.add(id(root))
        total += root.nbytes if isinstance(root, np.ndarray) else memoryview(root).nbytes
    return total


def _parts(obj):
    """obj and every value inside it (lists, tuples, a dict's keys and values), at any
    depth; not recursive: a header may nest deeper than Python's recursion limit."""
    todo = [obj]
    while todo:
        value = todo.pop()
        yield value
        if isinstance(value, (list, tuple)):
            todo.extend(value)
        elif isinstance(value, dict):
            todo.extend(value.keys())
            todo.extend(value.values())


def encode_bytes(obj, limits: Limits = DEFAULT_LIMITS) -> bytes:
    return b"".join(bytes(b) if isinstance(b, memoryview) else b for b in encode(obj, limits))


def parse_prefix(prefix: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[int, int]:
    """Validate a frame prefix; return (header length, payload length)."""
    if len(prefix) != PREFIX.size:
        raise CodecError(f"frame prefix must be {PREFIX.size} bytes, got {len(prefix)}")
    magic, hlen, plen = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise CodecError(f"bad frame magic {magic!r}")
    if hlen > limits.max_header:
        raise CodecError(f"header length {hlen} exceeds the limit of {limits.max_header}")
    if hlen + plen > limits.max_frame:
        raise CodecError(f"frame length {hlen + plen} exceeds the limit of {limits.max_frame}")
    return hlen, plen


def decode_body(header: bytes | memoryview, payload: bytes | memoryview, limits: Limits = DEFAULT_LIMITS):
    """Decode a frame given its header and payload bytes."""
    count = 0
    items = 0
    used = 0        # the arrays' bytes, padded as the encoder lays them out
    plen = len(payload)

    def count_items(obj):
        nonlocal items
        items += len(obj)
        if items > limits.max_header_items:
            raise CodecError(f"frame header holds more than {limits.max_header_items} list/map entries")
        return obj

    def ext_hook(code, data):
        nonlocal count, used
        if code != ARRAY_EXT:
            raise CodecError(f"unknown ext code {code}")
        count += 1
        if count > limits.max_arrays:
            raise CodecError(f"more than {limits.max_arrays} arrays in one frame")
        try:
            meta = msgpack.unpackb(data, max_array_len=MAX_DIMS + 4, max_str_len=16, max_bin_len=0,
                                   max_map_len=0, max_ext_len=0)
        except Exception as e:  # noqa: BLE001 - any malformed ext is a codec error
            raise CodecError(f"malformed array descriptor: {e}") from None
        if not (isinstance(meta, list) and len(meta) == 4):
            raise CodecError("malformed array descriptor")
        dtype, shape, offset, nbytes = meta
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise CodecError(f"dtype {dtype!r} is not allowed on the wire")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(d, int) and 0 <= d < 2 ** 48 for d in shape)):
            raise CodecError(f"bad array shape {shape!r}")
        if not (isinstance(offset, int) and isinstance(nbytes, int) and 0 <= offset and 0 <= nbytes):
            raise CodecError("bad array offset or size")
        dt = np.dtype(dtype)
        n = 1
        for d in shape:
            n *= d
        if n * dt.itemsize != nbytes:
            raise CodecError(f"array shape {tuple(shape)} of {dtype} needs {n * dt.itemsize} bytes, "
                             f"descriptor says {nbytes}")
        if offset + nbytes > plen:
            raise CodecError(f"array bytes {offset}..{offset + nbytes} run past the payload of {plen}")
        used += nbytes + _pad(nbytes)
        return np.frombuffer(payload, dt, count=n, offset=offset).reshape(shape)

    n = limits.max_header_items
    # every list or map entry takes at least one byte: a header no longer than the cap
    # cannot hold more entries than it, and needs no count (a Python call per list)
    hooks = {} if len(header) <= n else {"list_hook": count_items, "object_hook": count_items}
    try:
        obj = msgpack.unpackb(header, ext_hook=ext_hook, raw=False, strict_map_key=False,
                              max_array_len=n, max_map_len=n, **hooks)
    except CodecError:
        raise
    except Exception as e:  # noqa: BLE001 - msgpack raises many types on garbage
        why = str(e) or ("nested too deep" if type(e).__name__ == "StackError" else "no reason given")
        raise CodecError(f"malformed frame header: {type(e).__name__}: {why}") from None
    if used != plen:
        raise CodecError(f"payload of {plen} bytes, but its arrays take {used}")
    if _MAYBE_TIMESTAMP.search(header) and any(isinstance(v, msgpack.Timestamp) for v in _parts(obj)):
        raise CodecError("unknown ext code -1 (a msgpack timestamp)")
    return obj


#: msgpack decodes ext code -1 (its timestamp) itself, without calling ext_hook: a
#: header whose bytes could hold one (an ext header, then 0xff) is searched for it
_MAYBE_TIMESTAMP = re.compile(rb"[\xd4-\xd8]\xff|\xc7.\xff|\xc8..\xff|\xc9....\xff", re.S)


def decode(frame: bytes | memoryview, limits: Limits = DEFAULT_LIMITS):
    """Decode one whole frame (prefix included)."""
    view = memoryview(frame)
    if len(view) < PREFIX.size:
        raise CodecError(f"frame of {len(view)} bytes is shorter than its prefix")
    hlen, plen = parse_prefix(bytes(view[:PREFIX.size]), limits)
    if len(view) != PREFIX.size + hlen + plen:
        raise CodecError(f"frame is {len(view)} bytes, prefix says {PREFIX.size + hlen + plen}")
    return decode_body(view[PREFIX.size:PREFIX.size + hlen], view[PREFIX.size + hlen:], limits)
