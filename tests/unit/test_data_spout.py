"""The data spout as the engine builds it (DataSpout(**config), open(ctx, collector)):
its position is saved at every epoch end and at most every SAVE_S within an epoch
(every SAVE_EVERY rounds and at every change of shares under load balancing), and a
spout started from an older position sends those rounds again with their steps (the
units answer them "applied"; the sync bolt counts each step once). Most of the load
balancing tests here run with SAVE_EVERY = 1 (`every_round`), where each rule shows
round by round; the SAVE_EVERY > 1 tests are at the end."""
import concurrent.futures
from dataclasses import replace

import numpy as np
import pytest

from streamnet.runtime.component import Context, SpoutCollector
from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
from streamnet.training import data_spout
from streamnet.training.config import run_config_to_dict
from streamnet.training.data_spout import DataSpout
from streamnet.training.streams import WORK

CFG = RunConfig(model=ModelConfig(name="lenet5"), data=DataConfig(dataset="synthetic", synthetic_train=64,
                                                                   synthetic_test=16),
                algorithm=AlgorithmConfig(name="mixbp", batch=4, sync_period=2), units=2, epochs=2, seed=3)


@pytest.fixture
def every_round(monkeypatch):
    """Under load balancing, the position saved at every round boundary."""
    monkeypatch.setattr(data_spout, "SAVE_EVERY", 1)


class Recorder:
    """Stands where the spout's executor stands behind the real SpoutCollector."""

    def __init__(self):
        self.emitted = []

    def emit(self, values, stream, msg_id, direct_task):
        self.emitted.append((msg_id, dict(zip(WORK, values))))
        return [direct_task]


def _spout(saves: list, state=None, cfg=CFG, started=None, work_shares=lambda component: None):
    """A spout opened (and restored from `state`) on a Context whose saves go to `saves`,
    or, given `started`, start there (ctx.save_state_started)."""
    spout = DataSpout(run=run_config_to_dict(cfg), train_size=64)
    ctx = Context(topology="t", component="data", task=0, task_index=0, parallelism=1, worker="w0", config={},
                  component_config=spout.config, component_tasks={"compute": range(1, 3)}.__getitem__,
                  compute=None, publish=lambda k, v: None, save_state=saves.append, work_shares=work_shares)
    if started is not None:
        ctx.save_state_started = started
    out = Recorder()
    spout.open(ctx, SpoutCollector(out))
    if state is not None:
        spout.restore(state)
    return spout, out


def _round(spout, out) -> list:
    """Emit a round and ack all of its work; the work values."""
    out.emitted.clear()
    spout.next_tuple()
    sent = list(out.emitted)
    for key, _ in sent:
        spout.ack(key)
    return [w for _, w in sent]


def test_the_position_is_saved_at_epoch_ends_and_every_save_s_within_an_epoch(monkeypatch):
    saves = []
    spout, out = _spout(saves)
    rounds = spout.rounds
    assert rounds >= 3
    monkeypatch.setattr(data_spout, "SAVE_S", 3600.0)
    _round(spout, out)
    assert len(saves) == 1                       # the first round: no save yet
    for _ in range(rounds - 2):
        _round(spout, out)
    assert len(saves) == 1                       # within SAVE_S: none more
    _round(spout, out)                           # the epoch's last round
    assert saves[-1]["epoch"] == 1 and saves[-1]["round"] == 0 and saves[-1]["step"] == rounds
    monkeypatch.setattr(data_spout, "SAVE_S", 0.0)
    _round(spout, out)
    assert saves[-1]["step"] == rounds + 1       # SAVE_S passed: saved again
    while not spout.is_done():
        _round(spout, out)
    assert saves[-1]["epoch"] == 2 and saves[-1]["step"] == 2 * rounds


def test_a_spout_started_from_an_older_position_sends_those_rounds_again(monkeypatch):
    monkeypatch.setattr(data_spout, "SAVE_S", 3600.0)
    saves = []
    first, out = _spout(saves)
    sent = [_round(first, out) for _ in range(3)]
    assert saves[-1]["step"] == 1                # the position it left: older than its 3 rounds (SAVE_S)
    again, out2 = _spout([], state=saves[-1])    # the first spout's worker died after 3 rounds
    resent = _round(again, out2)
    assert len(resent) == len(sent[1]) == CFG.units
    for a, b in zip(sent[1], resent):            # round 1 again: the same work, step and batches
        assert (a["epoch"], a["round"], a["step"], a["unit"]) == (b["epoch"], b["round"], b["step"], b["unit"])
        assert all(np.array_equal(x, y) for x, y in zip(a["batches"], b["batches"]))


