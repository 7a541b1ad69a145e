"""The Coordinator on a real ZooKeeper ensemble, through kazoo.

The session authenticates with one role's digest credential (roles.py: worker,
submit or observer); the cluster's top nodes carry the roles' ACLs, checked at
every start (`secure_cluster`), and every node below one is created with that top
node's ACL. A client without a credential can neither read nor change the cluster
(ZooKeeper answers NoAuth); a submitter cannot write assignments. Connection loss
is retried: reads (idempotent) are sent again after a reconnect, for up to the
session timeout; a write that was in flight when the connection dropped raises
ConnectionLostError, since it may or may not have been applied. Every call but the
watches has a deadline (the session timeout): kazoo queues a request while it has no
connection and would wait for one forever, so without a quorum a caller gets NoQuorumError
("ZooKeeper has no quorum (1 of 3 servers reachable)") instead of hanging. Setting up a
watch reads its node through kazoo's own retries, which wait for the ensemble however
long it is away: callers set watches from threads of their own, never from an event
loop (the worker: _watch_topology). A session that
expires loses its ephemeral nodes, so owners register `on_session_restart`
callbacks to re-create them and resynchronise.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import threading
import time
from concurrent.futures import Future
from typing import Callable

from kazoo import exceptions as kx
from kazoo.client import KazooClient, KazooState
from kazoo.protocol.serialization import Auth as kazoo_auth
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import ACL, Id, Permissions

from . import roles
from .coordinator import (BadVersionError, ConnectionLostError, Coordinator, CoordinatorError, NoNodeError,
                          NodeExistsError, NotEmptyError, SessionClosedError)

log = logging.getLogger(__name__)


class _NoCredentials(logging.Filter):
    """kazoo logs every request it sends at DEBUG, the digest credential of each connect
    included (`Auth(... auth='streamnet:<password>')`): a worker run with --log-level
    DEBUG wrote its role's password to its log. Such a record is logged without it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, kazoo_auth) for a in record.args):
            record.args = tuple("Auth(<credential left out>)" if isinstance(a, kazoo_auth) else a
                                for a in record.args)
        return True


logging.getLogger("kazoo.client").addFilter(_NoCredentials())   # the logger kazoo's connection logs to


@contextlib.contextmanager
def _logged(path: str):
    """A watch callback's error is logged here, not raised into kazoo: a watch's first
    call runs inside its constructor, which re-raised it to the caller (a worker's loop
    over the topologies stopped there, and those after it were never watched)."""
    try:
        yield
    except Exception:  # noqa: BLE001 - the callback's own fault; the watch stays
        log.exception("a watch on %s failed in its callback (the watch goes on)", path)


class UnauthorisedError(CoordinatorError):
    pass


class ClusterAclError(UnauthorisedError):
    """A cluster node's ACL is not what this cluster's roles give it."""


#: roots already warned about in this process (ZkCoordinator.ensure_root)
_warned_open_roots: set[str] = set()


class NoQuorumError(ConnectionLostError):
    """No answer from the ensemble within the call's deadline."""


#: the files of a --zk-tls directory (deploy/zookeeper.sh --tls-dir makes them)
TLS_FILES = {"ca": "ca.pem", "certfile": "client.pem", "keyfile": "client-key.pem"}


def tls_options(directory: str) -> dict:
    """KazooClient's TLS arguments for a --zk-tls directory: the ensemble's CA (the
    server's certificate must be signed by it, and name the host the connection string
    dials) and this client's certificate and key (the ensemble refuses clients without
    one). The key must be private to this user. Without the name check, a host holding
    a client certificate of the same CA (every submitter and UI host does) could pose
    as the ensemble and read the clients' digest credentials."""
    from ...private_file import read_private
    paths = {arg: os.path.join(directory, name) for arg, name in TLS_FILES.items()}
    for arg, path in paths.items():
        if not os.path.isfile(path):
            raise CoordinatorError(f"ZooKeeper TLS: {path} does not exist; a --zk-tls directory holds "
                                   f"{', '.join(TLS_FILES.values())} (deploy/zookeeper.sh --tls-dir makes them)")
    read_private(paths["keyfile"], "ZooKeeper TLS key")
    return {"use_ssl": True, "verify_certs": True, "check_hostname": True, "handler": ClusterCaOnly(), **paths}


