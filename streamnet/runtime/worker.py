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

from . import codec, monitor
from .assignment import MAX_THREADS, Assignment, threads_ok
from .dataplane import accept_shortage
from .dataplane.delivery import Delivery
from .dataplane.executor import Wake
from .control.cluster_state import FAILED_STATUS, REFUSED, RUNNING, ClusterState
from .dataplane.compute import ComputePool
from .dataplane.cpu_policy import short_slice
from .control.coordinator import CoordinatorError, NodeExistsError
from .prometheus import CONTENT_TYPE as PROMETHEUS_TYPE, prometheus
from .control.publisher import ResultPublisher
from .control.scheduler import SchedulerService
from .json_reply import json_reply
from .load import LoadMeter
from .dataplane.topology_runtime import TopologyRuntime
from .topology import DEFAULT_ALLOWED_MODULES, TopologyError, resolve, spec_version
from .dataplane.guard import HEADER_TIMEOUT_S, ConnectionGuard, GuardedRunner
from .dataplane.log_budget import budget_logger
from .dataplane.transport import Auth, StreamServer

log = logging.getLogger(__name__)

READ_BUFSIZE = 4 << 20  # measured: large frames move fastest with a 4 MiB read buffer
LOAD_SAMPLE_S = 0.25    # how often the worker samples its load (load.py decides what is published)
#: the tasks' speed reports (a compute unit's every round) make a record at most this often:
#: one a report was 0.13 ms of the event loop a round, 300 rounds a second at MixBP H=1
LOAD_RECORD_S = 0.1


