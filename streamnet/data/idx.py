"""IDX files (the MNIST family), raw or gzip-compressed, read with full validation.

Layout: two zero bytes, a dtype code, the number of dimensions, one big-endian
uint32 per dimension, then the values in big-endian C order.
"""
from __future__ import annotations

import gzip
import io
import math
import os
import stat
import zlib

import numpy as np

from ..errors import DataError

DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dt.newbyteorder(">"): code for code, dt in DTYPES.items()}
MAX_DIMS = 8
# The most bytes (header and values) one IDX file may declare. The whole array is
# held in memory (twice while it is converted to native byte order), so a header
# that asks for more is refused before anything is read or decompressed: a corrupt
# or hostile header (or a gzip bomb behind one) cannot make the reader allocate
# without bound. Fashion-MNIST's largest file is 47 MB; 60,000 images resized to
# 224x224 ahead of time are 3 GB.
MAX_BYTES = 4 << 30
_CHUNK = 16 << 20   # read (and decompress) at most this much at a time


def _read_at_most(f, n: int) -> bytearray:
    """Up to n bytes from f, fewer only at its end; memory grows with what is there,
    not with n, so a header that promises more than the file holds costs nothing."""
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(min(_CHUNK, n - len(buf)))
        if not chunk:
            break
        buf += chunk
    return buf


def _parse(f, name: str, size: int | None, what: str = "file") -> np.ndarray:
    """The array in the IDX stream f. `size` is the stream's length where it is known
    (raw files, bytes) and None for a gzip stream, whose length is only known once it
    is decompressed: that is then read up to the length its header declares plus one
    byte, so trailing data is found without decompressing it."""
    head = _read_at_most(f, 4)
    if len(head) < 4:
        raise DataError(f"{name}: too short for an IDX header ({len(head)} bytes)")
    if head[0] != 0 or head[1] != 0:
        raise DataError(f"{name}: bad IDX magic {head[:4].hex()} (must start with 0000)")
    code, ndim = head[2], head[3]
    if code not in DTYPES:
        raise DataError(f"{name}: unknown IDX dtype code 0x{code:02x}; known: "
                        + ", ".join(f"0x{c:02x}" for c in DTYPES))
    if not 1 <= ndim <= MAX_DIMS:
        raise DataError(f"{name}: IDX header gives {ndim} dimensions (1..{MAX_DIMS} allowed)")
    header = 4 + 4 * ndim
    head += _read_at_most(f, header - 4)
    if len(head) < header:
        raise DataError(f"{name}: truncated header: {ndim} dimensions need {header} bytes, {what} has {len(head)}")
    dims = tuple(int(d) for d in np.frombuffer(head, ">u4", count=ndim, offset=4))
    dtype = DTYPES[code]
    # Python ints: eight uint32 dimensions overflow int64 (4 x 65536 wraps to 0)
    count = math.prod(dims)
    expected = header + count * dtype.itemsize
    if expected > MAX_BYTES:
        raise DataError(f"{name}: dimensions {dims} of {dtype.itemsize}-byte values need {expected} bytes, "
                        f"more than the {MAX_BYTES:,} bytes an IDX file may hold (idx.MAX_BYTES)")
    if size is not None and size < expected:   # known length: refuse before reading the values
        raise DataError(f"{name}: truncated: dimensions {dims} need {expected} bytes, {what} has {size}")
    if size is not None and size > expected:
        raise DataError(f"{name}: {size - expected} bytes of trailing data after dimensions {dims}")
    body = _read_at_most(f, expected - header + 1)   # one byte more: is there trailing data?
    got = header + len(body)
    if got < expected:
        raise DataError(f"{name}: truncated: dimensions {dims} need {expected} bytes, {what} has {got}")
    if got > expected:
        raise DataError(f"{name}: trailing data after dimensions {dims}: the {what} holds more than "
                        f"the {expected} bytes they need")
    return np.frombuffer(body, dtype, count=count).reshape(dims).astype(dtype.newbyteorder("="))


def parse_idx(raw: bytes, name: str = "<bytes>") -> np.ndarray:
    """The array in IDX bytes; any fault raises DataError naming `name` and the fault."""
    return _parse(io.BytesIO(raw), name, len(raw))


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file; any fault raises DataError naming the file and the fault.

    A gzip file is decompressed as it is read, never more than its IDX header
    declares (plus one byte), so a small .gz that expands to gigabytes is refused
    after a few bytes of output, not after all of it."""
    path = os.fspath(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None
    with f:
        try:
            st = os.fstat(f.fileno())
            size = st.st_size if stat.S_ISREG(st.st_mode) else None   # a pipe's length is not known
            if f.peek(2)[:2] != b"\x1f\x8b":
                return _parse(f, path, size)
        except OSError as e:
            raise DataError(f"{path}: cannot read: {e.strerror}") from None
        try:
            with gzip.GzipFile(fileobj=f, mode="rb") as z:
                # the +1 probe reaches the member's end, so its CRC and length are checked
                return _parse(z, path, None, "decompressed file")
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path}: corrupt gzip stream ({e})") from None


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write an IDX file (gzip-compressed when the name ends in .gz)."""
    arr = np.asarray(array)
    be = arr.dtype.newbyteorder(">") if arr.dtype.itemsize > 1 else arr.dtype
    if be not in _CODES and arr.dtype not in DTYPES.values():
        raise DataError(f"{path}: dtype {arr.dtype} has no IDX code")
    code = _CODES.get(be, _CODES.get(arr.dtype.newbyteorder(">")))
    body = bytes([0, 0, code, arr.ndim]) + np.array(arr.shape, ">u4").tobytes() + arr.astype(be).tobytes()
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.write(gzip.compress(body, compresslevel=1) if path.endswith(".gz") else body)
