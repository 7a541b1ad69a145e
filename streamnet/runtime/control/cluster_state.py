"""The cluster's layout in the coordinator (DESIGN.md):

    <root>/<cluster>/workers/<worker-id>     ephemeral; host, port, cores, threads, load
    <root>/<cluster>/leader                  election (ephemeral sequential candidates)
    <root>/<cluster>/topologies/<name>       spec; children: status, done/<task>, results/<key>
    <root>/<cluster>/assignments/<name>      versioned task -> worker map, threads per worker
    <root>/<cluster>/checkpoints/<name>      latest checkpoint: step, path, checksum

Specs, assignments and worker records are JSON (readable with zkCli); results
use the frame codec so they may carry arrays.
"""
from __future__ import annotations

import json
import logging
from typing import Callable

from .. import codec
from ..assignment import Assignment, AssignmentError
from .coordinator import (BadVersionError, ConnectionLostError, Coordinator, NoNodeError, NodeExistsError,
                          retry_while_lost)
from ...errors import StreamnetError
from ..values import whole

log = logging.getLogger(__name__)


def _result(name: str, key: str, data: bytes):
    """One result node, decoded; one that does not decode (written by something other
    than a worker) reads as a line saying so, not an error that stops the reader - a
    kill, after which the topology could not be removed, or a status."""
    try:
        return codec.decode(data)
    except codec.CodecError as e:
        log.warning("topology %s: its result %s cannot be decoded (%s)", name, key, e)
        return f"<undecodable result {key}: {e}>"


def _status_text(data: bytes) -> str:
    """A topology's status node as text. Bytes that are not UTF-8 (a node written by
    hand or by another program) read as a status no one knows - not running - rather
    than raising in the leader's pass or a worker's watch, which once stopped every
    topology's scheduling."""
    return data.decode("utf-8", "replace")


class TopologyExistsError(StreamnetError):
    pass


class RebalancePendingError(StreamnetError):
    """A rebalance was asked for while another of the same topology is pending."""


class UnknownTopologyError(StreamnetError):
    pass


#: the nodes under <root>/<cluster> (roles.py gives each its ACL)
TOP_NODES = ("workers", "topologies", "assignments", "checkpoints", "leader", "unreachable")

#: topology statuses whose tasks run (and are scheduled); "killed" stops them, and so
#: does "failed": a task could not start, or a worker refused the topology (its results
#: say why), so the run cannot go on - workers stop its tasks as for "killed"
RUNNING = ("active", "stopping")
FAILED_STATUS = "failed"


#: result keys that say a topology cannot run: a task that could not start
#: (failed.<task>), a worker that refuses the spec (refused.<worker>)
FAILED, REFUSED = "failed.", "refused."

#: how long an idempotent write (a done mark, a result) is sent again while the
#: coordinator connection is lost: it must not be lost to a blip
RESEND_S = 30.0


def _j(obj) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()


def _unj(data: bytes | None):
    return None if data is None or data == b"" else json.loads(data)


def check_place(cluster: str, root: str) -> None:
    """A cluster's name (one ZooKeeper node) and the root it lives under (an absolute path):
    checked before connecting, so a bad one is a usage error, not news of the ensemble."""
    from ..names import name_problem
    problem = name_problem(cluster)
    if problem:
        raise StreamnetError(f"a cluster's name {problem}")
    parts = root.rstrip("/").split("/")[1:] if isinstance(root, str) and root.startswith("/") else []
    if not parts or any(name_problem(p) for p in parts):
        raise StreamnetError(f"the ZooKeeper root must be an absolute path like /streamnet; got {root!r}")


_said: set = set()     # (worker, problem) already logged by workers()


def _worker_info_problem(info) -> str | None:
    """Why a worker node's data is not a registration that placement and the probe can
    use (None: it is): one written by hand, by another version, or by a client."""
    if not isinstance(info, dict):
        return "no info"
    if not (isinstance(info.get("host"), str) and info["host"]):
        return "no host"
    port = info.get("port")
    if not (whole(port) and 0 < port < 65536):
        return f"port {port!r}"
    threads = info.get("threads", 1)
    if not (whole(threads) and threads >= 1):
        return f"threads {threads!r}"
    return None


