"""A worker watches a new topology's assignment and status from a thread, not from
its event loop: a watch reads its node as it is set, and kazoo retries that read for
as long as the coordinator is away, which on the event loop stopped the worker
(heartbeats, links, every other topology's tuples) meanwhile."""
import asyncio
import threading

from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.inprocess import InProcessServer
from streamnet.runtime.worker import Worker
from streamnet.testing import until


def test_a_new_topology_is_watched_from_a_thread_while_the_event_loop_goes_on():
    server = InProcessServer()
    state = ClusterState(server.session(), "c")
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()
    plain = state.watch_assignment

    def slow_watch(name, callback):          # as kazoo's first read while the coordinator is away
        entered.set()
        release.wait(10)
        cancel = plain(name, callback)
        returned.set()
        return cancel
    state.watch_assignment = slow_watch
    w = Worker(worker_id="w0", state=state, secret=b"s" * 32, port=0, threads=1, schedule=False)

    async def run():
        await w.start()
        try:
            watches = len(w._unwatch)
            w._on_topologies(["t"])
            await until(entered.is_set, "watch started")
            # the loop runs this coroutine while the watch is still being made
            assert not returned.is_set() and len(w._unwatch) == watches
            release.set()
            await until(lambda: len(w._unwatch) == watches + 2, "assignment and status watches")
        finally:
            release.set()
            await w.stop(drain_s=0)
    try:
        asyncio.run(run())
    finally:
        state.coord.close()
        server.shutdown()