@pytest.mark.usefixtures("every_round")
def test_under_load_balancing_the_position_is_saved_after_every_round(monkeypatch):
    monkeypatch.setattr(data_spout, "SAVE_S", 3600.0)
    saves = []
    spout, out = _spout(saves, cfg=replace(CFG, balance="load"))
    for step in range(1, 4):
        _round(spout, out)
        assert len(saves) == step and saves[-1]["step"] == step


class Saves:
    """ctx.save_state_started for a test that decides when each save lands."""

    def __init__(self):
        self.started = []          # (state, future) in the order they were started

    def __call__(self, state):
        done = concurrent.futures.Future()
        self.started.append((state, done))
        return done

    def land(self, error=None):
        """The oldest save in flight answers (with `error`, if given)."""
        state, done = next((s, d) for s, d in self.started if not d.done())
        done.set_exception(error) if error else done.set_result(None)
        return state


def _balanced(state=None, shares=None, cfg=replace(CFG, balance="load")):
    saves, box = Saves(), {"shares": shares}
    spout, out = _spout([], state, cfg, started=saves,
                        work_shares=lambda component: box["shares"])
    return spout, out, saves, box


def _send(spout, out) -> list:
    out.emitted.clear()
    spout.next_tuple()
    return list(out.emitted)


def _ack_all(spout, sent) -> None:
    for key, _ in sent:
        spout.ack(key)


@pytest.mark.usefixtures("every_round")
def test_under_load_balancing_a_round_goes_out_while_its_position_is_saved():
    spout, out, saves, box = _balanced()
    _ack_all(spout, _send(spout, out))               # round 0
    assert len(saves.started) == 1 and saves.started[0][0]["step"] == 1
    sent = _send(spout, out)                         # round 1 goes out while its position is being saved
    assert [w["step"] for _, w in sent] == [1, 1]
    _ack_all(spout, sent)
    assert len(saves.started) == 1                   # the next save waits behind the one in flight
    assert _send(spout, out) == []                   # and round 2 for the save of round 1
    saves.land()
    assert len(saves.started) == 2 and saves.started[1][0]["step"] == 2
    assert [w["step"] for _, w in _send(spout, out)] == [2, 2]


@pytest.mark.usefixtures("every_round")
def test_new_shares_go_out_only_once_saved_with_the_position():
    spout, out, saves, box = _balanced()
    for _ in range(2):                               # the first boundary keeps the shares it began with
        _ack_all(spout, _send(spout, out))
        saves.land()
    box["shares"] = [1.5, 0.5]
    sent = _send(spout, out)
    _ack_all(spout, sent)                            # the boundary takes the new shares ...
    assert saves.started[-1][0]["shares"] == [1.5, 0.5]
    assert _send(spout, out) == []                   # ... and waits for them to be saved
    saves.land()
    sent = _send(spout, out)
    assert [len(np.concatenate(w["batches"])) for _, w in sent] == [12, 4]     # batch 4 x 2 units, cut 3:1


@pytest.mark.usefixtures("every_round")
def test_a_spout_started_anew_cuts_the_rounds_the_last_one_may_have_sent_as_it_did():
    first, out, saves, box = _balanced()
    assert first.rounds >= 4
    _ack_all(first, _send(first, out))
    landed = saves.land()                            # round 1's position (shares 1, 1)
    _ack_all(first, _send(first, out))               # round 1 done; round 2's save starts ...
    sent2 = _send(first, out)                        # ... round 2 goes out, its save not landed: the worker dies
    again, out2, saves2, box2 = _balanced(state=landed, shares=[1.5, 0.5])    # the balancer has new shares
    assert again.step == 1
    _ack_all(again, _send(again, out2))
    r2 = _send(again, out2)                          # round 2 again: cut as the first spout cut it
    assert len(r2) == 2
    for (_, a), (_, b) in zip(sent2, r2):
        assert a["step"] == b["step"] == 2
        assert all(np.array_equal(x, y) for x, y in zip(a["batches"], b["batches"]))
    _ack_all(again, r2)
    assert saves2.land()["step"] == 2 and saves2.land()["shares"] == [1.5, 0.5]
    assert [len(np.concatenate(w["batches"])) for _, w in _send(again, out2)] == [12, 4]   # now the new ones


