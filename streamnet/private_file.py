"""Reading a file only its owner may read: the cluster secret, the monitor token."""
from __future__ import annotations

import os
import stat

from .errors import StreamnetError


def read_private(path: str, what: str, missing_hint: str = "") -> bytes:
    """The stripped content of `path`, which must belong to this user and be closed to
    everyone else (mode 0600 or 0400); StreamnetError naming `what`, the file and the fix."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            content = f.read().strip()
    except FileNotFoundError:
        raise StreamnetError(f"{what} {path} does not exist{missing_hint}") from None
    except OSError as e:
        raise StreamnetError(f"cannot read {what} {path}: {e.strerror}") from None
    if st.st_mode & 0o077:
        raise StreamnetError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read or "
                             f"change it; run: chmod 600 {path}")
    if st.st_uid != os.getuid():
        raise StreamnetError(f"{what} {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()}); "
                             f"run: chown {os.getuid()} {path}")
    return content
