"""The compute bolt as the engine builds it (ComputeBolt(**config), prepare(ctx,
collector)): work ahead of its parameters is held and the request for them repeated
until they come; work already applied is answered by field name; with sharded
synchronisation, a round is computed only once every slice of its parameters came."""
import asyncio
from dataclasses import replace

import numpy as np
import pytest

from streamnet.runtime.component import BoltCollector, Context, Tuple
from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
from streamnet.training.compute_bolt import ComputeBolt
from streamnet.training.config import run_config_to_dict
from streamnet.training.schedule import UnitSchedule
from streamnet.training.streams import APPLIED, CONTRIBUTION, OK, PARAMS, REPLICA, RESYNC, STATE_REQUEST, WORK, row

CFG = RunConfig(model=ModelConfig(name="lenet5"), data=DataConfig(dataset="synthetic", synthetic_train=64,
                                                                   synthetic_test=16),
                algorithm=AlgorithmConfig(name="cumulative", batch=4, sync_period=1), units=2, epochs=1, seed=3)


class Recorder:
    """Stands where the bolt's executor stands behind the real BoltCollector."""

    def __init__(self):
        self.emitted, self.acked, self.direct, self.sent_now = [], [], [], []

    def emit(self, values, stream, anchors, direct_task):
        self.emitted.append((stream, values))
        self.direct.append(direct_task)
        return []

    def ack(self, tup):
        self.acked.append(tup)

    def fail(self, tup):
        raise AssertionError(f"the compute bolt failed {tup}")

    async def send_now(self):
        self.sent_now.append(len(self.emitted))


async def _compute(fn, *args):
    return fn(*args)


def _bolt(sync_tasks=1, cfg=CFG):
    """A compute bolt for unit 1 (task 7), as topology_runtime.make_executor makes it."""
    bolt = ComputeBolt(run=run_config_to_dict(cfg))
    recorder = Recorder()
    tasks = {"compute": range(6, 8), "sync": range(8, 8 + sync_tasks)}
    ctx = Context(topology="t", component="compute", task=7, task_index=1, parallelism=2, worker="w0", config={},
                  component_config=bolt.config, component_tasks=tasks.__getitem__, compute=_compute,
                  publish=lambda k, v: None, save_state=lambda v: None)
    bolt.prepare(ctx, BoltCollector(recorder))
    return bolt, recorder


def _work(step: int, cfg=CFG) -> Tuple:
    batches = UnitSchedule(cfg, 64).epoch(0)[0][1][step]      # unit 1's batches of round `step`
    values = row(WORK, unit=1, epoch=0, round=step, step=step, lr_scale=1.0,
                 batches=[b.astype(np.int32) for b in batches], checkpoint=False, share=1.0)
    return Tuple(values, list(WORK), "default", "data", 0, {})


def _params(step: int, params: np.ndarray, s: int = 0, generation: int = 0) -> Tuple:
    return Tuple(row(PARAMS, step=step, slice=s, params=params, generation=generation), list(PARAMS), "params",
                 "sync", 8 + s, {})


def test_work_ahead_of_the_parameters_is_held_and_the_request_repeated_until_they_come():
    bolt, out = _bolt()
    asyncio.run(bolt.execute(_work(5)))
    asyncio.run(bolt.execute(_work(5)))
    # one request for both; a unit that computed nothing at its step names the work it holds
    assert out.emitted == [("resync", row(RESYNC, task=7, step=5))] and out.acked == []
    bolt.RESYNC_S = 3600.0
    bolt.tick()
    assert len(out.emitted) == 1                                # not yet: the request is still fresh
    bolt.RESYNC_S = 0.0                                         # the answer is overdue
    bolt.tick()
    assert out.emitted == [("resync", row(RESYNC, task=7, step=5))] * 2
    params = bolt.unit.model.params + 0.01                      # the current parameters (step 5) arrive
    asyncio.run(bolt.execute(_params(5, params)))
    assert bolt.params_step == 5
    np.testing.assert_array_equal(bolt.unit.model.params, params)
    computed = [dict(zip(CONTRIBUTION, v)) for s, v in out.emitted[2:]]
    assert [(c["step"], c["status"], c["samples"]) for c in computed] == [(5, OK, 4), (5, OK, 4)]
    assert len(out.acked) == 3                                  # the parameters and both held works
    bolt.tick()
    assert len(out.emitted) == 4                                # nothing held: no request


