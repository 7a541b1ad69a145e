"""Reading a file only its owner may read: the cluster secret, the monitor token."""
from __future__ import annotations

import os
import stat

from .errors import StreamnetError


#: a secret, a credential or a token is a few hundred bytes; past this it is not one
MAX_PRIVATE_BYTES = 64 << 10


def read_private(path: str, what: str, missing_hint: str = "") -> bytes:
    """The stripped content of `path`, which must be a regular file of this user closed to
    everyone else (mode 0600 or 0400), of at most MAX_PRIVATE_BYTES; StreamnetError naming
    `what`, the file and the fix. Opened without blocking and checked before it is read:
    /dev/zero was read to a MemoryError, and a FIFO waited for a writer for ever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise StreamnetError(f"{what} {path} does not exist{missing_hint}") from None
    except OSError as e:
        raise StreamnetError(f"cannot read {what} {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StreamnetError(f"{what} {path} is not a regular file; give the file that holds it")
        if st.st_size > MAX_PRIVATE_BYTES:
            raise StreamnetError(f"{what} {path} holds {st.st_size:,} bytes, more than such a file does "
                                 f"({MAX_PRIVATE_BYTES:,} at most): is it the right file?")
        if st.st_mode & 0o077:
            raise StreamnetError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read or "
                                 f"change it; run: chmod 600 {path}")
        if st.st_uid != os.getuid():
            raise StreamnetError(f"{what} {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()}); "
                                 f"run: chown {os.getuid()} {path}")
        try:
            return f.read(MAX_PRIVATE_BYTES + 1).strip()
        except OSError as e:
            raise StreamnetError(f"cannot read {what} {path}: {e.strerror}") from None
