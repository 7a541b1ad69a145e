"""The sync bolt's counters: counted once per round, undone once, and saved to the
coordinator and into checkpoints in the layouts earlier versions wrote."""
from streamnet.training import AlgorithmConfig, RunConfig
from streamnet.training.epoch_clock import EpochClock, LossMeter, progress_record
from streamnet.training.run_stats import EpochSpan
from streamnet.training.schedule import EpochPlans, UnitSchedule
from streamnet.training.sync_state import LastRound, SyncState


def _plans():   # 2 units x 8 samples, b=2, H=2: 2 rounds per epoch
    cfg = RunConfig(algorithm=AlgorithmConfig(name="mixbp", batch=2, sync_period=2), units=2)
    return EpochPlans(UnitSchedule(cfg, 16))


def test_a_round_is_counted_in_the_ledger_the_clock_and_the_totals():
    s, plans = SyncState(units=2, started=50.0), _plans()
    s.count_round(plans, step=0, epoch=0, rnd=0, samples=8, worked=[0, 1])
    assert (s.next_step, s.rounds, s.samples, dict(s.epoch_samples)) == (1, 1, 8, {1: 8})
    assert s.last_round == LastRound(0, 1, 8, 0, [0, 1])
    assert s.clock.spans[1].start == 50.0 and s.clock.spans[1].end is None
    s.count_round(plans, step=1, epoch=0, rnd=1, samples=8, worked=[0, 1])
    assert s.clock.spans[1].end is not None and s.clock.spans[1].samples == 16
    s.count_round(plans, step=2, epoch=1, rnd=0, samples=8, worked=[0, 1])
    assert 1 in s.ledger.open               # its last round is one of the recent ones, which may be undone
    s.count_round(plans, step=3, epoch=1, rnd=1, samples=8, worked=[0, 1])   # epoch 1 closes, clean
    assert s.ledger.clean(1) and 1 not in s.ledger.open
    assert s.clock.spans[2].start == s.clock.spans[1].end


def test_undoing_the_last_round_uncounts_it():
    s, plans = SyncState(units=2), _plans()
    s.count_round(plans, step=0, epoch=0, rnd=0, samples=8, worked=[0, 1])
    s.undo_last_round()
    assert (s.rounds, s.samples, s.epoch_samples[1]) == (0, 0, 0)
    s.count_round(plans, step=0, epoch=0, rnd=0, samples=8, worked=[0, 1])
    s.count_round(plans, step=1, epoch=0, rnd=1, samples=8, worked=[0, 1])
    assert s.clock.spans[1].samples == 16 and s.clock.spans[1].end is not None
    s.undo_last_round()                  # the epoch's last round: the clock takes its end back with it
    assert s.clock.spans[1].samples == 8 and s.clock.spans[1].end is None
    s.count_round(plans, step=1, epoch=0, rnd=1, samples=8, worked=[0, 1])
    s.ledger.close(1, plans.plan(0))
    assert s.ledger.clean(1)             # counted once in the end, not twice
    assert s.clock.spans[1].samples == 16 and s.clock.spans[1].end is not None


def test_the_coordinator_layout_round_trips_and_a_restore_is_a_recovery():
    s, plans = SyncState(units=2, started=50.0), _plans()
    s.count_round(plans, step=0, epoch=0, rnd=0, samples=8, worked=[0, 1])
    s.duplicates, s.lost_steps = 2, 3
    saved = s.saved()
    assert set(saved) == {"next_step", "epoch_samples", "rounds", "samples", "duplicates", "recoveries",
                          "lost_steps", "started", "last_round", "recent_rounds", "ledger", "epoch_clock",
                          "samples_before", "resumed_from"}
    assert saved["epoch_samples"] == {"1": 8} and saved["last_round"] == [0, 1, 8, 0, [0, 1]]
    assert saved["recent_rounds"] == [[0, 1, 8, 0, [0, 1]]]
    assert saved["epoch_clock"] == {"1": {"from": 50.0, "samples": 8}}
    t = SyncState(units=2)
    t.restore(saved)
    assert t.saved() == {**saved, "recoveries": 1}
    assert t.last_round == s.last_round and t.clock.started == 50.0
    # a resumed run's task started again still knows where the run resumed (samples this run)
    s.resume(1, s.checkpoint_counters())
    t.restore(s.saved())
    assert (t.resumed_from, t.samples_before) == (1, 8)


def test_the_checkpoint_layout_round_trips():
    s, plans = SyncState(units=2), _plans()
    s.count_round(plans, step=0, epoch=0, rnd=0, samples=8, worked=[0, 1])
    counters = s.checkpoint_counters()
    assert set(counters) == {"epoch_samples", "ledger", "rounds", "samples"}
    t = SyncState(units=2)
    t.resume(1, counters)
    assert (t.next_step, t.resumed_from, t.samples_before, t.rounds) == (1, 1, 8, 1)
    assert t.checkpoint_counters() == counters


def test_clock_loss_and_progress():
    clock = EpochClock.from_state(10.0, {"1": {"from": 10.0, "to": 20.0, "samples": 5}})
    assert clock.spans == {1: EpochSpan(start=10.0, end=20.0, samples=5)}
    loss = LossMeter()
    loss.record(1, 6.0, 3)
    loss.record(1, 2.0, 1)
    assert loss.last == 2.0 and loss.per_epoch() == {1: 2.0}
    p = progress_record(epoch=0, rnd=1, rounds=2, epoch_rounds=4, samples=40, loss=2.0, samples_this_run=20,
                        elapsed_s=4.0)
    assert p == {"epoch": 1, "round": 2, "rounds": 2, "epoch_rounds": 4, "samples": 40, "loss": 2.0,
                 "samples_per_s": 5.0}


def test_counting_on_a_snapshot_leaves_the_counters_it_was_taken_from():
    """What a save ahead counts on (sync_bolt `_save_later`): the next round counted on the
    snapshot, across an epoch's end that closes the ledger of the one before, and undone."""
    s, plans = SyncState(units=2, started=50.0), _plans()
    for step, (epoch, rnd) in enumerate([(0, 0), (0, 1), (1, 0)]):
        s.count_round(plans, step=step, epoch=epoch, rnd=rnd, samples=8, worked=[0, 1])
    before = s.saved()
    snap = s.snapshot()
    assert snap.saved() == before
    snap.count_round(plans, step=3, epoch=1, rnd=1, samples=8, worked=[0, 1])    # closes epoch 1's ledger
    snap.count_round(plans, step=4, epoch=2, rnd=0, samples=8, worked=[1])
    snap.undo_last_round()
    assert snap.saved() != before and 1 not in snap.ledger.open
    assert s.saved() == before and 1 in s.ledger.open and s.next_step == 3
