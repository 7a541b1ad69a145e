"""The worker: one asyncio process per node (or one thread per worker in the
embedded local cluster).

The event loop does I/O and scheduling; compute runs on a resizable thread pool.
An aiohttp server takes tuple streams, `/status` (JSON) and `/metrics`
(Prometheus). The worker registers itself in the coordinator, watches the
topologies and its assignments, and converges to them.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

import aiohttp
from aiohttp import web

from . import codec
from .control.cluster_state import RUNNING, ClusterState
from .component import Tuple
from .dataplane.compute import ComputePool
from .control.coordinator import BadVersionError, ConnectionLostError, CoordinatorError, NodeExistsError
from .dataplane.executor import BoltExecutor, SpoutExecutor, root_task
from .dataplane.fencing import FencedError
from .prometheus import prometheus
from .control.scheduler import SchedulerService
from .dataplane.topology_runtime import TopologyRuntime
from .dataplane.transport import Auth, PeerLink, StreamServer

log = logging.getLogger(__name__)

READ_BUFSIZE = 4 << 20  # measured: large frames move fastest with a 4 MiB read buffer


def _check_message(msg) -> None:
    """Types of an inbound message, checked before anything uses them."""
    ok = isinstance(msg, list) and len(msg) >= 4 and isinstance(msg[1], str) and isinstance(msg[2], int)
    if ok and msg[0] == "t":   # [t, topology, target, stream, source, values, anchors(, sender's assignment version)]
        ok = (len(msg) in (7, 8) and (len(msg) == 7 or isinstance(msg[7], int)) and isinstance(msg[3], str) and isinstance(msg[4], int) and isinstance(msg[5], list)
              and isinstance(msg[6], list)
              and all(isinstance(a, list) and len(a) == 2 and all(isinstance(x, int) for x in a) for a in msg[6]))
    elif ok and msg[0] == "a":
        ok = len(msg) == 5 and isinstance(msg[3], int) and isinstance(msg[4], int)
    elif ok and msg[0] == "f":
        ok = len(msg) == 4 and isinstance(msg[3], int)
    else:
        ok = False
    if not ok:
        raise codec.CodecError(f"malformed message {str(msg)[:80]}")


class Worker:
    def __init__(self, *, worker_id: str, state: ClusterState, secret: bytes, host: str = "127.0.0.1",
                 port: int = 0, threads: int = 2, advertise_host: str | None = None,
                 limits: codec.Limits = codec.DEFAULT_LIMITS, schedule: bool = True):
        self.id, self.state, self.host, self.port = worker_id, state, host, port
        self.advertise_host = advertise_host or host
        self.threads, self.limits = threads, limits
        self.auth = Auth(secret, worker_id)
        self.runtimes: dict[str, TopologyRuntime] = {}
        self.links: dict[str, PeerLink] = {}
        self.dropped = 0
        self.started = asyncio.Event()
        self._unwatch: list = []
        self._watched: set[str] = set()
        self._closing = False
        self.scheduler = SchedulerService(state, worker_id) if schedule else None

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.pool = ComputePool(self.threads, name=f"{self.id}-compute")
        self.stream_server = StreamServer(self.auth, self._dispatch, self.limits)
        app = web.Application(client_max_size=self.limits.max_frame + 1024)
        app.add_routes(self.stream_server.routes() + [web.get("/status", self._status_handler),
                                                      web.get("/metrics", self._metrics_handler)])
        self._runner = web.AppRunner(app, read_bufsize=READ_BUFSIZE, access_log=None,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=5, sock_connect=5),
            connector=aiohttp.TCPConnector(limit=0, force_close=True))
        await asyncio.to_thread(self.state.register_worker, self.id, self.info())
        self.state.coord.on_session_restart(self._session_restarted)
        self._unwatch.append(self.state.watch_topologies(self._threadsafe(self._on_topologies)))
        if self.scheduler:
            await asyncio.to_thread(self.scheduler.start)
        self.started.set()
        log.info("worker %s serving on %s:%d with %d compute threads", self.id, self.host, self.port, self.threads)

    def info(self) -> dict:
        return {"host": self.advertise_host, "port": self.port, "threads": self.pool.size,
                "cores": os.cpu_count(), "pid": os.getpid(), "started": time.time()}

    def _session_restarted(self) -> None:
        """Our ZooKeeper session expired and a new one began (coordinator thread):
        the ephemeral worker and candidate nodes are gone - make them again. The
        watches re-fire by themselves and the worker resynchronises from them."""
        if self._closing:
            return
        log.warning("worker %s: new ZooKeeper session; registering again", self.id)
        try:
            self.state.register_worker(self.id, self.info())
        except Exception as e:  # noqa: BLE001 - e.g. the old node not yet expired everywhere
            log.warning("worker %s: re-registration: %s", self.id, e)
        if self.scheduler:
            self.scheduler.rejoin()

    def _threadsafe(self, fn):
        """Coordinator callbacks arrive on its thread; run them on our loop."""
        def cb(*args):
            if not self._closing:
                self.loop.call_soon_threadsafe(fn, *args)
        return cb

    async def stop_topologies_cleanly(self, timeout: float) -> list[str]:
        """Ask every topology with tasks here to stop cleanly (Spout.drain: training ends
        with a checkpoint round) and wait until their spouts are done, at most `timeout`
        seconds. Returns the names of those that did not finish in time."""
        from .control.client import request_stop, spout_tasks
        names = list(self.runtimes)
        spouts = {name: spout_tasks(self.runtimes[name].topology) for name in names}

        def request():
            for name in names:
                if request_stop(self.state, name):
                    log.warning("worker %s: stopping topology %s cleanly before leaving", self.id, name)
        await asyncio.to_thread(request)
        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                try:
                    if spouts[name] <= await asyncio.to_thread(self.state.done_tasks, name) or \
                            await asyncio.to_thread(self.state.status, name) is None:   # removed meanwhile
                        pending.discard(name)
                except CoordinatorError as e:   # away for a moment: look again
                    log.warning("worker %s: waiting for %s to stop: %s", self.id, name, e)
            await asyncio.sleep(0.2)
        for name in pending:
            log.error("worker %s: topology %s did not stop within %.0f s; leaving anyway", self.id, name, timeout)
        return sorted(pending)

    async def stop(self, drain_s: float = 5.0) -> None:
        """Stop spouts, drain bolts, close connections, deregister."""
        if self._closing:
            return
        self._closing = True
        for cancel in self._unwatch:
            cancel()
        if self.scheduler:
            await asyncio.to_thread(self.scheduler.stop)
        for rt in list(self.runtimes.values()):
            await rt.stop(drain_s)
        await asyncio.gather(*(l.close() for l in self.links.values()))
        await self.session.close()
        await self._runner.cleanup()
        self.pool.shutdown()
        log.info("worker %s stopped", self.id)

    # -- coordinator events ----------------------------------------------------------
    def _on_topologies(self, names: list[str]) -> None:
        for name in names:
            if name not in self._watched:
                self._watched.add(name)
                self._unwatch.append(self.state.watch_assignment(
                    name, self._threadsafe(lambda a, v, n=name: self._spawn(self._on_assignment(n, a, v)))))
                self._unwatch.append(self.state.watch_status(
                    name, self._threadsafe(lambda s, n=name: self._spawn(self._on_status(n, s)))))
        for name in list(self.runtimes):
            if name not in names:
                self._spawn(self._drop_runtime(name))

    def _spawn(self, coro) -> None:
        task = self.loop.create_task(coro)
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or
                               log.error("worker %s: %s", self.id, t.exception(), exc_info=t.exception()))

    async def _on_assignment(self, name: str, assignment: dict | None, version: int) -> None:
        if assignment is None or self._closing:
            return
        rt = self.runtimes.get(name)
        if rt is not None and rt.spec_version < assignment.get("spec_version", 0):
            log.info("worker %s: topology %s changed shape; restarting its tasks here", self.id, name)
            await self._drop_runtime(name)
            rt = None
        if rt is None:
            status = await asyncio.to_thread(self.state.status, name)
            if status not in RUNNING:
                return
            spec = await asyncio.to_thread(self.state.topology, name)
            if spec.get("version", 0) < assignment.get("spec_version", 0):
                return  # the new spec is not readable yet; its watch will call again
            rt = self.runtimes[name] = TopologyRuntime(self, name, spec)
            rt.stop_requested = status == "stopping"
        threads = assignment.get("threads", {}).get(self.id)
        if threads and threads != self.pool.size:
            log.info("worker %s: compute threads %d -> %d (assignment)", self.id, self.pool.size, threads)
            self.pool.resize(int(threads))
            self._spawn(asyncio.to_thread(self.state.update_worker, self.id, self.info()))
        await rt.apply(assignment, version)
        await self._deliver_parked(rt)
        self._spawn(asyncio.to_thread(self.state.mark_applied, name, self.id, version))

    async def _on_status(self, name: str, status: str | None) -> None:
        if status == "stopping" and name in self.runtimes:
            log.info("worker %s: topology %s is stopping cleanly", self.id, name)
            self.runtimes[name].stop_requested = True
        if status in ("killed", None):
            await self._drop_runtime(name)
            if status == "killed":
                await asyncio.to_thread(self.state.mark_stopped, name, self.id)

    async def _drop_runtime(self, name: str) -> None:
        rt = self.runtimes.pop(name, None)
        if rt is not None:
            await rt.stop()

    # -- services for tasks ------------------------------------------------------------
    def compute(self, fn, *args):
        return asyncio.wrap_future(self.pool.submit(fn, *args))

    def publish(self, topology: str, key: str, value) -> None:
        self.state.publish_result(topology, key, value)

    def save_state(self, topology: str, key: str, value, ex) -> None:
        try:
            ex.state_version = self.state.save_state(topology, key, value, ex.state_version)
        except (BadVersionError, NodeExistsError):
            raise FencedError(f"task {key} of {topology} was taken over by another instance; this one "
                              f"(on worker {self.id}) stops without saving or acking") from None

    async def claim_state(self, topology: str, key: str, ex) -> None:
        """Load the task's last state and take ownership of it: rewriting it bumps the
        version, so an older instance still running somewhere (a worker that was cut
        off and came back) fails its next save and stops - it is fenced."""
        delay, deadline = 0.1, self.loop.time() + 120
        while True:
            try:
                value, version = await asyncio.to_thread(self.state.load_state, topology, key)
                ex.restored, ex.state_version = value, version
                # write it back (or create it empty): an instance that loaded it before us
                # now fails its next save, even a first one
                ex.state_version = await asyncio.to_thread(self.state.save_state, topology, key, value, version)
                return
            except (BadVersionError, NodeExistsError):
                continue     # another instance claimed it between our read and write: read again
            except ConnectionLostError as e:
                # the task cannot start without its state: wait for the coordinator to come back
                if self.loop.time() > deadline or self._closing:
                    raise
                log.warning("worker %s: cannot claim the state of %s yet (%s); retrying", self.id, key, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def mark_done(self, topology: str, task: int) -> None:
        self._spawn(asyncio.to_thread(self.state.mark_done, topology, task))

    # -- message delivery --------------------------------------------------------------
    def link(self, peer: str, url: str) -> PeerLink:
        link = self.links.get(peer)
        if link is None or link.url != url.rstrip("/"):
            if link is not None:
                self._spawn(link.close(0.0))
            link = self.links[peer] = PeerLink(sender=self.id, peer=peer, url=url, auth=self.auth,
                                               session=self.session, limits=self.limits)
            link.on_unreachable = self._peer_unreachable
            link.start()
        return link

    def _peer_unreachable(self, peer: str, error: str | None) -> None:
        """Fast failure detection: connections to `peer` are refused (its process is gone)
        or work again. The leader confirms with a probe of its own before moving tasks;
        the ZooKeeper session stays the authority (fencing covers a wrong guess)."""
        if self._closing:
            return
        if error is None:
            log.info("worker %s: %s is reachable again", self.id, peer)
            self._spawn(asyncio.to_thread(self.state.clear_unreachable, peer, self.id))
        else:
            log.warning("worker %s: connections to %s fail (%s); reporting it to the scheduler", self.id, peer, error)
            self._spawn(asyncio.to_thread(self.state.report_unreachable, peer, self.id, error))

    async def deliver(self, rt: TopologyRuntime, target: int, msg: list) -> None:
        ex = rt.executors.get(target)
        if ex is not None:
            await self._deliver_local(rt, ex, msg)
            return
        peer = rt.task_worker.get(target)
        if peer == self.id and msg[0] == "t":
            rt.park(msg)     # ours in the assignment being applied, not started yet
            return
        if peer is None or peer == self.id or peer not in rt.addresses:
            rt.dropped += 1  # assignment in flux
            await self._fail_roots(rt, msg)
            return
        q = self.link(peer, rt.addresses[peer]).queue
        if not q.full():
            q.put_nowait(msg)     # the common case, without a suspension point
            return
        # backpressure: wait for the stream to drain - but not on a peer that stopped
        # draining because it is cut off and its tasks moved: look again every second
        while True:
            try:
                await asyncio.wait_for(q.put(msg), 1.0)
                return
            except asyncio.TimeoutError:
                if self._closing:
                    rt.dropped += 1
                    return
                now = rt.task_worker.get(target)
                if now != peer:
                    log.warning("worker %s: task %d moved from %s (not draining) to %s while a tuple waited; "
                                "sending it there", self.id, target, peer, now)
                    await self.deliver(rt, target, msg)
                    return

    async def _deliver_local(self, rt: TopologyRuntime, ex, msg: list) -> None:
        kind = msg[0]
        if kind == "t" and isinstance(ex, BoltExecutor):
            src = rt.task_cid.get(msg[4])
            fields = rt.fields.get(src, {}).get(msg[3])
            if fields is None:
                rt.dropped += 1
                return
            tup = Tuple(msg[5], fields, msg[3], src, msg[4], {r: e for r, e in msg[6]})
            if ex.inbound.full():
                await ex.inbound.put(tup)
            else:
                ex.inbound.put_nowait(tup)
            if ex.queue_taken:   # a fenced instance whose queue was already dealt with
                await rt.hand_over_queue(ex)
        elif kind == "a" and isinstance(ex, SpoutExecutor):
            ex.on_ack(msg[3], msg[4])
        elif kind == "f" and isinstance(ex, SpoutExecutor):
            ex.on_fail(msg[3])
        else:
            rt.dropped += 1

    async def _dispatch(self, msg, sender: str | None = None) -> None:
        _check_message(msg)
        rt = self.runtimes.get(msg[1])
        ex = rt.executors.get(msg[2]) if rt else None
        if ex is None:
            if rt is not None and msg[0] == "t" and len(msg) > 7 and msg[7] > rt.version:
                rt.park(msg)   # the sender applied a newer assignment than we have: hold it until we do
                return
            self.dropped += 1  # not ours (any more): the sender's view is stale
            if rt is not None:
                await self._fail_roots(rt, msg)
            return
        if msg[0] == "t" and sender is not None and self._stale(rt, msg, sender):
            return
        await self._deliver_local(rt, ex, msg)

    async def _deliver_parked(self, rt: TopologyRuntime) -> None:
        """Tuples that arrived for tasks of an assignment we had not applied yet."""
        parked, rt.parked = rt.parked, []
        for msg in parked:
            ex = rt.executors.get(msg[2])
            if ex is not None:
                await self._deliver_local(rt, ex, msg)
            elif msg[7] > rt.version:
                rt.park(msg)
            else:
                rt.dropped += 1
                await self._fail_roots(rt, msg)

    async def _fail_roots(self, rt: TopologyRuntime, msg: list) -> None:
        """A tuple that cannot reach its task (sent on a view of the assignment older
        than ours, while the task moved) fails its trees: their spouts replay them now,
        not after message_timeout_s. By then every worker routes by the new assignment."""
        if msg[0] != "t" or len(msg) < 7:
            return
        for root, _ in msg[6]:
            task = root_task(root)
            if rt.executors.get(task) is not None or rt.task_worker.get(task) not in (None, self.id):
                await self.deliver(rt, task, ["f", rt.name, task, root])

    def _stale(self, rt: TopologyRuntime, msg: list, sender: str) -> bool:
        """Fencing: a tuple from a task instance that an assignment at least as new as the
        sender's places elsewhere comes from a worker that was cut off (session expired,
        network healed) and has not caught up yet; it must not reach the topology."""
        placed = rt.task_worker.get(msg[4])
        version = msg[7] if len(msg) > 7 else None
        if placed is None or placed == sender or version is None or version > rt.version:
            return False
        rt.stale += 1
        if rt.stale <= 5 or rt.stale % 1000 == 0:
            log.warning("worker %s: dropped a stale tuple (%d so far) of %s from task %d on %s: assignment v%d "
                        "places that task on %s; the sender is at v%d", self.id, rt.stale, rt.name, msg[4], sender,
                        rt.version, placed, version)
        return True

    # -- status ------------------------------------------------------------------------
    def status(self) -> dict:
        s = self.stream_server
        return {
            "worker": self.id, "host": self.advertise_host, "port": self.port, "pid": os.getpid(),
            "threads": self.pool.size, "busy_fraction": round(self.pool.busy_fraction(), 4),
            "leader": bool(self.scheduler and self.scheduler.leading),
            "topologies": {n: rt.status() for n, rt in self.runtimes.items()},
            "links": {p: l.status() for p, l in self.links.items()},
            "transport": {"rejected": s.rejected, "frames_in": s.frames_in, "bytes_in": s.bytes_in,
                          "open_streams": s.open_streams, "dropped": self.dropped},
        }

    async def _status_handler(self, request: web.Request) -> web.Response:
        return web.json_response(self.status())

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(text=prometheus(self.status()), content_type="text/plain")
