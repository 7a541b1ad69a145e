import numpy as np
import pytest

from streamnet.training.checkpoint import CheckpointError, read_checkpoint, write_checkpoint


def test_round_trip_and_pointer(tmp_path):
    p = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    ptr = write_checkpoint(str(tmp_path), "run", 7, p)
    assert ptr["step"] == 7 and ptr["path"].endswith("run-00000007.ckpt") and ptr["bytes"] == 4000
    np.testing.assert_array_equal(read_checkpoint(ptr["path"], ptr["sha256"]), p)
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]


def test_corrupt_checkpoint_is_refused(tmp_path):
    ptr = write_checkpoint(str(tmp_path), "run", 1, np.ones(100, np.float32))
    raw = bytearray(open(ptr["path"], "rb").read())
    raw[-5] ^= 0xFF
    open(ptr["path"], "wb").write(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt"):
        read_checkpoint(ptr["path"])
    (tmp_path / "junk.ckpt").write_bytes(b"hello")
    with pytest.raises(CheckpointError, match="not a streamnet checkpoint"):
        read_checkpoint(str(tmp_path / "junk.ckpt"))


def test_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    first = write_checkpoint(str(tmp_path), "run", 1, np.ones(10, np.float32))
    import errno
    import os

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device"):
        write_checkpoint(str(tmp_path), "run", 2, np.zeros(10, np.float32))
    monkeypatch.undo()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["run-00000001.ckpt"]  # no temp file left
    np.testing.assert_array_equal(read_checkpoint(first["path"]), np.ones(10))
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        write_checkpoint(str(tmp_path / "a-file" / "sub"), "run", 3, np.ones(10, np.float32))
