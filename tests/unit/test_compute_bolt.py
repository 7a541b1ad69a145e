"""The compute bolt as the engine builds it (ComputeBolt(**config), prepare(ctx,
collector)): work ahead of its parameters is held and the request for them repeated
until they come; work already applied is answered by field name."""
import asyncio

import numpy as np

from streamnet.runtime.component import BoltCollector, Context, Tuple
from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
from streamnet.training.compute_bolt import ComputeBolt
from streamnet.training.config import run_config_to_dict
from streamnet.training.schedule import UnitSchedule
from streamnet.training.streams import APPLIED, CONTRIBUTION, OK, PARAMS, RESYNC, WORK, row

CFG = RunConfig(model=ModelConfig(name="lenet5"), data=DataConfig(dataset="synthetic", synthetic_train=64,
                                                                   synthetic_test=16),
                algorithm=AlgorithmConfig(name="cumulative", batch=4, sync_period=1), units=2, epochs=1, seed=3)


class Recorder:
    """Stands where the bolt's executor stands behind the real BoltCollector."""

    def __init__(self):
        self.emitted, self.acked = [], []

    def emit(self, values, stream, anchors, direct_task):
        self.emitted.append((stream, values))
        return []

    def ack(self, tup):
        self.acked.append(tup)

    def fail(self, tup):
        raise AssertionError(f"the compute bolt failed {tup}")


async def _compute(fn, *args):
    return fn(*args)


def _bolt():
    """A compute bolt for unit 1 (task 7), as topology_runtime.make_executor makes it."""
    bolt = ComputeBolt(run=run_config_to_dict(CFG))
    recorder = Recorder()
    ctx = Context(topology="t", component="compute", task=7, task_index=1, parallelism=2, worker="w0", config={},
                  component_config=bolt.config, component_tasks=lambda c: range(6, 8), compute=_compute,
                  publish=lambda k, v: None, save_state=lambda v: None)
    bolt.prepare(ctx, BoltCollector(recorder))
    return bolt, recorder


def _work(step: int) -> Tuple:
    batches = UnitSchedule(CFG, 64).epoch(0)[0][1][step]      # unit 1's batches of round `step`
    values = row(WORK, unit=1, epoch=0, round=step, step=step, lr_scale=1.0,
                 batches=[b.astype(np.int32) for b in batches], checkpoint=False)
    return Tuple(values, list(WORK), "default", "data", 0, {})


def _params(step: int, params: np.ndarray) -> Tuple:
    return Tuple(row(PARAMS, step=step, params=params), list(PARAMS), "params", "sync", 5, {})


def test_work_ahead_of_the_parameters_is_held_and_the_request_repeated_until_they_come():
    bolt, out = _bolt()
    asyncio.run(bolt.execute(_work(5)))
    asyncio.run(bolt.execute(_work(5)))
    assert out.emitted == [("resync", row(RESYNC, task=7))] and out.acked == []   # one request for both
    bolt.RESYNC_S = 3600.0
    bolt.tick()
    assert len(out.emitted) == 1                                # not yet: the request is still fresh
    bolt.RESYNC_S = 0.0                                         # the answer is overdue
    bolt.tick()
    assert out.emitted == [("resync", row(RESYNC, task=7))] * 2
    params = bolt.unit.model.params + 0.01                      # the current parameters (step 5) arrive
    asyncio.run(bolt.execute(_params(5, params)))
    assert bolt.params_step == 5
    np.testing.assert_array_equal(bolt.unit.model.params, params)
    computed = [dict(zip(CONTRIBUTION, v)) for s, v in out.emitted[2:]]
    assert [(c["step"], c["status"], c["samples"]) for c in computed] == [(5, OK, 4), (5, OK, 4)]
    assert len(out.acked) == 3                                  # the parameters and both held works
    bolt.tick()
    assert len(out.emitted) == 4                                # nothing held: no request


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
    assert {k: sent[k] for k in given if k != "batches"} == {k: v for k, v in given.items() if k != "batches"}
    assert (sent["status"], sent["samples"], sent["unit_state"]) == (APPLIED, 0, None)