@pytest.mark.usefixtures("every_round")
def test_a_failed_save_is_tried_again_until_one_lands_and_a_fenced_one_stops_the_spout(monkeypatch):
    from streamnet.runtime import FencedError
    clock = [1000.0]
    monkeypatch.setattr(data_spout, "clock", lambda: clock[0])
    spout, out, saves, box = _balanced()
    _ack_all(spout, _send(spout, out))               # round 0; the save of its boundary starts
    sent = _send(spout, out)                         # round 1 goes out meanwhile
    saves.land(ConnectionError("coordinator away"))
    _ack_all(spout, sent)                            # a later position is queued, to start after RETRY_S
    assert len(saves.started) == 1 and _send(spout, out) == []
    clock[0] += data_spout.RETRY_S
    assert _send(spout, out) == [] and len(saves.started) == 2 and saves.started[1][0]["step"] == 2
    saves.land(ConnectionError("coordinator away"))  # no round comes to save a later one: this one again
    assert _send(spout, out) == [] and len(saves.started) == 2
    clock[0] += data_spout.RETRY_S
    assert _send(spout, out) == [] and len(saves.started) == 3 and saves.started[2][0]["step"] == 2
    saves.land()
    _ack_all(spout, _send(spout, out))               # round 2
    box["shares"] = [1.5, 0.5]
    saves.land()
    _ack_all(spout, _send(spout, out))               # round 3; new shares: the next round waits for their save
    saves.land(ConnectionError("coordinator away"))
    assert _send(spout, out) == [] and len(saves.started) == 5
    clock[0] += data_spout.RETRY_S
    assert _send(spout, out) == [] and len(saves.started) == 6 and saves.started[5][0]["shares"] == [1.5, 0.5]
    saves.land()
    assert len(_send(spout, out)) == 2
    _ack_all(spout, list(out.emitted))
    saves.land(FencedError("taken over"))
    with pytest.raises(FencedError):
        spout.next_tuple()
    assert not spout.is_done()


@pytest.mark.usefixtures("every_round")
def test_a_failed_save_behind_a_later_position_is_not_tried_again_and_a_cancelled_one_ends_the_saving():
    spout, out, saves, box = _balanced()
    _ack_all(spout, _send(spout, out))               # round 0; the save of step 1 starts
    _ack_all(spout, _send(spout, out))               # round 1 done: step 2's position waits behind it
    saves.land(ConnectionError("coordinator away"))  # step 1's fails: step 2's covers it
    assert [s["step"] for s, _ in saves.started] == [1, 2]
    saves.land()
    assert [s["step"] for s, _ in saves.started] == [1, 2] and spout._landed == 2
    _ack_all(spout, _send(spout, out))               # round 2; step 3's save starts
    saves.started[-1][1].cancel()                    # the worker closing
    spout.next_tuple()
    assert spout._saving is None and spout._queued is None and len(saves.started) == 3


def _key_of(work) -> tuple:
    return (work["epoch"], work["round"], work["unit"])


