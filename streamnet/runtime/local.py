"""LocalCluster: K workers on this machine, the in-process coordinator, and the
same loopback aiohttp transport a real cluster uses.

Why one process with a thread (and event loop) per worker, not K subprocesses:
the in-process coordinator is an object the workers must share, the numba
kernels and datasets load once instead of K times (a subprocess pays ~2 s of
imports and its own copy of the data), and the work that matters - kernels,
msgpack, socket I/O - releases the GIL. Each worker keeps its own loop, so one
worker's stall does not stall the others, and every tuple between workers still
crosses a real socket, framed, authenticated and decoded. Multi-process
clusters run on ZooKeeper (`streamnet-worker`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import threading
import urllib.request

from ..errors import StreamnetError
from .control.cluster_state import ClusterState
from .control.client import kill_topology, wait_done, wait_for
from .control.inprocess import InProcessServer
from .topology import Topology
from .worker import Worker

log = logging.getLogger(__name__)


class _WorkerThread:
    def __init__(self, worker: Worker):
        self.worker = worker
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"worker-{worker.id}", daemon=True)
        self._stop: asyncio.Event | None = None
        self.crashed = False

    def _main(self) -> None:
        async def serve():
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                await self.worker.start()
            except BaseException as e:  # noqa: BLE001 - reported to the starter
                self.error = e
                self.ready.set()
                return
            self.ready.set()
            await self._stop.wait()
            if self.crashed:
                await self.worker.crash()
            else:
                await self.worker.stop()
        asyncio.run(serve())

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 30.0, crash: bool = False) -> None:
        self.ask_to_stop(crash)
        self.thread.join(timeout)

    def ask_to_stop(self, crash: bool = False) -> None:
        self.crashed = self.crashed or crash
        if self.loop is not None and self._stop is not None and self.thread.is_alive():
            try:
                self.loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:       # its loop closed since: asked before (__exit__ asks all at once), and gone
                pass


def descriptors_needed(workers: int) -> int:
    """File descriptors `workers` embedded workers may hold at once: a socket at each end
    of a stream each way between every two of them (a sharded sync bolt with a task on
    every worker links them all), and a few of each worker's own (listener, event loop)."""
    return 2 * workers * (workers - 1) + 8 * workers


def allow_descriptors(workers: int) -> None:
    """Raise this process's open-file limit towards what `workers` may need, up to the
    hard limit (a link that runs out says so when it happens: transport.py)."""
    need = descriptors_needed(workers)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))


class LocalCluster:
    """with LocalCluster(workers=2) as cluster: results = cluster.run(topology)"""

    def __init__(self, workers: int = 2, threads: int = 2, secret: bytes | None = None,
                 cluster: str = "local", threads_auto: bool = False):
        if workers < 1:
            raise StreamnetError(f"workers must be >= 1; got {workers}")
        self.num_workers, self.threads, self.cluster = workers, threads, cluster
        self.threads_auto = threads_auto    # as `streamnet-worker --threads auto`: the balancer may set them
        self.secret = secret or os.urandom(32)
        self._threads: list[_WorkerThread] = []

    def __enter__(self) -> "LocalCluster":
        allow_descriptors(self.num_workers)
        self.server = InProcessServer()
        self.client = self.server.session()
        self.state = ClusterState(self.client, self.cluster)
        try:
            for i in range(self.num_workers):
                w = Worker(worker_id=f"w{i}", state=ClusterState(self.server.session(), self.cluster),
                           secret=self.secret, threads=self.threads, threads_auto=self.threads_auto)
                wt = _WorkerThread(w)
                self._threads.append(wt)
                wt.start()
            for wt in self._threads:
                wt.ready.wait(60)
                if wt.error is not None:
                    raise StreamnetError(f"worker {wt.worker.id} failed to start: {wt.error}") from wt.error
            wait_for(lambda: len(self.state.workers()) == self.num_workers, 10, "workers to register")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        # all at once: workers stopped one by one are each taken for dead by the others,
        # which report them, move tasks and wait for peers' streams to close (with 100
        # workers that took minutes)
        for wt in self._threads:
            wt.ask_to_stop()
        for wt in self._threads:
            wt.stop()
        for wt in self._threads:
            wt.worker.state.coord.close()
        self.client.close()
        self.server.shutdown()

    @property
    def workers(self) -> list[Worker]:
        return [wt.worker for wt in self._threads]

    def crash_worker(self, worker_id: str) -> None:
        """Fault injection: worker `worker_id` dies as if SIGKILLed - its tasks end without
        close(), its connections are cut and its coordinator session ends, so the leader
        moves its tasks and the spouts replay what was in flight."""
        wt = next(wt for wt in self._threads if wt.worker.id == worker_id)
        wt.stop(crash=True)
        wt.worker.state.coord.close()

    def leader(self) -> str | None:
        """The worker whose scheduler leads now (None while an election is open)."""
        return next((wt.worker.id for wt in self._threads if not wt.crashed and wt.worker.scheduler and
                     wt.worker.scheduler.leading), None)

    # -- topologies ------------------------------------------------------------------
    def submit(self, topology: Topology, before=None) -> None:
        """Store the topology; the elected scheduler (one of the workers) places it.
        `before()` runs once its name is known to be free (ClusterState.submit_topology)."""
        self.state.submit_topology(topology.name, topology.to_dict(), before)

    def wait_done(self, name: str, timeout: float = 60.0) -> None:
        """Until every spout task is done and its tuple trees are complete."""
        wait_done(self.state, name, timeout, interval=0.01)

    def kill(self, name: str, timeout: float = 30.0) -> dict:
        """Stop the topology's tasks everywhere (their close() runs); return its results."""
        return kill_topology(self.state, name, timeout)

    def run(self, topology: Topology, timeout: float = 120.0) -> dict:
        """Submit, wait until done, kill, and return the published results."""
        self.submit(topology)
        try:
            self.wait_done(topology.name, timeout)
        finally:
            results = self.kill(topology.name)
        return results

    def worker_status(self) -> list[dict]:
        out = []
        for w in self.workers:
            with urllib.request.urlopen(f"http://127.0.0.1:{w.port}/status", timeout=5) as r:
                out.append(json.load(r))
        return out
