"""The schedule both trainers share: a function of the seed, covering each shard once
per epoch, with per-unit batch and sync period."""
import numpy as np

from streamnet.training import AlgorithmConfig, RunConfig
from streamnet.training.schedule import EpochPlans, UnitSchedule


def _cfg(**alg):
    return RunConfig(algorithm=AlgorithmConfig(**{"name": "mixbp", "batch": 4, "sync_period": 3, **alg}), units=2,
                     seed=5)


def test_each_epoch_covers_every_sample_once_in_rounds_of_h_batches():
    plan, rounds = UnitSchedule(_cfg(), 50).epoch(0)
    flat = np.concatenate([b for unit in plan for rnd in unit for b in rnd])
    assert sorted(flat.tolist()) == list(range(50))
    assert rounds == max(len(u) for u in plan) == 3            # 25 samples: 7 batches of <= 4, rounds of 3
    assert [len(r) for r in plan[0]] == [3, 3, 1] and all(len(b) <= 4 for b in plan[0][0])


def test_the_schedule_is_a_function_of_the_seed_and_the_epoch():
    a, b = UnitSchedule(_cfg(), 50), UnitSchedule(_cfg(), 50)
    same = lambda p, q: all(np.array_equal(x, y) for u, v in zip(p, q) for r, s in zip(u, v) for x, y in zip(r, s))
    assert same(a.epoch(1)[0], b.epoch(1)[0])
    assert not same(a.epoch(0)[0], a.epoch(1)[0])


def test_per_unit_batch_and_sync_period():
    plan, rounds = UnitSchedule(_cfg(unit_batches=(2, 5), unit_sync_periods=(1, 2)), 20).epoch(0)
    assert [len(b) for b in plan[0][0]] == [2] and len(plan[0]) == 5     # 10 samples, b=2, H=1
    assert [len(b) for b in plan[1][0]] == [5, 5] and len(plan[1]) == 1  # 10 samples, b=5, H=2
    assert rounds == 5


def test_epoch_plans_expect_the_units_with_work_and_every_unit_in_a_checkpoint_round():
    plans = EpochPlans(UnitSchedule(_cfg(unit_batches=(2, 5), unit_sync_periods=(1, 2)), 20))
    assert plans.expected(0, 0) == {0, 1} and plans.expected(0, 3) == {0}
    assert plans.expected(0, 3, flagged=True) == {0, 1}
    assert plans.worked(0, 3, [0, 1]) == [0]
    assert not plans.epoch_end(0, 3) and plans.epoch_end(0, 4)


def test_epoch_plans_keep_two_epochs():
    plans = EpochPlans(UnitSchedule(_cfg(), 50))
    for e in (0, 1, 2):
        plans.plan(e)
    assert plans.cached(0) is None and plans.cached(1) is not None and plans.cached(2) is not None