@pytest.mark.parametrize("balance", ["static", "load"])
def test_the_next_round_goes_out_ahead_with_what_the_barrier_would_send(balance):
    """Round r + 1's work leaves while round r is in flight (the units hold it until its
    step's parameters come); round r + 2 still waits for every tree of r + 1, an
    epoch's last round is never sent ahead, and the whole run sends what a spout that
    waits for each round sends, each piece of work once (under load balancing with
    unchanged shares too: its saves land at once here)."""
    cfg = replace(CFG, balance=balance)
    barrier, out = _spout([], cfg=cfg)
    expected = []
    while not barrier.is_done():
        expected += [(_key_of(w), w["step"], w["lr_scale"], w["checkpoint"], [b.tolist() for b in w["batches"]])
                     for w in _round(barrier, out)]

    spout, out = _spout([], cfg=cfg)
    sent, rounds = [], barrier.rounds
    spout.next_tuple()
    spout.next_tuple()                          # round 0 in flight: round 1 goes out ahead
    assert sorted({_key_of(w)[1] for _, w in out.emitted}) == [0, 1]
    sent += out.emitted
    out.emitted.clear()
    spout.next_tuple()
    assert out.emitted == []                    # round 2 waits for round 1 (and round 0)
    while not spout.is_done():
        spout.next_tuple()
        spout.next_tuple()
        new, out.emitted[:] = list(out.emitted), []
        sent += new
        oldest = min(k[:2] for k in spout.in_flight)
        ahead = [k for k in spout.in_flight if k[:2] != oldest]
        if ahead:
            assert ahead[0][1] == oldest[1] + 1 and oldest[1] + 2 < rounds   # never an epoch's last round
            for k in ahead:
                spout.ack(k)                     # the round ahead acked first: nothing moves on
            assert (spout.epoch, spout.round) == oldest
        for k in [k for k in spout.in_flight if k[:2] == oldest]:
            spout.ack(k)
    got = [(_key_of(w), w["step"], w["lr_scale"], w["checkpoint"], [b.tolist() for b in w["batches"]])
           for _, w in sent]
    assert sorted(got) == sorted(expected) and len(got) == len(expected)


def _rounds_of(spout, out) -> list:
    """(round, unit, samples, share) of each piece of work emitted since the last call."""
    got = sorted({(w["round"], w["unit"], len(np.concatenate(w["batches"])), w["share"]) for _, w in out.emitted})
    out.emitted.clear()
    return got


# load balancing with 8 rounds an epoch (H = 1): rounds sent ahead up to the sixth
H1 = replace(CFG, balance="load", algorithm=AlgorithmConfig(name="mixbp", batch=4, sync_period=1))


@pytest.mark.usefixtures("every_round")
def test_under_load_balancing_a_round_goes_out_ahead_once_its_position_is_saved_and_new_shares_a_round_later():
    spout, out, saves, box = _balanced(cfg=H1)
    assert spout.rounds == 8
    spout.next_tuple()
    spout.next_tuple()                  # round 0, and round 1 ahead: the position it follows is where we began
    assert _rounds_of(spout, out) == [(0, 0, 4, 1.0), (0, 1, 4, 1.0), (1, 0, 4, 1.0), (1, 1, 4, 1.0)]
    _ack_all(spout, [((0, 0, u), None) for u in range(2)])     # round 1, sent ahead, is now the one in flight
    assert [s["step"] for s, _ in saves.started] == [1]
    spout.next_tuple()
    assert _rounds_of(spout, out) == []                         # round 2 waits for round 1's position
    saves.land()
    spout.next_tuple()
    assert _rounds_of(spout, out) == [(2, 0, 4, 1.0), (2, 1, 4, 1.0)]
    box["shares"] = [1.5, 0.5]          # the balancer's new shares: round 2 went out with the old ones ...
    _ack_all(spout, [((0, 1, u), None) for u in range(2)])
    assert saves.started[-1][0] == {**saves.started[-1][0], "step": 2, "shares": [1.0, 1.0]}
    saves.land()
    spout.next_tuple()
    assert _rounds_of(spout, out) == []                         # ... and round 3 is not sent ahead with them
    _ack_all(spout, [((0, 2, u), None) for u in range(2)])     # the next boundary takes them ...
    assert saves.started[-1][0]["shares"] == [1.5, 0.5]
    spout.next_tuple()
    assert _rounds_of(spout, out) == []                         # ... once they are saved
    saves.land()
    spout.next_tuple()
    spout.next_tuple()                                          # and round 4 goes ahead, cut 6:2
    assert _rounds_of(spout, out) == [(3, 0, 6, 1.5), (3, 1, 2, 0.5), (4, 0, 6, 1.5), (4, 1, 2, 0.5)]


