"""What the cluster commands share: reading the secret, connecting to ZooKeeper."""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys

from ..errors import StreamnetError
from ..private_file import read_private


ENVIRONMENT = """environment: STREAMNET_ZK, STREAMNET_ZK_ROOT, STREAMNET_ZK_TLS, STREAMNET_CLUSTER and
STREAMNET_SECRET_FILE are the defaults of --zk, --zk-root, --zk-tls, --cluster and --secret-file; a flag
given wins."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line ("PROG: error: ...; see PROG --help"), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def completing(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`p`, after answering the shell's tab completion if this run is one: the shell
    runs the command with $_ARGCOMPLETE set (argcomplete's protocol), and the answer
    is written and the process ends here, before anything else is done."""
    import argcomplete
    argcomplete.autocomplete(p)
    return p


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v
    try:
        return v("streamnet")
    except PackageNotFoundError:
        return "unknown"


def add_common_options(p: argparse.ArgumentParser, log_level: str) -> None:
    """--version and --log-level, the same on every command."""
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=log_level,
                   help=f"one of {', '.join(LOG_LEVELS)} (any case; default {log_level})")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def zk_hosts(text: str) -> str:
    """--zk: HOST:PORT[,HOST:PORT...] with numeric ports, checked before connecting."""
    for part in text.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon:
            host, port = part.strip(), "2181"
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not HOST:PORT with a port from 1 to 65535")
    return text


def port_number(text: str) -> int:
    n = _int(text)
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"must be from 0 to 65535 (0: any free port); got {n}")
    return n


def positive_int(text: str) -> int:
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {n}")
    return n


def threads_option(text: str) -> int | str:
    """--threads: a number of compute threads (at most an assignment's MAX_THREADS: a
    worker starts them all at once), or 'auto'."""
    from ..runtime.assignment import MAX_THREADS
    if text == "auto":
        return text
    try:
        n = positive_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}, or 'auto'") from None
    if n > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_THREADS}; got {n}")
    return n


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < x < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text}")
    return x


#: --session-timeout's ceiling: ZooKeeper grants at most 20 of its ticks anyway (40 s at its
#: default 2 s tick); far above, kazoo's connect overflowed or hung
MAX_SESSION_TIMEOUT_S = 3600.0


def session_timeout(text: str) -> float:
    x = positive_float(text)
    if x > MAX_SESSION_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SESSION_TIMEOUT_S:.0f} seconds (ZooKeeper grants "
                                         f"at most 20 of its ticks); got {text}")
    return x


def worker_name(text: str) -> str:
    """--name: one element of a ZooKeeper path, in ASCII (the handshake's fields are)."""
    from ..runtime.names import name_problem
    problem = name_problem(text) or (None if text.isascii() else f"must be ASCII; got {text!r}")
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def parse_set(items: list[str], flag: str = "--set", what: str = "KEY=VALUE") -> dict:
    """KEY=VALUE options, the one parser for --set, --parallelism and --threads; a value
    that is JSON (5000, 0.5, true, "x") is read as JSON, anything else is a string."""
    out = {}
    for kv in items:
        k, eq, v = kv.partition("=")
        if not eq or not k.strip():
            raise StreamnetError(f"{flag} takes {what}; got {kv!r}")
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def check_writable(path: str | None, flag: str) -> None:
    """Refuse an output path before a run starts, not after it."""
    if not path:
        return
    d = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise StreamnetError(f"{flag} {path} is a directory; give a file name")
    if not os.path.isdir(d):
        raise StreamnetError(f"{flag} {path}: directory {d} does not exist")
    if not os.access(d, os.W_OK):
        raise StreamnetError(f"{flag} {path}: directory {d} is not writable")


class BadEnvironment:
    """An environment default that does not parse: kept as it is (argparse would check a
    string default against the flag's type and blame the flag), refused by connect()
    naming the variable."""

    def __init__(self, variable: str, value: str, why: str):
        self.variable, self.value, self.why = variable, value, why

    def error(self) -> StreamnetError:
        return StreamnetError(f"${self.variable}: {self.why} (set it right, or pass the flag)")

    def __str__(self) -> str:
        return self.value


def _zk_from_environment():
    text = os.environ.get("STREAMNET_ZK") or None
    if text is None:
        return None
    try:
        return zk_hosts(text)
    except argparse.ArgumentTypeError as e:
        return BadEnvironment("STREAMNET_ZK", text, str(e))


def _zk_root_default() -> str:
    return os.environ.get("STREAMNET_ZK_ROOT") or "/streamnet"