def _assignment(data: bytes | None) -> Assignment | None:
    """An assignment node, parsed; None where there is none, or where it cannot be read
    (written by something other than the leader): the leader then places the topology
    afresh over it - it is never refused for that - and a worker waits for that write."""
    try:
        d = _unj(data)
        return None if d is None else Assignment.from_json(d)
    except (ValueError, AssignmentError) as e:       # json's errors are ValueErrors
        log.warning("an assignment node cannot be read (%s: %s); it counts as none", type(e).__name__, e)
        return None


class ClusterState:
    def __init__(self, coord: Coordinator, cluster: str = "default", root: str = "/streamnet"):
        check_place(cluster, root)
        self.coord = coord
        self.cluster = cluster
        self.base = f"{root.rstrip('/')}/{cluster}"
        coord.ensure_root(root.rstrip("/"))
        coord.secure_cluster(self.base, TOP_NODES)

    def path(self, *parts: str) -> str:
        return "/".join([self.base, *parts])

    # -- workers ------------------------------------------------------------------
    def register_worker(self, worker_id: str, info: dict) -> None:
        self.coord.create(self.path("workers", worker_id), _j(info), ephemeral=True)

    def update_worker(self, worker_id: str, info: dict) -> None:
        self.coord.set(self.path("workers", worker_id), _j(info))

    def workers(self) -> dict[str, dict]:
        """The registered workers' infos; a node under workers/ that holds none is no
        worker (one made by hand, or the parent of a node named 'a/b' by an older version)."""
        out = {}
        for w in self.coord.children(self.path("workers")):
            try:
                info = _unj(self.coord.get(self.path("workers", w))[0])
            except NoNodeError:
                continue  # left between the listing and the read
            except ValueError:
                info = None
            problem = _worker_info_problem(info)
            if problem is None:
                out[w] = info
            elif (w, problem) not in _said:
                _said.add((w, problem))
                log.warning("the node of worker %s is not a worker's registration (%s): leaving it out", w, problem)
        return out

    def watch_workers(self, callback: Callable[[list[str]], None]):
        return self.coord.watch_children(self.path("workers"), callback)

    def watch_worker(self, worker_id: str, callback: Callable[[bytes | None, int], None]):
        """Watch one worker's registration (its load records are published there)."""
        return self.coord.watch_data(self.path("workers", worker_id), callback)

    # -- fast failure detection: a worker reports a peer whose connections fail ------
    def report_unreachable(self, peer: str, reporter: str, why: str) -> None:
        try:
            self.coord.create(self.path("unreachable", f"{peer}@{reporter}"), why.encode(), ephemeral=True)
        except NodeExistsError:
            pass

    def clear_unreachable(self, peer: str, reporter: str) -> None:
        try:
            self.coord.delete(self.path("unreachable", f"{peer}@{reporter}"))
        except NoNodeError:
            pass

    def unreachable_reports(self) -> dict[str, list[str]]:
        """{peer: [reporters]}"""
        out: dict[str, list[str]] = {}
        for node in self.coord.children(self.path("unreachable")):
            peer, _, reporter = node.rpartition("@")
            out.setdefault(peer, []).append(reporter)
        return out

    def watch_unreachable(self, callback: Callable[[list[str]], None]):
        return self.coord.watch_children(self.path("unreachable"), callback)

    # -- topologies ---------------------------------------------------------------
    def submit_topology(self, name: str, spec: dict, before: Callable[[], None] | None = None) -> None:
        """A new topology. What a kill racing the leader's pass or a worker's late write
        left of an earlier one of this name goes first: an assignment the leader wrote
        after the kill (the new run's placement then looked unchanged, and no worker
        started it), or a topology node a late result made again, holding no spec (the
        name then read as submitted). `before()` runs once the name is known to be free,
        just before the topology is written (a resumed run's files set aside)."""
        path = self.path("topologies", name)
        try:
            left = not self.coord.get(path)[0]
        except NoNodeError:
            left = None
        if left is False:
            raise TopologyExistsError(f"topology {name!r} is already submitted; kill it first")
        for stale in ((path,) if left else ()) + (self.path("assignments", name),):
            try:
                self.coord.delete(stale, recursive=True)
            except NoNodeError:
                pass
        if before is not None:
            before()
        try:
            self.coord.create(path, _j(spec))
        except NodeExistsError:
            raise TopologyExistsError(f"topology {name!r} is already submitted; kill it first") from None
        self.coord.create(self.path("topologies", name, "status"), b"active")

    def topology(self, name: str) -> dict:
        try:
            return _unj(self.coord.get(self.path("topologies", name))[0])
        except NoNodeError:
            raise UnknownTopologyError(f"unknown topology {name!r}; running: "
                                       f"{', '.join(self.topology_names()) or 'none'}") from None

    def update_topology(self, name: str, spec: dict) -> None:
        self.coord.set(self.path("topologies", name), _j(spec))

    def request_rebalance(self, name: str, request: dict) -> None:
        """Write the request, over one pending (the leader's own: what is left of a
        request it carries out in steps)."""
        self.topology(name)  # UnknownTopologyError if it is not there
        self.coord.put(self.path("topologies", name, "rebalance"), _j(request))

    def add_rebalance_request(self, name: str, request: dict) -> None:
        """A client's request: RebalancePendingError while another is pending (the leader
        has not carried it out yet). Written over it, that one was lost without a word,
        though its client had been told "requested"."""
        self.topology(name)  # UnknownTopologyError if it is not there
        try:
            self.coord.create(self.path("topologies", name, "rebalance"), _j(request), makepath=True)
        except NodeExistsError:
            pending = self.rebalance_request(name)
            raise RebalancePendingError(f"a rebalance of {name} is still pending ({pending}); ask again once the "
                                        "leader has carried it out (`describe` shows the layout)") from None

    def rebalance_request(self, name: str) -> dict | None:
        return self.rebalance_request_version(name)[0]

    def rebalance_request_version(self, name: str) -> tuple[dict | None, int]:
        """The request and its node's version (-1: none), for clear_rebalance."""
        try:
            data, version = self.coord.get(self.path("topologies", name, "rebalance"))
        except NoNodeError:
            return None, -1
        try:
            return _unj(data), version
        except ValueError:
            return {"unreadable": data[:80].decode("utf-8", "replace")}, version

    def clear_rebalance(self, name: str, version: int = -1) -> None:
        """Remove the request (only as read at `version`: one written since stays)."""
        try:
            self.coord.delete(self.path("topologies", name, "rebalance"), version)
        except (NoNodeError, BadVersionError):
            pass

    def put_balance_log(self, name: str, history: list[dict]) -> None:
        """The load balancer's last decisions for `name` (control/balance.py), for status."""
        self.coord.put(self.path("topologies", name, "balance"), _j(history))

    def balance_log(self, name: str) -> list[dict]:
        """The leader's last balancing decisions ({time, decision, ...} each); entries of
        another shape, or a node that does not parse, are left out."""
        try:
            entries = _unj(self.coord.get(self.path("topologies", name, "balance"))[0])
        except (NoNodeError, ValueError):      # none, or not JSON
            return []
        return [d for d in entries if isinstance(d, dict) and isinstance(d.get("time"), (int, float))
                and "decision" in d] if isinstance(entries, list) else []

    def mark_applied(self, name: str, worker: str, version: int) -> None:
        """A worker reports the assignment version it has converged to."""
        self.coord.put(self.path("topologies", name, "applied", worker), str(version).encode())

    def applied_workers(self, name: str, version: int) -> set[str]:
        out = set()
        try:
            kids = self.coord.children(self.path("topologies", name, "applied"))
        except NoNodeError:
            return out
        for w in kids:
            try:
                if int(self.coord.get(self.path("topologies", name, "applied", w))[0]) >= version:
                    out.add(w)
            except (NoNodeError, ValueError):
                pass
        return out

    def save_state(self, name: str, key: str, value, version: int) -> int:
        """Compare-and-set on the node's version (-1: it must not exist yet); returns the
        new version. BadVersionError/NodeExistsError mean another instance of the task
        wrote since: this one is stale."""
        path = self.path("topologies", name, "state", key)
        data = codec.encode_bytes(value)
        try:
            if version == -1:
                self.coord.create(path, data, makepath=True)
                return 0
            return self.coord.set(path, data, version)
        except ConnectionLostError:
            # the connection dropped with the write in flight (or never came back within
            # the call's deadline): it may have been applied. Look once the connection is
            # back rather than take our own write for another instance's next time and
            # fence ourselves.
            return retry_while_lost(lambda: self._settle_state_write(path, data, version), RESEND_S)

    def _settle_state_write(self, path: str, data: bytes, version: int) -> int:
        try:
            current, now = self.coord.get(path)
        except NoNodeError:
            if version != -1:
                raise BadVersionError(f"{path} was removed by someone else") from None
            self.coord.create(path, data, makepath=True)
            return 0
        if now == version + 1 and current == data:
            return now                   # ours: applied before the connection dropped
        if now == version:
            return self.coord.set(path, data, version)   # not applied: write it now
        if version == -1:
            raise NodeExistsError(f"{path} exists")
        raise BadVersionError(f"{path} was changed by someone else")

    def save_state_async(self, name: str, key: str, value, version: int):
        """save_state of a claimed node (version >= 0) for a caller on an event loop: a
        Future of the new version. A ConnectionLostError leaves the write unsettled:
        settle_state (on a thread) finds out whether it was applied, as save_state does."""
        return self.coord.set_async(self.path("topologies", name, "state", key), codec.encode_bytes(value), version)

    def settle_state(self, name: str, key: str, value, version: int) -> int:
        """After a save_state_async lost its connection: the new version, whether that
        write was applied or is made now (BadVersionError: another instance wrote)."""
        path, data = self.path("topologies", name, "state", key), codec.encode_bytes(value)
        return retry_while_lost(lambda: self._settle_state_write(path, data, version), RESEND_S)

    def load_state(self, name: str, key: str) -> tuple[object, int]:
        """(state, version), or (None, -1) if none was saved."""
        try:
            data, version = self.coord.get(self.path("topologies", name, "state", key))
            return codec.decode(data), version
        except NoNodeError:
            return None, -1

    def has_topology(self, name: str) -> bool:
        return self.coord.exists(self.path("topologies", name)) is not None

    def topology_names(self) -> list[str]:
        return self.coord.children(self.path("topologies"))

    def watch_topologies(self, callback: Callable[[list[str]], None]):
        return self.coord.watch_children(self.path("topologies"), callback)

    def status(self, name: str) -> str | None:
        try:
            return _status_text(self.coord.get(self.path("topologies", name, "status"))[0])
        except NoNodeError:
            return None

    def set_status(self, name: str, status: str) -> None:
        """UnknownTopologyError if the topology is gone: a kill racing this one removed
        it (writing the status anyway made its node again, a topology holding no spec
        that `list` and `status` stumbled on)."""
        path, data = self.path("topologies", name, "status"), status.encode()
        try:
            self.coord.set(path, data)
            return
        except NoNodeError:
            pass
        try:
            self.coord.create(path, data, makepath=False)   # submitted, its status not yet written
        except NodeExistsError:
            self.coord.set(path, data)
        except NoNodeError:
            raise UnknownTopologyError(f"topology {name!r} is gone (killed meanwhile)") from None

    def fail_topology(self, name: str, because: str) -> bool:
        """Mark a running topology failed because of its result `because` (a failed.* or
        refused.* key, published first); False if it is not running (killed, gone) or has
        no such result: a topology of that name submitted again since is another run."""
        reason = self.path("topologies", name, "results", because)
        if self.status(name) not in RUNNING or self.coord.exists(reason) is None:
            return False
        try:
            self.set_status(name, FAILED_STATUS)
        except UnknownTopologyError:
            return False             # killed meanwhile
        return True

    def watch_status(self, name: str, callback: Callable[[str | None], None]):
        return self.coord.watch_data(self.path("topologies", name, "status"),
                                     lambda data, _v: callback(None if data is None else _status_text(data)))

    def remove_topology(self, name: str) -> None:
        for p in (self.path("assignments", name), self.path("topologies", name)):
            try:
                self.coord.delete(p, recursive=True)
            except NoNodeError:
                pass

    def mark_done(self, name: str, task: int) -> None:
        def create():
            try:
                self.coord.create(self.path("topologies", name, "done", str(task)), b"")
            except NodeExistsError:
                pass
        retry_while_lost(create, RESEND_S)

    def done_tasks(self, name: str) -> set[int]:
        try:
            kids = self.coord.children(self.path("topologies", name, "done"))
        except NoNodeError:
            return set()
        return {int(t) for t in kids if t.isdigit()}     # only workers write here: a task number each

    def mark_stopped(self, name: str, worker: str) -> None:
        """Say that `worker` stopped the topology's tasks; nothing when the topology is gone:
        a late mark made the nodes above it again, a topology node holding no spec that
        `list` and `status` then stumbled on."""
        stopped = self.path("topologies", name, "stopped")
        for path in (stopped, f"{stopped}/{worker}"):
            try:
                self.coord.create(path, b"", makepath=False)
            except NodeExistsError:
                continue
            except NoNodeError:
                return

    def stopped_workers(self, name: str) -> set[str]:
        try:
            return set(self.coord.children(self.path("topologies", name, "stopped")))
        except NoNodeError:
            return set()

    def publish_result(self, name: str, key: str, value) -> None:
        self.put_result(name, key, codec.encode_bytes(value))

    def put_result(self, name: str, key: str, data: bytes) -> None:
        """An encoded result, sent again while the connection is lost (it is idempotent)."""
        retry_while_lost(lambda: self.coord.put(self.path("topologies", name, "results", key), data), RESEND_S)

    def withdraw_result(self, name: str, key: str) -> None:
        try:
            self.coord.delete(self.path("topologies", name, "results", key))
        except NoNodeError:
            pass

    def results(self, name: str) -> dict:
        out = {}
        try:
            keys = self.coord.children(self.path("topologies", name, "results"))
        except NoNodeError:
            return out
        for k in keys:
            try:
                out[k] = _result(name, k, self.coord.get(self.path("topologies", name, "results", k))[0])
            except NoNodeError:
                pass            # removed while we listed (the topology is being killed)
        return out

    def failures(self, name: str) -> dict[str, str]:
        """The failed.* and refused.* results: why the topology cannot run, if it cannot."""
        try:
            keys = self.coord.children(self.path("topologies", name, "results"))
        except NoNodeError:
            return {}
        out = {}
        for k in sorted(k for k in keys if k.startswith((FAILED, REFUSED))):
            try:
                out[k] = _result(name, k, self.coord.get(self.path("topologies", name, "results", k))[0])
            except NoNodeError:
                pass
        return out

    # -- assignments --------------------------------------------------------------
    def assignment(self, name: str) -> tuple[Assignment | None, int]:
        try:
            data, version = self.coord.get(self.path("assignments", name))
            return _assignment(data), version
        except NoNodeError:
            return None, -1

    def write_assignment(self, name: str, assignment: Assignment, version: int) -> int:
        """Compare-and-set: version -1 creates; otherwise BadVersionError if someone wrote first."""
        if version == -1:
            self.coord.create(self.path("assignments", name), _j(assignment.to_json()))
            return 0
        return self.coord.set(self.path("assignments", name), _j(assignment.to_json()), version)

    def watch_assignment(self, name: str, callback: Callable[[Assignment | None, int], None]):
        return self.coord.watch_data(self.path("assignments", name),
                                     lambda data, version: callback(_assignment(data), version))

    # -- checkpoints --------------------------------------------------------------
    def put_checkpoint(self, name: str, pointer: dict) -> None:
        self.coord.put(self.path("checkpoints", name), _j(pointer))

    def checkpoint(self, name: str) -> dict | None:
        try:
            return _unj(self.coord.get(self.path("checkpoints", name))[0])
        except NoNodeError:
            return None
