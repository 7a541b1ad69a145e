"""A worker and its coordinator's events: it watches a new topology's assignment and
status from a thread, not from its event loop (a watch reads its node as it is set, and
kazoo retries that read for as long as the coordinator is away, which on the event loop
stopped the worker - heartbeats, links, every other topology's tuples - meanwhile), and
drops them once the topology goes; it applies one assignment of a topology at a time; it
registers again after a session expiry until that holds."""
import asyncio
import threading
import time

from streamnet.examples import wordcount
from streamnet.runtime.assignment import Assignment
from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.coordinator import ConnectionLostError
from streamnet.runtime.control.inprocess import InProcessServer
from streamnet.runtime.worker import Worker
from streamnet.testing import until


def _on_a_worker(server, state: ClusterState, body) -> None:
    """`await body(w)` on a started worker w0 of `state`; then the worker stops and the
    coordinator closes, whatever happened."""
    w = Worker(worker_id="w0", state=state, secret=b"s" * 32, port=0, threads=1, schedule=False)

    async def run():
        await w.start()
        try:
            await body(w)
        finally:
            await w.stop(drain_s=0)
    try:
        asyncio.run(run())
    finally:
        state.coord.close()
        server.shutdown()


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
    state.submit_topology("t", wordcount.topology(name="t", count=10).to_dict())   # listed: the worker watches it

    async def body(w):
        try:
            await until(entered.is_set, "watch started")
            # the loop runs this coroutine while the watch is still being made
            assert not returned.is_set() and w._watched == {"t": []}
            release.set()
            await until(lambda: len(w._watched["t"]) == 2, "assignment and status watches")
            # the topology gone, its watches go (they were kept for every name ever seen)
            cancels, cancelled = w._watched["t"], []
            w._watched["t"] = [lambda c=c: (cancelled.append(c), c()) for c in cancels]
            await asyncio.to_thread(state.remove_topology, "t")
            await until(lambda: w._watched == {} and len(cancelled) == 2, "its watches cancelled")
        finally:
            release.set()
    _on_a_worker(server, state, body)


def test_two_assignment_events_close_together_build_one_runtime(monkeypatch):
    """Each event found no runtime across its awaits (the status and spec reads) and built
    one; the first one's tasks ran on, duplicated, and were never stopped."""
    from streamnet.runtime import worker as worker_module
    server = InProcessServer()
    state = ClusterState(server.session(), "c")
    topo = wordcount.topology(count=10)
    state.submit_topology(topo.name, topo.to_dict())
    built = []
    real = worker_module.TopologyRuntime

    def counting(*args, **kwargs):
        built.append(args[1])
        return real(*args, **kwargs)
    monkeypatch.setattr(worker_module, "TopologyRuntime", counting)
    read = state.topology

    def slow_read(name):            # widens the window between the check and the build
        time.sleep(0.05)
        return read(name)
    state.topology = slow_read

    async def body(w):
        a = Assignment(tasks={t: "w0" for t in range(topo.num_tasks)}, workers={"w0": f"http://127.0.0.1:{w.port}"},
                       threads={"w0": 1})
        await asyncio.gather(w._on_assignment(topo.name, a, 0), w._on_assignment(topo.name, a, 1))
        assert built == [topo.name] and list(w.runtimes) == [topo.name]
    _on_a_worker(server, state, body)


def test_a_worker_registers_again_after_a_session_expiry_until_it_holds():
    """Tried once, a lost connection there left the worker running unregistered, given no
    work, for good."""
    server = InProcessServer()
    state = ClusterState(server.session(), "c")
    register, fails = state.register_worker, [2]

    def flaky(*args):
        if fails[0]:
            fails[0] -= 1
            raise ConnectionLostError("lost the ZooKeeper connection: ConnectionLoss")
        return register(*args)

    async def body(w):
        state.coord.delete(state.path("workers", "w0"))     # as the session's expiry does
        state.register_worker = flaky
        await asyncio.to_thread(w._session_restarted)        # the coordinator's thread calls it
        await until(lambda: "w0" in state.workers(), "w0 registered again", timeout=10)
        assert fails == [0]
    _on_a_worker(server, state, body)
