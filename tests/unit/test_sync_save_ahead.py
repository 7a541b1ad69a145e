"""The sync task saves the counters of the round after the one it sent while the units
compute it (sync_bolt `_save_ahead`): a round that comes as planned goes out on that
save, one that does not gets its own, and a successor that restores counters one or
two rounds ahead of every replica uncounts those rounds (sync_recovery `_undone`)."""
import asyncio

import numpy as np
import pytest

from streamnet.runtime import FencedError
from streamnet.runtime.component import BoltCollector, Context, Tuple
from streamnet.runtime.control.coordinator import ConnectionLostError
from streamnet.testing import until
from streamnet.training import AlgorithmConfig, RunConfig
from streamnet.training.config import run_config_to_dict
from streamnet.training.schedule import EpochPlans, UnitSchedule
from streamnet.training.streams import CONTRIBUTION, OK, STATE_REQUEST, row
from streamnet.training.sync_bolt import AHEAD_YIELDS, SyncBolt
from streamnet.training.sync_state import SyncState
from tests.unit.test_security_inputs import CFG, P, TASKS, Recorder, _compute
from tests.unit.test_sync_adoption import _last_params, _replica


@pytest.fixture(autouse=True)
def every_round(monkeypatch):
    """These tests follow the saves round by round: the counters saved every round
    (test_sync_save_every.py has them every few rounds)."""
    monkeypatch.setattr(SyncBolt, "SAVE_EVERY", 1)


def _sync(save_state_async=None):
    saves = []
    bolt = SyncBolt(run=run_config_to_dict(CFG))
    out = Recorder()
    ctx = Context(topology="t", component="sync", task=3, task_index=0, parallelism=1, worker="w0", config={},
                  component_config=bolt.config, component_tasks=TASKS.__getitem__, compute=_compute,
                  publish=lambda k, v: None, save_state=saves.append, save_state_async=save_state_async)
    bolt.prepare(ctx, BoltCollector(out))
    return bolt, out, saves


async def _round(bolt, step, samples=4):
    for unit in (0, 1):
        values = row(CONTRIBUTION, unit=unit, epoch=0, round=step, step=step, lr_scale=1.0, samples=samples, steps=1,
                     loss_sum=1.0, slice=0, vector=np.zeros(P, np.float32), finite=True, status=OK,
                     checkpoint=False, unit_state=None, timing=None, share=1.0)
        await bolt.execute(Tuple(values, list(CONTRIBUTION), "default", "compute", 1 + unit, {}))


async def _passes():
    """Enough passes of the event loop for a save ahead to start (sync_bolt AHEAD_YIELDS)."""
    for _ in range(AHEAD_YIELDS + 2):
        await asyncio.sleep(0)


def _counted(state):
    return {k: state[k] for k in ("next_step", "rounds", "samples", "epoch_samples", "recent_rounds", "ledger")}


def test_a_round_that_comes_as_planned_goes_out_on_the_save_made_while_it_was_computed():
    bolt, out, saves = _sync()

    async def go():
        await _round(bolt, 0)
        await _passes()
        assert [s["next_step"] for s in saves] == [1]        # nothing saved ahead of step 1 (see _save_ahead)
        await _round(bolt, 1)
        # the round's own save, then the next round's, made before the next round came
        await _passes()
        assert [s["next_step"] for s in saves] == [1, 2, 3] and _last_params(out)["step"] == 2
        await _round(bolt, 2)
        await _passes()
    asyncio.run(go())
    assert [s["next_step"] for s in saves] == [1, 2, 3, 4]       # no save of its own: round 2 went out on #3
    assert _counted(saves[2]) == _counted(bolt.counts.saved())   # and #3 is what counting it gave
    assert bolt.counts.next_step == 3 and _last_params(out)["step"] == 3


def test_a_round_not_as_planned_gets_its_own_save_after_the_one_ahead():
    bolt, out, saves = _sync()

    async def go():
        await _round(bolt, 0)
        await _round(bolt, 1)
        await _round(bolt, 2, samples=3)                         # not what the plan says
        await _passes()
    asyncio.run(go())
    assert [s["next_step"] for s in saves] == [1, 2, 3, 3, 4]
    assert saves[3]["samples"] == 8 + 8 + 6 and _counted(saves[3]) == _counted(bolt.counts.saved())


def test_the_ahead_count_never_moves_the_counters_that_judge_replays():
    bolt, out, saves = _sync()

    async def go():
        await _round(bolt, 0)
        await _round(bolt, 1)
        await _passes()
        assert saves[-1]["next_step"] == 3
        assert bolt.counts.next_step == 2 and bolt.counts.rounds == 2     # saved as 3; in memory 2
        await _round(bolt, 1)                                             # a replay of round 1: answered
        assert bolt.counts.duplicates == 2 and bolt.counts.rounds == 2
    asyncio.run(go())


