"""Atomic checkpoints of a flat parameter vector: temporary file, fsync, rename,
SHA-256 - a reader never sees half a file, and a corrupt one is refused."""
from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np

from ..errors import StreamnetError

MAGIC = b"SNCK1\n"


class CheckpointError(StreamnetError):
    pass


def write_checkpoint(directory: str, name: str, step: int, params: np.ndarray, meta: bytes = b"") -> dict:
    """Write atomically; return the pointer {step, path, sha256, bytes}."""
    path = os.path.join(directory, f"{name}-{step:08d}.ckpt")
    body = np.ascontiguousarray(params, dtype=np.float32).tobytes()
    digest = hashlib.sha256(body).hexdigest()
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + digest.encode() + b"\n" + body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)  # the rename itself is durable
        finally:
            os.close(dfd)
    except OSError as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise CheckpointError(f"cannot write checkpoint {path}: {e.strerror or e}") from None
    return {"step": step, "path": path, "sha256": digest, "bytes": len(body)}


def read_checkpoint(path: str, expected_sha256: str | None = None) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror}") from None
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 65:
        raise CheckpointError(f"{path} is not a streamnet checkpoint")
    digest = raw[len(MAGIC):len(MAGIC) + 64].decode(errors="replace")
    body = raw[len(MAGIC) + 65:]
    actual = hashlib.sha256(body).hexdigest()
    if actual != digest or (expected_sha256 and actual != expected_sha256):
        raise CheckpointError(f"{path} is corrupt: checksum {actual[:12]}... does not match {digest[:12]}...")
    if len(body) % 4:
        raise CheckpointError(f"{path} is corrupt: {len(body)} bytes is not a float32 vector")
    return np.frombuffer(body, np.float32).copy()
