"""Inputs are checked where they enter (issue 15): the codec bounds what a header
may decode to and refuses a payload larger than its arrays; the training bolts
refuse a vector of the wrong shape or dtype before any kernel sees it."""
import asyncio
import logging
import re

import msgpack
import numpy as np
import pytest

from streamnet.runtime import codec
from streamnet.runtime.component import BoltCollector, Context, Tuple
from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
from streamnet.training.compute_bolt import ComputeBolt
from streamnet.training.config import run_config_to_dict
from streamnet.training.streams import CONTRIBUTION, OK, PARAMS, REPLICA, row
from streamnet.training.sync_bolt import SyncBolt


# -- codec -------------------------------------------------------------------------------
def _frame(header: bytes, payload: bytes = b"") -> bytes:
    return codec.PREFIX.pack(codec.MAGIC, len(header), len(payload)) + header + payload


def test_a_header_of_many_small_objects_is_refused_before_it_grows():
    header = msgpack.packb([[] for _ in range(5000)])      # 5 KB that would be 5000 list objects
    limits = codec.Limits(max_header_items=1000)
    with pytest.raises(codec.CodecError, match=r"exceeds max_array_len\(1000\)"):   # one list too long
        codec.decode(_frame(header), limits)
    nested = msgpack.packb([[[] for _ in range(300)] for _ in range(10)])    # entries at every level count
    with pytest.raises(codec.CodecError, match="more than 1000 list/map entries"):
        codec.decode(_frame(nested), limits)
    nested = msgpack.packb([{"a": [1, 2]} for _ in range(400)])
    with pytest.raises(codec.CodecError, match="list/map entries"):
        codec.decode(_frame(nested), limits)
    assert codec.decode(_frame(msgpack.packb([{"a": [1, 2]}] * 100)), limits) == [{"a": [1, 2]}] * 100


def test_a_payload_larger_than_its_arrays_is_refused():
    good = codec.encode_bytes([np.arange(1, dtype=np.float32)])
    hlen, plen = codec.parse_prefix(good[:codec.PREFIX.size])
    assert plen == 8 and np.array_equal(codec.decode(good)[0], [0.0])
    header = good[codec.PREFIX.size:codec.PREFIX.size + hlen]
    pinned = _frame(header, good[codec.PREFIX.size + hlen:] + b"\0" * (1 << 20))   # 4 bytes pin 1 MiB
    with pytest.raises(codec.CodecError, match="payload of 1048584 bytes, but its arrays take 8"):
        codec.decode(pinned)
    with pytest.raises(codec.CodecError, match="but its arrays take 0"):
        codec.decode(_frame(msgpack.packb([1]), b"\0" * 8))


# -- sync bolt ---------------------------------------------------------------------------
# The bolts as the engine builds them: Component(**config), prepare(ctx, collector).
CFG = RunConfig(model=ModelConfig(name="lenet5"), data=DataConfig(dataset="synthetic", synthetic_train=64,
                                                                   synthetic_test=16),
                algorithm=AlgorithmConfig(name="cumulative", batch=4, sync_period=1), units=2, epochs=1, seed=3)
P = 61706         # LeNet-5's parameters (tests/unit/test_models.py)
TASKS = {"compute": range(1, 3), "sync": range(3, 4)}


class Recorder:
    """Stands where a bolt's executor stands behind the real BoltCollector."""

    def __init__(self):
        self.emitted, self.acked, self.failed = [], [], []

    def emit(self, values, stream, anchors, direct_task):
        self.emitted.append((stream, values))
        return []

    def ack(self, tup):
        self.acked.append(tup)

    def fail(self, tup):
        self.failed.append(tup)

    async def send_now(self):
        pass


async def _compute(fn, *args):
    return fn(*args)


def _prepared(cls, component: str, task_index: int, cfg: RunConfig = CFG):
    bolt = cls(run=run_config_to_dict(cfg))
    out = Recorder()
    ctx = Context(topology="t", component=component, task=TASKS[component][task_index], task_index=task_index,
                  parallelism=len(TASKS[component]), worker="w0", config={}, component_config=bolt.config,
                  component_tasks=TASKS.__getitem__, compute=_compute, publish=lambda k, v: None,
                  save_state=lambda v: None)
    bolt.prepare(ctx, BoltCollector(out))
    return bolt, out


def _contribution(unit, vector, step=0, status=OK) -> Tuple:
    values = row(CONTRIBUTION, unit=unit, epoch=0, round=step, step=step, lr_scale=1.0, samples=4, steps=1,
                 loss_sum=1.0, slice=0, vector=vector, finite=True, status=status, checkpoint=False, unit_state=None,
                 timing=None, share=1.0)
    return Tuple(values, list(CONTRIBUTION), "default", "compute", 1, {})


