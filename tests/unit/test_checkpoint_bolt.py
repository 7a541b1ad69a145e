"""The checkpoint bolt on its own, with S=2 sync tasks: a checkpoint is written once
both slices are in; a slice that a replay sends again afterwards is acked at once,
by this instance and by one started anew from what this one saved, which also
reports the run's last checkpoint."""
import asyncio

import numpy as np

from streamnet.training.checkpoint import list_checkpoints
from streamnet.training.checkpoint_bolt import CheckpointBolt
from streamnet.training.config import SETUPS, with_overrides
from streamnet.training.nsmap import build_topology


class Ctx:
    topology = "run"

    def __init__(self):
        self.saved, self.published, self.pointers = None, {}, []

    def component_tasks(self, component):
        return [3, 4]                   # two sync tasks

    async def compute(self, fn, *args):
        return fn(*args)

    def put_checkpoint(self, pointer):
        self.pointers.append(pointer)

    async def save_state_async(self, state):
        self.saved = state

    def publish(self, key, value):
        self.published[key] = value


class Collector:
    def __init__(self):
        self.acked, self.failed = [], []

    def ack(self, tup):
        self.acked.append(tup["name"])

    def fail(self, tup):
        self.failed.append(tup["name"])


def _bolt(directory):
    cfg = with_overrides(SETUPS["lenet5-mixbp"](), {"dataset": "synthetic", "train_limit": 64, "test_limit": 32})
    config = next(c for c in build_topology(cfg, checkpoint_dir=directory).components
                  if c["id"] == "checkpoint")["config"]
    bolt, ctx, out = CheckpointBolt(**config), Ctx(), Collector()
    bolt.prepare(ctx, out)
    return bolt, ctx, out


def _part(name, s, step=24):
    state = {"position": {"epoch": 1, "round": 0, "step": step}, "outer": {"velocity": np.zeros(0, np.float32)},
             "units": {}, "counters": {}, "config": {}}
    return {"name": name, "epoch": 1, "step": step, "slice": s, "params": np.full(3, s, np.float32), "state": state}


def test_a_late_copy_of_a_written_checkpoints_slice_is_acked_at_once_also_after_a_restart(tmp_path):
    run, directory = asyncio.run, str(tmp_path)
    bolt, ctx, out = _bolt(directory)
    run(bolt.execute(_part("s1 (replay of unit 0)", 1)))
    run(bolt.execute(_part("s0", 0)))
    assert sorted(out.acked) == ["s0", "s1 (replay of unit 0)"]
    assert [s for s, _ in list_checkpoints(directory, "run")] == [24] and len(ctx.pointers) == 1
    run(bolt.execute(_part("s1 (replay of unit 1)", 1)))
    assert out.acked[-1] == "s1 (replay of unit 1)" and bolt.gather.parts == {} and len(ctx.pointers) == 1
    assert ctx.saved == {"last": ctx.pointers[0], "errors": 0, "done": 24}

    again, ctx2, out2 = _bolt(directory)          # a new instance, from what the first saved
    again.restore(ctx.saved)
    run(again.execute(_part("s0 (late)", 0)))
    assert out2.acked == ["s0 (late)"] and again.gather.parts == {} and ctx2.pointers == []
    again.close()
    assert ctx2.published["checkpoints"]["last"] == ctx.pointers[0]
    run(again.execute(_part("s1 of the next", 1, step=48)))
    assert out2.acked == ["s0 (late)"]            # a newer checkpoint gathers as before
    assert out.failed == out2.failed == []
