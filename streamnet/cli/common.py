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


def read_secret(path: str | None) -> bytes:
    if not path:
        raise StreamnetError("a cluster secret is required: pass --secret-file FILE (make one with "
                             "`head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE`)")
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise StreamnetError(f"secret file {path} does not exist") from None
    except OSError as e:
        raise StreamnetError(f"cannot read secret file {path}: {e.strerror}") from None
    if len(secret) < 16:
        raise StreamnetError(f"secret file {path} holds {len(secret)} bytes; use at least 16")
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        import logging
        logging.getLogger("streamnet").warning("secret file %s is readable by others; chmod 600 it", path)
    return secret


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
