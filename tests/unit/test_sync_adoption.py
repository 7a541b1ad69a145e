"""A sync task started anew rebuilds its parameters from the compute units' replicas
(sync_recovery.py): it adopts the newest, and never goes back to a step the data
spout has passed - if every replica started anew with it, the updates in between are
lost (counted in `lost_steps`, logged as an error) and training goes on."""
import asyncio
import logging
from dataclasses import replace

import numpy as np

from streamnet.runtime.component import Tuple
from streamnet.training import AlgorithmConfig
from streamnet.training.compute_bolt import ComputeBolt
from streamnet.training.streams import APPLIED, OK, PARAMS, REPLICA, STATE_REQUEST, WORK, row
from streamnet.training.sync_bolt import SyncBolt
from tests.unit.test_security_inputs import CFG, P, _contribution, _prepared


def _replica(bolt, task: int, step: int) -> None:
    tup = Tuple(row(REPLICA, task=task, slice=0, step=step, params=np.full(P, task, np.float32)), list(REPLICA),
                "replica", "compute", task, {})
    asyncio.run(bolt.execute(tup))


def _last_params(out) -> dict:
    stream, values = out.emitted[-1]
    assert stream == "params"
    return dict(zip(PARAMS, values))


def test_when_every_replica_started_anew_it_goes_on_at_its_counters_step(caplog):
    # the sync task and every unit moved at once: the counters say step 5 is next, the
    # replicas hold the seeded parameters of step 0. The spout will not send steps 0-4
    # again: going back to step 0 left every unit asking for step 5's parameters for ever
    bolt, out = _prepared(SyncBolt, "sync", 0)
    bolt.counts.next_step = 5
    with caplog.at_level(logging.WARNING):
        bolt._request_replicas()
        for task in (1, 2):
            _replica(bolt, task, 0)
    assert bolt.adoption is None and bolt.counts.next_step == 5 and bolt.counts.lost_steps == 5
    assert _last_params(out)["step"] == 5
    assert "the updates of steps 0-4 were lost" in caplog.text
    assert bolt.stats().lost_steps == 5


def test_an_older_replica_is_not_adopted_while_a_newer_one_may_yet_answer(monkeypatch):
    bolt, out = _prepared(SyncBolt, "sync", 0)
    bolt.counts.next_step = 5
    bolt._request_replicas()
    _replica(bolt, 1, 0)                       # a unit started anew; the other has not answered
    monkeypatch.setattr(bolt, "ADOPT_WAIT_S", 0.0)
    asyncio.run(bolt.tick())
    assert bolt.adoption is not None and out.emitted[-1][0] == "state_request"   # asked again
    _replica(bolt, 1, 0)
    _replica(bolt, 2, 5)                       # the unit that holds step 5's parameters
    assert bolt.adoption is None and bolt.counts.lost_steps == 0
    params = _last_params(out)
    assert params["step"] == 5 and params["params"][0] == 2.0


def test_a_combine_saved_but_never_sent_is_combined_again_but_not_the_first(caplog):
    # the old sync task counted step 3 and died before sending it: the replicas hold step 3
    bolt, out = _prepared(SyncBolt, "sync", 0)
    bolt.counts.count_round(bolt.plans, 3, 0, 3, 8, [0, 1])
    bolt._request_replicas()
    for task in (1, 2):
        _replica(bolt, task, 3)
    assert bolt.counts.next_step == 3 and bolt.counts.lost_steps == 0 and _last_params(out)["step"] == 3
    # at step 0 a replica started anew cannot be told from one the first combine never
    # reached: the step is not undone (if it reached them, the spout is past it)
    bolt, out = _prepared(SyncBolt, "sync", 0)
    bolt.counts.count_round(bolt.plans, 0, 0, 0, 8, [0, 1])
    bolt._request_replicas()
    with caplog.at_level(logging.WARNING):
        for task in (1, 2):
            _replica(bolt, task, 0)
    assert bolt.counts.next_step == 1 and bolt.counts.lost_steps == 1 and _last_params(out)["step"] == 1


def test_a_replica_is_the_parameters_of_its_step_not_the_units_own_steps_since():
    # MixBP: a unit that computed its round has moved its parameters by its local steps;
    # what it hands a new sync task is what it received (here the seeded step 0's)
    cfg = replace(CFG, algorithm=AlgorithmConfig(name="mixbp", batch=4, sync_period=2))
    bolt, out = _prepared(ComputeBolt, "compute", 0, cfg)
    seeded = bolt.unit.model.params.copy()
    work = Tuple(row(WORK, unit=0, epoch=0, round=0, step=0, lr_scale=1.0, checkpoint=False, share=1.0,
                     batches=[np.arange(4), np.arange(4, 8)]), list(WORK), "default", "data", 0, {})
    asyncio.run(bolt.execute(work))
    assert out.emitted and not np.array_equal(bolt.unit.model.params, seeded)      # it stepped
    request = Tuple(row(STATE_REQUEST, nonce=1, slice=0, generation=0), list(STATE_REQUEST), "state_request", "sync", 3, {})
    asyncio.run(bolt.execute(request))
    stream, values = out.emitted[-1]
    replica = dict(zip(REPLICA, values))
    assert stream == "replica" and replica["step"] == 0
    np.testing.assert_array_equal(replica["params"], seeded)


