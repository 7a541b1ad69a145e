"""The sync bolt as the engine builds it (SyncBolt(**config), prepare(ctx, collector)):
a round's counters are saved (the save is the fencing check) before anything of the
round is sent; a fenced save sends nothing; a combine that fails leaves the round
uncounted, to be combined on replay; the parameters go before the round's
bookkeeping; a small combine runs on the event loop, a large
one on the compute pool, with the same result."""
import asyncio

import numpy as np
import pytest

from streamnet.runtime import FencedError
from streamnet.runtime.component import BoltCollector, Context, Tuple
from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
from streamnet.training.config import run_config_to_dict
from streamnet.training.streams import CONTRIBUTION, OK, PARAMS, row
from streamnet.training.sync_bolt import SyncBolt

CFG = RunConfig(model=ModelConfig(name="lenet5"), data=DataConfig(dataset="synthetic", synthetic_train=64,
                                                                   synthetic_test=16),
                algorithm=AlgorithmConfig(name="mixbp", batch=4, sync_period=2), units=1, epochs=1, seed=3)
TASKS = {"compute": range(1, 2), "sync": range(2, 3)}


class Recorder:
    """Stands where the bolt's executor stands behind the real BoltCollector; `events`
    is the order of saves and emits."""

    def __init__(self, events: list):
        self.events, self.acked, self.direct = events, [], []

    def emit(self, values, stream, anchors, direct_task):
        self.events.append(("emit", stream, values))
        self.direct.append(direct_task)
        return []

    def ack(self, tup):
        self.acked.append(tup)

    def fail(self, tup):
        raise AssertionError(f"the sync bolt failed {tup}")

    async def send_now(self):
        self.events.append(("send_now", len(self.acked)))


async def _compute(fn, *args):
    return fn(*args)


def _bolt(save, compute=_compute):
    events = []
    bolt = SyncBolt(run=run_config_to_dict(CFG))
    ctx = Context(topology="t", component="sync", task=2, task_index=0, parallelism=1, worker="w0", config={},
                  component_config=bolt.config, component_tasks=TASKS.__getitem__, compute=compute,
                  publish=lambda k, v: None, save_state=lambda state: save(events, state))
    out = Recorder(events)
    bolt.prepare(ctx, BoltCollector(out))
    return bolt, out


def _contribution(bolt, step=0) -> Tuple:
    values = row(CONTRIBUTION, unit=0, epoch=0, round=step, step=step, lr_scale=1.0, samples=8, steps=2,
                 loss_sum=2.0, slice=0, vector=np.full(bolt.agg.params.size, 0.01, np.float32), finite=True,
                 status=OK, checkpoint=False, unit_state=None, timing=None, share=1.0)
    return Tuple(values, list(CONTRIBUTION), "default", "compute", 1, {})


def test_the_round_is_saved_before_its_parameters_leave():
    bolt, out = _bolt(lambda events, state: events.append(("save", state["next_step"])))
    before = bolt.agg.params.copy()
    tup = _contribution(bolt)
    asyncio.run(bolt.execute(tup))
    assert out.events[0] == ("save", 1)
    (_, stream, values), = [e for e in out.events if e[0] == "emit"]
    sent = dict(zip(PARAMS, values))
    assert stream == "params" and sent["step"] == 1
    np.testing.assert_allclose(sent["params"], before - 0.01)        # MixBP: start minus the mean change
    assert out.acked == [tup] and bolt.counts.next_step == 1 and bolt.counts.rounds == 1
    # the parameters and the contribution's ack were sent at once, ahead of the round's figures
    assert [e[0] for e in out.events] == ["save", "emit", "send_now"] and out.events[-1] == ("send_now", 1)


def test_a_fenced_save_sends_nothing():
    def fenced(events, state):
        raise FencedError("taken over")
    bolt, out = _bolt(fenced)
    with pytest.raises(FencedError):
        asyncio.run(bolt.execute(_contribution(bolt)))
    assert out.events == [] and out.acked == []