def test_work_sent_ahead_for_the_next_step_waits_for_its_parameters_without_asking():
    """The data spout sends round r + 1 while round r is in flight: a unit that has just
    sent its result for step r holds work for step r + 1 quietly - the parameters are on
    their way - and asks for them only if they do not come within RESYNC_S."""
    bolt, out = _bolt()
    params = bolt.unit.model.params.copy()
    asyncio.run(bolt.execute(_params(2, params)))
    asyncio.run(bolt.execute(_work(2)))                         # step 2 computed and sent
    assert [s for s, _ in out.emitted] == ["default"]
    assert out.sent_now == [1] and len(out.acked) == 2          # sent at once, the work acked with it
    asyncio.run(bolt.execute(_work(3)))                         # step 3, ahead of its parameters
    assert [s for s, _ in out.emitted] == ["default"]           # held, no request
    bolt.tick()
    assert len(out.emitted) == 1
    bolt.RESYNC_S = 0.0                                         # they are overdue: ask
    bolt.tick()
    assert out.emitted[-1] == ("resync", row(RESYNC, task=7, step=None))     # it computed step 2
    asyncio.run(bolt.execute(_params(3, params)))
    assert [dict(zip(CONTRIBUTION, v))["step"] for s, v in out.emitted if s == "default"] == [2, 3]


def test_work_already_applied_is_answered_by_field_name():
    """A replay of a combined step: the answer's values follow the stream's declared fields."""
    bolt, out = _bolt()
    asyncio.run(bolt.execute(_params(6, bolt.unit.model.params.copy())))
    work = _work(5)
    asyncio.run(bolt.execute(work))
    (stream, values), = out.emitted
    assert ComputeBolt.outputs["default"] == list(CONTRIBUTION)
    sent = dict(zip(CONTRIBUTION, values))
    assert stream == "default" and out.acked[-1] is work
    given = work.as_dict()
    echoed = [k for k in given if k != "batches"]     # what the sync task reads back
    assert {k: sent[k] for k in echoed} == {k: given[k] for k in echoed}
    assert (sent["status"], sent["samples"], sent["unit_state"]) == (APPLIED, 0, None)


def test_a_round_waits_for_every_slice_and_each_slice_of_the_result_goes_to_its_sync_task():
    bolt, out = _bolt(sync_tasks=3)
    (a, b), (c, d), (e, f) = bolt.slices
    assert a == 0 and b == c and d == e and f == bolt.unit.model.num_params
    asyncio.run(bolt.execute(_work(2)))
    assert [s for s, _ in out.emitted] == ["resync"]                  # asked every sync task (all grouping)
    new = bolt.unit.model.params + 0.5
    asyncio.run(bolt.execute(_params(2, new[a:b], 0)))
    asyncio.run(bolt.execute(_params(2, new[e:f], 2)))
    assert bolt.params_step == 0 and len(out.emitted) == 1            # slice 1 still missing: nothing computed
    asyncio.run(bolt.execute(_params(2, new[c:d], 1)))
    assert bolt.params_step == 2
    np.testing.assert_array_equal(bolt.unit.model.params, new)
    sent = [dict(zip(CONTRIBUTION, v)) for _, v in out.emitted[1:]]
    assert [(c["slice"], c["step"], c["status"], c["vector"].size) for c in sent] == [
        (0, 2, OK, b - a), (1, 2, OK, d - c), (2, 2, OK, f - e)]
    assert out.direct[1:] == [8, 9, 10] and all(c["finite"] is True for c in sent)
    # a fault left slice 0 ahead: the replayed round is computed for the others only
    asyncio.run(bolt.execute(_params(3, new[a:b], 0)))
    asyncio.run(bolt.execute(_work(2)))
    again = [dict(zip(CONTRIBUTION, v)) for _, v in out.emitted[4:]]
    assert [(c["slice"], c["status"]) for c in again] == [(0, APPLIED), (1, OK), (2, OK)]


def test_a_parameter_slice_that_is_not_one_of_the_sync_tasks_is_refused():
    bolt, out = _bolt(sync_tasks=2)
    failed = []
    out.fail = failed.append                                           # expected here: record, not raise
    tup = _params(1, np.zeros(10, np.float32), s=2)
    asyncio.run(bolt.execute(tup))
    assert failed == [tup] and out.acked == [] and bolt.params_step == 0


def _request(s: int, generation: int) -> Tuple:
    return Tuple(row(STATE_REQUEST, nonce=1, slice=s, generation=generation), list(STATE_REQUEST), "state_request",
                 "sync", 8 + s, {})


