"""Atomic, authenticated training checkpoints: temporary file, fsync, rename, MAC.

A checkpoint is one file, `<name>-<step>.ckpt`:

    b"SNCK3\n" + sha256 hex of the body + b" " + HMAC-SHA256 hex of the body + b"\n" + body

The MAC's key is derived from the cluster secret (`signing_with`, used by
streamnet-worker and by clients that hold the secret): a checkpoint changed by
someone without the secret - on a shared filesystem, say - is refused on load and
resume with an error naming the file. A process with no secret (the embedded local
cluster, whose secret is random per run) writes the unkeyed form, b"SNCK2\n" +
sha256 hex + b"\n" + body, and checks only the SHA-256; a process with the key
refuses unkeyed files, since anyone could have written them.

The body is msgpack of a plain dict: the run's name and the step (checked against the
file's name on load: the MAC covers the body only, so a checkpoint renamed to stand
for another run or step is refused), the parameters after `step` synchronisation
rounds and, for a checkpoint meant for resuming, everything else the run needs to
continue as if it had never stopped (the outer optimiser's velocity, each unit's
inner velocity and dropout counters, the position in the data schedule, the
sample counters). numpy arrays travel as {"__nd__": [dtype, shape, bytes]}.

A reader never sees half a file (rename); `latest_checkpoint` falls back to the
previous one when the newest is refused. Each write keeps the newest `keep`
checkpoints of its run (DEFAULT_KEEP; 0 keeps all) and removes temporary files
that a crash mid-write left behind. A run resumed from an older checkpoint first sets
aside the newer ones (`set_aside_newer`), so that "newest" stays the resumed run's.
"""
from __future__ import annotations

import glob
import hashlib
import hmac
import logging
import os
import re
import tempfile
import time
from contextlib import contextmanager

import msgpack
import numpy as np

from ..errors import StreamnetError

log = logging.getLogger(__name__)

MAGIC = b"SNCK3\n"           # keyed
MAGIC_UNKEYED = b"SNCK2\n"
_DTYPES = {"<f4", "<f8", "<i4", "<i8", "|u1"}
DEFAULT_KEEP = 3               # checkpoints kept per run: the newest, and two to fall back on
STALE_TMP_S = 600.0            # a temporary file this old is a write that died, not one in progress

_cluster_key: bytes | None = None
_root: str | None = None       # where checkpoints may be, in this process (`confined_to`)


def checkpoint_key(secret: bytes) -> bytes:
    """The checkpoints' MAC key, derived from the cluster secret (never the secret itself)."""
    return hmac.new(secret, b"streamnet checkpoint", hashlib.sha256).digest()


@contextmanager
def signing_with(secret: bytes | None):
    """Within this block, sign and verify this process's checkpoints with a key derived
    from `secret` (None: unkeyed, as the embedded local cluster does); the key before
    it comes back after."""
    global _cluster_key
    before, _cluster_key = _cluster_key, checkpoint_key(secret) if secret else None
    try:
        yield
    finally:
        _cluster_key = before


class CheckpointError(StreamnetError):
    pass


@contextmanager
def confined_to(root: str | None):
    """Within this block, checkpoints are written and read under `root` only (None: any
    path): streamnet-worker's --checkpoint-root, since the directory a run checkpoints to
    and the file it resumes from are named by whoever submits it."""
    global _root
    before, _root = _root, os.path.realpath(root) if root else None
    try:
        yield
    finally:
        _root = before


def check_under_root(path: str) -> None:
    """CheckpointError unless `path` (symbolic links followed) lies under this process's
    checkpoint root, if it has one."""
    real = os.path.realpath(path)
    if _root is not None and os.path.commonpath([real, _root]) != _root:
        shown = path if real == path else f"{path} ({real})"
        raise CheckpointError(f"{shown} is not under this worker's checkpoint root {_root} (streamnet-worker "
                              "--checkpoint-root): name a checkpoint directory or file under it")


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


def write_checkpoint(directory: str, name: str, step: int, params: np.ndarray, state: dict | None = None, *,
                     keep: int = DEFAULT_KEEP, key: bytes | None = None) -> dict:
    """Write atomically, signed with `key` (default: this process's cluster key), then
    keep only the newest `keep` checkpoints of `name`; return the pointer
    {step, path, sha256, bytes}."""
    key = key if key is not None else _cluster_key
    check_under_root(directory)
    path = checkpoint_path(directory, name, step)
    body = msgpack.packb({"name": name, "step": int(step), "params": np.asarray(params, np.float32),
                          "state": state}, default=_pack, use_bin_type=True)
    digest = hashlib.sha256(body).hexdigest()
    if key:
        head = MAGIC + digest.encode() + b" " + hmac.new(key, body, hashlib.sha256).hexdigest().encode() + b"\n"
    else:
        head = MAGIC_UNKEYED + digest.encode() + b"\n"
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
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
    clean_up(directory, name, keep, written=path)
    return {"step": int(step), "path": path, "sha256": digest, "bytes": len(head) + len(body)}


def clean_up(directory: str, name: str, keep: int = DEFAULT_KEEP, written: str | None = None) -> list[str]:
    """Remove all but the newest `keep` checkpoints of `name` (never `written`, the one
    just written: a run resumed from an older step writes below the newest), and
    temporary files older than STALE_TMP_S. keep=0 keeps every checkpoint. Returns
    what it removed; a file it cannot remove is logged, not raised (the checkpoint
    itself was written)."""
    doomed = []
    if keep > 0:
        others = [p for _, p in list_checkpoints(directory, name) if p != written]
        doomed += others[keep - 1:] if written else others[keep:]
    now = time.time()
    for tmp in glob.glob(os.path.join(glob.escape(directory), "." + glob.escape(name) + "-*.tmp")):
        try:
            if now - os.stat(tmp).st_mtime > STALE_TMP_S:
                doomed.append(tmp)
        except OSError:
            pass      # gone meanwhile
    removed = []
    for path in doomed:
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove old checkpoint file %s: %s", path, e.strerror)
    return removed


