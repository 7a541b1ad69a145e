"""The scheduler that runs in whichever worker wins the election.

Every worker runs one; only the leader acts. It keeps no state of its own:
each pass reads workers, topologies, assignments and rebalance requests from
the coordinator, computes the placement with the pure functions of
placement.py, and writes what changed with compare-and-set - so a new leader
continues exactly where the old one stopped.

A leader passes every `period_s`, and at once when workers, topologies or
unreachable reports change, or when a worker publishes a new load record (a data
watch per worker node: the balancer reacts within a round or two, not a period) -
but never sooner than MIN_GAP_S after its last pass.

A leader whose own ZooKeeper session expired (a ZooKeeper outage usually expires
everyone's) leaves the tasks of workers that have not registered again where they
are for one session timeout after it rejoined: moving them all at once, as if their
workers had died, would restart every compute unit together with the sync task, and
with them every replica of the parameters.

Election and the liveness probe: election.py.
"""
from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from dataclasses import replace

from .balance import Memory, decide
from .client import spout_tasks
from .cluster_state import REFUSED, RUNNING, ClusterState, UnknownTopologyError
from .coordinator import BadVersionError, ConnectionLostError, CoordinatorError, NoNodeError
from .election import Election, ProbeInconclusive, probe
from .placement import NoWorkersError, plan, worker_url
from ..assignment import Assignment, moved_tasks
from ..topology import Topology

log = logging.getLogger(__name__)

MIN_GAP_S = 0.05    # between two passes, however many watches fire


def _new_reason(said: dict[str, str], name: str, error: Exception) -> str | None:
    """`error` as a reason about topology `name`, or None where it is the one last said
    about it (kept in `said`): each reason is said once, not every pass."""
    reason = f"{type(error).__name__}: {error}"
    if said.get(name) == reason:
        return None
    said[name] = reason
    return reason


