"""The sync task saves its counters every SAVE_EVERY rounds, and at once any round a
successor could not count from the epoch plan (sync_bolt `_must_save`); a successor
that finds the counters behind the rounds its predecessor combined counts those from
the plan (sync_recovery `_recount`): up to the newest replica's step, or - every
replica started anew - up to the step of the work the units hold, their updates lost."""
import asyncio
import logging

import pytest

from streamnet.runtime.component import Tuple
from streamnet.testing import until
from streamnet.training.streams import DIRECT_PARAMS, PARAMS, RESYNC, row
from streamnet.training.sync_bolt import SyncBolt
from tests.unit.test_sync_adoption import _last_params, _replica
from tests.unit.test_sync_save_ahead import HeldSaves, _counted, _passes, _round, _sync

EVERY = 4       # the test config has 8 rounds an epoch: saves at steps 4 and 8 (the epoch's end)


@pytest.fixture(autouse=True)
def every_few_rounds(monkeypatch):
    monkeypatch.setattr(SyncBolt, "SAVE_EVERY", EVERY)


def _rounds(bolt, steps, **kw):
    async def go():
        for step in steps:
            await _round(bolt, step, **kw)
            await _passes()
    asyncio.run(go())


def _predecessor(upto: int):
    """A sync task that combined rounds 0 .. upto - 1: (its saves, its counters now)."""
    bolt, _, saves = _sync()
    _rounds(bolt, range(upto))
    return saves, bolt.counts.saved()


def _successor(replicas: list[int]):
    """A sync task started anew after a predecessor that combined rounds 0-6 and saved
    at step 4, its replicas answering with the steps `replicas`: (the bolt, what it
    sent, what it saved, the predecessor's counters)."""
    saves, now = _predecessor(7)
    bolt, out, mine = _sync()
    bolt.restore(saves[-1])
    for task, step in zip((1, 2), replicas):
        _replica(bolt, task, step)
    return bolt, out, mine, now


def _epoch_counted_once(bolt) -> bool:
    stats = bolt.stats()
    return stats.each_sample_counted_once and stats.epoch_samples == {1: 64}


def _resync(bolt, task: int, step) -> None:
    tup = Tuple(row(RESYNC, task=task, step=step), list(RESYNC), "resync", "compute", task, {})
    asyncio.run(bolt.execute(tup))


def _direct(out) -> dict:
    stream, values = out.emitted[-1]
    assert stream == "direct_params"
    return dict(zip(DIRECT_PARAMS, values))


def test_the_counters_are_saved_every_few_rounds_the_first_and_the_epochs_end():
    saves, now = _predecessor(8)
    # round 0: the instance's first; round 3 (step 4): saved ahead; round 7: the epoch's end
    assert [s["next_step"] for s in saves] == [1, 4, 8]
    assert _counted(saves[-1]) == _counted(now)


def test_a_round_between_saves_goes_out_without_waiting_for_the_coordinator():
    saves = HeldSaves()
    bolt, out, _ = _sync(saves)

    async def go():
        task = asyncio.ensure_future(_round(bolt, 0))
        await until(lambda: saves.landing, "round 0's save to start", timeout=10)
        saves.landing[0].set_result(None)           # the first round waits for its save
        await asyncio.wait_for(task, 10)
        await _round(bolt, 1)                       # no save: out at once, though none would land now
        assert _last_params(out)["step"] == 2 and len(saves.states) == 1
    asyncio.run(go())


def test_a_round_not_as_planned_between_saves_is_saved_at_once():
    bolt, out, saves = _sync()
    _rounds(bolt, [0])
    _rounds(bolt, [1], samples=3)                   # a unit's batch short of the plan
    assert [s["next_step"] for s in saves] == [1, 2] and saves[1]["samples"] == 8 + 6


def test_a_successor_counts_the_rounds_after_the_last_save_up_to_the_newest_replica(caplog):
    with caplog.at_level(logging.WARNING):
        bolt, out, mine, now = _successor([7, 7])   # the predecessor combined and sent 4, 5 and 6
    assert bolt.adoption is None and _last_params(out)["step"] == 7
    assert _counted(bolt.counts.saved()) == _counted(now)           # as if it had counted them itself
    assert bolt.counts.lost_steps == 0 and _counted(mine[-1]) == _counted(now)    # and saved
    assert "steps 4-6 were combined after the counters it restored were saved" in caplog.text
    _rounds(bolt, [7])                              # the epoch ends: every sample of it counted once
    assert _epoch_counted_once(bolt)


def test_every_replica_started_anew_the_units_work_says_where_the_spout_is(caplog):
    bolt, out, mine, now = _successor([0, 0])       # the units moved with the sync task
    assert bolt.counts.next_step == 4 and bolt.counts.lost_steps == 4
    _resync(bolt, 1, None)                          # a unit that computed at its step: no news
    assert _direct(out)["step"] == 4 and bolt.counts.next_step == 4
    with caplog.at_level(logging.ERROR):
        _resync(bolt, 1, 7)                         # holds the spout's work of step 7 and nothing before
    assert _direct(out)["step"] == 7 and bolt.counts.lost_steps == 4 + 3
    assert _counted(bolt.counts.saved()) == _counted(now) and _counted(mine[-1]) == _counted(now)
    assert "steps 4-6 were combined after the counters were saved and their updates are lost" in caplog.text
    _resync(bolt, 2, 7)                             # the other unit: counted already
    assert bolt.counts.lost_steps == 7 and _direct(out)["step"] == 7
    _rounds(bolt, [7])
    assert _epoch_counted_once(bolt)