class ClusterCaOnly(SequentialThreadingHandler):
    """kazoo's handler, but a TLS connection trusts the ensemble's CA only: kazoo's own
    loads the system's CA store too, so a host showing a certificate for the name dialled
    from any CA the system trusts (a public or a company one) passed as the ensemble and
    read the clients' digest credentials."""

    def create_connection(self, address, hostname=None, timeout=None, use_ssl=False, ca=None, certfile=None,
                          keyfile=None, keyfile_password=None, verify_certs=True, check_hostname=False, **more):
        if not use_ssl:
            return super().create_connection(address, hostname=hostname, timeout=timeout, **more)
        if not (ca and verify_certs):
            raise ValueError("a TLS connection to ZooKeeper needs the ensemble's CA, verified")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)        # certificate required, TLS 1.2 at least
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = check_hostname
        ctx.load_verify_locations(ca)
        if certfile and keyfile:
            ctx.load_cert_chain(certfile=certfile, keyfile=keyfile, password=keyfile_password)
        family = socket.getaddrinfo(address[0], address[1], 0, socket.SOCK_STREAM)[0][0]
        conn = ctx.wrap_socket(socket.socket(family), server_hostname=hostname)
        try:
            conn.settimeout(timeout)
            conn.connect(address)
        except BaseException:
            conn.close()
            raise
        return conn


#: servers kazoo is given at least, the list repeated: it waits session_timeout /
#: len(hosts) for a server's answer to a connect, so with one server a single attempt
#: that is never answered outlasts the session, which the server then expires. Seen
#: after a ZooKeeper restart (tests/integration/test_training_faults.py, within the
#: session): a worker's first attempt was taken and not answered for 10 s, its session
#: expired, its tasks moved. With the list at 3, that attempt gives up after a third
#: of the timeout and the next one finds the server.
CONNECT_ATTEMPTS = 3


def _servers(hosts: str) -> list[str]:
    """The "host:port" entries of a connection string ("h:p,h:p[/chroot]")."""
    return [h.strip() for h in hosts.partition("/")[0].split(",") if h.strip()]


def padded_hosts(hosts: str, at_least: int = CONNECT_ATTEMPTS) -> str:
    """hosts with its servers repeated until at least `at_least` are listed (as is
    where there are that many already); a chroot stays at the end."""
    listed = _servers(hosts)
    if not listed or len(listed) >= at_least:
        return hosts
    _, slash, chroot = hosts.partition("/")
    return ",".join(listed * -(-at_least // len(listed))) + slash + chroot


def reachable_servers(hosts: str, timeout: float = 0.5) -> tuple[int, int]:
    """(servers accepting TCP connections, servers listed): a server without a quorum
    still accepts connections but serves nothing, so this tells "no quorum" apart from
    "nothing there"."""
    servers = _servers(hosts)
    up = 0
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host or server, int(port or 2181)), timeout=timeout):
                up += 1
        except (OSError, ValueError):
            pass
    return up, len(servers)


def describe_outage(hosts: str) -> str:
    up, n = reachable_servers(hosts)
    if up == 0:
        return f"ZooKeeper is unreachable (0 of {n} server{'s' if n != 1 else ''} reachable)"
    if up <= n // 2:
        return f"ZooKeeper has no quorum ({up} of {n} servers reachable)"
    return f"ZooKeeper did not answer ({up} of {n} servers reachable)"


def no_answer(hosts: str, waited: float) -> NoQuorumError:
    return NoQuorumError(f"{describe_outage(hosts)}; gave up after {waited:.1f} s")