def test_a_combine_that_fails_leaves_the_round_uncounted():
    bolt, out = _bolt(lambda events, state: events.append(("save", state["next_step"])))

    def broken(*args):
        raise RuntimeError("combine failed")
    bolt.agg.combine = broken
    with pytest.raises(RuntimeError):
        asyncio.run(bolt.execute(_contribution(bolt)))
    assert [e[0] for e in out.events] == ["save"] and out.acked == []
    assert (bolt.counts.next_step, bolt.counts.rounds, bolt.counts.samples) == (0, 0, 0)


def test_a_small_combine_runs_on_the_event_loop_and_a_large_one_on_the_compute_pool(monkeypatch):
    from streamnet.training import sync_bolt
    sent = {}
    assert 61_706 <= sync_bolt.INLINE_COMBINE_FLOATS      # LeNet-5's vector is a small one
    for inline_floats in (sync_bolt.INLINE_COMBINE_FLOATS, 0):
        monkeypatch.setattr(sync_bolt, "INLINE_COMBINE_FLOATS", inline_floats)
        pooled = []

        async def compute(fn, *args):
            pooled.append(fn.__name__)
            return fn(*args)
        bolt, out = _bolt(lambda events, state: None, compute)
        asyncio.run(bolt.execute(_contribution(bolt)))
        (_, _, values), = [e for e in out.events if e[0] == "emit"]
        sent[inline_floats] = dict(zip(PARAMS, values))["params"]
        assert pooled == ([] if inline_floats else ["combine"])
    assert bolt.agg.params.size == 61_706
    small, large = sent.values()
    np.testing.assert_array_equal(small, large)


def test_a_resumed_runs_first_combine_hands_each_idle_unit_its_saved_state_before_the_parameters():
    """Units with no work in the resumed round never ask for parameters, so never got
    their state with them: it comes to each now, ahead of the broadcast of that step."""
    from dataclasses import replace
    from streamnet.training.streams import DIRECT_PARAMS
    cfg = replace(CFG, units=2, data=replace(CFG.data, synthetic_train=32),
                  algorithm=AlgorithmConfig(name="cumulative", batch=4, sync_period=1, unit_batches=(8, 4)))
    events = []
    bolt = SyncBolt(run=run_config_to_dict(cfg))
    tasks = {"compute": range(1, 3), "sync": range(3, 4)}
    ctx = Context(topology="t", component="sync", task=3, task_index=0, parallelism=1, worker="w0", config={},
                  component_config=bolt.config, component_tasks=tasks.__getitem__, compute=_compute,
                  publish=lambda k, v: None, save_state=lambda state: None)
    out = Recorder(events)
    bolt.prepare(ctx, BoltCollector(out))

    def contribution(unit, step):
        values = row(CONTRIBUTION, unit=unit, epoch=0, round=step, step=step, lr_scale=1.0, samples=(8, 4)[unit],
                     steps=1, loss_sum=1.0, slice=0, vector=np.zeros(bolt.agg.params.size, np.float32),
                     finite=True, status=OK, checkpoint=False, unit_state=None, timing=None, share=1.0)
        return Tuple(values, list(CONTRIBUTION), "default", "compute", 1 + unit, {})
    for step in (0, 1):                       # both units work in rounds 0 and 1; unit 0's shard then ends
        for unit in (0, 1):
            asyncio.run(bolt.execute(contribution(unit, step)))
    assert bolt.plans.expected(0, 2) == {1}
    states = {0: {"velocity": None, "random": [5]}, 1: {"velocity": None, "random": [6]}}
    bolt.unit_states = dict(states)           # as resume() leaves them for a run resumed at step 2
    del events[:], out.direct[:]
    asyncio.run(bolt.execute(contribution(1, 2)))
    sent = [(stream, dict(zip(DIRECT_PARAMS if stream == "direct_params" else PARAMS, values)), task)
            for (_, stream, values), task in zip([e for e in events if e[0] == "emit"], out.direct)]
    assert [(stream, task) for stream, _, task in sent] == [("direct_params", 1), ("params", None)]
    handed = sent[0][1]
    assert handed["unit_state"] == states[0] and handed["step"] == 3 == sent[1][1]["step"]
    np.testing.assert_array_equal(handed["params"], sent[1][1]["params"])
    assert bolt.unit_states == {}


