"""One topology's share of one worker: its tasks, its routing, its assignment.

The worker hands each assignment version here; the runtime converges to it -
starting tasks that became its own, stopping those that moved away - and
rebuilds the routing tables, which depend on which tasks are local.
"""
from __future__ import annotations

import asyncio
import logging
import zlib

from ..assignment import Assignment
from ..codec import CodecError, held_bytes
from ..control.cluster_state import FAILED
from ..component import Context
from ..messages import DataMsg, DataRun, Message
from . import fencing
from .executor import STOP, BoltExecutor, SpoutExecutor
from .grouping import make_chooser
from .routing import View
from ..topology import (DEFAULT_ALLOWED_MODULES, Topology, TopologyError, declared_outputs, resolve_component,
                        spec_version)

log = logging.getLogger(__name__)


class TopologyRuntime:
    def __init__(self, worker, name: str, spec: dict):
        """TopologyError, naming the class, if the spec names one the worker does not allow."""
        self.worker, self.name = worker, name
        self.allow = getattr(worker, "allow_modules", DEFAULT_ALLOWED_MODULES)
        self.topology = Topology.from_dict(spec, check_classes=True, allow=self.allow)
        self.spec_version = spec_version(spec)
        self.classes = {c["id"]: resolve_component(c["class"], c["kind"], self.allow) for c in self.topology.components}
        self.fields = {cid: declared_outputs(cls) for cid, cls in self.classes.items()}
        self.task_cid = {t: c["id"] for c in self.topology.components for t in self.topology.tasks(c["id"])}
        self.task_worker: dict[int, str] = {}
        self.addresses: dict[str, str] = {}
        self.executors: dict = {}
        self.choosers: dict[tuple[str, str], list] = {}
        self.version = -1
        self.dropped = 0
        self.stale = 0        # tuples refused from superseded task instances (fencing)
        self.parked: list = []   # tuples for tasks of an assignment not applied here yet (park)
        self.parked_tuples = self.parked_bytes = 0
        self.dropped_parking = False     # park() dropped since the last unpark (warned once)
        self.stop_requested = False   # the topology is stopping cleanly: its spouts get drain()
        self.lock = asyncio.Lock()
        self.view = View(worker.id, -1, frozenset(), {}, {})
        self.shares: dict[int, float] = {}   # the load balancer's work shares (task -> weight)

    def refresh_view(self) -> None:
        """After any change of version, placement or local executors: routing reads the view."""
        self.view = View(self.worker.id, self.version, frozenset(self.executors), dict(self.task_worker),
                         dict(self.addresses))

    # -- assignment -------------------------------------------------------------------
    async def apply(self, assignment: Assignment, version: int) -> None:
        async with self.lock:
            if version <= self.version:
                return
            self.version = version
            self.shares = dict(assignment.shares)
            before = self.task_worker
            self.task_worker = dict(assignment.tasks)
            moved = sorted(t for t, w in before.items() if self.task_worker.get(t) != w)
            if moved and before:
                # tuples in flight to a worker that left, or to a task instance that was
                # stopped to move, are gone: replay now rather than after message_timeout_s,
                # so no round waits longer than failure detection
                lost = sorted({w for w in before.values() if w not in assignment.workers})
                why = f"worker(s) {','.join(lost)} left" if lost else f"task(s) {moved[:8]} moved"
                for ex in self.executors.values():
                    if isinstance(ex, SpoutExecutor) and ex.pending:
                        log.warning("%s: %s; failing %d pending tuple tree(s) of task %d for replay",
                                    self.name, why, len(ex.pending), ex.task)
                        ex.fail_all()
            self.addresses = dict(assignment.workers)
            mine = {t for t, w in self.task_worker.items() if w == self.worker.id}
            log.info("%s: assignment v%d: tasks here %s", self.name, version, sorted(mine))
            self._build_routes(mine)
            self.refresh_view()
            for t in sorted(set(self.executors) - mine):
                log.info("%s: task %d moved away; stopping it here", self.name, t)
                ex = self.executors.pop(t)
                # placed elsewhere while this worker's session expired: a stale instance,
                # whose results must not replace its successor's (a task moved live, or
                # gone with a smaller parallelism, still publishes as it stops)
                if t in self.task_worker and ex.session < getattr(self.worker, "sessions", 0):
                    log.warning("%s: task %d is a stale instance (placed elsewhere while this worker's "
                                "coordinator session expired); it publishes nothing as it stops", self.name, t)
                    ex.ctx.retire()
                self.worker.load.forget(self.name, t)
                self.refresh_view()
                await self._stop_executor(ex)
            for t in sorted(mine - set(self.executors)):
                try:
                    ex = self.make_executor(t)
                except Exception as e:  # noqa: BLE001 - user code: the component's constructor
                    log.exception("%s: task %d cannot be made", self.name, t)
                    self.task_failed(t, f"its constructor raised {type(e).__name__}: {e}")
                    continue     # the other tasks start; the client fails the run on this one
                try:
                    await fencing.claim_state(self, ex)
                except CodecError as e:       # its saved state cannot be read: it cannot start, as if prepare() raised
                    key = fencing.state_key(ex)
                    log.error("%s: task %d cannot start: its saved state %s cannot be read: %s", self.name, t, key, e)
                    self.task_failed(t, f"its saved state ({key}) cannot be read: {e}")
                    continue
                except Exception:
                    self.version = -1  # not converged: the next assignment event applies it again
                    self.refresh_view()
                    raise
                self.executors[t] = ex
                self.refresh_view()
            for t in sorted(mine & set(self.executors)):
                ex = self.executors[t]
                ex.session = getattr(self.worker, "sessions", 0)   # placed here in this session: current
                if ex._task is None:
                    ex.start()

    def on_fenced(self, ex) -> None:
        """A task instance here was fenced (fencing.py decides what happens next)."""
        if self.executors.get(ex.task) is ex:
            asyncio.get_running_loop().create_task(fencing.restart_fenced(self, ex))

    async def hand_over_queue(self, old) -> None:
        await fencing.hand_over_queue(self, old)

    def _build_routes(self, local: set[int]) -> None:
        routes: dict[tuple[str, str], list] = {}
        for c in self.topology.components:
            for stream, fields in self.fields[c["id"]].items():
                choosers = []
                for bolt, grouping in self.topology.subscribers(c["id"], stream):
                    seed = zlib.crc32(f"{self.name}/{self.worker.id}/{c['id']}/{stream}/{bolt['id']}".encode())
                    choosers.append(make_chooser(grouping, list(self.topology.tasks(bolt["id"])), fields,
                                                 local, seed, self.allow))
                routes[(c["id"], stream)] = choosers
        self.choosers = routes

    def make_executor(self, task: int):
        c = self.topology.task_component(task)
        r = self.topology.tasks(c["id"])
        instance = self.classes[c["id"]](**c["config"])
        ctx = Context(topology=self.name, component=c["id"], task=task, task_index=task - r.start,
                      parallelism=c["parallelism"], worker=self.worker.id, config=self.topology.config,
                      component_config=c["config"], component_tasks=self.topology.tasks,
                      compute=self.worker.compute, publish=lambda k, v: self.worker.publish(self.name, k, v),
                      save_state=None,
                      put_checkpoint=lambda p: self.worker.state.put_checkpoint(self.name, p),
                      compute_share=lambda: self.compute_share(c["id"]),
                      report_work=lambda items, seconds, share: self.report_work(task, items, seconds, share),
                      work_shares=self.work_shares, fail_topology=lambda why: self.task_failed(task, why))
        if c["kind"] == "spout":
            ex = SpoutExecutor(self, task, c, instance, ctx)
        else:
            ex = BoltExecutor(self, task, c, instance, ctx, queue_size=int(self.topology.config["queue_size"]))
        ctx._save_state = lambda v: fencing.save_state(self, ex, v)
        ctx._save_state_async = lambda v: fencing.save_state_async(self, ex, v)
        if isinstance(ex, SpoutExecutor):
            ctx._on_saved = ex.saved          # a spout waiting for a save goes on when it lands
        return ex

    def report_work(self, task: int, items: float, seconds: float, share: float | None = None) -> None:
        """A task's work report, to the worker's load meter with the share it was done
        under (the assignment's where the task does not say)."""
        self.worker.report_work(self.name, task, items, seconds, self.shares.get(task, 1.0) if share is None else share)

    def work_shares(self, cid: str) -> list[float] | None:
        """The assignment's work shares of `cid`'s tasks, by task index (None: none set)."""
        tasks = self.topology.tasks(cid)
        if not any(t in self.shares for t in tasks):
            return None
        return [self.shares.get(t, 1.0) for t in tasks]

    def compute_share(self, cid: str) -> int:
        """The worker's compute threads divided among this component's tasks here."""
        here = sum(1 for ex in self.executors.values() if ex.cid == cid)
        return max(1, self.worker.pool.size // max(1, here))

    async def _stop_executor(self, ex, timeout: float = 10.0) -> None:
        if ex._task is None or ex._task.done():
            return         # never started, or ended on its own (its start failed, or it crashed)
        ex.stopping = True

        async def stopped():
            if isinstance(ex, BoltExecutor):
                await ex.inbound.put(STOP)      # behind what is queued: a full queue waits for the bolt
            else:
                ex.wake.set()
            await asyncio.shield(ex._task)
        try:
            await asyncio.wait_for(stopped(), timeout)
        except asyncio.TimeoutError:
            log.warning("%s: task %d did not stop within %.0f s; cancelling", self.name, ex.task, timeout)
            ex._task.cancel()
        if isinstance(ex, BoltExecutor) and (not ex.inbound.empty() or ex.inbound.told):
            # what nobody will take now (a cancelled bolt's queue, tuples that came after
            # its STOP) is failed for replay, and its senders released; a stream waiting
            # for room in its overflow goes on
            await ex.fail_queue()
            if ex.inbound.told:
                self.release_holds(ex.task, ex.inbound)

    async def stop(self, drain_s: float = 5.0) -> None:
        """Stop spouts, let bolt queues drain (up to drain_s), then stop bolts."""
        async with self.lock:
            spouts = [e for e in self.executors.values() if isinstance(e, SpoutExecutor)]
            bolts = [e for e in self.executors.values() if isinstance(e, BoltExecutor)]
            for e in spouts:
                await self._stop_executor(e)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + drain_s
            while any(not e.inbound.empty() for e in bolts) and loop.time() < deadline:
                await asyncio.sleep(0.01)
            for e in bolts:
                await self._stop_executor(e)
            self.executors.clear()
            self.worker.load.forget(self.name)
            self.refresh_view()

    # -- routing ----------------------------------------------------------------------
    def route(self, cid: str, stream: str, values: list, direct: int | None) -> list[int]:
        choosers = self.choosers.get((cid, stream))
        if choosers is None:
            raise TopologyError(f"{cid!r} emitted on stream {stream!r}, which it does not declare; "
                                f"declared: {', '.join(self.fields[cid]) or 'none'}")
        declared = self.fields[cid][stream]
        if len(values) != len(declared):
            raise TopologyError(f"{cid!r} emitted {len(values)} values on {stream!r}, which declares "
                                f"fields {declared}")
        out: list[int] = []
        for choose in choosers:
            out += choose(values, direct)
        return out

    async def wait_converged(self, timeout: float = 30.0) -> None:
        """Until every worker of the current assignment has applied it: a spout that
        starts before its bolts exist elsewhere would have its first tuples dropped and
        replayed only after message_timeout_s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline and not self.worker.closing:
            version = self.version
            needed = set(self.task_worker.values())
            try:
                done = await asyncio.to_thread(self.worker.state.applied_workers, self.name, version)
            except Exception:  # noqa: BLE001 - the coordinator may be briefly away: keep waiting
                done = set()
            if needed <= done:
                return
            await asyncio.sleep(0.05)
        log.warning("%s: not every worker reported the assignment after %.0f s; starting anyway", self.name, timeout)

    def task_done(self, task: int) -> None:
        self.worker.mark_done(self.name, task)

    def task_failed(self, task: int, why: str) -> None:
        """A task could not start: `why`, after the component, task and worker, goes where
        clients look (client.wait_done)."""
        c = self.topology.task_component(task)
        self.worker.publish(self.name, f"{FAILED}{task}",
                            f"{c['kind']} {c['id']!r} (task {task}) on worker {self.worker.id}: {why}")
        self.worker.topology_failed(self.name, f"{FAILED}{task}")

    MAX_PARKED = 10_000             # tuples
    MAX_PARKED_BYTES = 1 << 30      # what their arrays keep alive: the frames they are views of

    def park(self, msg: DataMsg | DataRun) -> None:
        """Hold tuples for tasks of an assignment this worker has not applied yet; past
        either bound they are dropped (the spout replays them at their trees' timeout)."""
        tuples, size = (len(msg) if isinstance(msg, DataRun) else 1), held_bytes(msg.values)
        if self.parked_tuples + tuples > self.MAX_PARKED or self.parked_bytes + size > self.MAX_PARKED_BYTES:
            if not self.dropped_parking:
                log.warning("%s: %d tuples (%d bytes) are held for an assignment not applied here yet; "
                            "dropping more (their trees are replayed)", self.name, self.parked_tuples,
                            self.parked_bytes)
            self.dropped_parking = True
            self.dropped += tuples
            return
        self.parked.append(msg)
        self.parked_tuples += tuples
        self.parked_bytes += size

    def unpark(self) -> list:
        """The held messages, in arrival order; none are held after."""
        parked, self.parked = self.parked, []
        self.parked_tuples = self.parked_bytes = 0
        self.dropped_parking = False
        return parked

    async def deliver(self, target: int, msg: Message) -> None:
        await self.worker.delivery.send(self, target, msg)

    def write_now(self) -> None:
        """A task here is about to wait: what the worker's links hold goes now."""
        self.worker.delivery.write_now()

    def release_holds(self, task: int, inbox) -> None:
        """Bolt task `task`'s queue has room again (inbox.py): release its senders."""
        self.worker.delivery.release(self, task, inbox)

    def status(self) -> dict:
        tasks = {}
        for t, ex in sorted(self.executors.items()):
            m = {"component": ex.cid, "kind": ex.kind, **ex.metrics.as_dict()}
            if ex.ctx.figures:
                m["figures"] = ex.ctx.figures_status()
            if isinstance(ex, BoltExecutor):
                m["queue"], m["queue_max"] = ex.inbound.qsize(), ex.inbound.maxsize
                m["overflow"], m["overflow_most"] = len(ex.inbound.overflow), ex.inbound.most_overflow
            else:
                m["pending"], m["pending_max"] = len(ex.pending), ex.max_pending
            tasks[t] = m
        return {"assignment_version": self.version, "tasks": tasks, "dropped": self.dropped, "stale": self.stale,
                "shares": {str(t): w for t, w in sorted(self.shares.items())}}