@pytest.mark.parametrize("vector, why", [
    (np.zeros(4 << 20, np.float32), rf"shape \(4194304,\), not \({P},\)"),     # the SIGSEGV of the review
    (np.zeros(P, np.float64), "dtype float64, not float32"),
    (np.zeros((4, 4), np.float32), rf"shape \(4, 4\), not \({P},\)"),
    ([0.0] * 16, "a list, not an array"),
])
def test_a_contribution_of_the_wrong_shape_or_dtype_is_refused_naming_its_unit(caplog, vector, why):
    bolt, out = _prepared(SyncBolt, "sync", 0)
    assert bolt.agg.params.size == P
    tup = _contribution(1, vector)
    with caplog.at_level(logging.WARNING, "streamnet.training.sync_bolt"):
        asyncio.run(bolt.execute(tup))
    assert out.failed == [tup]                         # replayed by the spout: nothing lost
    assert bolt.pending == {}                          # never reaches the aggregator's kernels
    assert bolt.agg.refused and bolt.agg.refused[0][0] == 1
    assert any("refuses the contribution of unit 1 to step 0" in r.getMessage() for r in caplog.records)
    import re
    assert re.search(why, caplog.text)


def test_a_contribution_for_an_unknown_unit_is_refused_and_a_good_one_goes_on():
    bolt, out = _prepared(SyncBolt, "sync", 0)
    asyncio.run(bolt.execute(_contribution(7, np.zeros(P, np.float32))))
    assert len(out.failed) == 1 and bolt.pending == {}
    good = _contribution(1, np.ones(P, np.float32))
    asyncio.run(bolt.execute(good))
    assert bolt.pending == {(0, 0): {1: good}} and len(out.failed) == 1   # waiting for unit 0's


def test_a_replica_of_the_wrong_shape_is_not_adopted(caplog):
    bolt, out = _prepared(SyncBolt, "sync", 0)
    # work past step 0 reaching a sync task with no state: it replaced one that died, and asks the replicas
    asyncio.run(bolt.execute(_contribution(0, np.zeros(P, np.float32), step=3)))
    assert bolt.adoption is not None and out.emitted[-1][0] == "state_request"
    with caplog.at_level(logging.WARNING):
        for task, params in ((1, np.zeros(99, np.float32)), (2, np.full(P, np.inf, np.float32))):
            replica = Tuple(row(REPLICA, task=task, slice=0, step=3, params=params), list(REPLICA), "replica",
                            "compute", task, {})
            asyncio.run(bolt.execute(replica))
    assert bolt.adoption.replies == {}
    assert "replica of task 1" in caplog.text and "non-finite values" in caplog.text


# -- compute bolt ------------------------------------------------------------------------
def test_parameters_of_the_wrong_shape_are_refused_by_a_compute_unit(caplog):
    bolt, out = _prepared(ComputeBolt, "compute", 1)
    before = bolt.unit.model.params.copy()
    tup = Tuple(row(PARAMS, step=1, slice=0, params=np.zeros(1 << 20, np.float32), generation=0), list(PARAMS), "params", "sync",
                3, {})
    with caplog.at_level(logging.WARNING):
        asyncio.run(bolt.execute(tup))
    np.testing.assert_array_equal(bolt.unit.model.params, before)
    assert bolt.params_step == 0 and out.failed == [tup]
    assert "unit 1 refuses parameters for step 1 from sync" in caplog.text


def test_a_unit_state_of_another_model_leaves_the_compute_unit_as_it_was_and_fails_the_run():
    """The tuple failed, and each request for parameters was answered with the same state,
    every 2 s, for ever: the run fails now, saying why."""
    from streamnet.training.streams import DIRECT_PARAMS
    bolt, out = _prepared(ComputeBolt, "compute", 1)
    failures = []
    bolt.ctx._fail_topology = failures.append
    before, steps = bolt.unit.model.params.copy(), bolt.unit.model.random_state()
    state = {"velocity": None, "random": steps + [0]}         # another model's dropout counters
    tup = Tuple(row(DIRECT_PARAMS, step=1, slice=0, params=np.ones(before.size, np.float32), unit_state=state,
                    generation=0), list(DIRECT_PARAMS), "direct_params", "sync", 3, {})
    asyncio.run(bolt.execute(tup))
    assert out.failed == [tup] and len(failures) == 1
    assert failures[0].startswith("unit 1 cannot take its state from the checkpoint of step 1: ") and \
        "random state" in failures[0]
    np.testing.assert_array_equal(bolt.unit.model.params, before)     # the slice not taken either
    assert bolt.params_step == 0 and bolt.unit.model.random_state() == steps


