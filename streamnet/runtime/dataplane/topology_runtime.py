"""One topology's share of one worker: its tasks, its routing, its assignment.

The worker hands each assignment version here; the runtime converges to it -
starting tasks that became its own, stopping those that moved away - and
rebuilds the routing tables, which depend on which tasks are local.
"""
from __future__ import annotations

import asyncio
import logging
import zlib

from ..component import Context
from .executor import STOP, BoltExecutor, SpoutExecutor
from .grouping import make_chooser
from ..topology import Topology, TopologyError, declared_outputs, resolve

log = logging.getLogger(__name__)


class TopologyRuntime:
    def __init__(self, worker, name: str, spec: dict):
        self.worker, self.name = worker, name
        self.topology = Topology.from_dict(spec)
        self.spec_version = spec.get("version", 0)
        self.classes = {c["id"]: resolve(c["class"]) for c in self.topology.components}
        self.fields = {cid: declared_outputs(cls) for cid, cls in self.classes.items()}
        self.task_cid = {t: c["id"] for c in self.topology.components for t in self.topology.tasks(c["id"])}
        self.task_worker: dict[int, str] = {}
        self.addresses: dict[str, str] = {}
        self.executors: dict = {}
        self.choosers: dict[tuple[str, str], list] = {}
        self.version = -1
        self.dropped = 0
        self.stale = 0        # tuples refused from superseded task instances (fencing)
        self.parked: list = []   # tuples for tasks of an assignment not applied here yet
        self.stop_requested = False   # the topology is stopping cleanly: its spouts get drain()
        self.lock = asyncio.Lock()

    # -- assignment -------------------------------------------------------------------
    async def apply(self, assignment: dict, version: int) -> None:
        async with self.lock:
            if version <= self.version:
                return
            self.version = version
            before = self.task_worker
            self.task_worker = {int(t): w for t, w in assignment["tasks"].items()}
            moved = sorted(t for t, w in before.items() if self.task_worker.get(t) != w)
            if moved and before:
                # tuples in flight to a worker that left, or to a task instance that was
                # stopped to move, are gone: replay now rather than after message_timeout_s,
                # so no round waits longer than failure detection
                lost = sorted({w for w in before.values() if w not in assignment["workers"]})
                why = f"worker(s) {','.join(lost)} left" if lost else f"task(s) {moved[:8]} moved"
                for ex in self.executors.values():
                    if isinstance(ex, SpoutExecutor) and ex.pending:
                        log.warning("%s: %s; failing %d pending tuple tree(s) of task %d for replay",
                                    self.name, why, len(ex.pending), ex.task)
                        ex.fail_all()
            self.addresses = dict(assignment["workers"])
            mine = {t for t, w in self.task_worker.items() if w == self.worker.id}
            log.info("%s: assignment v%d: tasks here %s", self.name, version, sorted(mine))
            self._build_routes(mine)
            for t in sorted(set(self.executors) - mine):
                log.info("%s: task %d moved away; stopping it here", self.name, t)
                await self._stop_executor(self.executors.pop(t))
            for t in sorted(mine - set(self.executors)):
                ex = self._make_executor(t)
                try:
                    await self.worker.claim_state(self.name, f"{ex.cid}.{ex.ctx.task_index}", ex)
                except Exception:
                    self.version = -1  # not converged: the next assignment event applies it again
                    raise
                self.executors[t] = ex
            for t in sorted(mine):
                ex = self.executors[t]
                if ex._task is None:
                    ex.start()

    def on_fenced(self, ex) -> None:
        """A task instance here was fenced. Normally a newer instance runs elsewhere; but
        if the assignment in the coordinator still places the task here, this worker
        lost a race with an older instance and must run the task again."""
        if self.executors.get(ex.task) is ex:
            asyncio.get_running_loop().create_task(self._restart_fenced(ex))

    async def _restart_fenced(self, old) -> None:
        try:
            assignment, _ = await asyncio.to_thread(self.worker.state.assignment, self.name)
        except Exception as e:  # noqa: BLE001 - coordinator away: the next assignment event decides
            log.warning("%s: cannot check where task %d belongs: %s", self.name, old.task, e)
            await self.hand_over_queue(old)
            return
        if (assignment or {}).get("tasks", {}).get(str(old.task)) != self.worker.id:
            await self.hand_over_queue(old)     # it runs elsewhere: what waited here is replayed
            return
        async with self.lock:
            if self.executors.get(old.task) is not old:
                return
            log.warning("%s: task %d was fenced but the assignment places it here; starting it again",
                        self.name, old.task)
            ex = self._make_executor(old.task)
            await self.worker.claim_state(self.name, f"{ex.cid}.{ex.ctx.task_index}", ex)
            self.executors[old.task] = ex
            await self.hand_over_queue(old)
            ex.start()

    async def hand_over_queue(self, old) -> None:
        """The tuples queued for a fenced bolt instance (also those that reach its queue
        later) go to its successor on this worker, or are failed so their spouts replay them."""
        if not isinstance(old, BoltExecutor):
            return
        new = self.executors.get(old.task)
        if isinstance(new, BoltExecutor) and new is not old:
            queued = old.take_queue()
            for tup in queued:
                await new.inbound.put(tup)
            what = "handed to the new instance"
        else:
            queued = await old.fail_queue()
            what = "failed for replay"
        if queued:
            log.info("%s: task %d: %d tuple(s) queued for the fenced instance %s", self.name, old.task,
                     len(queued), what)

    def _build_routes(self, local: set[int]) -> None:
        routes: dict[tuple[str, str], list] = {}
        for c in self.topology.components:
            for stream, fields in self.fields[c["id"]].items():
                choosers = []
                for bolt, grouping in self.topology.subscribers(c["id"], stream):
                    seed = zlib.crc32(f"{self.name}/{self.worker.id}/{c['id']}/{stream}/{bolt['id']}".encode())
                    choosers.append(make_chooser(grouping, list(self.topology.tasks(bolt["id"])), fields,
                                                 local, seed))
                routes[(c["id"], stream)] = choosers
        self.choosers = routes

    def _make_executor(self, task: int):
        c = self.topology.task_component(task)
        r = self.topology.tasks(c["id"])
        instance = self.classes[c["id"]](**c["config"])
        ctx = Context(topology=self.name, component=c["id"], task=task, task_index=task - r.start,
                      parallelism=c["parallelism"], worker=self.worker.id, config=self.topology.config,
                      component_config=c["config"], component_tasks=self.topology.tasks,
                      compute=self.worker.compute, publish=lambda k, v: self.worker.publish(self.name, k, v),
                      save_state=None,
                      put_checkpoint=lambda p: self.worker.state.put_checkpoint(self.name, p))
        if c["kind"] == "spout":
            ex = SpoutExecutor(self, task, c, instance, ctx)
        else:
            ex = BoltExecutor(self, task, c, instance, ctx, queue_size=int(self.topology.config["queue_size"]))
        key = f"{c['id']}.{task - r.start}"
        ctx._save_state = lambda v: self.worker.save_state(self.name, key, v, ex)
        return ex

    async def _stop_executor(self, ex, timeout: float = 10.0) -> None:
        if ex._task is None:
            return
        ex.stopping = True
        if isinstance(ex, BoltExecutor):
            await ex.inbound.put(STOP)
        else:
            ex.wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(ex._task), timeout)
        except asyncio.TimeoutError:
            log.warning("%s: task %d did not stop within %.0f s; cancelling", self.name, ex.task, timeout)
            ex._task.cancel()

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
        while loop.time() < deadline and not self.worker._closing:
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

    MAX_PARKED = 10_000

    def park(self, msg: list) -> None:
        if len(self.parked) >= self.MAX_PARKED:
            self.dropped += 1    # bounded: the spout replays what is lost
        else:
            self.parked.append(msg)

    async def deliver(self, target: int, msg: list) -> None:
        await self.worker.deliver(self, target, msg)

    def status(self) -> dict:
        tasks = {}
        for t, ex in sorted(self.executors.items()):
            m = {"component": ex.cid, "kind": ex.kind, **ex.metrics.as_dict()}
            if isinstance(ex, BoltExecutor):
                m["queue"], m["queue_max"] = ex.inbound.qsize(), ex.inbound.maxsize
            else:
                m["pending"], m["pending_max"] = len(ex.pending), ex.max_pending
            tasks[t] = m
        return {"assignment_version": self.version, "tasks": tasks, "dropped": self.dropped, "stale": self.stale}
