"""The Coordinator on a real ZooKeeper ensemble, through kazoo.

Every node is created with a digest ACL derived from the cluster secret, and the
session authenticates with the same digest: a client without the secret can
neither read nor change the cluster (ZooKeeper answers NoAuth). Connection loss
is retried by kazoo: reads (idempotent) are sent again after a reconnect, for up to
the session timeout; a write that was in flight when the connection dropped raises
ConnectionLostError, since it may or may not have been applied. A session that
expires loses its ephemeral nodes, so owners register `on_session_restart`
callbacks to re-create them and resynchronise.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import threading
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
    wrapper.__name__ = fn.__name__
    return wrapper


class ZkCoordinator(Coordinator):
    def __init__(self, hosts: str, secret: bytes, *, session_timeout: float = 10.0,
                 connect_timeout: float = 10.0):
        pw = digest_password(secret)
        self.hosts = hosts
        self.zk = KazooClient(
            hosts=hosts, timeout=session_timeout,
            auth_data=[("digest", f"{DIGEST_USER}:{pw}")],
            default_acl=[make_digest_acl(DIGEST_USER, pw, all=True)],
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
            # used for reads only (self.zk.retry): a server lost mid-request, the read goes again
            command_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5, deadline=session_timeout))
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
            raise CoordinatorError(f"ZooKeeper ensemble {hosts} unreachable after {connect_timeout:.0f} s") from None

    # -- session ------------------------------------------------------------------------
    def _listener(self, state) -> None:
        self.state = str(state)
        if state == KazooState.LOST and self._closing:
            return
        if state == KazooState.LOST:
            log.warning("ZooKeeper session expired; ephemeral nodes are gone until re-registration")
            self._lost = True
        elif state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection suspended; retrying")
        elif state == KazooState.CONNECTED:
            if self._lost:
                self._lost = False
                # ZooKeeper calls are not allowed in the listener: re-register elsewhere
                threading.Thread(target=self._run_restart, name="zk-session-restart", daemon=True).start()

    def _run_restart(self) -> None:
        for cb in list(self._restart_callbacks):
            try:
                cb()
            except Exception:  # noqa: BLE001
                log.exception("session restart callback failed")

    def on_session_restart(self, callback: Callable[[], None]) -> None:
        self._restart_callbacks.append(callback)

    # -- primitives -----------------------------------------------------------------------
    @_translate
    def create(self, path, data=b"", *, ephemeral=False, sequence=False, makepath=True):
        return self.zk.create(path, bytes(data), ephemeral=ephemeral, sequence=sequence, makepath=makepath)

    @_translate
    def get(self, path):
        data, stat = self.zk.retry(self.zk.get, path)
        return data, stat.version

    @_translate
    def set(self, path, data, version=-1):
        return self.zk.set(path, bytes(data), version=version).version

    @_translate
    def delete(self, path, version=-1, recursive=False):
        self.zk.delete(path, version=version, recursive=recursive)

    @_translate
    def exists(self, path):
        stat = self.zk.retry(self.zk.exists, path)
        return None if stat is None else stat.version

    @_translate
    def children(self, path):
        return sorted(self.zk.retry(self.zk.get_children, path))

    @_translate
    def ensure_shared(self, path):
        # anyone may list, add a cluster, and remove an empty one; nothing inside a cluster
        shared = [ACL(Permissions.READ | Permissions.CREATE | Permissions.DELETE, Id("world", "anyone"))]
        parts = [p for p in path.split("/") if p]
        for i in range(1, len(parts) + 1):
            try:
                self.zk.create("/" + "/".join(parts[:i]), b"", acl=shared)
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