def test_a_checkpoint_keeps_the_shares_the_round_was_cut_with_not_its_sample_counts():
    """Load balancing: an epoch's last round is partial, so its samples (8 and 2 here) do
    not say the shares ([1.5, 0.5]) the spout cut it with; a resumed run starts from those."""
    from dataclasses import replace
    cfg = replace(CFG, units=2, balance="load")
    bolt = SyncBolt(run=run_config_to_dict(cfg))
    tasks = {"compute": range(1, 3), "sync": range(3, 4)}
    ctx = Context(topology="t", component="sync", task=3, task_index=0, parallelism=1, worker="w0", config={},
                  component_config=bolt.config, component_tasks=tasks.__getitem__, compute=_compute,
                  publish=lambda k, v: None, save_state=lambda state: None)
    bolt.prepare(ctx, BoltCollector(Recorder([])))

    def contribution(unit, samples, share):
        values = row(CONTRIBUTION, unit=unit, epoch=0, round=3, step=3, lr_scale=1.0, samples=samples, steps=1,
                     loss_sum=1.0, slice=0, vector=np.zeros(bolt.agg.params.size, np.float32), finite=True,
                     status=OK, checkpoint=True, unit_state=None, timing=None, share=share)
        return Tuple(values, list(CONTRIBUTION), "default", "compute", 1 + unit, {})
    state = bolt._checkpoint_state([contribution(0, 8, 1.5), contribution(1, 2, 0.5)], (1, 0))
    assert state["position"]["shares"] == [1.5, 0.5]
    odd = bolt._checkpoint_state([contribution(0, 8, 1.5), contribution(1, 2, "x")], (1, 0))
    assert odd["position"]["shares"] is None          # a share that is not one: the balancer decides afresh


def test_only_the_epochs_the_run_evaluates_send_their_parameters_to_eval():
    """eval_every_epochs=2 over 3 epochs of one round each: the ends of epochs 2 and 3 go
    to the eval bolt (every 2nd and the last, as the in-process trainer evaluates), and
    epoch 1's end sends nothing there - no evaluation its tree would wait for. A replay of
    an epoch's last step sends its evaluation again only for an evaluated epoch."""
    from dataclasses import replace
    from streamnet.training.streams import EVAL
    cfg = replace(CFG, algorithm=replace(CFG.algorithm, batch=32), epochs=3, eval_every_epochs=2)  # 64 samples: 1 round
    events = []
    bolt = SyncBolt(run=run_config_to_dict(cfg))
    ctx = Context(topology="t", component="sync", task=2, task_index=0, parallelism=1, worker="w0", config={},
                  component_config=bolt.config, component_tasks=TASKS.__getitem__, compute=_compute,
                  publish=lambda k, v: None, save_state=lambda state: None)
    out = Recorder(events)
    bolt.prepare(ctx, BoltCollector(out))

    def contribution(epoch):
        values = row(CONTRIBUTION, unit=0, epoch=epoch, round=0, step=epoch, lr_scale=1.0, samples=64, steps=2,
                     loss_sum=2.0, slice=0, vector=np.full(bolt.agg.params.size, 0.01, np.float32), finite=True,
                     status=OK, checkpoint=False, unit_state=None, timing=None, share=1.0)
        return Tuple(values, list(CONTRIBUTION), "default", "compute", 1, {})
    assert bolt.plans.rounds(0) == 1
    evaluated = []
    for epoch in range(3):
        for tup in (contribution(epoch), contribution(epoch)):     # the round, then a replay of it
            del events[:]
            asyncio.run(bolt.execute(tup))
            evaluated.append([dict(zip(EVAL, values))["epoch"] for _, stream, values in
                              (e for e in events if e[0] == "emit") if stream == "eval"])
    assert evaluated == [[], [], [2], [2], [3], [3]]
    assert bolt.counts.next_step == 3 and bolt.counts.duplicates == 3
