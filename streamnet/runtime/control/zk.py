"""The Coordinator on a real ZooKeeper ensemble, through kazoo.

Every node is created with a digest ACL derived from the cluster secret, and the
session authenticates with the same digest: a client without the secret can
neither read nor change the cluster (ZooKeeper answers NoAuth). Connection loss
is retried: reads (idempotent) are sent again after a reconnect, for up to the
session timeout; a write that was in flight when the connection dropped raises
ConnectionLostError, since it may or may not have been applied. Every call has a
deadline (the session timeout): kazoo queues a request while it has no connection
and would wait for one forever, so without a quorum a caller gets NoQuorumError
("ZooKeeper has no quorum (1 of 3 servers reachable)") instead of hanging. A session that
expires loses its ephemeral nodes, so owners register `on_session_restart`
callbacks to re-create them and resynchronise.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import socket
import threading
import time
from typing import Callable

from kazoo import exceptions as kx
from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from .coordinator import (BadVersionError, ConnectionLostError, Coordinator, CoordinatorError, NoNodeError,
                          NodeExistsError, NotEmptyError, SessionClosedError)

log = logging.getLogger(__name__)
DIGEST_USER = "streamnet"


class UnauthorisedError(CoordinatorError):
    pass


class NoQuorumError(ConnectionLostError):
    """No answer from the ensemble within the call's deadline."""


def reachable_servers(hosts: str, timeout: float = 0.5) -> tuple[int, int]:
    """(servers accepting TCP connections, servers listed): a server without a quorum
    still accepts connections but serves nothing, so this tells "no quorum" apart from
    "nothing there"."""
    servers = [h.strip() for h in hosts.split("/")[0].split(",") if h.strip()]
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


def digest_password(secret: bytes) -> str:
    return hmac.new(secret, b"streamnet zookeeper digest", hashlib.sha256).hexdigest()


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
                                    "wrong cluster secret?") from None
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
                 connect_timeout: float = 10.0):
        pw = digest_password(secret)
        self.hosts = hosts
        self.call_timeout = session_timeout
        self._connected = threading.Event()
        self.zk = KazooClient(
            hosts=hosts, timeout=session_timeout,
            auth_data=[("digest", f"{DIGEST_USER}:{pw}")],
            default_acl=[make_digest_acl(DIGEST_USER, pw, all=True)],
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0))
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

    @_translate
    def create(self, path, data=b"", *, ephemeral=False, sequence=False, makepath=True):
        try:
            return self._write(self.zk.create_async, path, bytes(data), ephemeral=ephemeral, sequence=sequence)
        except kx.NoNodeError:
            if not makepath:
                raise
        parts = [p for p in path.split("/") if p][:-1]
        for i in range(1, len(parts) + 1):
            try:
                self._write(self.zk.create_async, "/" + "/".join(parts[:i]), b"")
            except kx.NodeExistsError:
                pass
        return self._write(self.zk.create_async, path, bytes(data), ephemeral=ephemeral, sequence=sequence)

    @_translate
    def get(self, path):
        data, stat = self._read(self.zk.get_async, path)
        return data, stat.version

    @_translate
    def set(self, path, data, version=-1):
        return self._write(self.zk.set_async, path, bytes(data), version=version).version

    @_translate
    def delete(self, path, version=-1, recursive=False):
        if recursive:
            self._delete_tree(path)
        else:
            self._write(self.zk.delete_async, path, version=version)

    def _delete_tree(self, path):
        try:
            for child in self._read(self.zk.get_children_async, path):
                self._delete_tree(f"{path.rstrip('/')}/{child}")
            self._write(self.zk.delete_async, path)
        except kx.NoNodeError:
            pass       # removed meanwhile (an ephemeral child's session ended)

    @_translate
    def exists(self, path):
        stat = self._read(self.zk.exists_async, path)
        return None if stat is None else stat.version

    @_translate
    def children(self, path):
        return sorted(self._read(self.zk.get_children_async, path))

    @_translate
    def ensure_shared(self, path):
        # anyone may list, add a cluster, and remove an empty one; nothing inside a cluster
        shared = [ACL(Permissions.READ | Permissions.CREATE | Permissions.DELETE, Id("world", "anyone"))]
        parts = [p for p in path.split("/") if p]
        for i in range(1, len(parts) + 1):
            try:
                self._write(self.zk.create_async, "/" + "/".join(parts[:i]), b"", acl=shared)
            except kx.NodeExistsError:
                pass

    def watch_data(self, path, callback):
        stopped = threading.Event()

        def fn(data, stat):
            if stopped.is_set():
                return False
            callback(data if stat is not None else None, stat.version if stat is not None else -1)
        self.zk.DataWatch(path, fn)
        return stopped.set

    @_translate
    def watch_children(self, path, callback):
        stopped = threading.Event()

        def fn(children):
            if stopped.is_set():
                return False
            callback(sorted(children))
        self.zk.ChildrenWatch(path, fn)
        return stopped.set

    def close(self) -> None:
        self._closing = True
        try:
            self.zk.stop()
        finally:
            self.zk.close()