def test_a_successor_two_rounds_ahead_of_every_replica_uncounts_both():
    # the old task saved step 3's count, sent step 4's parameters to no one, and saved the
    # count of step 4 ahead: the replicas hold step 3
    bolt, out = _sync()[:2]
    for step in (3, 4):
        bolt.counts.count_round(bolt.plans, step, 0, step, 8, [0, 1])
    bolt._request_replicas()
    for task in (1, 2):
        _replica(bolt, task, 3)
    assert bolt.counts.next_step == 3 and bolt.counts.rounds == 0 and bolt.counts.lost_steps == 0
    assert _last_params(out)["step"] == 3
    # three ahead is not a count saved ahead: those updates are lost
    bolt, out = _sync()[:2]
    for step in (2, 3, 4):
        bolt.counts.count_round(bolt.plans, step, 0, step, 8, [0, 1])
    bolt._request_replicas()
    for task in (1, 2):
        _replica(bolt, task, 2)
    assert bolt.counts.next_step == 5 and bolt.counts.lost_steps == 3


def test_two_rounds_undone_across_an_epoch_boundary_leave_the_ledger_clean():
    cfg = RunConfig(algorithm=AlgorithmConfig(name="mixbp", batch=2, sync_period=2), units=2)
    plans = EpochPlans(UnitSchedule(cfg, 16))             # 2 units x 8 samples, b=2, H=2: 2 rounds per epoch
    s = SyncState(units=2)
    for step, (epoch, rnd) in enumerate([(0, 0), (0, 1), (1, 0)]):
        s.count_round(plans, step, epoch, rnd, 8, [0, 1])
    assert 1 in s.ledger.open                 # epoch 1's last round is still recent: not closed yet
    s.undo_last_round()
    s.undo_last_round()
    for step, (epoch, rnd) in enumerate([(0, 1), (1, 0), (1, 1), (2, 0), (2, 1)], start=1):
        s.count_round(plans, step, epoch, rnd, 8, [0, 1])
    assert 1 not in s.ledger.open and 2 not in s.ledger.open
    assert s.ledger.clean(1) and s.ledger.clean(2) and dict(s.epoch_samples) == {1: 16, 2: 16, 3: 16}
    # the epoch clock took the two undone rounds back too: each epoch's samples once
    assert {e: span.samples for e, span in s.clock.spans.items()} == {1: 16, 2: 16, 3: 16}


class HeldSaves:
    """Saves that land only when the test lets them (a ZooKeeper still answering)."""

    def __init__(self):
        self.states, self.landing = [], []

    async def __call__(self, state):
        self.states.append(state)
        landed = asyncio.get_running_loop().create_future()
        self.landing.append(landed)
        await landed

    async def rounds_0_and_1(self, bolt):
        """Rounds 0 and 1, each save landing as it is made; then round 2's ahead is in flight."""
        for step in (0, 1):
            task = asyncio.ensure_future(_round(bolt, step))
            await until(lambda: len(self.landing) > step, f"round {step}'s save to start", timeout=10)
            self.landing[step].set_result(None)
            await asyncio.wait_for(task, 10)
        await _passes()


def test_a_round_that_comes_while_its_ahead_save_is_in_flight_goes_out_when_it_lands():
    saves = HeldSaves()
    bolt, out, _ = _sync(saves)

    async def go():
        await saves.rounds_0_and_1(bolt)
        assert [s["next_step"] for s in saves.states] == [1, 2, 3]    # round 1's own save, then 2's ahead
        sent = len(out.emitted)
        task = asyncio.ensure_future(_round(bolt, 2))                 # comes before the ahead save landed
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(out.emitted) == sent and not task.done()           # its parameters wait for that save
        saves.landing[2].set_result(None)
        await asyncio.wait_for(task, 10)
        await _passes()
        assert len(saves.states) == 4 and _last_params(out)["step"] == 3   # no save of its own (#4: ahead)
        saves.landing[3].set_result(None)
    asyncio.run(go())


def test_a_fenced_ahead_save_stops_the_round_it_counted():
    saves = HeldSaves()
    bolt, out, _ = _sync(saves)

    async def go():
        await saves.rounds_0_and_1(bolt)
        saves.landing[2].set_exception(FencedError("another instance took the task over"))
        sent = len(out.emitted)
        with pytest.raises(FencedError):
            await _round(bolt, 2)
        assert len(out.emitted) == sent                                # nothing of round 2 went out
    asyncio.run(go())


def test_what_the_sync_task_sends_carries_its_generation():
    bolt, out, saves = _sync()
    bolt.ctx.generation = 7
    asyncio.run(_round(bolt, 0))
    assert _last_params(out)["generation"] == 7
    bolt._request_replicas()
    assert dict(zip(STATE_REQUEST, out.emitted[-1][1]))["generation"] == 7