def add_cluster_options(p: argparse.ArgumentParser, zk_required: bool = True) -> None:
    # not argparse-required: $STREAMNET_ZK may supply it, and connect() says what is missing
    p.add_argument("--zk", type=zk_hosts, metavar="HOST:PORT[,HOST:PORT...]", default=_zk_from_environment(),
                   help="ZooKeeper ensemble (default: $STREAMNET_ZK)" + ("; required" if zk_required else ""))
    p.add_argument("--zk-root", default=_zk_root_default(), metavar="PATH",
                   help="ZooKeeper node the cluster lives under; it belongs to the cluster whose worker made it, "
                        "so clusters of different secrets need different roots (default: $STREAMNET_ZK_ROOT, "
                        "else /streamnet)")
    p.add_argument("--zk-tls", default=os.environ.get("STREAMNET_ZK_TLS") or None, metavar="DIR",
                   help="talk to ZooKeeper over TLS with DIR's ca.pem, client.pem and client-key.pem (as "
                        "deploy/zookeeper.sh --tls-dir makes them; default: $STREAMNET_ZK_TLS)")
    p.add_argument("--cluster", default=os.environ.get("STREAMNET_CLUSTER", "default"),
                   help="cluster name: several clusters share one ensemble (default: $STREAMNET_CLUSTER, else "
                        "default)")
    p.add_argument("--secret-file", default=os.environ.get("STREAMNET_SECRET_FILE") or None,
                   help="file holding the cluster secret (default: $STREAMNET_SECRET_FILE)")
    p.add_argument("--session-timeout", type=session_timeout, default=10.0,
                   help="ZooKeeper session timeout in seconds: how long until a dead worker is declared dead "
                        "(default: 10; the server grants 2 to 20 of its ticks, at most "
                        f"{MAX_SESSION_TIMEOUT_S:.0f} asked)")


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
    secret = read_private(path, "secret file", f" (make one with `streamnet-submit new-secret {path}`)")
    if len(secret) < MIN_SECRET_BYTES:
        raise StreamnetError(f"secret file {path} holds {len(secret)} bytes; use at least {MIN_SECRET_BYTES} "
                             f"(`streamnet-submit new-secret FILE` writes one)")
    return secret


def write_secret(path: str, content: bytes | None = None) -> None:
    """A new secret (48 random bytes as base64, 64 characters), or `content` (a role
    credential), mode 0600; never overwrites a file (that would lock the cluster's
    workers out)."""
    import base64
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise StreamnetError(f"{path} exists; remove it first if you mean to replace the cluster secret") from None
    except OSError as e:
        raise StreamnetError(f"cannot create {path}: {e.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)        # whatever the umask
        f.write(content if content is not None else base64.b64encode(os.urandom(48)) + b"\n")


_warned_full_access = False


def connect(a: argparse.Namespace, worker: bool = False):
    """(coordinator, ClusterState, secret) for the options; clear errors for the usual
    faults. A worker needs the cluster secret; a client may hold a submit or observer
    credential instead (runtime/control/roles.py), and is warned once when it holds
    the cluster secret (which lets it do whatever a worker does)."""
    from ..runtime.control import roles
    from ..runtime.control.cluster_state import ClusterState, check_place
    from ..runtime.control.zk import ZkCoordinator
    global _warned_full_access
    if not a.zk:
        raise StreamnetError("no ZooKeeper ensemble given: pass --zk HOST:PORT (or set STREAMNET_ZK)")
    if isinstance(a.zk, BadEnvironment):
        raise a.zk.error()
    check_place(a.cluster, getattr(a, "zk_root", None) or _zk_root_default())
    secret = read_secret(a.secret_file)
    role = roles.parse(secret)[0].role
    if worker and role != roles.WORKER:
        raise StreamnetError(f"{a.secret_file} holds {'an' if role[0] in 'aeiou' else 'a'} {role} credential; a "
                             "worker needs the cluster secret itself")
    if not worker and role == roles.WORKER and not _warned_full_access:
        _warned_full_access = True
        logging.getLogger("streamnet").warning(
            "%s holds the cluster secret, which lets this client do anything a worker does (write assignments, "
            "register workers); give submitters a submit credential (`streamnet-submit new-credential submit "
            "FILE`) and read-only tools an observer one", a.secret_file)
    coord = ZkCoordinator(a.zk, secret, session_timeout=a.session_timeout, connect_timeout=a.session_timeout,
                          tls=getattr(a, "zk_tls", None))
    try:
        return coord, ClusterState(coord, a.cluster, root=getattr(a, "zk_root", None) or _zk_root_default()), secret
    except BaseException:
        coord.close()
        raise


def error_exit(prog: str, e: StreamnetError) -> int:
    """One line on stderr for an error streamnet raised on purpose, and its exit code:
    1 when the coordinator is away or has no quorum, or a topology failed on the cluster,
    timed out or was killed before its end, or training diverged (the README's exit codes:
    not usage errors), else 2."""
    from ..runtime.control import ClusterTimeout, TopologyFailed, TopologyGone
    from ..runtime.control.coordinator import ConnectionLostError
    from ..training.bp import TrainingDiverged
    print(f"{prog}: error: {e}", file=sys.stderr)
    return 1 if isinstance(e, (ConnectionLostError, TopologyFailed, ClusterTimeout, TopologyGone,
                               TrainingDiverged)) else 2


def interrupted(e: BaseException) -> bool:
    """Whether `e` is a KeyboardInterrupt (Ctrl-C, or SIGTERM where a command maps it so)
    or was raised because of one. Python raises the interrupt in whatever Python code runs
    when the signal lands; when that is numba's own (it unpickles a compiled function's
    constants on a call), numba hands it on wrapped in a SystemError."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False
