"""The Coordinator interface: a small ZooKeeper-shaped store, and its in-process twin.

Both implementations offer the same primitives - nodes with data and versions,
ephemeral nodes that vanish with their session, sequential names, versioned
compare-and-set writes, persistent watches - so everything above (membership,
election, assignments, the scheduler) is written once. The ZooKeeper one lives
in `zk.py`; the in-process one (`inprocess.py`) serves the embedded local cluster, as Storm's
LocalCluster and Flink's embedded HA services do.

Watch callbacks run on a coordinator-owned thread, never under a lock and never
on the caller's event loop: receivers hand them to their loop themselves.
"""
from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Callable

from ...errors import StreamnetError

log = logging.getLogger(__name__)

DataCallback = Callable[[bytes | None, int], None]        # (data or None if gone, version)
ChildrenCallback = Callable[[list[str]], None]


class CoordinatorError(StreamnetError):
    pass


class NoNodeError(CoordinatorError):
    pass


class NodeExistsError(CoordinatorError):
    pass


class BadVersionError(CoordinatorError):
    """A compare-and-set write lost: someone else wrote first."""


class NotEmptyError(CoordinatorError):
    pass


class ConnectionLostError(CoordinatorError):
    """The connection dropped; the client reconnects (a ZooKeeper server went away)."""


class SessionClosedError(ConnectionLostError):
    """This client closed its session: nothing will come back."""


def retry_while_lost(fn: Callable[[], object], timeout: float, *, what: str = "",
                     give_up: Callable[[], bool] = lambda: False):
    """fn(), called again while the connection is lost (the client is reconnecting,
    say to another server of the ensemble), for up to `timeout` s or until give_up();
    then the last ConnectionLostError propagates. A closed session is not waited on.
    Only for calls that may safely run twice: reads, and writes whose repeat changes
    nothing. With `what`, the first retry is logged."""
    deadline, delay = time.monotonic() + timeout, 0.05
    while True:
        try:
            return fn()
        except SessionClosedError:
            raise
        except ConnectionLostError as e:
            if time.monotonic() + delay > deadline or give_up():
                raise
            if what and delay == 0.05:
                log.warning("cannot %s yet (%s); retrying for up to %.0f s", what, e, timeout)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class Coordinator(ABC):
    """One client session. Closing it removes its ephemeral nodes."""

    #: sessions that expired under this client (counted when lost, before a new one reads
    #: anything); in-process sessions never expire
    sessions_lost = 0

    @abstractmethod
    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = True) -> str: ...

    @abstractmethod
    def get(self, path: str) -> tuple[bytes, int]: ...

    @abstractmethod
    def set(self, path: str, data: bytes, version: int = -1) -> int: ...

    def set_async(self, path: str, data: bytes, version: int = -1) -> Future:
        """set() for a caller that must not block (an event loop): a Future of the new
        version, or of the error set() raises. ZooKeeper completes it when the answer
        comes, with no thread of the caller's waiting for it; here it is done at once."""
        fut: Future = Future()
        try:
            fut.set_result(self.set(path, data, version))
        except Exception as e:  # noqa: BLE001 - handed to the caller
            fut.set_exception(e)
        return fut

    @abstractmethod
    def delete(self, path: str, version: int = -1, recursive: bool = False) -> None: ...

    @abstractmethod
    def exists(self, path: str) -> int | None: ...

    @abstractmethod
    def children(self, path: str) -> list[str]: ...

    @abstractmethod
    def watch_data(self, path: str, callback: DataCallback) -> Callable[[], None]:
        """Call back now and after every change of path's data (None when deleted).
        Returns a function that cancels the watch."""

    @abstractmethod
    def watch_children(self, path: str, callback: ChildrenCallback) -> Callable[[], None]:
        """Call back now and after every change of path's children."""

    @abstractmethod
    def close(self, timeout: float | None = None) -> bool:
        """End the session, waiting at most `timeout` seconds (None: the implementation's
        bound); True if it closed in time."""

    def on_session_restart(self, callback: Callable[[], None]) -> None:
        """Register a callback for when a new session replaces an expired one (its
        ephemeral nodes are gone: re-create them). In-process sessions never expire."""

    def ensure_root(self, path: str) -> None:
        """Make (or check) the node the clusters live under. ZooKeeper gives it to the
        cluster of the worker that makes it; in process there is no ACL."""
        self.ensure(path)

    #: whose credential this session holds (roles.py); in-process sessions do anything
    role = "worker"

    def secure_cluster(self, base: str, nodes: tuple[str, ...]) -> None:
        """Make (or check) the cluster node `base` and its top nodes `nodes`. ZooKeeper
        gives each its roles' ACL and checks it at start; in process there is no ACL."""
        for node in ("", *nodes):
            self.ensure(f"{base}/{node}" if node else base)

    # -- helpers shared by both implementations ------------------------------
    def ensure(self, path: str) -> None:
        try:
            self.create(path, b"", makepath=True)
        except NodeExistsError:
            pass

    def put(self, path: str, data: bytes) -> int:
        """Create or overwrite."""
        try:
            self.create(path, data, makepath=True)
            return 0
        except NodeExistsError:
            return self.set(path, data)