class Worker:
    def __init__(self, *, worker_id: str, state: ClusterState, secret: bytes, host: str = "127.0.0.1",
                 port: int = 0, threads: int = 2, advertise_host: str | None = None,
                 limits: codec.Limits = codec.DEFAULT_LIMITS, schedule: bool = True,
                 allow_modules: tuple[str, ...] = DEFAULT_ALLOWED_MODULES, threads_auto: bool = False,
                 monitor_token: str | None = None, tls=None, preload: tuple[str, ...] = ()):
        self.id, self.state, self.host, self.port = worker_id, state, host, port
        #: "package.module:function" paths run once on the compute threads at start (see _preload)
        self.preload = tuple(preload)
        #: module prefixes this worker imports components and groupings from
        self.allow_modules = tuple(allow_modules)
        self.refused: dict[str, int] = {}   # topology -> spec version refused (logged once)
        self.advertise_host = advertise_host or host
        self.threads, self.limits = threads, limits
        #: `--threads auto`: the load balancer may set this worker's threads to its free cores
        self.threads_auto = threads_auto
        self.load = LoadMeter()
        self._load_news = Wake()              # a task reported work (report_work)
        self.started_at = time.time()
        self.auth = Auth(secret, worker_id)
        self.monitor_token = monitor_token     # required on /status and /metrics when set (monitor.py)
        self.tls = tls                         # dataplane.tls.TlsConfig: TLS inside tuple streams
        self.runtimes: dict[str, TopologyRuntime] = {}
        self.started = asyncio.Event()
        self._unwatch: list = []
        # topology -> the cancels of its assignment and status watches, while it is listed
        self._watched: dict[str, list] = {}
        # one assignment applied at a time per topology: two events close together (the first
        # placement, then a change) each found no runtime across their awaits and each built
        # one, and the first one's tasks ran on, duplicated, never stopped
        self._applying: dict[str, asyncio.Lock] = {}
        self.closing = False
        self.scheduler = SchedulerService(state, worker_id, self.auth) if schedule else None
        self.publisher = ResultPublisher(state)

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        short_slice()       # the loop preempts this worker's compute threads when it wakes (cpu_policy.py)
        accept_shortage.install(self.loop)      # one line a minute, not a traceback a second
        self.pool = ComputePool(self.threads, name=f"{self.id}-compute")
        await self._preload()
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=5, sock_connect=5),
            connector=aiohttp.TCPConnector(limit=0, force_close=True))
        self.delivery = Delivery(worker_id=self.id, auth=self.auth, session=self.session, limits=self.limits,
                                 runtimes=self.runtimes, on_unreachable=self._peer_unreachable, tls=self.tls)
        self.stream_server = StreamServer(self.auth, self.delivery.receive, self.limits, tls=self.tls,
                                          dispatch_now=self.delivery.receive_now,
                                          on_open=self.delivery.peer_restarted)
        self.publisher.start()
        app = web.Application(client_max_size=self.limits.max_frame + 1024)
        app.add_routes(self.stream_server.routes() + [web.get("/status", self._status_handler),
                                                      web.get("/metrics", self._metrics_handler)])
        # keepalive_timeout runs from a connection's start: it is also the time allowed
        # to send a request's headers (a half-sent request holds a descriptor no longer)
        self.guard = ConnectionGuard()
        budget_logger("aiohttp.server")     # a malformed request is a line and a traceback each
        self._runner = GuardedRunner(app, self.guard, read_bufsize=READ_BUFSIZE, access_log=None,
                                     shutdown_timeout=1.0, keepalive_timeout=HEADER_TIMEOUT_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        await asyncio.to_thread(self.state.register_worker, self.id, self.info())
        self.state.coord.on_session_restart(self._session_restarted)
        on_topologies = self._threadsafe(self._on_topologies)
        self._unwatch.append(await asyncio.to_thread(self.state.watch_topologies, on_topologies))
        if self.scheduler:
            await asyncio.to_thread(self.scheduler.start)
        self._spawn(self._measure_load())
        self.started.set()
        log.info("worker %s serving on %s:%d with %d compute threads", self.id, self.host, self.port, self.threads)

    async def _preload(self) -> None:
        """Run the preload functions (`streamnet-worker --preload`: training's loads the
        compiled kernels, 0.4-0.5 s) on the compute threads, before the worker registers:
        nothing is assigned to it until it is ready, so no first round pays for them.
        They are the operator's configuration, but code all the same: only from the
        allowed modules. An error stops the start (TopologyError names the path)."""
        for path in self.preload:
            try:
                fn = resolve(path, self.allow_modules)
            except TopologyError as e:
                raise TopologyError(f"preload {path!r}: {e}") from None
            if not callable(fn):
                raise TopologyError(f"preload {path!r} is not a function")
            t0 = time.perf_counter()
            await asyncio.wrap_future(self.pool.submit(fn))
            log.info("worker %s: preloaded %s in %.2f s", self.id, path, time.perf_counter() - t0)

    def info(self) -> dict:
        info = {"host": self.advertise_host, "port": self.port, "threads": self.pool.size,
                "cores": os.cpu_count(), "pid": os.getpid(), "started": self.started_at}
        if self.load.published is not None:
            info["load"] = self.load.published
        return info

    def report_work(self, topology: str, task: int, items: float, seconds: float, share: float = 1.0) -> None:
        """A task's work report (Context.report_work, on the event loop), done under its
        work `share` of the moment: into its speed window, and the load loop looks at
        once whether that is news."""
        self.load.report_work(topology, task, items, seconds, share)
        self._load_news.set()

    async def _measure_load(self) -> None:
        """Sample the host's load every LOAD_SAMPLE_S, and the tasks' speeds when one
        reports (at most every LOAD_RECORD_S); publish the record (in the worker's registration) when a figure moved
        enough (load.py), for the leader's balancing policy."""
        next_sample = recorded = time.monotonic()
        while not self.closing:
            await self._load_news.wait(max(0.0, next_sample - time.monotonic()))
            pause = min(recorded + LOAD_RECORD_S, next_sample) - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)      # the reports meanwhile go into the same record
            self._load_news.clear()
            now = recorded = time.monotonic()
            if now >= next_sample:
                rec = self.load.sample(self.pool.busy_fraction(), self.pool.size, self.threads_auto)
                next_sample = now + LOAD_SAMPLE_S
            else:
                rec = self.load.record(self.pool.busy_fraction(), self.pool.size, self.threads_auto)
            if self.load.due(rec, now):
                try:
                    await asyncio.to_thread(self.state.update_worker, self.id, self.info())
                except CoordinatorError as e:   # the next change (or heartbeat) writes again
                    log.debug("worker %s: could not publish its load: %s", self.id, e)

    @property
    def sessions(self) -> int:
        """Coordinator sessions that expired under this worker: a task instance that
        began before one and was then placed elsewhere is stale (topology_runtime.apply)."""
        return self.state.coord.sessions_lost

    def _session_restarted(self) -> None:
        """Our ZooKeeper session expired and a new one began (coordinator thread):
        the ephemeral worker and candidate nodes are gone - make them again. The
        watches re-fire by themselves and the worker resynchronises from them."""
        if self.closing:
            return
        log.warning("worker %s: new ZooKeeper session; registering again", self.id)
        self.loop.call_soon_threadsafe(self._spawn, self._register_again())

    async def _register_again(self) -> None:
        """Register, and stand for leader, again - retried until both hold or the worker
        closes: tried once, a lost connection there left the worker running unregistered
        (given no work) and out of the election for good."""
        delay, said = 0.1, ""
        for step in (self._reregister, self.scheduler.rejoin if self.scheduler else None):
            while step is not None and not self.closing:
                try:
                    await asyncio.to_thread(step)
                    break
                except Exception as e:  # noqa: BLE001 - a lost connection, the old node not yet gone, ...
                    if str(e) != said:
                        said = str(e)
                        log.warning("worker %s: registering again: %s; retrying", self.id, e)
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, 5.0)

    def _reregister(self) -> None:
        try:
            self.state.register_worker(self.id, self.info())
        except NodeExistsError:     # a try whose answer was lost made it: it is ours
            self.state.update_worker(self.id, self.info())

    def _threadsafe(self, fn):
        """Coordinator callbacks arrive on its thread; run them on our loop."""
        def cb(*args):
            if not self.closing:
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

    async def _stop_listening(self) -> bool:
        """The first step of stop() and crash(): no more coordinator events, no more
        scheduling here. False if the worker was already going."""
        if self.closing:
            return False
        self.closing = True
        for cancel in self._unwatch + [c for cancels in self._watched.values() for c in cancels]:
            cancel()
        if self.scheduler:
            await asyncio.to_thread(self.scheduler.stop)
        return True

    async def stop(self, drain_s: float = 5.0) -> None:
        """Stop spouts, drain bolts, close connections, deregister."""
        if not await self._stop_listening():
            return
        for rt in list(self.runtimes.values()):
            await rt.stop(drain_s)
        await self.publisher.close()
        await self.delivery.close()
        await self.session.close()
        await self._runner.cleanup()
        self.pool.shutdown()
        log.info("worker %s stopped", self.id)

    async def crash(self) -> None:
        """Go away as a killed process would, for LocalCluster.crash_worker: tasks end
        without close() (nothing published), connections are cut, nothing is drained;
        the caller then closes this worker's coordinator session, so its ephemeral
        nodes vanish as a dead process's session would."""
        if not await self._stop_listening():
            return
        tasks = []
        for rt in self.runtimes.values():
            for ex in rt.executors.values():
                if ex._task is not None:
                    ex.crashed = True
                    ex._task.cancel()
                    tasks.append(ex._task)
        if tasks:     # a dead process waits for nothing: give them a moment, no more
            _, stuck = await asyncio.wait(tasks, timeout=2.0)
            if stuck:
                log.warning("worker %s crash: %d task(s) still ending: %s", self.id, len(stuck),
                            ", ".join(t.get_name() for t in stuck))
        self.runtimes.clear()
        for link in self.delivery.links.values():
            link.abort()
        try:
            await asyncio.wait_for(self._runner.cleanup(), 5.0)
        except asyncio.TimeoutError:
            log.warning("worker %s crash: its HTTP server did not close within 5 s", self.id)
        await self.session.close()
        self.pool.shutdown()
        log.warning("worker %s crashed (on purpose)", self.id)

    # -- coordinator events ----------------------------------------------------------
    def _on_topologies(self, names: list[str]) -> None:
        for name in names:
            if name not in self._watched:
                self._watched[name] = []
                self._spawn(self._watch_topology(name))
        listed = set(names)
        for name in [n for n in self._watched if n not in listed]:
            # gone: its watches go too (they were kept for every name ever seen, two a name;
            # a name submitted again is watched anew)
            for cancel in self._watched.pop(name):
                cancel()
            lock = self._applying.get(name)
            if lock is not None and not lock.locked():
                del self._applying[name]
        for name in list(self.runtimes):
            if name not in listed:
                self._spawn(self._drop_runtime(name))

    async def _watch_topology(self, name: str) -> None:
        """Watch a new topology's assignment and status. From a thread: a watch reads its
        node as it is set, and kazoo retries that read for as long as the coordinator is
        away, which on the event loop stopped the worker meanwhile (its heartbeats, its
        links, every other topology's tuples)."""
        on_assignment = lambda a, v: self._spawn(self._on_assignment(name, a, v))    # noqa: E731
        on_status = lambda s: self._spawn(self._on_status(name, s))                   # noqa: E731
        cancels = self._watched.get(name)
        for watch, callback in ((self.state.watch_assignment, on_assignment), (self.state.watch_status, on_status)):
            cancel = await asyncio.to_thread(watch, name, self._threadsafe(callback))
            if self.closing or self._watched.get(name) is not cancels:
                cancel()            # stopped, or the topology went, meanwhile: the others were cancelled
                return
            cancels.append(cancel)

    def _spawn(self, coro) -> None:
        task = self.loop.create_task(coro)
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or
                               log.error("worker %s: %s", self.id, t.exception(), exc_info=t.exception()))

    async def _on_assignment(self, name: str, assignment: Assignment | None, version: int) -> None:
        if assignment is None or self.closing:
            return
        async with self._applying.setdefault(name, asyncio.Lock()):
            if not self.closing:
                await self._apply_assignment(name, assignment, version)

    async def _apply_assignment(self, name: str, assignment: Assignment, version: int) -> None:
        rt = self.runtimes.get(name)
        if rt is not None and rt.spec_version < assignment.spec_version:
            log.info("worker %s: topology %s changed shape; restarting its tasks here", self.id, name)
            await self._drop_runtime(name)
            rt = None
        if rt is None:
            status = await asyncio.to_thread(self.state.status, name)
            if status not in RUNNING:
                return
            spec = await asyncio.to_thread(self.state.topology, name)
            try:
                if spec_version(spec) < assignment.spec_version:
                    return  # the new spec is not readable yet; its watch will call again
                rt = TopologyRuntime(self, name, spec)
            except TopologyError as e:
                self._refuse(name, spec.get("version", 0), e)
                return
            self.runtimes[name] = rt
            rt.stop_requested = status == "stopping"
        threads = assignment.threads.get(self.id)
        if threads is not None and not threads_ok(threads):     # the leader checks; an older one did not
            log.warning("worker %s: assignment v%d asks for %r compute threads; keeping %d (1..%d)", self.id,
                        version, threads, self.pool.size, MAX_THREADS)
            threads = None
        if threads and threads != self.pool.size:
            log.info("worker %s: compute threads %d -> %d (assignment)", self.id, self.pool.size, threads)
            self.pool.resize(int(threads))
            self._spawn(asyncio.to_thread(self.state.update_worker, self.id, self.info()))
        await rt.apply(assignment, version)
        self._prune_links()
        await self.delivery.deliver_parked(rt)
        self._spawn(asyncio.to_thread(self.state.mark_applied, name, self.id, version))

    def _refuse(self, name: str, version: int, error: TopologyError) -> None:
        """A spec this worker will not run (a class outside its allowed modules, or not
        a Spout/Bolt): none of its tasks start here; the reason goes to the log and to
        the topology's results, where the submitter reads it. Other topologies go on."""
        if self.refused.get(name) == version:
            return
        self.refused[name] = version
        log.error("worker %s refuses topology %s: %s", self.id, name, error)
        self.publish(name, f"{REFUSED}{self.id}", str(error))
        self.topology_failed(name, f"{REFUSED}{self.id}")

    def topology_failed(self, name: str, because: str) -> None:
        """A task of `name` could not start here, or this worker refused it (the reason is
        published as the result `because`): the run cannot go on, so it is marked failed
        and its tasks stop on every worker. Left running, the work sent to the task that
        never started was failed and replayed at once, for ever (20,000 replays a second),
        the topology still "active" for anyone who was not waiting on it. The reason is
        written first, so that whoever sees the status finds it, and marks only the run
        that has it (not one of the same name submitted since)."""
        async def mark():
            await self.publisher.flush()
            if await asyncio.to_thread(self.state.fail_topology, name, because):
                log.error("worker %s: topology %s cannot run; marked it failed (its tasks stop on every worker; "
                          "`streamnet-submit status %s` says why, `kill` removes it)", self.id, name, name)
        self._spawn(mark())

    async def _on_status(self, name: str, status: str | None) -> None:
        if status == "stopping" and name in self.runtimes:
            log.info("worker %s: topology %s is stopping cleanly", self.id, name)
            self.runtimes[name].stop_requested = True
        if status in ("killed", FAILED_STATUS, None):
            await self._drop_runtime(name)
            # "stopped" marks answer a kill (kill_topology waits for them, then removes the
            # topology): a failed run's are written when it is killed, as any run's - a mark
            # written for "failed" made the kill's wait end at once, and the kill's own mark,
            # late, landed in the next run of that name
            if status == "killed":
                await self.publisher.flush()     # what close() published, before the client reads it
                await asyncio.to_thread(self.state.mark_stopped, name, self.id)

    async def _drop_runtime(self, name: str) -> None:
        rt = self.runtimes.pop(name, None)
        if rt is not None:
            self.delivery.forget(name)      # an emitter held here would keep its bolt from stopping
            await rt.stop()
            self._prune_links()

    def _prune_links(self) -> None:
        """Links only to the workers some topology here addresses."""
        self.delivery.prune({w for rt in self.runtimes.values() for w in rt.addresses})

    # -- services for tasks ------------------------------------------------------------
    def compute(self, fn, *args):
        return asyncio.wrap_future(self.pool.submit(fn, *args))

    def publish(self, topology: str, key: str, value) -> None:
        self.publisher.publish(topology, key, value)

    def mark_done(self, topology: str, task: int) -> None:
        self._spawn(asyncio.to_thread(self.state.mark_done, topology, task))

    # -- fast failure detection ----------------------------------------------------------
    def _peer_unreachable(self, peer: str, error: str | None) -> None:
        """Connections to `peer` are refused (its process is gone) or work again. The
        leader confirms with a probe of its own before moving tasks; the ZooKeeper
        session stays the authority (fencing covers a wrong guess)."""
        if self.closing:
            return
        if error is None:
            log.info("worker %s: %s is reachable again", self.id, peer)
            self._spawn(asyncio.to_thread(self.state.clear_unreachable, peer, self.id))
        else:
            log.warning("worker %s: connections to %s fail (%s); reporting it to the scheduler", self.id, peer, error)
            self._spawn(asyncio.to_thread(self.state.report_unreachable, peer, self.id, error))

    # -- status ------------------------------------------------------------------------
    def status(self) -> dict:
        s = self.stream_server
        return {
            "worker": self.id, "host": self.advertise_host, "port": self.port, "pid": os.getpid(),
            "threads": self.pool.size, "busy_fraction": round(self.pool.busy_fraction(), 4),
            "leader": bool(self.scheduler and self.scheduler.leading),
            "load": self.load.published,
            "balance": ({n: m.history for n, m in self.scheduler.balance_memory.items()}
                        if self.scheduler and self.scheduler.leading else {}),
            "topologies": {n: rt.status() for n, rt in self.runtimes.items()},
            "links": self.delivery.status(),
            "holds": self.delivery.holds_status(),
            "transport": {"rejected": s.rejected, "frames_in": s.frames_in, "bytes_in": s.bytes_in,
                          "open_streams": s.open_streams, "dropped": self.delivery.dropped,
                          "connections": self.guard.status()},
        }

    async def _status_handler(self, request: web.Request) -> web.Response:
        if (refused := monitor.refusal(request, self.monitor_token)) is not None:
            return refused
        return json_reply(self.status())

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        if (refused := monitor.refusal(request, self.monitor_token)) is not None:
            return refused
        return web.Response(body=prometheus(self.status()).encode(), headers={"Content-Type": PROMETHEUS_TYPE})
