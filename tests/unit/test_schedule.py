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


# -- the shared schedule of load balancing ------------------------------------------

from streamnet.training.schedule import SharedSchedule, schedule_for, split  # noqa: E402


def _run(units=2, balance="load"):
    return RunConfig(algorithm=AlgorithmConfig(name="mixbp", batch=4, sync_period=3), units=units, seed=5,
                     balance=balance)


def test_split_keeps_the_total_and_gives_each_part_at_least_one():
    assert split(64, [1.0, 1.0]) == [32, 32]
    assert split(64, [4 / 3, 2 / 3]) == [43, 21]
    assert split(64, [100.0, 0.001]) == [63, 1]            # never a zero batch while there are enough samples
    assert split(1, [1.0, 1.0]) in ([1, 0], [0, 1])
    assert split(0, [1.0, 2.0]) == [0, 0]
    for total in range(0, 70):
        assert sum(split(total, [0.3, 1.9, 0.8])) == total


def test_every_sample_once_per_epoch_whatever_the_shares_round_by_round():
    import random
    rng = random.Random(3)
    s = SharedSchedule(_run(units=3), 1000)
    for epoch in range(2):
        seen = []
        for r in range(s.num_rounds):
            shares = [rng.uniform(0.2, 2.0) for _ in range(3)]
            per_unit = s.round(epoch, r, shares)
            assert len(per_unit) == 3
            sizes = [sum(len(b) for b in unit) for unit in per_unit]
            if (r + 1) * s.step * s.h <= 1000:        # a full round: each step's batches add up to B
                assert sum(sizes) == s.step * s.h
                assert [len(b) for b in per_unit[0]] == [s.batch_sizes(shares)[0]] * s.h
            seen += [int(i) for unit in per_unit for b in unit for i in b]
        assert sorted(seen) == list(range(1000)), "each sample exactly once in the epoch"


def test_shares_cut_a_round_differently_but_cover_the_same_samples():
    s = SharedSchedule(_run(units=2), 500)
    equal, skewed = s.round(0, 0), s.round(0, 0, [1.5, 0.5])
    flat = lambda units: sorted(int(i) for u in units for b in u for i in b)
    assert flat(equal) == flat(skewed)
    assert [len(b) for b in skewed[0]] == [s.batch_sizes([1.5, 0.5])[0]] * s.h
    assert len(skewed[0][0]) == 3 * len(skewed[1][0])


def test_schedule_for_picks_by_balance_mode_and_plans_have_every_unit_in_every_round():
    assert isinstance(schedule_for(_run(balance="static"), 50), UnitSchedule)
    shared = schedule_for(_run(), 50)
    plan, rounds = shared.epoch(0)
    assert isinstance(shared, SharedSchedule) and all(len(p) == rounds for p in plan)
    assert EpochPlans(shared).expected(0, rounds - 1) == set(range(len(plan)))
