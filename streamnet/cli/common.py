"""What the cluster commands share: reading the secret, connecting to ZooKeeper."""
from __future__ import annotations

import argparse
import os
import stat

from ..errors import StreamnetError


def add_cluster_options(p: argparse.ArgumentParser, zk_required: bool = True) -> None:
    p.add_argument("--zk", required=zk_required, metavar="HOST:PORT[,HOST:PORT...]",
                   default=os.environ.get("STREAMNET_ZK"), help="ZooKeeper ensemble (or $STREAMNET_ZK)")
    p.add_argument("--cluster", default=os.environ.get("STREAMNET_CLUSTER", "default"),
                   help="cluster name: several clusters share one ensemble (default: default)")
    p.add_argument("--secret-file", default=os.environ.get("STREAMNET_SECRET_FILE"),
                   help="file holding the cluster secret (or $STREAMNET_SECRET_FILE)")
    p.add_argument("--session-timeout", type=float, default=10.0,
                   help="ZooKeeper session timeout in seconds: how long until a dead worker is declared dead")


def add_allow_option(p: argparse.ArgumentParser) -> None:
    from ..runtime.topology import DEFAULT_ALLOWED_MODULES
    p.add_argument("--allow-module", action="append", default=[], metavar="PREFIX[,PREFIX...]",
                   help="module prefix that topologies may take component and grouping classes from "
                        "(repeatable; default: $STREAMNET_ALLOW_MODULES, else "
                        f"{','.join(DEFAULT_ALLOWED_MODULES)})")


def allowed_modules(a: argparse.Namespace | None = None) -> tuple[str, ...]:
    """The worker's --allow-module list; else $STREAMNET_ALLOW_MODULES (which is also
    what `streamnet-submit submit` checks against: keep the two in agreement); else
    the project's own packages."""
    from ..runtime.topology import DEFAULT_ALLOWED_MODULES
    items = list(getattr(a, "allow_module", None) or []) or [os.environ.get("STREAMNET_ALLOW_MODULES", "")]
    given = tuple(p.strip() for item in items for p in item.split(",") if p.strip())
    return given or DEFAULT_ALLOWED_MODULES


MIN_SECRET_BYTES = 32


def read_secret(path: str | None) -> bytes:
    """The cluster secret: a file of at least MIN_SECRET_BYTES, owned by this user,
    that nobody else may read or write (mode 0600 or 0400)."""
    if not path:
        raise StreamnetError("a cluster secret is required: pass --secret-file FILE (make one with "
                             "`streamnet-submit new-secret FILE`)")
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            secret = f.read().strip()
    except FileNotFoundError:
        raise StreamnetError(f"secret file {path} does not exist (make one with "
                             f"`streamnet-submit new-secret {path}`)") from None
    except OSError as e:
        raise StreamnetError(f"cannot read secret file {path}: {e.strerror}") from None
    if st.st_mode & 0o077:
        raise StreamnetError(f"secret file {path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read or "
                             f"change it; run: chmod 600 {path}")
    if st.st_uid != os.getuid():
        raise StreamnetError(f"secret file {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()}); "
                             f"run: chown {os.getuid()} {path}")
    if len(secret) < MIN_SECRET_BYTES:
        raise StreamnetError(f"secret file {path} holds {len(secret)} bytes; use at least {MIN_SECRET_BYTES} "
                             f"(`streamnet-submit new-secret FILE` writes one)")
    return secret


def write_secret(path: str) -> None:
    """A new secret: 48 random bytes as base64 (64 characters), mode 0600; never
    overwrites a file (that would lock the cluster's workers out)."""
    import base64
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise StreamnetError(f"{path} exists; remove it first if you mean to replace the cluster secret") from None
    except OSError as e:
        raise StreamnetError(f"cannot create {path}: {e.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)        # whatever the umask
        f.write(base64.b64encode(os.urandom(48)) + b"\n")


def connect(a: argparse.Namespace):
    """(coordinator, ClusterState) for the options; clear errors for the usual faults."""
    from ..runtime.control.cluster_state import ClusterState
    from ..runtime.control.zk import ZkCoordinator
    if not a.zk:
        raise StreamnetError("no ZooKeeper ensemble given: pass --zk HOST:PORT (or set STREAMNET_ZK)")
    secret = read_secret(a.secret_file)
    coord = ZkCoordinator(a.zk, secret, session_timeout=a.session_timeout,
                          connect_timeout=a.session_timeout)
    try:
        return coord, ClusterState(coord, a.cluster), secret
    except BaseException:
        coord.close()
        raise
