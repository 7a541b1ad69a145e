"""The in-process coordinator: the Coordinator interface over a dict tree guarded by
one lock, for the embedded local cluster (as Storm's LocalCluster and Flink's
embedded HA services do). Sessions never expire; closing one removes its
ephemeral nodes. Watch callbacks run on one dispatcher thread, in order."""
from __future__ import annotations

import itertools
import logging
import posixpath
import queue
import threading
from typing import Callable

from .coordinator import (BadVersionError, Coordinator, CoordinatorError, NoNodeError,
                          NodeExistsError, NotEmptyError, SessionClosedError)

log = logging.getLogger(__name__)


class _Node:
    __slots__ = ("data", "version", "owner", "children", "seq")

    def __init__(self, data: bytes, owner: int | None):
        self.data, self.version, self.owner = data, 0, owner
        self.children: dict[str, _Node] = {}
        self.seq = 0


class InProcessServer:
    """The shared tree; each `session()` is one client's Coordinator."""

    def __init__(self):
        self._root = _Node(b"", None)
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._data_watches: dict[str, list] = {}
        self._child_watches: dict[str, list] = {}
        # callbacks run in order on one thread, like kazoo's event thread
        self._events: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._deliver, name="coordinator-events", daemon=True)
        self._thread.start()

    def session(self) -> "InProcessCoordinator":
        return InProcessCoordinator(self, next(self._ids))

    def shutdown(self) -> None:
        self._events.put(None)
        self._thread.join(timeout=5)

    # -- tree -------------------------------------------------------------------
    def _walk(self, path: str) -> _Node | None:
        node = self._root
        for part in _parts(path):
            node = node.children.get(part)
            if node is None:
                return None
        return node

    def _deliver(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                return
            cb, args = item
            try:
                cb(*args)
            except Exception:  # noqa: BLE001 - a watcher's bug must not stop the others
                log.exception("coordinator watch callback failed")

    def _fire(self, path: str, parent_changed: bool = True) -> None:
        node = self._walk(path)
        data = (node.data, node.version) if node else (None, -1)
        for cb in list(self._data_watches.get(path, ())):
            self._events.put((cb, data))
        if parent_changed:
            parent = posixpath.dirname(path)
            pnode = self._walk(parent)
            kids = sorted(pnode.children) if pnode else []
            for cb in list(self._child_watches.get(parent, ())):
                self._events.put((cb, (kids,)))

    def _fire_children(self, path: str) -> None:
        node = self._walk(path)
        kids = sorted(node.children) if node else []
        for cb in list(self._child_watches.get(path, ())):
            self._events.put((cb, (kids,)))

    def end_session(self, owner: int) -> None:
        with self._lock:
            gone = []

            def sweep(node: _Node, path: str):
                for name, child in list(node.children.items()):
                    p = posixpath.join(path, name)
                    if child.owner == owner:
                        del node.children[name]
                        gone.append(p)
                    else:
                        sweep(child, p)
            sweep(self._root, "/")
            for p in gone:
                self._fire(p)


def _parts(path: str) -> list[str]:
    if not path.startswith("/"):
        raise CoordinatorError(f"paths are absolute; got {path!r}")
    return [p for p in path.split("/") if p]


class InProcessCoordinator(Coordinator):
    def __init__(self, server: InProcessServer, session_id: int):
        self._s, self._id = server, session_id
        self._closed = False
        self._watches: list[Callable[[], None]] = []

    def _check(self):
        if self._closed:
            raise SessionClosedError("coordinator session is closed")

    def create(self, path, data=b"", *, ephemeral=False, sequence=False, makepath=True):
        self._check()
        s = self._s
        with s._lock:
            parts = _parts(path)
            node = s._root
            made = []
            for i, part in enumerate(parts[:-1]):
                child = node.children.get(part)
                if child is None:
                    if not makepath:
                        raise NoNodeError(f"{'/' + '/'.join(parts[:i + 1])} does not exist")
                    child = node.children[part] = _Node(b"", None)
                    made.append("/" + "/".join(parts[:i + 1]))
                elif child.owner is not None:
                    raise CoordinatorError(f"ephemeral node {'/' + '/'.join(parts[:i + 1])} cannot have children")
                node = child
            name = parts[-1]
            if sequence:
                name = f"{name}{node.seq:010d}"
                node.seq += 1
            if name in node.children:
                raise NodeExistsError(f"{path} exists")
            node.children[name] = _Node(bytes(data), self._id if ephemeral else None)
            full = "/" + "/".join(parts[:-1] + [name])
            for p in made:
                s._fire(p)
            s._fire(full)
            return full

    def get(self, path):
        self._check()
        with self._s._lock:
            node = self._s._walk(path)
            if node is None:
                raise NoNodeError(f"{path} does not exist")
            return node.data, node.version

    def set(self, path, data, version=-1):
        self._check()
        with self._s._lock:
            node = self._s._walk(path)
            if node is None:
                raise NoNodeError(f"{path} does not exist")
            if version != -1 and version != node.version:
                raise BadVersionError(f"{path} is at version {node.version}, not {version}")
            node.data = bytes(data)
            node.version += 1
            self._s._fire(path, parent_changed=False)
            return node.version

    def delete(self, path, version=-1, recursive=False):
        self._check()
        with self._s._lock:
            parts = _parts(path)
            parent = self._s._walk("/" + "/".join(parts[:-1]))
            node = parent.children.get(parts[-1]) if parent else None
            if node is None:
                raise NoNodeError(f"{path} does not exist")
            if version != -1 and version != node.version:
                raise BadVersionError(f"{path} is at version {node.version}, not {version}")
            if node.children and not recursive:
                raise NotEmptyError(f"{path} has children")
            del parent.children[parts[-1]]
            gone = []

            def collect(n, p):
                gone.append(p)
                for k, c in n.children.items():
                    collect(c, posixpath.join(p, k))
            collect(node, path)
            for p in reversed(gone):
                self._s._fire(p, parent_changed=(p == path))
                self._s._fire_children(p)

    def exists(self, path):
        self._check()
        with self._s._lock:
            node = self._s._walk(path)
            return None if node is None else node.version

    def children(self, path):
        self._check()
        with self._s._lock:
            node = self._s._walk(path)
            if node is None:
                raise NoNodeError(f"{path} does not exist")
            return sorted(node.children)

    def _watch(self, table, path, callback, initial):
        s = self._s
        with s._lock:
            table.setdefault(path, []).append(callback)
            s._events.put((callback, initial()))

        def cancel():
            with s._lock:
                if callback in table.get(path, []):
                    table[path].remove(callback)
        self._watches.append(cancel)
        return cancel

    def watch_data(self, path, callback):
        self._check()

        def initial():
            node = self._s._walk(path)
            return (node.data, node.version) if node else (None, -1)
        return self._watch(self._s._data_watches, path, callback, initial)

    def watch_children(self, path, callback):
        self._check()

        def initial():
            node = self._s._walk(path)
            return (sorted(node.children) if node else [],)
        return self._watch(self._s._child_watches, path, callback, initial)

    def close(self, timeout: float | None = None) -> bool:
        if self._closed:
            return True
        for cancel in self._watches:
            cancel()
        self._closed = True
        self._s.end_session(self._id)
        return True
