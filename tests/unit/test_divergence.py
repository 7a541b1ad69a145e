"""A run whose updates are not finite is declared diverged - a unit refused as not
finite DIVERGED_ROUNDS rounds in a row, or an outer step that made the parameters not
finite - instead of going on to its end at chance accuracy: the in-process trainer
raises TrainingDiverged (train exits 1 saying so), and the sync bolt fails its
topology with that reason, counts nothing of the round and takes nothing more."""
import asyncio

import numpy as np
import pytest

from streamnet.runtime.component import BoltCollector, Context, Tuple
from streamnet.training import AlgorithmConfig
from streamnet.training.bp import DIVERGED_ROUNDS, SGD, Aggregator, Contribution, Plan, TrainingDiverged, plan_for
from streamnet.training.config import run_config_to_dict
from streamnet.training.streams import CONTRIBUTION, OK, row
from streamnet.training.sync_bolt import SyncBolt
from tests.unit.test_sync_bolt import CFG, TASKS, Recorder, _compute

P = 10


def _c(unit, value, samples=4):
    return Contribution(unit, samples, 1, 1.0, np.full(P, value, np.float32))


def test_a_unit_refused_in_a_row_of_rounds_is_divergence_and_once_is_not():
    agg = Aggregator(np.zeros(P, np.float32), plan_for(AlgorithmConfig(name="mixbp")))
    for step in range(DIVERGED_ROUNDS - 1):
        agg.combine([_c(0, np.nan), _c(1, 0.1)], step=step)       # unit 1 goes on alone
    agg.combine([_c(0, 0.1), _c(1, 0.1)], step=DIVERGED_ROUNDS - 1)   # unit 0 finite once: the count starts over
    for step in range(DIVERGED_ROUNDS - 1):
        agg.combine([_c(0, np.inf), _c(1, 0.1)], step=10 + step)
    with pytest.raises(TrainingDiverged, match=rf"unit 0's update was not finite in {DIVERGED_ROUNDS} rounds in a "
                                               r"row \(up to step 99\); try a smaller learning rate"):
        agg.combine([_c(0, np.nan), _c(1, 0.1)], step=99)


def test_a_round_in_which_every_unit_diverged_is_divergence_at_once():
    """Nothing to combine: a run of two rounds (--lr 1e9) ended "successfully", training
    loss 0 and the test accuracy at chance."""
    agg = Aggregator(np.zeros(P, np.float32), plan_for(AlgorithmConfig(name="mixbp")))
    agg.combine([_c(0, np.nan), _c(1, 0.1), _c(2, 0, samples=0)], step=0)       # one left: goes on
    before = agg.params.copy()
    with pytest.raises(TrainingDiverged, match="at step 1: every unit's update was not finite, nothing to combine"):
        agg.combine([_c(0, np.nan), _c(1, np.inf), _c(2, 0, samples=0)], step=1)
    assert np.isfinite(before).all() and (before != 0).all()
    np.testing.assert_array_equal(agg.params, before)                               # untouched


def test_an_outer_step_that_overflows_is_divergence():
    agg = Aggregator(np.full(P, 3e38, np.float32), Plan(inner=None, outer=SGD(lr=1.0), scale_outer=True))
    with pytest.raises(TrainingDiverged, match="step 7: the outer step made the parameters not finite"):
        agg.combine([_c(0, -3e38)], step=7)                          # 3e38 + 3e38 overflows float32


def test_the_sync_bolt_fails_its_topology_counts_nothing_and_takes_nothing_more():
    failed, events = [], []
    bolt = SyncBolt(run=run_config_to_dict(CFG))
    ctx = Context(topology="t", component="sync", task=2, task_index=0, parallelism=1, worker="w0", config={},
                  component_config=bolt.config, component_tasks=TASKS.__getitem__, compute=_compute,
                  publish=lambda k, v: None, save_state=lambda state: None, fail_topology=failed.append)
    out = Recorder(events)
    bolt.prepare(ctx, BoltCollector(out))

    def contribution(step, value):
        values = row(CONTRIBUTION, unit=0, epoch=0, round=step, step=step, lr_scale=1.0, samples=8, steps=2,
                     loss_sum=2.0, slice=0, vector=np.full(bolt.agg.params.size, value, np.float32), finite=True,
                     status=OK, checkpoint=False, unit_state=None, timing=None, share=1.0)
        return Tuple(values, list(CONTRIBUTION), "default", "compute", 1, {})
    asyncio.run(bolt.execute(contribution(0, 0.01)))                # a round as any
    assert bolt.counts.next_step == 1 and failed == []
    bolt.agg.nonfinite[0] = DIVERGED_ROUNDS - 1                     # as after two refused rounds
    events.clear()
    out.acked.clear()
    asyncio.run(bolt.execute(contribution(1, np.nan)))
    assert len(failed) == 1 and "training diverged: unit 0's update was not finite" in failed[0]
    assert bolt.counts.next_step == 1 and bolt.pending == {}       # the round uncounted, nothing held
    assert [e for e in events if e[0] == "emit"] == [] and out.acked == []
    asyncio.run(bolt.execute(contribution(1, 0.01)))                # a replay: neither combined nor failed
    assert bolt.counts.next_step == 1 and len(failed) == 1 and out.acked == []
