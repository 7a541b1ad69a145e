"""Atomic training checkpoints: temporary file, fsync, rename, SHA-256.

A checkpoint is one file, `<name>-<step>.ckpt`:

    b"SNCK2\\n" + sha256 hex of the body + b"\\n" + body

and the body is msgpack of a plain dict: the parameters after `step` synchronisation
rounds and, for a checkpoint meant for resuming, everything else the run needs to
continue as if it had never stopped (the outer optimiser's velocity, each unit's
inner velocity and dropout counters, the position in the data schedule, the
sample counters). numpy arrays travel as {"__nd__": [dtype, shape, bytes]}.

A reader never sees half a file (rename), and a file whose checksum does not match
is refused with an error naming it; `latest_checkpoint` then falls back to the
previous one.
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import tempfile

import msgpack
import numpy as np

from ..errors import StreamnetError

log = logging.getLogger(__name__)

MAGIC = b"SNCK2\n"
_DTYPES = {"<f4", "<f8", "<i4", "<i8", "|u1"}


class CheckpointError(StreamnetError):
    pass


def _pack(obj):
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        return {"__nd__": [a.dtype.str, list(a.shape), a.tobytes()]}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}")


def _unpack(d: dict):
    if "__nd__" in d:
        dtype, shape, raw = d["__nd__"]
        if dtype not in _DTYPES:
            raise ValueError(f"unexpected array type {dtype}")
        return np.frombuffer(raw, np.dtype(dtype)).reshape(shape).copy()
    return d


def checkpoint_path(directory: str, name: str, step: int) -> str:
    return os.path.join(directory, f"{name}-{step:08d}.ckpt")


def write_checkpoint(directory: str, name: str, step: int, params: np.ndarray, state: dict | None = None) -> dict:
    """Write atomically; return the pointer {step, path, sha256, bytes}."""
    path = checkpoint_path(directory, name, step)
    body = msgpack.packb({"step": int(step), "params": np.asarray(params, np.float32), "state": state},
                         default=_pack, use_bin_type=True)
    digest = hashlib.sha256(body).hexdigest()
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            head = MAGIC + digest.encode() + b"\n"
            f.write(head + body)
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
    return {"step": int(step), "path": path, "sha256": digest, "bytes": len(head) + len(body)}


def load_checkpoint(path: str, expected_sha256: str | None = None) -> dict:
    """{"step", "params", "state"} of a verified checkpoint; CheckpointError otherwise."""
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
        raise CheckpointError(f"{path} is corrupt: checksum {actual[:12]}... does not match "
                              f"{(expected_sha256 or digest)[:12]}...")
    try:
        ck = msgpack.unpackb(body, object_hook=_unpack, raw=False, strict_map_key=False)
        if not isinstance(ck, dict) or not isinstance(ck.get("params"), np.ndarray) or ck["params"].dtype != np.float32:
            raise ValueError("no float32 parameter vector")
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise CheckpointError(f"{path} is corrupt: {e}") from None
    ck["sha256"] = actual
    return ck


def read_checkpoint(path: str, expected_sha256: str | None = None) -> np.ndarray:
    """The parameter vector of a verified checkpoint."""
    return load_checkpoint(path, expected_sha256)["params"]


def list_checkpoints(directory: str, name: str) -> list[tuple[int, str]]:
    """(step, path) of the checkpoints of `name` in `directory`, newest first."""
    pattern = re.compile(re.escape(name) + r"-(\d{8,})\.ckpt$")
    found = []
    for path in glob.glob(os.path.join(glob.escape(directory), glob.escape(name) + "-*.ckpt")):
        m = pattern.search(os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


def latest_checkpoint(directory: str, name: str, resumable: bool = True) -> tuple[str, dict]:
    """The newest checkpoint of `name` that verifies (and, with `resumable`, holds the
    full training state); each refused one is logged and the previous one tried."""
    candidates = list_checkpoints(directory, name)
    if not candidates:
        raise CheckpointError(f"no checkpoint of {name!r} in {directory}")
    refused = []
    for _, path in candidates:
        try:
            ck = load_checkpoint(path)
        except CheckpointError as e:
            log.error("refusing checkpoint: %s; trying the previous one", e)
            refused.append(str(e))
            continue
        if resumable and not ck.get("state"):
            refused.append(f"{path} holds parameters only (not a resumable checkpoint)")
            log.error("refusing checkpoint: %s; trying the previous one", refused[-1])
            continue
        return path, ck
    raise CheckpointError(f"no usable checkpoint of {name!r} in {directory}: " + "; ".join(refused))
