"""The secret file (issue 15): mode 0600, owned by the user, at least 32 bytes;
`streamnet-submit new-secret FILE` writes one."""
import os

import pytest

from streamnet.cli.common import read_secret
from streamnet.cli.submit import main
from streamnet.errors import StreamnetError


def _file(tmp_path, data: bytes, mode: int):
    p = tmp_path / "secret"
    p.write_bytes(data)
    p.chmod(mode)
    return str(p)


def test_a_secret_others_may_read_is_refused_with_the_chmod_line(tmp_path):
    path = _file(tmp_path, b"s" * 40, 0o644)
    with pytest.raises(StreamnetError, match=rf"mode 0644: others may read or change it; run: chmod 600 {path}"):
        read_secret(path)
    os.chmod(path, 0o620)
    with pytest.raises(StreamnetError, match="mode 0620"):
        read_secret(path)
    os.chmod(path, 0o600)
    assert read_secret(path) == b"s" * 40


def test_a_short_secret_is_refused(tmp_path):
    with pytest.raises(StreamnetError, match="holds 31 bytes; use at least 32"):
        read_secret(_file(tmp_path, b"s" * 31 + b"\n", 0o600))


def test_a_device_a_fifo_or_a_huge_file_is_refused_before_it_is_read(tmp_path):
    """/dev/zero was read to a MemoryError, a FIFO waited for a writer for ever."""
    with pytest.raises(StreamnetError, match="/dev/zero is not a regular file"):
        read_secret("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(StreamnetError, match="fifo is not a regular file"):
        read_secret(str(fifo))                      # returns at once: no writer is waited for
    with pytest.raises(StreamnetError, match="holds 10,000,000 bytes, more than such a file does"):
        read_secret(_file(tmp_path, b"s" * 10_000_000, 0o600))


def test_new_secret_writes_a_valid_one_and_never_overwrites(tmp_path, capsys):
    path = str(tmp_path / "new")
    old = os.umask(0o022)               # a usual umask would give 0644
    try:
        assert main(["new-secret", path]) == 0
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o600
    secret = read_secret(path)
    assert len(secret) >= 32
    assert main(["new-secret", path]) == 2 and "exists" in capsys.readouterr().err
    assert read_secret(path) == secret