@pytest.mark.usefixtures("every_round")
def test_a_spout_started_anew_cuts_a_round_the_last_one_sent_ahead_as_it_did():
    first, out, saves, box = _balanced(cfg=H1)
    first.next_tuple()
    first.next_tuple()
    _ack_all(first, [((0, 0, u), None) for u in range(2)])
    landed = saves.land()                                       # round 1's position
    out.emitted.clear()
    first.next_tuple()                                          # round 2 ahead; then the worker dies
    ahead = {w["unit"]: w for _, w in out.emitted}
    assert landed["step"] == 1 and {w["round"] for w in ahead.values()} == {2}
    again, out2, saves2, box2 = _balanced(state=landed, shares=[1.5, 0.5], cfg=H1)
    again.next_tuple()
    again.next_tuple()                                          # round 1 again, nothing ahead (new shares)
    assert {w["round"] for _, w in out2.emitted} == {1}
    _ack_all(again, list(out2.emitted))
    out2.emitted.clear()
    again.next_tuple()                                          # round 2: cut as the first spout cut it
    assert len(out2.emitted) == 2
    for _, w in out2.emitted:
        assert w["step"] == 2 and w["share"] == 1.0
        assert all(np.array_equal(x, y) for x, y in zip(w["batches"], ahead[w["unit"]]["batches"]))


def test_nothing_goes_out_ahead_with_a_replay_pending():
    spout, out = _spout([])
    spout.next_tuple()
    spout.fail(out.emitted[0][0])
    out.emitted.clear()
    spout.next_tuple()                          # the replay, not the next round
    assert [w["round"] for _, w in out.emitted] == [0]


# --- SAVE_EVERY > 1: the position every few rounds ------------------------------------------


def test_under_load_balancing_the_position_is_saved_every_save_every_rounds_and_at_epoch_ends(monkeypatch):
    monkeypatch.setattr(data_spout, "SAVE_EVERY", 3)
    saves = []
    spout, out = _spout(saves, cfg=H1)                 # 8 rounds an epoch, saves landing at once
    while not spout.is_done():
        _round(spout, out)
    assert [s["step"] for s in saves] == [n for n in range(1, 17) if n % 3 == 0 or n % 8 == 0]


def test_round_s_goes_out_once_the_position_of_s_minus_save_every_has_landed(monkeypatch):
    monkeypatch.setattr(data_spout, "SAVE_EVERY", 3)
    spout, out, saves, box = _balanced(cfg=H1)
    for r in range(4):                                  # rounds 0-3: the start (step 0) is ours
        sent = _send(spout, out)
        assert [w["round"] for _, w in sent] == [r, r]
        _ack_all(spout, sent)
    assert [s["step"] for s, _ in saves.started] == [3]
    assert _send(spout, out) == []                      # round 4 waits for step 3's position
    saves.land()
    assert [w["step"] for _, w in _send(spout, out)] == [4, 4]


def test_a_spout_started_anew_keeps_its_shares_for_the_rounds_the_last_one_may_have_sent(monkeypatch):
    monkeypatch.setattr(data_spout, "SAVE_EVERY", 3)
    first, out, saves, box = _balanced(cfg=H1)
    sent = {}
    for r in range(7):                                  # rounds 0-6; the save of step 3 lands after round 3
        work = _send(first, out)
        assert [w["round"] for _, w in work] == [r, r]
        sent[r] = {w["unit"]: w for _, w in work}
        _ack_all(first, work)
        if r == 3:
            landed = saves.land()
    assert landed["step"] == 3 and _send(first, out) == []     # round 7 waits for step 6's save: the worker dies
    again, out2, saves2, box2 = _balanced(state=landed, shares=[1.5, 0.5], cfg=H1)   # the balancer has new shares
    for r in range(3, 7):                               # rounds 3-6 again, cut as the first spout cut them
        work = _send(again, out2)
        for _, w in work:
            assert w["round"] == r and w["share"] == 1.0
            assert all(np.array_equal(x, y) for x, y in zip(w["batches"], sent[r][w["unit"]]["batches"]))
        _ack_all(again, work)
    assert _send(again, out2) == []                     # then the new shares, once saved
    assert saves2.land()["step"] == 6                   # (the position of step 6, in flight before them)
    assert _send(again, out2) == []
    assert saves2.land() == {**saves2.started[-1][0], "step": 7, "shares": [1.5, 0.5]}
    assert sorted((w["round"], len(np.concatenate(w["batches"]))) for _, w in _send(again, out2)) == [(7, 2), (7, 6)]