class SchedulerService:
    def __init__(self, state: ClusterState, worker_id: str, auth, period_s: float = 1.0):
        """`auth`: this worker's transport Auth, with which the liveness probe checks
        that a peer's answer comes from that peer (election.probe)."""
        self.state, self.id, self.period, self.auth = state, worker_id, period_s, auth
        self.election = Election(state, worker_id, self._leadership)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{worker_id}-scheduler", daemon=True)
        self._watching = False
        self.leading = False
        self.passes = 0
        self.unreachable: dict[str, str] = {}   # registered workers placed on no task: why
        self._reports: list[str] = []            # unreachable/ as the watch last saw it: peer@reporter, sorted
        self._unwatch = None
        self.balance_memory: dict[str, Memory] = {}   # topology -> the load balancer's memory (leader only)
        self._load_watches: dict[str, object] = {}     # worker -> cancel its data watch (leader only)
        self._parsed: dict[str, tuple[str, Topology]] = {}   # topology -> (its spec as JSON, parsed)
        self._grace_until = -float("inf")   # time.monotonic(): after our session expired (see the docstring)
        self._graced: set[str] = set()      # topologies whose waiting was logged in this grace
        self._finished_seen: set[str] = set()   # topologies whose finish was logged
        self._refused: dict[str, str] = {}      # topology -> the error its spec was refused with
        self._balance_errors: dict[str, str] = {}   # topology -> the balancer's last error
        self._recheck_at = float("inf")     # time.monotonic(): a pass the load balancer asked for

    def start(self) -> None:
        # every candidate watches the reports: the leader to place no task on a dead peer,
        # the next in line to depose a dead leader - without reading them every period
        self._unwatch = self.state.watch_unreachable(self._on_reports)
        self._thread.start()
        self.election.join()

    def rejoin(self) -> None:
        """After a session expiry: our candidate node is gone, and the other workers'
        sessions have probably expired with ours (see the module's docstring)."""
        self._grace_until = time.monotonic() + getattr(self.state.coord, "session_timeout", 0.0)
        self._graced = set()
        self.election.stand()
        self._wake.set()

    def stop(self) -> None:
        if self._unwatch:
            self._unwatch()
        self._unwatch_loads(set(self._load_watches))
        self._stop.set()
        self._wake.set()
        self.election.leave()
        self._thread.join(10)

    def _leadership(self, leading: bool) -> None:
        if leading and not self.leading:
            log.info("worker %s is now the scheduler (leader)", self.id)
            if not self._watching:
                self._watching = True
                self.state.watch_workers(lambda _: self._wake.set())
                self.state.watch_topologies(lambda _: self._wake.set())
        if not leading:
            self._unwatch_loads(set(self._load_watches))
        self.leading = leading
        self._wake.set()

    def _watch_loads(self, workers) -> None:
        """Keep a data watch on each registered worker's node (scheduler thread): a load
        record it publishes wakes the leader."""
        self._unwatch_loads(set(self._load_watches) - set(workers))
        for w in sorted(set(workers) - set(self._load_watches)):
            self._load_watches[w] = self.state.watch_worker(w, lambda *_: self._wake.set())

    def _unwatch_loads(self, workers) -> None:
        for w in workers:
            cancel = self._load_watches.pop(w, None)
            if cancel:
                cancel()

    def _on_reports(self, nodes: list[str]) -> None:
        """Every candidate gets every change of the reports (coordinator thread), but only
        two act on one: the leader, and the next in line when the leader is reported.
        Waking all of them made each change cost a pass of every scheduler (with 100
        embedded workers, thousands of reports, 100 passes each reading all of them)."""
        self._reports = nodes
        if self.leading or (self.election.next_in_line and self._leader_reported()):
            self._wake.set()

    def _leader_reported(self) -> bool:
        """Whether someone reports the leader (a binary search of the sorted reports)."""
        leader = self.election.leader
        if not leader:
            return False
        at = leader + "@"
        i = bisect.bisect_left(self._reports, at)
        return i < len(self._reports) and self._reports[i].startswith(at)

    def poke(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        last = -float("inf")
        while not self._stop.is_set():
            self._wake.wait(max(0.0, min(self.period, self._recheck_at - time.monotonic())))
            self._recheck_at = float("inf")
            self._stop.wait(max(0.0, last + MIN_GAP_S - time.monotonic()))
            self._wake.clear()
            last = time.monotonic()
            if self._stop.is_set():
                return
            if not self.election.is_leader:
                try:
                    self._depose_dead_leader()
                except CoordinatorError as e:
                    log.warning("checking the leader failed (will retry): %s", e)
                except Exception:  # noqa: BLE001 - the thread must live on to lead one day
                    log.exception("checking the leader failed")
                continue
            try:
                self.reconcile()
                self.passes += 1
            except CoordinatorError as e:
                log.warning("scheduler pass failed (will retry): %s", e)
            except Exception:  # noqa: BLE001 - the leader must keep scheduling
                log.exception("scheduler pass failed")

    def _depose_dead_leader(self) -> None:
        """The next candidate in line takes over from a leader that peers report
        unreachable and that does not answer its probe either, without waiting for the
        leader's session to end: it deletes the leader's election node."""
        leader = self.election.leader
        if not leader or leader == self.id or not self.election.next_in_line or not self._leader_reported():
            return    # only the next in line acts, and only on a report (both as the watches saw them)
        reports = self.state.unreachable_reports()
        if leader not in reports:
            return
        kids, node = sorted(self.election._kids()), self.election.node
        if node is None or len(kids) < 2 or kids[1] != node.rsplit("/", 1)[-1]:
            return    # the candidates changed since the watch saw them (or we stand again)
        info = self.state.workers().get(leader)
        try:
            why = probe(info, leader, self.auth) if info else "not registered"
        except ProbeInconclusive as e:
            log.warning("the leader %s is reported unreachable, but %s; not taking over", leader, e)
            return
        if why is None:
            return
        log.warning("the leader %s is unreachable (%s cannot connect; my probe: %s): taking over before its "
                    "session ends", leader, ",".join(sorted(reports[leader])), why)
        try:
            self.state.coord.delete(self.state.path("leader", kids[0]))
        except NoNodeError:
            pass

    # -- one pass ------------------------------------------------------------------------
    def reconcile(self) -> None:
        registered = self.state.workers()
        self._watch_loads(registered)
        workers = self._reachable(registered)
        names = self.state.topology_names()
        for gone in set(self._parsed) - set(names):
            del self._parsed[gone]
        for said in (self._refused, self._balance_errors):
            for gone in set(said) - set(names):
                del said[gone]
        self._finished_seen &= set(names)     # a name submitted again is a new run
        for name in names:
            try:
                if self.state.status(name) not in RUNNING:
                    continue
                self._reconcile_topology(name, workers)
            except NoWorkersError as e:
                log.warning("topology %s: %s", name, e)
            except (BadVersionError, NoNodeError, UnknownTopologyError):
                self._wake.set()  # someone wrote first (or it went away): look again
            except ConnectionLostError:
                raise             # the pass as a whole is retried
            except Exception as e:  # noqa: BLE001 - one topology must not stop the others: a spec that
                # does not place, or a node of it we may not read (a submitter chose its ACL)
                self._refuse(name, e)
            else:
                if self._refused.pop(name, None) is not None:
                    self._withdraw_refusal(name)

    def _refuse(self, name: str, error: Exception) -> None:
        """A topology that cannot be scheduled (a spec that does not parse or place: one
        written past the submit client's checks, or by another version): the others are
        scheduled as usual, and the reason goes to the log and - as a worker's refusal
        does - to the topology's results, where the submitter reads it; once per reason."""
        reason = _new_reason(self._refused, name, error)
        if reason is None:
            return
        log.error("topology %s cannot be scheduled: %s", name, reason)
        try:
            self.state.publish_result(name, f"{REFUSED}scheduler", f"the scheduler cannot place it: {reason}")
        except CoordinatorError as e:
            del self._refused[name]      # said again on the next pass
            log.warning("topology %s: could not publish why it cannot be scheduled: %s", name, e)

    def _withdraw_refusal(self, name: str) -> None:
        """A topology this leader refused is placed now (its spec or request was mended):
        the refusal goes from its results, or a submitter waiting later would fail on it."""
        try:
            self.state.withdraw_result(name, f"{REFUSED}scheduler")
        except CoordinatorError as e:
            log.warning("topology %s: could not withdraw its refusal: %s", name, e)
        else:
            log.info("topology %s: placed after all; its refusal is withdrawn", name)

    def _reachable(self, workers: dict) -> dict:
        """The registered workers minus those peers report unreachable and our own probe
        confirms: their tasks move now, not when their ZooKeeper session ends."""
        reports = self.state.unreachable_reports()
        out, now_unreachable = dict(workers), {}
        for peer, reporters in sorted(reports.items()):
            if peer not in workers or peer == self.id:
                continue
            try:
                why = probe(workers[peer], peer, self.auth)
            except ProbeInconclusive as e:     # no news: it stays as the last pass saw it
                if peer in self.unreachable:
                    now_unreachable[peer] = self.unreachable[peer]
                    del out[peer]
                log.warning("worker %s is reported unreachable, but %s", peer, e)
                continue
            if why is None:
                continue          # it answers us: the reporters' links will recover
            now_unreachable[peer] = (f"it is unreachable ({', '.join(sorted(reporters))} cannot connect; the "
                                     f"leader's probe: {why}), before its ZooKeeper session ends")
            del out[peer]
        for peer, why in now_unreachable.items():
            if peer not in self.unreachable:
                log.warning("worker %s: %s; placing no tasks on it", peer, why)
        self.unreachable = now_unreachable
        return out

    def _reconcile_topology(self, name: str, workers: dict) -> None:
        current, version = self.state.assignment(name)
        if current is not None and time.monotonic() < self._grace_until:
            away = sorted(set(current.tasks.values()) - set(workers))
            if away:
                if name not in self._graced:
                    self._graced.add(name)
                    log.info("topology %s: workers %s not registered again yet after ZooKeeper sessions "
                             "expired; their tasks stay for up to %.1f s", name, ",".join(away),
                             self._grace_until - time.monotonic())
                return
        spec = self.state.topology(name)
        topology = self._parse(name, spec)
        if current is not None and topology is not None and self._finished(name, topology):
            return
        stopped = self.state.applied_workers(name, version) if current and current.draining else set()
        request, request_version = self.state.rebalance_request_version(name)
        try:
            step = plan(spec, workers, current, request, stopped, time.time(), topology)
        except Exception as e:  # noqa: BLE001 - judged below
            if request is None:
                raise
            # the request cannot be carried out (a spec it would make that cannot run, or a
            # request of the wrong shape, written past the client's checks): the request
            # goes, the topology runs on as it was (the next pass places it without it)
            log.error("topology %s: rebalance request %r refused: %s: %s", name, request, type(e).__name__, e)
            self.state.clear_rebalance(name, request_version)
            self._wake.set()
            return
        for note in step.notes:
            log.info("topology %s: %s", name, note)
        assignment = step.assignment
        if step.spec is None:
            try:
                assignment = self._balance(name, topology, assignment or current, workers) or assignment
            except CoordinatorError:
                raise
            except Exception as e:  # noqa: BLE001 - load records from workers: the placement goes on without
                self._balance_failed(name, e)
            else:
                self._balance_errors.pop(name, None)
        if step.spec is not None:
            self.state.update_topology(name, step.spec)
        if assignment is not None:
            if not assignment.draining:
                self._log_moves(name, current, assignment, workers)
            self.state.write_assignment(name, assignment, version)
        if step.request == {}:
            self.state.clear_rebalance(name, request_version)
        elif step.request:
            self.state.request_rebalance(name, step.request)
        if step.again:
            self._wake.set()

    def _finished(self, name: str, topology: Topology) -> bool:
        """Whether every spout task of `name` is done (its source exhausted, its trees
        complete): then nothing is left for its tasks to do, and those of a worker that
        leaves are not started elsewhere. A new instance would only rebuild its state
        for no work - a sync task finding no replica to restore from reports updates
        lost that were not, and a unit publishes figures of nothing - and a topology
        stopped by SIGTERM to all its workers would start again on the next ones to
        register. It stays as it is until it is killed (`submit --resume` removes a
        stopped one)."""
        if not spout_tasks(topology) <= self.state.done_tasks(name):
            return False
        if name not in self._finished_seen:
            self._finished_seen.add(name)
            log.info("topology %s: every spout is done; its tasks stay where they are until it is killed", name)
        return True

    def _parse(self, name: str, spec: dict) -> Topology:
        """The spec as a Topology, parsed again only when it changed (a rebalance, or
        the topology killed and submitted anew under the same name)."""
        text = json.dumps(spec, sort_keys=True)
        kept = self._parsed.get(name)
        if kept is None or kept[0] != text:
            kept = self._parsed[name] = (text, Topology.from_dict(spec))
        return kept[1]

    def _balance_failed(self, name: str, error: Exception) -> None:
        """The load balancer could not decide (a worker's load record it cannot read):
        this pass places the topology without it, and says why once per reason."""
        reason = _new_reason(self._balance_errors, name, error)
        if reason is not None:
            log.exception("topology %s: the load balancer failed (%s); placing it without balancing", name, reason)

    def _balance(self, name: str, topology: Topology, base: Assignment | None, workers: dict) -> Assignment | None:
        """The load balancer's decision (balance.py) applied to `base`, or None: no change."""
        if base is None or base.draining:
            return None
        memory = self.balance_memory.setdefault(name, Memory())
        now = time.time()
        d = decide(name, topology, base, workers, memory, now)
        if d.recheck_at is not None:     # a change held by its minimum interval: decide again then
            self._recheck_at = min(self._recheck_at, time.monotonic() + d.recheck_at - now)
        if not d.changed:
            return None
        for note in d.notes:
            log.info("topology %s: balance: %s", name, note)
        tasks = {**base.tasks, **d.moves}
        urls = {w: u for w, u in base.workers.items() if w in tasks.values()}
        urls.update({w: worker_url(workers[w]) for w in tasks.values() if w not in urls and w in workers})
        new = replace(base, tasks=tasks, workers=urls, threads={**base.threads, **(d.threads or {})},
                      shares=d.shares if d.shares is not None else base.shares)
        try:
            self.state.put_balance_log(name, memory.history)
        except CoordinatorError as e:
            log.warning("topology %s: could not store the balance history: %s", name, e)
        return new

    def _log_moves(self, name: str, current: Assignment | None, new: Assignment, workers: dict) -> None:
        moved = moved_tasks(None if current is None or current.draining else current, new)
        gone: dict[str, list[int]] = {}
        for t, (old, _) in moved.items():
            if old is not None and old not in workers:
                gone.setdefault(old, []).append(t)
        for w, tasks in sorted(gone.items()):
            why = self.unreachable.get(w, "it left the cluster (ZooKeeper session ended)")
            log.warning("topology %s: reassigning %d task(s) of worker %s: %s; tasks %s", name, len(tasks), w, why,
                        ",".join(map(str, sorted(tasks))))
        if current is None or current.draining:
            log.info("topology %s: placing %d tasks on %d workers", name, len(new.tasks), len(new.workers))
        elif moved and not gone:
            log.info("topology %s: moving %d task(s) to balance load", name, len(moved))
