"""A worker runs its preload functions (`streamnet-worker --preload`) on its compute
threads before it registers, so nothing is assigned to it before they are done;
a path outside the allowed modules, or not a function, stops the start."""
import asyncio
import threading

import pytest

from streamnet.cli.worker import DEFAULT_PRELOAD, build_parser, preload_paths
from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.inprocess import InProcessServer
from streamnet.runtime.topology import DEFAULT_ALLOWED_MODULES, TopologyError
from streamnet.runtime.worker import Worker

CALLS: list[dict] = []
NOT_A_FUNCTION = 42


def record():
    """A preload function: where it ran, and whether the worker was registered by then."""
    CALLS.append({"thread": threading.current_thread().name})


def _start(preload) -> list[str]:
    """Start a worker with `preload` and stop it; the workers registered meanwhile."""
    server = InProcessServer()
    state = ClusterState(server.session(), "c")
    w = Worker(worker_id="w0", state=state, secret=b"s" * 32, port=0, threads=1, schedule=False,
               allow_modules=("tests.unit",), preload=preload)

    async def run():
        try:
            await w.start()
        finally:
            registered.extend(state.workers())
            if w.started.is_set():
                await w.stop(drain_s=0)
            else:
                w.pool.shutdown()
    registered: list[str] = []
    try:
        asyncio.run(run())
    finally:
        state.coord.close()
        server.shutdown()
    return registered


def test_preload_runs_on_a_compute_thread_before_the_worker_registers(monkeypatch):
    registered_at_call, register = [], ClusterState.register_worker

    def registering(self, *a):
        registered_at_call.append(len(CALLS))
        return register(self, *a)
    monkeypatch.setattr(ClusterState, "register_worker", registering)
    CALLS.clear()
    workers = _start(("tests.unit.test_worker_preload:record",) * 2)
    assert [c["thread"] for c in CALLS] == ["w0-compute-1", "w0-compute-1"]
    assert registered_at_call == [2]          # both preloads had run when the worker registered
    assert workers == ["w0"]


@pytest.mark.parametrize("path, why", [
    ("streamnet.training.warmup:load_kernels", "outside the allowed prefixes"),
    ("tests.unit.test_worker_preload:NOT_A_FUNCTION", "is not a function"),
    ("tests.unit.test_worker_preload", "must be 'package.module:"),
])
def test_a_bad_preload_stops_the_start_before_registering(path, why, monkeypatch):
    registered = []
    monkeypatch.setattr(ClusterState, "register_worker", lambda self, *a: registered.append(a))
    with pytest.raises(TopologyError, match=why) as e:
        _start((path,))
    assert path in str(e.value)
    assert registered == []


def test_the_worker_command_preloads_the_kernels_unless_told_otherwise():
    def paths(*argv, allow=DEFAULT_ALLOWED_MODULES):
        return preload_paths(build_parser().parse_args(list(argv)).preload, allow)
    assert paths() == DEFAULT_PRELOAD == ("streamnet.training.warmup:load_kernels",)
    assert paths("--preload", "none") == ()
    assert paths("--preload", "a.b:f,c.d:g", "--preload", "e:h") == ("a.b:f", "c.d:g", "e:h")
    # a worker that may not run training components does not load its kernels (nor refuse to start)
    assert paths(allow=("myorg.topologies",)) == ()
    assert paths("--preload", "streamnet.training.warmup:load_kernels", allow=("myorg",)) == DEFAULT_PRELOAD
