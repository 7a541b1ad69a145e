"""Leader election: each candidate holds an ephemeral sequential node under leader/;
the lowest one leads. When it vanishes (its session ended, or the next in line
deleted it after confirming the leader dead) the next one takes over; a candidate
whose node was deleted while its session lives stands again, at the back of the line.
And the liveness probe the leader (or the next in line) runs before acting on a report.
"""
from __future__ import annotations

import errno
import logging
import threading

from .cluster_state import ClusterState
from .coordinator import CoordinatorError
from ...errors import StreamnetError

log = logging.getLogger(__name__)


class Election:
    def __init__(self, state: ClusterState, candidate: str, on_change):
        self.state, self.candidate, self.on_change = state, candidate, on_change
        self.node: str | None = None
        self.leader: str | None = None
        self.kids: list[str] = []      # the candidates' nodes, as the watch last saw them (sorted)
        self._cancel = None
        self._lock = threading.Lock()  # one node at a time: the watch and a rejoin may both stand
        self._left = False

    def join(self) -> None:
        self.stand()
        if self._cancel is None:
            self._cancel = self.state.coord.watch_children(self.state.path("leader"), self._children)

    def stand(self) -> None:
        """Hold a candidate node: a new one unless the one we hold is still there (after
        a session expiry, or once the next in line deleted ours, taking us for dead)."""
        with self._lock:
            if self._left or (self.node is not None and self.node.rsplit("/", 1)[-1] in self._kids()):
                return
            self.node = self.state.coord.create(self.state.path("leader", "n-"), self.candidate.encode(),
                                                ephemeral=True, sequence=True)

    def _children(self, kids: list[str]) -> None:
        mine = self.node
        if mine is not None and not self._left and mine.rsplit("/", 1)[-1] not in kids:
            # deposed while alive (or our session expired: then the create fails, and the
            # worker's rejoin stands again on the new session). Before, such a candidate was
            # neither leader nor in line for good: with two workers, once the other one
            # died no one led, and no task moved again
            try:
                self.stand()
                log.warning("%s: my candidate node was removed while my session lives (taken for dead?); "
                            "standing again", self.candidate)
            except CoordinatorError as e:
                log.info("%s: could not stand again yet: %s", self.candidate, e)
        self.kids = sorted(kids)
        leader = None
        if kids:
            try:
                leader = self.state.coord.get(self.state.path("leader", min(kids)))[0].decode()
            except CoordinatorError:
                leader = None
        self.leader = leader
        self.on_change(self.is_leader)

    @property
    def is_leader(self) -> bool:
        return self.node is not None and self.leader == self.candidate and \
            self.node.rsplit("/", 1)[-1] == min(self._kids() or [""])

    @property
    def next_in_line(self) -> bool:
        """Whether this candidate follows the leader, as the watch last saw the candidates
        (no coordinator read: every candidate asks on every report)."""
        return self.node is not None and len(self.kids) >= 2 and self.kids[1] == self.node.rsplit("/", 1)[-1]

    def _kids(self) -> list[str]:
        try:
            return self.state.coord.children(self.state.path("leader"))
        except CoordinatorError:
            return []

    def leave(self) -> None:
        with self._lock:
            self._left = True
        if self._cancel:
            self._cancel()
        if self.node:
            try:
                self.state.coord.delete(self.node)
            except CoordinatorError:
                pass
            self.node = None


PROBE_TIMEOUT_S = 2.0
MAX_HELLO_BYTES = 4096      # of a /hello answer the leader's probe or a link reads (a worker's: ~250)

#: connection errors that are the connecting process's own shortage - out of descriptors,
#: memory or local ports - not news of the peer. Neither a link's report nor the probe may
#: count them against the peer: with 100 embedded workers in one process (~20,000 sockets)
#: EMFILE had workers report healthy peers and the leader, whose probe failed the same way,
#: take them for dead.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL})


class ProbeInconclusive(StreamnetError):
    """The probe could not be sent for a reason of the prober's own (out of file
    descriptors, ...): it says nothing about the peer, which must not be taken for dead."""


def probe(info: dict, worker_id: str, auth, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None if `worker_id` answers on its address and proves that it holds the cluster
    secret (its /hello signs our random nonce); else why not. Any other answer - an
    error page, another program on that port, a worker of another cluster - is no
    sign of life. `auth`: the prober's transport Auth (check_proof). Raises
    ProbeInconclusive when the failure is the prober's own (LOCAL_ERRNOS)."""
    import json
    import os
    import urllib.error
    import urllib.request

    client_nonce = os.urandom(16).hex()
    try:
        with urllib.request.urlopen(f"http://{info['host']}:{info['port']}/hello?c={client_nonce}",
                                    timeout=timeout) as r:
            hello = json.loads(r.read(MAX_HELLO_BYTES))
    except urllib.error.HTTPError as e:
        return f"it answered HTTP {e.code}, not a worker's hello"
    except (OSError, ValueError, KeyError) as e:
        reason = getattr(e, "reason", e)
        if getattr(reason, "errno", None) in LOCAL_ERRNOS:
            raise ProbeInconclusive(f"could not probe {worker_id}: {reason}") from e
        return f"{type(e).__name__}: {reason}"
    if not isinstance(hello, dict) or hello.get("worker") != worker_id:
        return f"another program answers there (not worker {worker_id})"
    if not auth.check_proof(hello.get("proof"), hello.get("nonce"), client_nonce, worker_id):
        return "its hello does not prove the cluster secret"
    return None
