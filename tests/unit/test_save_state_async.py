"""Context.save_state_async (the sync bolt's per-round save) keeps save_state's
contract on both coordinators: compare-and-set on the version the instance owns, a
superseded instance fails with FencedError, and a write whose connection dropped is
settled (applied or not) before the next one, never taken for another instance's."""
import asyncio
from concurrent.futures import Future

import pytest

from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.coordinator import ConnectionLostError
from streamnet.runtime.control.inprocess import InProcessServer
from streamnet.runtime.dataplane import fencing
from streamnet.runtime.dataplane.fencing import FencedError


class Instance:
    """What fencing reads of a task instance (an executor)."""

    def __init__(self):
        self.cid, self.state_version, self.restored, self.unsettled = "sync", -1, None, None
        self.ctx = type("Ctx", (), {"task_index": 0})()


class Runtime:
    def __init__(self, state):
        self.name = "train"
        self.worker = type("W", (), {"state": state, "id": "w0", "closing": False})()


@pytest.fixture(params=["inprocess", "zk"])
def state(request):
    if request.param == "inprocess":
        server = InProcessServer()
        coord = server.session()
        try:
            yield ClusterState(coord, "c")
        finally:
            coord.close()
            server.shutdown()
        return
    from streamnet.runtime.control.zk import ZkCoordinator
    coord = ZkCoordinator(request.getfixturevalue("zk"), b"s" * 32)
    try:
        yield ClusterState(coord, f"save-async-{id(coord)}")
    finally:
        coord.close()


@pytest.fixture
def server():
    """An in-process coordinator, shut down after the test however it ended."""
    server = InProcessServer()
    try:
        yield server
    finally:
        server.shutdown()


def test_the_owner_saves_and_a_superseded_instance_is_fenced(state):
    rt, old, new = Runtime(state), Instance(), Instance()

    async def go():
        await fencing.claim_state(rt, old)
        await fencing.save_state_async(rt, old, {"next_step": 1})
        await fencing.save_state_async(rt, old, {"next_step": 2})
        assert state.load_state("train", "sync.0") == ({"next_step": 2}, old.state_version)
        await fencing.claim_state(rt, new)              # a new instance takes the task over
        assert new.restored == {"next_step": 2}
        # its fencing token is larger than any its predecessor could send, after any number of saves
        assert new.ctx.generation == new.state_version > old.state_version > old.ctx.generation >= 0
        with pytest.raises(FencedError, match="taken over by another instance"):
            await fencing.save_state_async(rt, old, {"next_step": 3})
        await fencing.save_state_async(rt, new, {"next_step": 3})
    asyncio.run(go())
    assert state.load_state("train", "sync.0") == ({"next_step": 3}, new.state_version)


class LostAnswers(ClusterState):
    """Every async save loses its connection with the write in flight: `applied` says
    whether ZooKeeper had applied it."""
    applied = True

    def save_state_async(self, name, key, value, version):
        if self.applied:
            self.save_state(name, key, value, version)
        fut = Future()
        fut.set_exception(ConnectionLostError("lost the ZooKeeper connection: ConnectionLoss"))
        return fut


@pytest.mark.parametrize("applied", [True, False])
def test_a_save_whose_connection_dropped_is_settled_not_taken_for_another_instance(applied, server):
    state = LostAnswers(server.session(), "c")
    state.applied = applied
    rt, ex = Runtime(state), Instance()

    async def go():
        await fencing.claim_state(rt, ex)
        for step in (1, 2, 3):
            await fencing.save_state_async(rt, ex, {"next_step": step})
    asyncio.run(go())
    assert state.load_state("train", "sync.0") == ({"next_step": 3}, ex.state_version) and ex.state_version == 3


class SettleGivesUpOnce(LostAnswers):
    """The connection stays away longer than a settle waits, once: the save in flight
    had been applied, but the settle gives up before it can see so."""
    gave_up = False

    def settle_state(self, name, key, value, version):
        if not self.gave_up:
            self.gave_up = True
            raise ConnectionLostError("lost the ZooKeeper connection: still reconnecting")
        return super().settle_state(name, key, value, version)


@pytest.mark.parametrize("path,applied", [("async", True), ("async", False), ("sync", True)])
def test_a_save_left_unsettled_is_settled_by_the_next_not_taken_for_another_instance(path, applied, server):
    """The save after one whose settle gave up finds out whether that write was applied
    (and writes it if not) before its own: it goes on, where it used to compare-and-set
    on the version before it and, the write applied, fence itself."""
    state = SettleGivesUpOnce(server.session(), "c")
    state.applied = applied
    rt, ex = Runtime(state), Instance()
    versions = []
    save = fencing.save_state_async if path == "async" else \
        (lambda rt, ex, value: asyncio.to_thread(fencing.save_state, rt, ex, value))
    if path == "sync":      # the synchronous save loses its connection the same way
        real = state.save_state

        def losing(name, key, value, version):
            if not state.gave_up and version >= 0:
                real(name, key, value, version)          # applied, and then the connection drops
                state.gave_up = True
                raise ConnectionLostError("lost the ZooKeeper connection: still reconnecting")
            return real(name, key, value, version)
        state.save_state = losing

    async def go():
        await fencing.claim_state(rt, ex)
        with pytest.raises(ConnectionLostError):
            await save(rt, ex, {"next_step": 1})
        assert ex.unsettled == ({"next_step": 1}, 0)
        state.applied = True            # the connection is back
        await save(rt, ex, {"next_step": 2})
        versions.append(ex.state_version)
        await save(rt, ex, {"next_step": 3})
    asyncio.run(go())
    assert ex.unsettled is None
    assert versions == [2]          # 0: the claim, 1: step 1's write (applied then, or by the settle), 2: step 2's
    assert state.load_state("train", "sync.0") == ({"next_step": 3}, ex.state_version)