def test_a_unit_state_handed_over_twice_is_set_once(monkeypatch):
    """A resumed run's unit that asked for parameters again (the sync task slow to start)
    got the checkpoint's state twice: the second answer, after the unit computed that
    round, set its inner momentum and dropout streams back."""
    from streamnet.training.streams import DIRECT_PARAMS
    bolt, out = _prepared(ComputeBolt, "compute", 1)
    set_states = []
    monkeypatch.setattr(bolt.unit, "set_state", set_states.append)
    size = bolt.unit.model.params.size
    for _ in range(2):
        tup = Tuple(row(DIRECT_PARAMS, step=3, slice=0, params=np.ones(size, np.float32), unit_state={"s": 1},
                        generation=0), list(DIRECT_PARAMS), "direct_params", "sync", 3, {})
        asyncio.run(bolt.execute(tup))
    assert set_states == [{"s": 1}] and bolt.params_step == 3 and out.failed == []


@pytest.mark.parametrize("batches, why", [
    ([np.array([0, 5, 64])], "batch 0 indexes outside the 64 training samples"),
    ([np.array([1, 2]), np.array([-1])], "batch 1 indexes outside"),
    ([np.array([1.0, 2.0])], "batch 0 is not a 1-D integer array"),
    ("0,1,2", "batches are a str, not a list"),
])
def test_work_with_batches_outside_the_training_set_is_refused(caplog, batches, why):
    from streamnet.training.streams import WORK
    bolt, out = _prepared(ComputeBolt, "compute", 1)
    before = bolt.unit.model.params.copy()
    work = Tuple(row(WORK, unit=1, epoch=0, round=0, step=0, lr_scale=1.0, batches=batches, checkpoint=False,
                     share=1.0),
                 list(WORK), "default", "data", 0, {})
    with caplog.at_level(logging.WARNING):
        asyncio.run(bolt.execute(work))
    np.testing.assert_array_equal(bolt.unit.model.params, before)       # no step was taken
    assert out.failed == [work] and out.emitted == []
    assert "unit 1 refuses its work for step 0: " + why in caplog.text


@pytest.mark.parametrize("field, value", [("samples", -4), ("samples", float("nan")), ("samples", True),
                                          ("steps", -1), ("step", "0"), ("round", -1), ("epoch", 1.5),
                                          ("lr_scale", float("nan")), ("lr_scale", -1.0), ("loss_sum", "1")])
def test_a_contribution_whose_figures_are_not_counts_is_refused_before_it_is_weighed(caplog, field, value):
    bolt, out = _prepared(SyncBolt, "sync", 0)
    before = bolt.agg.params.copy()
    bad = _contribution(1, np.ones(P, np.float32))
    bad.values[list(CONTRIBUTION).index(field)] = value
    with caplog.at_level(logging.WARNING, "streamnet.training.sync_bolt"):
        asyncio.run(bolt.execute(bad))
    assert out.failed == [bad] and bolt.pending == {}            # failed: its spout replays the unit's work
    assert f"refuses a contribution from unit 1: {field} " in caplog.text
    asyncio.run(bolt.execute(_contribution(0, np.ones(P, np.float32))))   # the round goes on with good ones
    asyncio.run(bolt.execute(_contribution(1, np.ones(P, np.float32))))
    assert bolt.pending == {} and np.isfinite(bolt.agg.params).all() and not np.array_equal(bolt.agg.params, before)


@pytest.mark.parametrize("component", ["compute", "sync"])
def test_a_task_whose_training_set_is_not_the_runs_fails_naming_both(component):
    """A worker host with other data (another STREAMNET_DATA) took the client's schedule:
    a larger set here had every round's work refused and replayed at once, a smaller one
    rounds that never combined - a run that never ended."""
    from streamnet.training.schedule import dataset_for, training_data
    from streamnet.training.sync_bolt import SyncBolt
    cls = ComputeBolt if component == "compute" else SyncBolt
    here = training_data(dataset_for(CFG))
    for built_for, says in ((dict(here, samples=here["samples"] + 1), f"{here['samples']} samples here"),
                            (dict(here, labels_sha256="0" * 16), "(labels 0000000000000000)")):
        bolt = cls(run=run_config_to_dict(CFG), data=built_for)
        ctx = Context(topology="t", component=component, task=TASKS[component][0], task_index=0,
                      parallelism=len(TASKS[component]), worker="w0", config={}, component_config=bolt.config,
                      component_tasks=TASKS.__getitem__, compute=_compute, publish=lambda k, v: None,
                      save_state=lambda v: None)
        with pytest.raises(ValueError, match=re.escape(says) + ".*give every worker and the client the same data"):
            bolt.prepare(ctx, BoltCollector(Recorder()))
    cls(run=run_config_to_dict(CFG), data=here).prepare(ctx, BoltCollector(Recorder()))       # the same: runs