def test_rounds_to_uncount_wait_for_every_replica_not_the_timeout(monkeypatch):
    # the counters are a round ahead of the replicas that answered; the one that did not
    # could yet take that round from the superseded instance: ask again, do not uncount
    bolt, out = _prepared(SyncBolt, "sync", 0)
    for step in (2, 3):
        bolt.counts.count_round(bolt.plans, step, 0, step, 8, [0, 1])
    bolt._request_replicas()
    _replica(bolt, 1, 3)
    monkeypatch.setattr(bolt, "ADOPT_WAIT_S", 0.0)
    asyncio.run(bolt.tick())
    assert bolt.adoption is not None and out.emitted[-1][0] == "state_request"     # asked again
    assert bolt.counts.next_step == 4
    _replica(bolt, 1, 3)
    _replica(bolt, 2, 3)                       # every replica answered: step 3 was never delivered
    assert bolt.adoption is None and bolt.counts.next_step == 3 and _last_params(out)["step"] == 3
    # with nothing to uncount, the timeout goes on without the replica that died
    bolt, out = _prepared(SyncBolt, "sync", 0)
    bolt.counts.count_round(bolt.plans, 2, 0, 2, 8, [0, 1])
    bolt._request_replicas()
    _replica(bolt, 1, 3)
    monkeypatch.setattr(bolt, "ADOPT_WAIT_S", 0.0)
    asyncio.run(bolt.tick())
    assert bolt.adoption is None and bolt.counts.next_step == 3 and _last_params(out)["step"] == 3


def _applied(bolt, unit: int, step: int, status):
    """Unit `unit`'s answer to the replay of the round of `step` (tasks 1 and 2 are units 0 and 1)."""
    vector = np.zeros(0 if status == APPLIED else P, np.float32)
    tup = _contribution(unit, vector, step=step, status=status)
    asyncio.run(bolt.execute(tup))
    return tup


def _adopted_step_3_without_unit_0(monkeypatch):
    """A new sync task whose counters end at step 3 adopted step 3 from unit 1 alone: unit
    0's replica did not answer in time, and unit 0 holds step 4 - the superseded task's
    combine of round 3 reached it and no other unit."""
    bolt, out = _prepared(SyncBolt, "sync", 0)
    for step in range(3):
        bolt.counts.count_round(bolt.plans, step, 0, step, 8, [0, 1])
    bolt._request_replicas()
    _replica(bolt, 2, 3)
    monkeypatch.setattr(bolt, "ADOPT_WAIT_S", 0.0)
    asyncio.run(bolt.tick())
    assert bolt.adoption is None and bolt.counts.next_step == 3
    monkeypatch.setattr(bolt, "ADOPT_WAIT_S", 5.0)
    return bolt, out


def test_a_unit_that_applied_a_step_the_task_never_combined_makes_it_ask_the_replicas_again(monkeypatch):
    # the replay of round 3: unit 0 answers that it applied it, unit 1 computes it again.
    # Answered as a replay, unit 0's tree completed and it never contributed to round 3:
    # the round waited for it for ever (a read-only review of training's fault paths)
    bolt, out = _adopted_step_3_without_unit_0(monkeypatch)
    applied = _applied(bolt, 0, 3, APPLIED)
    assert bolt.adoption is not None and out.emitted[-1][0] == "state_request"      # asks again
    computed = _applied(bolt, 1, 3, OK)
    assert bolt.pending                               # held while the task rebuilds
    _replica(bolt, 1, 4)
    _replica(bolt, 2, 3)
    assert bolt.adoption is None and bolt.counts.next_step == 4 and bolt.counts.lost_steps == 0
    assert not bolt.pending and applied in out.acked and computed in out.acked and not out.failed
    params = _last_params(out)
    assert params["step"] == 4 and params["params"][0] == 1.0      # unit 0's replica (task 1)


def test_when_that_unit_does_not_answer_again_its_answer_is_failed_not_taken_for_a_replay(monkeypatch):
    # unit 0's replica is lost a second time: the task goes on at step 3, and fails unit
    # 0's answer, so that the spout replays its work and the next answer asks again
    bolt, out = _adopted_step_3_without_unit_0(monkeypatch)
    applied = _applied(bolt, 0, 3, APPLIED)
    _replica(bolt, 2, 3)
    monkeypatch.setattr(bolt, "ADOPT_WAIT_S", 0.0)
    asyncio.run(bolt.tick())
    assert bolt.adoption is None and bolt.counts.next_step == 3
    assert applied in out.failed and applied not in out.acked
    _applied(bolt, 0, 3, APPLIED)                     # the replay
    assert bolt.adoption is not None and out.emitted[-1][0] == "state_request"
