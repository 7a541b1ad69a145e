"""Sharded synchronisation on plain data: slices cover the vector, S aggregators on
the slices give the one aggregator's parameters exactly, and the parts of a vector
or a checkpoint state come back together."""
import numpy as np
import pytest

from streamnet.training import AlgorithmConfig
from streamnet.training.bp import Aggregator, Contribution, plan_for
from streamnet.training.slices import (Gather, bounds, joined, merge_checkpoint_states, slice_index,
                                       slice_of_outer_state)


def test_the_slices_cover_the_vector_once_in_order():
    assert bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert bounds(5, 1) == [(0, 5)]
    with pytest.raises(ValueError, match="6 sync tasks for a vector of 5 values"):
        bounds(5, 6)
    assert slice_index(2, 3) is None
    assert slice_index(3, 3) and slice_index(True, 3) and slice_index("0", 3)


@pytest.mark.parametrize("alg", [AlgorithmConfig(name="cumulative", sync_period=1, lr=0.1, weight_decay=1e-3),
                                 AlgorithmConfig(name="mixbp", outer_momentum=0.6)], ids=["cumulative", "mixbp"])
def test_aggregators_on_slices_give_the_whole_vectors_result_exactly(alg):
    """Three rounds of three units; in the second, unit 1 diverges in the last slice
    only: the one aggregator drops the unit, and so must every slice's (the unit
    sends its verdict on the whole vector with each slice)."""
    rng = np.random.default_rng(0)
    size, S = 1001, 3
    start = rng.standard_normal(size).astype(np.float32)
    whole = Aggregator(start, plan_for(alg))
    parts = [Aggregator(start[lo:hi], plan_for(alg)) for lo, hi in bounds(size, S)]
    for rnd in range(3):
        vectors = [rng.standard_normal(size).astype(np.float32) for _ in range(3)]
        if rnd == 1:
            vectors[1][-1] = np.nan
        samples = [8, 16, 24]
        expected = whole.combine([Contribution(u, samples[u], 1, 0.0, v) for u, v in enumerate(vectors)], 0.5, rnd)
        got = joined([agg.combine([Contribution(u, samples[u], 1, 0.0, v[lo:hi], bool(np.isfinite(v).all()))
                                   for u, v in enumerate(vectors)], 0.5, rnd)
                      for agg, (lo, hi) in zip(parts, bounds(size, S))])
        np.testing.assert_array_equal(got, expected)
    assert [len(a.refused) for a in parts] == [1, 1, 1] == [len(whole.refused)] * 3


def test_gather_hands_back_the_slices_in_order_once_all_came():
    g = Gather(3)
    assert g.add((1, 5), 2, "c") == (None, None)
    assert g.add((1, 5), 0, "a") == (None, None)
    assert g.add((1, 5), 0, "a2") == (None, "a")          # a replay's copy replaces the first
    assert g.add((0, 2), 1, "old") == (None, None)         # an epoch end left incomplete by a fault
    assert g.add((1, 5), 1, "b") == (["a2", "b", "c"], None)
    assert g.finish((1, 5)) == ["old"] and g.parts == {}


def test_gather_hands_back_a_late_copy_of_a_finished_key_at_once():
    """The hang of a CI run: S=2, a replay reached sync task 1 once per unit, so its
    slice of an epoch end came twice, the second copy after sync task 0's slice had
    completed the first. Kept, that copy waited for a slice 0 that never came again."""
    g = Gather(2)
    assert g.add((1, 23), 1, "s1 for unit 0's replay") == (None, None)
    whole, _ = g.add((1, 23), 0, "s0")
    assert whole == ["s0", "s1 for unit 0's replay"] and g.finish((1, 23)) == []
    assert g.add((1, 23), 1, "s1 for unit 1's replay") == (None, "s1 for unit 1's replay")
    assert g.add((0, 11), 0, "older") == (None, "older")
    assert g.parts == {}
    assert g.add((2, 47), 0, "next epoch") == (None, None)   # a newer key gathers as before


def test_a_checkpoint_state_split_over_slices_joins_and_splits_back():
    v = np.arange(10, dtype=np.float32)
    b = bounds(10, 3)
    parts = [{"position": {"step": 4}, "outer": {"velocity": v[lo:hi]}, "counters": {"rounds": 4},
              "units": {"0": {"velocity": None}} if s == 0 else {}, "config": {}} for s, (lo, hi) in enumerate(b)]
    merged = merge_checkpoint_states(parts)
    np.testing.assert_array_equal(merged["outer"]["velocity"], v)
    assert merged["units"] == {"0": {"velocity": None}} and merged["position"] == {"step": 4}
    for lo, hi in b:
        np.testing.assert_array_equal(slice_of_outer_state(merged["outer"], lo, hi)["velocity"], v[lo:hi])
    empty = {"velocity": np.zeros(0, np.float32)}         # no outer momentum
    assert slice_of_outer_state(empty, 3, 6)["velocity"].size == 0