SUPERSEDED = "superseded"       # subdirectory where a resume sets aside the checkpoints it goes back past


def set_aside_newer(directory: str, name: str, step: int) -> list[str]:
    """Move the checkpoints of `name` in `directory` newer than `step` into
    `directory/superseded/` and return where they went. A run resumed from an older
    checkpoint (`--resume FILE`, or the newest refused) writes below them: left in place,
    the next `--resume` would continue the abandoned run instead, and retention, which
    goes by step, would remove the resumed run's own checkpoints first. Nothing is
    deleted; CheckpointError if one cannot be moved."""
    newer = [p for s, p in list_checkpoints(directory, name) if s > step]
    if not newer:
        return []
    aside = os.path.join(directory, SUPERSEDED)
    moved = []
    try:
        os.makedirs(aside, exist_ok=True)
        for path in newer:
            target = os.path.join(aside, os.path.basename(path))
            n = 1
            while os.path.exists(target):       # set aside before, by an earlier resume
                target = os.path.join(aside, f"{os.path.basename(path)}.{n}")
                n += 1
            os.rename(path, target)
            moved.append(target)
    except OSError as e:
        raise CheckpointError(f"cannot set aside the checkpoints of {name!r} newer than step {step} "
                              f"in {directory} (a resumed run would be mixed with them): {e.strerror or e}") from None
    return moved


def load_checkpoint(path: str, expected_sha256: str | None = None, *, key: bytes | None = None) -> dict:
    """{"step", "params", "state", "sha256", "authenticated"} of a verified checkpoint;
    CheckpointError otherwise. With a key (default: this process's cluster key) the file
    must carry a good MAC; without one only its SHA-256 can be checked."""
    key = key if key is not None else _cluster_key
    check_under_root(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror}") from None
    keyed = raw.startswith(MAGIC)
    if keyed and len(raw) >= len(MAGIC) + 130 and raw[len(MAGIC) + 64:len(MAGIC) + 65] == b" ":
        digest, tag, body = raw[len(MAGIC):len(MAGIC) + 64], raw[len(MAGIC) + 65:len(MAGIC) + 129], \
            raw[len(MAGIC) + 130:]
    elif raw.startswith(MAGIC_UNKEYED) and len(raw) >= len(MAGIC_UNKEYED) + 65:
        digest, tag, body = raw[len(MAGIC_UNKEYED):len(MAGIC_UNKEYED) + 64], None, raw[len(MAGIC_UNKEYED) + 65:]
    else:
        raise CheckpointError(f"{path} is not a streamnet checkpoint")
    digest = digest.decode(errors="replace")
    actual = hashlib.sha256(body).hexdigest()
    if actual != digest or (expected_sha256 and actual != expected_sha256):
        raise CheckpointError(f"{path} is corrupt: checksum {actual[:12]}... does not match "
                              f"{(expected_sha256 or digest)[:12]}...")
    if key and tag is None:
        raise CheckpointError(f"{path} is not authenticated (written without the cluster secret, or changed "
                              "to look so): refusing it; resume from a checkpoint this cluster wrote")
    if key and not hmac.compare_digest(hmac.new(key, body, hashlib.sha256).hexdigest().encode(), tag):
        raise CheckpointError(f"{path} was changed by someone without the cluster secret (its MAC does not "
                              "match; or it was written by another cluster): refusing it")
    try:
        ck = msgpack.unpackb(body, object_hook=_unpack, raw=False, strict_map_key=False)
        if not isinstance(ck, dict) or not isinstance(ck.get("params"), np.ndarray) or ck["params"].dtype != np.float32:
            raise ValueError("no float32 parameter vector")
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise CheckpointError(f"{path} is corrupt: {e}") from None
    _check_named(path, ck)
    ck["sha256"] = actual
    ck["authenticated"] = bool(key)
    return ck


_FILE_NAME = re.compile(r"(.+)-(\d{8,})\.ckpt$")


def _check_named(path: str, ck: dict) -> None:
    """A file named as checkpoint_path names one must hold that run's checkpoint of that
    step: the name and step inside are under the MAC, the file's name is not, so a
    checkpoint renamed to stand for another run or another step is refused. (A file a
    user named otherwise, an export's copy say, is read as what it holds.) Files written
    before the name was kept inside have only their step checked."""
    m = _FILE_NAME.match(os.path.basename(path))
    if m is None:
        return
    name, step = m.group(1), int(m.group(2))
    inside = ck.get("name")
    if ck.get("step") != step or (inside is not None and inside != name):
        holds = f"run {inside!r}'s step {ck.get('step')}" if inside is not None else f"step {ck.get('step')}"
        raise CheckpointError(f"{path} holds {holds}, not run {name!r}'s step {step} as its file name says "
                              "(renamed, or copied over another): refusing it")


def read_checkpoint(path: str, expected_sha256: str | None = None) -> np.ndarray:
    """The parameter vector of a verified checkpoint."""
    return load_checkpoint(path, expected_sha256)["params"]


def list_checkpoints(directory: str, name: str) -> list[tuple[int, str]]:
    """(step, path) of the checkpoints of `name` in `directory`, newest first."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(directory), glob.escape(name) + "-*.ckpt")):
        m = _FILE_NAME.match(os.path.basename(path))
        if m and m.group(1) == name:        # not another run's whose name starts with this one's
            found.append((int(m.group(2)), path))
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
