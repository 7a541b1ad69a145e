"""IDX files (the MNIST family), raw or gzip-compressed, read with full validation.

Layout: two zero bytes, a dtype code, the number of dimensions, one big-endian
uint32 per dimension, then the values in big-endian C order.
"""
from __future__ import annotations

import gzip
import os
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


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path}: corrupt gzip stream ({e})") from None
    return raw


def parse_idx(raw: bytes, name: str = "<bytes>") -> np.ndarray:
    if len(raw) < 4:
        raise DataError(f"{name}: too short for an IDX header ({len(raw)} bytes)")
    if raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{name}: bad IDX magic {raw[:4].hex()} (must start with 0000)")
    code, ndim = raw[2], raw[3]
    if code not in DTYPES:
        raise DataError(f"{name}: unknown IDX dtype code 0x{code:02x}; known: "
                        + ", ".join(f"0x{c:02x}" for c in DTYPES))
    if not 1 <= ndim <= MAX_DIMS:
        raise DataError(f"{name}: IDX header gives {ndim} dimensions (1..{MAX_DIMS} allowed)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{name}: truncated header: {ndim} dimensions need {header} bytes, file has {len(raw)}")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    dtype = DTYPES[code]
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) < expected:
        raise DataError(f"{name}: truncated: dimensions {dims} need {expected} bytes, file has {len(raw)}")
    if len(raw) > expected:
        raise DataError(f"{name}: {len(raw) - expected} bytes of trailing data after dimensions {dims}")
    return np.frombuffer(raw, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file; any fault raises DataError naming the file and the fault."""
    path = os.fspath(path)
    return parse_idx(_read_bytes(path), path)


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