def test_the_work_a_unit_holds_moves_no_count_where_a_replica_was_adopted():
    # after a successor adopted a replica, work held ahead (round 7 sent while 6 is in
    # flight) must not make round 6 count as lost
    bolt, out, *_ = _successor([6, 6])
    assert bolt.counts.next_step == 6
    _resync(bolt, 1, 7)
    assert bolt.counts.next_step == 6 and bolt.counts.lost_steps == 0 and _direct(out)["step"] == 6


def test_a_step_further_ahead_than_the_rounds_between_two_saves_counts_nothing():
    bolt, out, *_ = _successor([0, 0])
    _resync(bolt, 1, 4 + EVERY + 2)                 # no predecessor gets that far without a save
    _resync(bolt, 1, "7")                           # nor is a string a step
    assert bolt.counts.next_step == 4 and bolt.counts.lost_steps == 4 and _direct(out)["step"] == 4


def test_a_late_replica_ahead_of_the_adopted_one_is_asked_again_and_its_rounds_are_kept(monkeypatch, caplog):
    bolt, out, _, now = _successor([5])
    monkeypatch.setattr(bolt, "ADOPT_WAIT_S", 0.0)
    asyncio.run(bolt.tick())                        # the other unit did not answer in time
    assert bolt.adoption is None and bolt.counts.next_step == 5
    asyncio.run(_round(bolt, 7))                    # yet it holds step 7's parameters (and unit 0 too, here)
    assert bolt.adoption is not None and out.emitted[-1][0] == "state_request"      # asked again
    _replica(bolt, 1, 7)
    _replica(bolt, 2, 7)
    # counted as lost, the updates of steps 5 and 6 - which those parameters hold - were dropped
    assert bolt.counts.lost_steps == 0 and not [r for r in caplog.records if r.levelno >= logging.ERROR]
    sent = [dict(zip(PARAMS, v)) for stream, v in out.emitted if stream == "params"]
    assert bolt.counts.rounds == now["rounds"] + 1 and sent[-1]["step"] == 8
    assert _epoch_counted_once(bolt)


def test_a_late_replica_that_does_not_answer_again_has_its_rounds_counted_as_lost(monkeypatch, caplog):
    bolt, out, _, now = _successor([5])
    monkeypatch.setattr(bolt, "ADOPT_WAIT_S", 0.0)
    asyncio.run(bolt.tick())
    asyncio.run(_round(bolt, 7))
    _replica(bolt, 2, 5)
    before = len(out.emitted)
    with caplog.at_level(logging.ERROR):
        asyncio.run(bolt.tick())                    # it did not answer again
    assert bolt.counts.lost_steps == 2 and "a unit holds the parameters of step 7" in caplog.text
    # the parameters it adopted go out as the step the units compute next, not the step before
    assert dict(zip(PARAMS, next(v for s, v in out.emitted[before:] if s == "params")))["step"] == 7
    sent = [dict(zip(PARAMS, v)) for stream, v in out.emitted if stream == "params"]
    assert bolt.counts.rounds == now["rounds"] + 1 and sent[-1]["step"] == 8
    assert _epoch_counted_once(bolt)


def test_rounds_whose_place_in_the_plan_is_unknown_are_not_counted_and_the_log_says_so(caplog):
    bolt, out, _ = _sync()
    bolt.counts.next_step = 5                       # no round counted to start from (a resumed run's counters)
    bolt._request_replicas()
    with caplog.at_level(logging.ERROR):
        for task in (1, 2):
            _replica(bolt, task, 7)
    assert bolt.counts.next_step == 7 and bolt.counts.rounds == 0 and _last_params(out)["step"] == 7
    assert "the rounds between cannot be counted from the epoch plan" in caplog.text


def test_the_training_time_ends_at_the_last_combine_not_when_the_task_closes():
    bolt, _, _ = _sync()
    before = [bolt.stats().train_s for _ in range(2)]
    assert before[1] > before[0]                # nothing combined yet: the clock runs
    _rounds(bolt, range(3))
    first, again = bolt.stats().train_s, bolt.stats().train_s
    # the final evaluation and the topology's teardown come after: they are not training
    assert first == again == bolt.combined_at - bolt.counts.started > 0


def test_a_successors_training_time_spans_the_run_as_its_samples_do():
    bolt, _, _, _ = _successor([4, 4])          # restored at step 4, where the replicas are
    bolt.counts.started -= 100.0                # as if the run had started 100 s before
    _rounds(bolt, range(4, 8))
    stats = bolt.stats()
    # the run's samples, counted by both instances, over the run's time - not the successor's life
    assert stats.samples_this_run == 64 and stats.train_s > 100.0


def test_requests_for_parameters_queued_while_the_task_waited_get_one_answer(monkeypatch):
    # a unit asks every 2 s while it waits; a save waiting for the coordinator let them queue,
    # and each was answered with a copy of the parameters (31 MB a slice for AlexNet-64)
    bolt, out, *_ = _successor([6, 6])
    for _ in range(5):
        _resync(bolt, 1, None)
    _resync(bolt, 2, None)
    assert [s for s, _ in out.emitted].count("direct_params") == 2
    monkeypatch.setattr(bolt, "RESYNC_ANSWERED_S", 0.0)      # later: a unit that lost its answer asks again
    _resync(bolt, 1, None)
    assert [s for s, _ in out.emitted].count("direct_params") == 3