def test_once_a_new_sync_task_asked_for_its_replica_a_unit_takes_no_parameters_from_the_one_it_superseded():
    bolt, out = _bolt(sync_tasks=2)
    failed = []
    out.fail = failed.append
    (a, b), (c, d) = bolt.slices
    start = bolt.unit.model.params.copy()
    old = start + 0.25
    asyncio.run(bolt.execute(_params(1, old[a:b], 0, generation=3)))      # the old instance, before any request
    assert bolt.slice_steps == [1, 0] and failed == []
    asyncio.run(bolt.execute(_request(0, generation=5)))                   # its successor starts over
    replica = dict(zip(REPLICA, out.emitted[-1][1]))
    assert (out.emitted[-1][0], replica["slice"], replica["step"]) == ("replica", 0, 1)
    stale = _params(2, (old + 1.0)[a:b], 0, generation=3)                  # the old instance's next round
    asyncio.run(bolt.execute(stale))
    assert failed == [stale] and bolt.slice_steps == [1, 0]                # refused: its round is replayed
    np.testing.assert_array_equal(bolt.unit.model.params[a:b], old[a:b])
    asyncio.run(bolt.execute(_params(2, old[c:d], 1, generation=1)))       # another slice's task: its own count
    asyncio.run(bolt.execute(_params(2, (old + 2.0)[a:b], 0, generation=5)))   # the successor's own
    assert bolt.slice_steps == [2, 2] and failed == [stale]
    np.testing.assert_array_equal(bolt.unit.model.params[a:b], (old + 2.0)[a:b])
    np.testing.assert_array_equal(bolt.unit.model.params[c:d], old[c:d])
    late = _request(0, generation=4)                                       # a request from an older one still
    asyncio.run(bolt.execute(late))
    assert failed == [stale, late] and out.emitted[-1][0] == "replica" and len(out.emitted) == 1


def test_a_parameter_tuple_whose_generation_is_not_a_count_is_refused():
    bolt, out = _bolt()
    failed = []
    out.fail = failed.append
    for generation in (-1, 1.5, "2", None, True):
        tup = Tuple(row(PARAMS, step=1, slice=0, params=np.zeros(bolt.unit.model.num_params, np.float32),
                        generation=generation), list(PARAMS), "params", "sync", 8, {})
        asyncio.run(bolt.execute(tup))
        assert failed[-1] is tup
    assert bolt.params_step == 0 and out.acked == []


def test_with_one_slice_the_sync_task_judges_finiteness_and_still_drops_a_diverged_unit():
    from streamnet.training.bp import Aggregator, Contribution, TrainingDiverged, plan_for
    bolt, out = _bolt(sync_tasks=1)
    asyncio.run(bolt.execute(_work(0)))
    sent, = [dict(zip(CONTRIBUTION, v)) for _, v in out.emitted]
    assert sent["finite"] is None and sent["status"] == OK         # not checked twice
    agg = Aggregator(bolt.unit.model.params, plan_for(CFG.algorithm))
    before = agg.params.copy()
    diverged = sent["vector"].copy()
    diverged[7] = np.nan
    with pytest.raises(TrainingDiverged, match="every unit's update was not finite"):   # the round's only unit
        agg.combine([Contribution(1, sent["samples"], sent["steps"], sent["loss_sum"], diverged, sent["finite"])])
    assert agg.refused == [(1, "non-finite")]
    np.testing.assert_array_equal(agg.params, before)


def test_the_round_computed_last_sent_again_gets_the_same_result_not_a_second_computation():
    """Its tree failed (a worker left, a message timed out, the spout started anew) and the
    work came again while the unit still holds that step's parameters: computing it again
    would start from the parameters its first local steps moved, MixBP's samples trained
    twice (a vector of two rounds' progress, which replaces the first at the sync task)."""
    mixbp = replace(CFG, algorithm=AlgorithmConfig(name="mixbp", batch=4, sync_period=2))
    bolt, out = _bolt(cfg=mixbp)
    asyncio.run(bolt.execute(_work(0, mixbp)))
    moved = bolt.unit.model.params.copy()
    asyncio.run(bolt.execute(_work(0, mixbp)))
    first, again = [dict(zip(CONTRIBUTION, v)) for s, v in out.emitted if s == "default"]
    assert first["samples"] == again["samples"] == 8 and first["status"] == again["status"] == OK
    assert np.array_equal(first["vector"], again["vector"]) and np.abs(first["vector"]).max() > 0
    assert np.array_equal(bolt.unit.model.params, moved)          # no second round of local steps
    assert bolt.samples == 8 and len(out.acked) == 2                 # counted once, both copies acked
