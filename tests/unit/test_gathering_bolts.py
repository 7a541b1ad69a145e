"""The eval and checkpoint bolts on their own, with S=2 sync tasks: a step is evaluated
or written once both slices are in, and a slice that a replay sends again afterwards
is acked at once - by this instance, and by one started anew from what this one saved
(the eval bolt's history, the checkpoint bolt's account)."""
import asyncio

import numpy as np

from streamnet.training.checkpoint import list_checkpoints
from streamnet.training.checkpoint_bolt import CheckpointBolt
from streamnet.training.config import SETUPS, with_overrides
from streamnet.training.eval_bolt import EvalBolt
from streamnet.training.nsmap import build_topology
from streamnet.training.schedule import dataset_for, make_model

CFG = with_overrides(SETUPS["lenet5-mixbp"](), {"dataset": "synthetic", "train_limit": 64, "test_limit": 32})


class Ctx:
    topology = "run"

    def __init__(self):
        self.saved, self.published, self.pointers = None, {}, []

    def component_tasks(self, component):
        return [3, 4]                   # two sync tasks

    async def compute(self, fn, *args):
        return fn(*args)

    async def save_state_async(self, state):
        self.saved = state

    def put_checkpoint(self, pointer):
        self.pointers.append(pointer)

    def publish(self, key, value):
        self.published[key] = value

    def figure(self, *a, **k):
        pass


class Collector:
    def __init__(self):
        self.acked, self.failed = [], []

    def ack(self, tup):
        self.acked.append(tup["name"])

    def fail(self, tup):
        self.failed.append(tup["name"])


def _bolt(cls, cid, **build):
    config = next(c for c in build_topology(CFG, **build).components if c["id"] == cid)["config"]
    bolt, ctx, out = cls(**config), Ctx(), Collector()
    bolt.prepare(ctx, out)
    return bolt, ctx, out


def _eval_slice(name, s, params, epoch=1, step=23):
    half = params.size // 2 + params.size % 2          # bounds(size, 2)
    part = params[:half] if s == 0 else params[half:]
    return {"name": name, "epoch": epoch, "step": step, "slice": s, "params": part.copy()}


def test_a_late_copy_of_an_evaluated_slice_is_acked_at_once():
    params = make_model(CFG, dataset_for(CFG).num_classes).params
    bolt, ctx, out = _bolt(EvalBolt, "eval")
    run = asyncio.run
    run(bolt.execute(_eval_slice("s1 (replay of unit 0)", 1, params)))
    assert out.acked == [] and ctx.saved is None
    run(bolt.execute(_eval_slice("s0", 0, params)))
    assert sorted(out.acked) == ["s0", "s1 (replay of unit 0)"]
    assert [(h["epoch"], h["step"]) for h in ctx.saved] == [(1, 23)]
    run(bolt.execute(_eval_slice("s1 (replay of unit 1)", 1, params)))
    assert out.acked[-1] == "s1 (replay of unit 1)" and bolt.gather.parts == {}
    assert len(ctx.saved) == 1 and out.failed == []

    again, _, out2 = _bolt(EvalBolt, "eval")         # a new instance: the history tells it
    again.restore(ctx.saved)
    run(again.execute(_eval_slice("s0 (late)", 0, params)))
    assert out2.acked == ["s0 (late)"] and again.gather.parts == {}
    run(again.execute(_eval_slice("epoch 2, s1", 1, params, epoch=2, step=47)))
    assert out2.acked == ["s0 (late)"]              # a new epoch end gathers as before


def _checkpoint_part(name, s, step=24):
    state = {"position": {"epoch": 1, "round": 0, "step": step}, "outer": {"velocity": np.zeros(0, np.float32)},
             "units": {}, "counters": {}, "config": {}}
    return {"name": name, "epoch": 1, "step": step, "slice": s, "params": np.full(3, s, np.float32), "state": state}


def test_a_late_copy_of_a_written_checkpoints_slice_is_acked_at_once_also_after_a_restart(tmp_path):
    run, directory = asyncio.run, str(tmp_path)
    bolt, ctx, out = _bolt(CheckpointBolt, "checkpoint", checkpoint_dir=directory)
    run(bolt.execute(_checkpoint_part("s1 (replay of unit 0)", 1)))
    run(bolt.execute(_checkpoint_part("s0", 0)))
    assert sorted(out.acked) == ["s0", "s1 (replay of unit 0)"]
    assert [s for s, _ in list_checkpoints(directory, "run")] == [24] and len(ctx.pointers) == 1
    run(bolt.execute(_checkpoint_part("s1 (replay of unit 1)", 1)))
    assert out.acked[-1] == "s1 (replay of unit 1)" and bolt.gather.parts == {} and len(ctx.pointers) == 1
    assert ctx.saved == {"last": ctx.pointers[0], "errors": 0, "done": 24}

    again, ctx2, out2 = _bolt(CheckpointBolt, "checkpoint", checkpoint_dir=directory)   # from what the first saved
    again.restore(ctx.saved)
    run(again.execute(_checkpoint_part("s0 (late)", 0)))
    assert out2.acked == ["s0 (late)"] and again.gather.parts == {} and ctx2.pointers == []
    again.close()
    assert ctx2.published["checkpoints"]["last"] == ctx.pointers[0]
    run(again.execute(_checkpoint_part("s1 of the next", 1, step=48)))
    assert out2.acked == ["s0 (late)"]            # a newer checkpoint gathers as before
    assert out.failed == out2.failed == []