def _translate(fn):
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except kx.NoNodeError:
            raise NoNodeError(f"{args[0] if args else ''} does not exist") from None
        except kx.NodeExistsError:
            raise NodeExistsError(f"{args[0] if args else ''} exists") from None
        except kx.BadVersionError:
            raise BadVersionError(f"{args[0] if args else ''} was changed by someone else") from None
        except kx.NotEmptyError:
            raise NotEmptyError(f"{args[0] if args else ''} has children") from None
        except kx.NoAuthError:
            raise UnauthorisedError(f"ZooKeeper refused access to {args[0] if args else 'the cluster'}: "
                                    "wrong cluster secret, or a role that may not do this?") from None
        except kx.ConnectionClosedError:
            raise SessionClosedError("the ZooKeeper client is closed") from None
        except (kx.ConnectionLoss, kx.SessionExpiredError, RetryFailedError) as e:
            raise ConnectionLostError(f"lost the ZooKeeper connection: {type(e).__name__}") from None
        except KazooTimeoutError:
            raise no_answer(self.hosts, self.call_timeout) from None
    wrapper.__name__ = fn.__name__
    return wrapper


class ZkCoordinator(Coordinator):
    def __init__(self, hosts: str, secret: bytes, *, session_timeout: float = 10.0,
                 connect_timeout: float = 10.0, tls: str | None = None):
        """`secret`: a --secret-file's content, the cluster secret (worker role) or a
        submit or observer credential (roles.parse). `tls`: a --zk-tls directory, to
        talk to an ensemble that serves clients over TLS only (tls_options)."""
        self.credential, self._secret = roles.parse(secret)
        self.role = self.credential.role
        self._clusters: dict[str, dict] = {}    # cluster node -> {role: ZooKeeper Id} (secure_cluster)
        self.hosts = hosts
        self.session_timeout = session_timeout
        self.call_timeout = session_timeout
        self._connected = threading.Event()
        self.zk = KazooClient(
            hosts=padded_hosts(hosts), timeout=session_timeout,
            auth_data=[self.credential.auth],
            default_acl=[ACL(Permissions.ALL, self.credential.id)],   # unused: create() passes an ACL
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
            **(tls_options(tls) if tls else {}))
        self._restart_callbacks: list[Callable[[], None]] = []
        self._lost = False
        self._closing = False
        self.state = "CONNECTING"
        self.zk.add_listener(self._listener)
        try:
            self.zk.start(timeout=connect_timeout)
        except KazooTimeoutError:
            self.zk.stop()
            self.zk.close()
            raise no_answer(hosts, connect_timeout) from None

    # -- session ------------------------------------------------------------------------
    def _listener(self, state) -> None:
        self.state = str(state)
        if state != KazooState.CONNECTED:
            self._connected.clear()
        if state == KazooState.LOST and self._closing:
            return
        if state == KazooState.LOST:
            log.warning("ZooKeeper session expired; ephemeral nodes are gone until re-registration")
            self._lost = True
            self.sessions_lost += 1     # before the new session's watches read anything again
        elif state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection suspended; retrying")
            # say why, once it lasts: no ZooKeeper calls (nor waits) in the listener
            threading.Thread(target=self._explain_outage, name="zk-outage", daemon=True).start()
        elif state == KazooState.CONNECTED:
            self._connected.set()
            if self._lost:
                self._lost = False
                # ZooKeeper calls are not allowed in the listener: re-register elsewhere
                threading.Thread(target=self._run_restart, name="zk-session-restart", daemon=True).start()

    def _explain_outage(self, after: float = 1.0) -> None:
        time.sleep(after)
        if self.state == str(KazooState.SUSPENDED) and not self._closing:
            log.warning("%s; tasks keep running, coordinator calls are retried until it is back",
                        describe_outage(self.hosts))

    def _run_restart(self) -> None:
        for cb in list(self._restart_callbacks):
            try:
                cb()
            except Exception:  # noqa: BLE001
                log.exception("session restart callback failed")

    def on_session_restart(self, callback: Callable[[], None]) -> None:
        self._restart_callbacks.append(callback)

    # -- primitives -----------------------------------------------------------------------
    def _send(self, async_call, args, kwargs, deadline: float):
        """Hand a request to kazoo only while connected: kazoo queues what it is given
        without a connection and sends it whenever one comes back - a write given up on
        here could then be applied later, and its owner would take its own write for
        another instance's (self-fencing). KazooTimeoutError past the deadline."""
        if not self._connected.wait(max(deadline - time.monotonic(), 0)):
            raise KazooTimeoutError()
        return async_call(*args, **kwargs).get(timeout=max(deadline - time.monotonic(), 0.01))

    def _write(self, async_call, *args, **kwargs):
        """One attempt, with the call's deadline."""
        return self._send(async_call, args, kwargs, time.monotonic() + self.call_timeout)

    def _read(self, async_call, *args):
        """Sent again after a lost connection (a server of the ensemble went away: the
        client moves to another), until the call's deadline."""
        deadline, delay = time.monotonic() + self.call_timeout, 0.05
        while True:
            try:
                return self._send(async_call, args, {}, deadline)
            except (kx.ConnectionLoss, kx.OperationTimeoutError, kx.SessionExpiredError):
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _acl_for(self, path: str) -> list:
        """A new node's ACL: its top node's roles' (roles.permissions; narrower for what
        workers write under a topology) inside a cluster this session has secured; only
        its own role's outside one."""
        for base, ids in self._clusters.items():
            if path == base or path.startswith(base + "/"):
                top, *below = path[len(base) + 1:].split("/")
                return [ACL(perms, ids[role]) for role, perms in roles.permissions(top, below).items()]
        return [ACL(Permissions.ALL, self.credential.id)]

    def _create(self, path, data, **kw):
        return self._write(self.zk.create_async, path, data, acl=self._acl_for(path), **kw)

    @_translate
    def create(self, path, data=b"", *, ephemeral=False, sequence=False, makepath=True):
        try:
            return self._create(path, bytes(data), ephemeral=ephemeral, sequence=sequence)
        except kx.NoNodeError:
            if not makepath:
                raise
        parts = [p for p in path.split("/") if p][:-1]
        for i in range(1, len(parts) + 1):
            try:
                self._create("/" + "/".join(parts[:i]), b"")
            except kx.NodeExistsError:
                pass
        return self._create(path, bytes(data), ephemeral=ephemeral, sequence=sequence)

    @_translate
    def get(self, path):
        data, stat = self._read(self.zk.get_async, path)
        return data, stat.version

    @_translate
    def set(self, path, data, version=-1):
        return self._write(self.zk.set_async, path, bytes(data), version=version).version

    def set_async(self, path, data, version=-1) -> Future:
        """Sent only while connected, as every call is; the Future is completed on kazoo's
        completion thread. A connection lost with the write in flight fails it with
        ConnectionLostError: it may or may not have been applied."""
        fut: Future = Future()

        def done(result):
            try:
                fut.set_result(self._answer(path, result))
            except BaseException as e:  # noqa: BLE001 - every outcome goes to the caller
                fut.set_exception(e)
        if not self._connected.is_set():
            fut.set_exception(ConnectionLostError("not connected to ZooKeeper"))
            return fut
        try:
            self.zk.set_async(path, bytes(data), version=version).rawlink(done)
        except Exception as e:  # noqa: BLE001 - e.g. the client closed meanwhile
            fut.set_exception(e)
        return fut

    @_translate
    def _answer(self, path, result):
        """A set_async answer's new version, or its error as set() raises it."""
        return result.get_nowait().version

    @_translate
    def delete(self, path, version=-1, recursive=False):
        if recursive:
            self._delete_tree(path)
        else:
            self._write(self.zk.delete_async, path, version=version)

    def _delete_tree(self, path, attempts: int = 5):
        for _ in range(attempts):
            try:
                for child in self._read(self.zk.get_children_async, path):
                    self._delete_tree(f"{path.rstrip('/')}/{child}")
                self._write(self.zk.delete_async, path)
                return
            except kx.NoNodeError:
                return     # removed meanwhile (an ephemeral child's session ended)
            except kx.NotEmptyError:
                continue   # a child was created meanwhile (a worker still publishing): list again
        raise kx.NotEmptyError(f"{path}: children kept appearing while it was deleted ({attempts} tries)")

    @_translate
    def exists(self, path):
        stat = self._read(self.zk.exists_async, path)
        return None if stat is None else stat.version

    @_translate
    def children(self, path):
        return sorted(self._read(self.zk.get_children_async, path))

    @_translate
    def ensure_root(self, path):
        """The node the clusters live under (--zk-root). A worker that makes it gives it
        to its own cluster: everyone may read it, only this cluster's workers may create
        or remove nodes below it, so a client without the secret can neither squat a
        cluster name there nor fill the ensemble's memory through it. A cluster of another
        secret needs a root of its own (secure_cluster says so). A root made by an older
        streamnet lets anyone create and delete below it; only the ensemble's
        administrator can change that, so it is warned about, not refused."""
        owned = [ACL(Permissions.READ, Id("world", "anyone")), ACL(Permissions.ALL, self.credential.id)]
        parts = [p for p in path.split("/") if p]
        if self.role == roles.WORKER:
            for i in range(1, len(parts) + 1):
                node = "/" + "/".join(parts[:i])
                try:
                    self._write(self.zk.create_async, node, b"", acl=owned)
                except kx.NodeExistsError:
                    pass
                except kx.NoAuthError:
                    if self._read(self.zk.exists_async, node) is None:
                        parent = node.rsplit("/", 1)[0] or "/"
                        raise ClusterAclError(f"cannot create {node}: {parent} lets only others create nodes below "
                                              "it; pick another --zk-root") from None
        try:
            acl = self._read(self.zk.get_acls_async, path)[0]
        except kx.NoNodeError:
            return          # a client cannot make it: secure_cluster says the cluster is not set up
        if any(e.id == Id("world", "anyone") and e.perms & (Permissions.CREATE | Permissions.DELETE) for e in acl) \
                and path not in _warned_open_roots:
            _warned_open_roots.add(path)
            log.warning("the ZooKeeper root %s lets anyone create and delete nodes below it ([%s], made by an "
                        "older streamnet): a client without the secret can squat cluster names there or fill "
                        "ZooKeeper; have the ensemble's administrator remove it when its clusters are moved, or "
                        "give this cluster a root of its own (--zk-root)", path, roles.describe(acl))

    @_translate
    def secure_cluster(self, base, nodes):
        """Make the cluster's top nodes with their roles' ACLs (workers; the cluster node's
        data is every role's ZooKeeper id, so that submitters can make nodes the workers
        may use), and check every one of them at start (every role): ClusterAclError,
        saying what to do, if someone else owns the cluster's name, the roles are not set
        up, or the credential is not this cluster's."""
        cluster = base.rsplit("/", 1)[-1]
        worker = self.role == roles.WORKER
        ids = roles.role_ids(self._secret) if worker else None
        upgraded = []
        for node in ("", *nodes):
            path = f"{base}/{node}" if node else base
            if worker:
                expected = [ACL(perms, ids[role]) for role, perms in roles.permissions(node).items()]
                try:
                    self._write(self.zk.create_async, path, b"" if node else roles.ids_record(ids), acl=expected)
                    continue
                except kx.NodeExistsError:
                    pass
                except kx.NoAuthError:       # ZooKeeper checks the parent's ACL before the name
                    if node or self._read(self.zk.exists_async, path) is not None:
                        raise
                    root = base.rsplit("/", 1)[0] or "/"
                    raise ClusterAclError(
                        f"cannot create {path}: the root {root} belongs to another cluster's workers (ACL "
                        f"[{roles.describe(self._read(self.zk.get_acls_async, root)[0])}]); give this cluster a "
                        f"root of its own: --zk-root {root}-{cluster} (or $STREAMNET_ZK_ROOT)") from None
            try:
                acl = list(self._read(self.zk.get_acls_async, path)[0])
            except kx.NoNodeError:
                raise ClusterAclError(f"cluster {cluster!r} is not set up on ZooKeeper {self.hosts} ({path} is "
                                      f"missing): start one of its workers first; a {self.role} credential "
                                      "cannot create it") from None
            except kx.NoAuthError:
                raise ClusterAclError(f"ZooKeeper refused to show {path}: wrong cluster secret, or the name "
                                      f"{cluster!r} belongs to another cluster; check --secret-file, or pick "
                                      "another --cluster") from None
            if worker:
                if sorted(acl) == sorted(expected):
                    continue
                if acl == [ACL(Permissions.ALL, self.credential.id)]:     # made before roles existed
                    self._write(self.zk.set_acls_async, path, expected)
                    upgraded.append(node or ".")
                    continue
                raise ClusterAclError(
                    f"{path} carries the ACL [{roles.describe(acl)}], not this cluster's "
                    f"[{roles.describe(expected)}]: someone else owns the cluster name {cluster!r} (or changed its "
                    f"ACL); pick another --cluster, or have the ensemble's administrator remove {path}")
            # ZooKeeper shows a digest's hash only to holders of ADMIN: match the user name
            # here; the ids record below is checked whole
            mine = [e for e in acl if e.id.scheme == "digest" and e.id.id.split(":")[0] == self.credential.user]
            if not mine or mine[0].perms != roles.permissions(node)[self.role]:
                raise ClusterAclError(
                    f"{path} does not grant the {self.role} role what it should (ACL: [{roles.describe(acl)}]): "
                    "start a worker of this streamnet version once (it sets the roles up)")
            if any(e.id.scheme != "digest" and e.perms & ~Permissions.READ for e in acl):
                raise ClusterAclError(f"{path} lets others change it (ACL: [{roles.describe(acl)}]); someone "
                                      f"changed the cluster's ACL: have a worker's operator check {cluster!r}")
        record = self._read(self.zk.get_async, base)[0]
        if worker:
            if record != roles.ids_record(ids):
                self._write(self.zk.set_async, base, roles.ids_record(ids))
        else:
            ids = roles.parse_ids_record(record)
            if ids is None:
                raise ClusterAclError(f"cluster {cluster!r} does not list its roles: start a worker of this "
                                      "streamnet version once (it sets the roles up)")
            if ids[self.role] != self.credential.id:
                raise ClusterAclError(f"this {self.role} credential was not made from the secret of cluster "
                                      f"{cluster!r}: make one with `streamnet-submit new-credential {self.role}` "
                                      "and that cluster's secret")
        self._clusters[base] = ids
        if upgraded:
            log.warning("cluster %s: its nodes were made before roles existed; gave the submit and observer "
                        "roles their permissions on %s", cluster, ", ".join(upgraded))

    def watch_data(self, path, callback):
        stopped = threading.Event()

        def fn(data, stat):
            if stopped.is_set():
                return False
            with _logged(path):
                callback(data if stat is not None else None, stat.version if stat is not None else -1)
        self.zk.DataWatch(path, fn)
        return stopped.set

    @_translate
    def watch_children(self, path, callback):
        stopped = threading.Event()

        def fn(children):
            if stopped.is_set():
                return False
            with _logged(path):
                callback(sorted(children))
        self.zk.ChildrenWatch(path, fn)
        return stopped.set

    def close(self, timeout: float | None = None) -> bool:
        """End the session; its ephemeral nodes go with it. kazoo's stop joins its threads
        without a bound, and a ZooKeeper that stopped answering would hold the caller (a
        worker or a daemon asked to stop) for as long as kazoo retries: so wait at most
        `timeout` seconds (default: the session timeout, after which the server expires the
        session anyway). True if it closed in time."""
        self._closing = True

        def stop():
            try:
                try:
                    self.zk.stop()
                finally:
                    self.zk.close()
            except Exception as e:  # noqa: BLE001 - the session expires on the server either way
                log.warning("closing the ZooKeeper session: %s", e)
        bound = self.call_timeout if timeout is None else timeout
        t = threading.Thread(target=stop, name="zk-close", daemon=True)
        t.start()
        t.join(bound)
        if t.is_alive():
            log.warning("the ZooKeeper session did not close within %.1f s; it expires on the server", bound)
            return False
        return True
