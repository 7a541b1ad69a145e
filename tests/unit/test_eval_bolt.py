"""The eval bolt on its own, with S=2 sync tasks: an epoch end is evaluated once its
two slices are in, and a slice that a replay sends again afterwards is acked at
once - here, and in an instance started anew that knows the epoch from its history."""
import asyncio

from streamnet.training.config import SETUPS, with_overrides
from streamnet.training.eval_bolt import EvalBolt
from streamnet.training.nsmap import build_topology
from streamnet.training.schedule import dataset_for, make_model


class Ctx:
    def __init__(self):
        self.saved, self.published = None, {}

    def component_tasks(self, component):
        return [3, 4]                   # two sync tasks

    async def compute(self, fn, *args):
        return fn(*args)

    async def save_state_async(self, state):
        self.saved = state

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


def _bolt():
    cfg = with_overrides(SETUPS["lenet5-mixbp"](), {"dataset": "synthetic", "train_limit": 64, "test_limit": 32})
    config = next(c for c in build_topology(cfg).components if c["id"] == "eval")["config"]
    params = make_model(cfg, dataset_for(cfg).num_classes).params
    bolt, ctx, out = EvalBolt(**config), Ctx(), Collector()
    bolt.prepare(ctx, out)
    return bolt, ctx, out, params


def _slice(name, s, params, epoch=1, step=23):
    half = params.size // 2 + params.size % 2          # bounds(size, 2)
    part = params[:half] if s == 0 else params[half:]
    return {"name": name, "epoch": epoch, "step": step, "slice": s, "params": part.copy()}


def test_a_late_copy_of_an_evaluated_slice_is_acked_at_once():
    bolt, ctx, out, params = _bolt()
    run = asyncio.run
    run(bolt.execute(_slice("s1 (replay of unit 0)", 1, params)))
    assert out.acked == [] and ctx.saved is None
    run(bolt.execute(_slice("s0", 0, params)))
    assert sorted(out.acked) == ["s0", "s1 (replay of unit 0)"]
    assert [(h["epoch"], h["step"]) for h in ctx.saved] == [(1, 23)]
    run(bolt.execute(_slice("s1 (replay of unit 1)", 1, params)))
    assert out.acked[-1] == "s1 (replay of unit 1)" and bolt.gather.parts == {}
    assert len(ctx.saved) == 1 and out.failed == []

    again, _, out2, _ = _bolt()                     # a new instance: the history tells it
    again.restore(ctx.saved)
    run(again.execute(_slice("s0 (late)", 0, params)))
    assert out2.acked == ["s0 (late)"] and again.gather.parts == {}
    run(again.execute(_slice("epoch 2, s1", 1, params, epoch=2, step=47)))
    assert out2.acked == ["s0 (late)"]              # a new epoch end gathers as before