@pytest.mark.parametrize("next_call", ["tuple", "tick"])
def test_a_fenced_ahead_save_stops_the_instance_at_its_next_tuple_or_tick(next_call):
    """A superseded instance whose round r went out on a save that landed before its
    successor took over learns of it from round r + 1's ahead save: from then on it
    answers nothing (no replay, no replica request), not only if it combines again."""
    saves = HeldSaves()
    bolt, out, _ = _sync(saves)

    async def go():
        await saves.rounds_0_and_1(bolt)
        saves.landing[2].set_exception(FencedError("another instance took the task over"))
        await asyncio.wait([bolt._ahead[1]])
        await asyncio.sleep(0)                     # its done callback
        sent = len(out.emitted)
        with pytest.raises(FencedError):
            if next_call == "tick":
                await bolt.tick()
            else:       # a replay of round 0, which an unfenced instance answers with its parameters
                await _round(bolt, 0)
        assert len(out.emitted) == sent
    asyncio.run(go())


def test_an_ahead_save_that_lands_leaves_the_instance_running():
    saves = HeldSaves()
    bolt, out, _ = _sync(saves)

    async def go():
        await saves.rounds_0_and_1(bolt)
        saves.landing[2].set_result(None)
        await asyncio.wait([bolt._ahead[1]])
        await _passes()
        await bolt.tick()
        sent = len(out.emitted)
        await _round(bolt, 0)                      # a replay: answered with the current parameters
        assert len(out.emitted) > sent
    asyncio.run(go())


def test_an_epoch_end_whose_save_is_not_confirmed_sends_nothing_until_it_is(monkeypatch):
    # the evaluation and the checkpoint carry no fencing token: they leave only once a save
    # has confirmed this instance still owns the task. A save that lost the coordinator was
    # taken as best effort, and a superseded instance, cut off from ZooKeeper, sent its
    # evaluation on (a read-only review of training's fault paths)
    monkeypatch.setattr(SyncBolt, "CONFIRM_RETRY_S", 0.0)
    saved, away = [], [2]

    async def save(state):
        if state["next_step"] == 8 and away[0]:
            away[0] -= 1
            raise ConnectionLostError("ZooKeeper is away")
        saved.append(state)

    bolt, out, _ = _sync(save)

    async def go():
        for step in range(7):
            await _round(bolt, step)
            await _passes()
        assert not [s for s, _ in out.emitted if s == "eval"]
        await _round(bolt, 7)                          # the epoch's end: evaluated
    asyncio.run(go())
    assert away == [0] and saved[-1]["next_step"] == 8     # tried until the coordinator answered
    streams = [s for s, _ in out.emitted]
    assert streams.count("eval") == 1 and streams[-2:] == ["params", "eval"]


def test_a_round_between_those_is_saved_at_best_effort():
    tries = []

    async def save(state):
        tries.append(state["next_step"])
        raise ConnectionLostError("ZooKeeper is away")

    bolt, out, _ = _sync(save)
    asyncio.run(_round(bolt, 0))
    assert tries == [1] and _last_params(out)["step"] == 1     # not tried again: the next round saves


async def _epoch(bolt) -> None:
    """Rounds 0-7: the test config's epoch, whose last round is evaluated."""
    for step in range(8):
        await _round(bolt, step)
        await _passes()


@pytest.mark.parametrize("error", ["refused", "closed"])
def test_a_refused_save_or_a_closed_session_is_not_retried_only_a_lost_connection_is(monkeypatch, error):
    from streamnet.runtime import CoordinatorError, SessionClosedError
    monkeypatch.setattr(SyncBolt, "CONFIRM_RETRY_S", 0.0)
    tries = []

    async def save(state):
        tries.append(state["next_step"])
        if state["next_step"] == 8 and tries.count(8) <= 3:      # (a retry would be seen, and end)
            # not authorised would fail the same way for ever; a session this worker closed
            # brings nothing back
            raise CoordinatorError("not authorised") if error == "refused" else SessionClosedError("closed")

    bolt, out, _ = _sync(save)
    asyncio.run(_epoch(bolt))
    assert tries.count(8) == 1 and [s for s, _ in out.emitted][-2:] == ["params", "eval"]


def test_a_replay_that_sends_the_evaluation_again_confirms_first(monkeypatch):
    # the answer to a replay of an evaluated epoch's end sends its evaluation again: it too
    # waits for a save to confirm this instance still owns the task (review finding)
    monkeypatch.setattr(SyncBolt, "CONFIRM_RETRY_S", 0.0)
    saved, away = [], [0]

    async def save(state):
        if away[0]:
            away[0] -= 1
            raise ConnectionLostError("ZooKeeper is away")
        saved.append(state)

    bolt, out, _ = _sync(save)

    async def go():
        await _epoch(bolt)
        before = len(saved)
        await _round(bolt, 6)                           # a replay of an ordinary round: no save
        assert len(saved) == before
        away[0] = 2
        emitted = len(out.emitted)
        await _round(bolt, 7)                           # a replay of the epoch's end
        assert away == [0] and len(saved) == before + 2     # tried until it answered; once per unit's replay
        assert [s for s, _ in out.emitted[emitted:]].count("eval") == 2       # once per unit's replay
    asyncio.run(go())
