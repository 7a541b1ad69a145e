"""The BP family is one mechanism: check each mode's arithmetic against its definition."""
import math
from dataclasses import replace

import numpy as np
import pytest

from streamnet import kernels as K
from streamnet.errors import ConfigError
from streamnet.training import (AlgorithmConfig, ComputeUnit, Contribution, DataConfig, ModelConfig,
                                RunConfig, UnitSchedule, load_data, lr_scale, make_model, plan_for, train_local)
from streamnet.training.bp import Aggregator

DATA = DataConfig(dataset="synthetic", synthetic_train=256, synthetic_test=64)


def cfg(units, name="cumulative", **alg):
    a = dict(name=name, batch=8, sync_period=1, lr=0.05, momentum=0.9, weight_decay=1e-3,
             lr_schedule="cosine")
    a.update(alg)
    return RunConfig(model=ModelConfig(name="lenet5"), data=DATA, algorithm=AlgorithmConfig(**a),
                     units=units, threads=min(units, 2), epochs=2, seed=3)


def cosine(progress: float) -> float:
    """The cosine schedule written out from its definition (not the library's lr_scale)."""
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def reference_sgd(c: RunConfig, ds):
    """Single-process SGD with momentum on the union of the units' batches, step by step.
    Which samples form a round's union is the schedule's business (tests/unit/test_schedule.py);
    the learning rate follows the cosine formula above over the whole run, or stays put."""
    model = make_model(c, ds.num_classes)
    velocity = np.zeros_like(model.params)
    schedule = UnitSchedule(c, len(ds.train))
    a = c.algorithm
    rate = cosine if a.lr_schedule == "cosine" else (lambda progress: 1.0)
    done, total = 0, None
    for epoch in range(c.epochs):
        rounds_by_unit, rounds = schedule.epoch(epoch)
        total = total or rounds * c.epochs
        for r in range(rounds):
            idx = np.concatenate([rounds_by_unit[k][r][0] for k in range(c.units) if r < len(rounds_by_unit[k])])
            x, y = ds.batch(ds.train, idx)
            _, g = model.loss_and_grad(x, y)
            K.sgd_step(model.params, g, velocity, a.lr * rate(done / total), a.momentum, a.weight_decay, False)
            done += 1
    return model.params


def test_cosine_schedule_follows_its_formula():
    """lr_scale(progress) = (1 + cos(pi * progress)) / 2: the full rate at the start, half
    at mid-run, zero at the end; `constant` is 1 throughout."""
    cos_alg, const_alg = AlgorithmConfig(lr_schedule="cosine"), AlgorithmConfig(lr_schedule="constant")
    for progress, expected in [(0.0, 1.0), (0.5, 0.5), (1.0, 0.0)]:
        assert lr_scale(cos_alg, progress) == pytest.approx(expected, abs=1e-12), progress
        assert lr_scale(const_alg, progress) == 1.0


@pytest.mark.parametrize("units", [1, 2, 4])
def test_cumulative_equals_single_process_sgd(units):
    c = cfg(units)
    ds = load_data(c.data, c.seed)
    result = train_local(c, ds)
    ref = reference_sgd(c, ds)
    assert result.summary.sync_rounds == 2 * (256 // (8 * units))
    err = np.max(np.abs(result.params - ref)) / np.max(np.abs(ref))
    assert err < 1e-5, f"relative difference {err:.2e}"


def test_constant_schedule_equals_sgd_at_a_fixed_rate():
    c = cfg(2, lr_schedule="constant")
    ds = load_data(c.data, c.seed)
    ref = reference_sgd(c, ds)
    err = np.max(np.abs(train_local(c, ds).params - ref)) / np.max(np.abs(ref))
    assert err < 1e-5, f"relative difference {err:.2e}"


def test_online_equals_single_process_sgd():
    """Online BP is cumulative BP with batch 1: two units equal SGD on batches of two."""
    c = replace(cfg(2, name="online", batch=1, momentum=0.0, lr=0.01), epochs=1)
    ds = load_data(c.data, c.seed)
    result = train_local(c, ds)
    assert result.summary.sync_rounds == 128 and result.summary.samples_processed == 256
    ref = reference_sgd(c, ds)
    err = np.max(np.abs(result.params - ref)) / np.max(np.abs(ref))
    assert err < 1e-5, f"relative difference {err:.2e}"


def test_mixbp_round_is_the_weighted_average_of_unit_parameters():
    c = cfg(3, name="mixbp", sync_period=4, unit_batches=(4, 8, 12))
    ds = load_data(c.data, c.seed)
    plan = plan_for(c.algorithm)
    units = [ComputeUnit(k, make_model(c), plan) for k in range(3)]
    agg = Aggregator(units[0].model.params, plan)
    rng = np.random.default_rng(0)
    contribs, finals = [], []
    for u in units:
        b = c.algorithm.batch_of(u.unit)
        batches = [ds.batch(ds.train, rng.choice(len(ds.train), b, replace=False)) for _ in range(4)]
        contribs.append(u.run_round(batches))
        finals.append(u.model.params.copy())
    assert [co.samples for co in contribs] == [16, 32, 48]
    expected = sum(w * p for w, p in zip([16, 32, 48], finals)) / 96
    np.testing.assert_allclose(agg.combine(contribs[::-1]), expected, rtol=1e-5, atol=1e-6)


def test_aggregation_does_not_depend_on_arrival_order():
    plan = plan_for(AlgorithmConfig(name="mixbp"))
    rng = np.random.default_rng(1)
    contribs = [Contribution(k, int(rng.integers(1, 50)), 1, 0.0, rng.standard_normal(1000).astype(np.float32))
                for k in range(5)]
    a = Aggregator(np.zeros(1000, np.float32), plan).combine(contribs)
    b = Aggregator(np.zeros(1000, np.float32), plan).combine(contribs[::-1])
    np.testing.assert_array_equal(a, b)


def test_outer_momentum_is_nesterov_on_the_averaged_change():
    """`--outer-momentum M` (mixbp): Delta = the sample-weighted average of the units'
    changes (start - end); v = M v + Delta; p -= outer_lr (Delta + M v) - DiLoCo's outer
    Nesterov step, written out here in float64. The lr schedule scales the inner steps
    only, so the outer step ignores the scale it is handed."""
    from streamnet.cli.submit import build_parser
    from streamnet.cli.train_args import config_from_args
    alg = config_from_args(build_parser().parse_args(["train", "--outer-momentum", "0.5"])).algorithm
    assert (alg.name, alg.outer_momentum, alg.outer_lr) == ("mixbp", 0.5, 1.0)
    rng = np.random.default_rng(2)
    p0 = rng.standard_normal(50).astype(np.float32)
    agg = Aggregator(p0, plan_for(alg))
    p, v = p0.astype(np.float64), np.zeros(50)
    for _ in range(3):
        changes = [rng.standard_normal(50).astype(np.float32) for _ in range(2)]
        delta = (16 * changes[0].astype(np.float64) + 48 * changes[1]) / 64
        v = 0.5 * v + delta
        p = p - 1.0 * (delta + 0.5 * v)
        out = agg.combine([Contribution(1, 48, 4, 0.0, changes[1]), Contribution(0, 16, 4, 0.0, changes[0])],
                          lr_scale=0.3)
        np.testing.assert_allclose(out, p, rtol=1e-5, atol=1e-5)


def test_non_finite_contribution_is_refused():
    plan = plan_for(AlgorithmConfig(name="mixbp"))
    agg = Aggregator(np.zeros(4, np.float32), plan)
    good = Contribution(0, 10, 1, 0.0, np.ones(4, np.float32))
    bad = Contribution(1, 10, 1, 0.0, np.array([1, np.nan, 1, 1], np.float32))
    out = agg.combine([good, bad])
    np.testing.assert_array_equal(out, -np.ones(4))
    assert agg.refused == [(1, "non-finite")]


def test_mixbp_learns_and_reports():
    s = train_local(replace(cfg(2, name="mixbp", sync_period=4), epochs=3)).summary
    assert s.history[-1].train_loss < s.history[0].train_loss
    assert s.test_accuracy > 0.5
    assert s.samples_processed == 3 * 256
    d = s.to_dict()
    for key in ("model", "dataset", "algorithm", "epochs", "test_accuracy", "samples_per_s", "wall_s"):
        assert key in d


def test_training_is_reproducible():
    c = cfg(2, name="mixbp", sync_period=2)
    np.testing.assert_array_equal(train_local(c).params, train_local(c).params)


@pytest.mark.parametrize("kwargs,message", [
    (dict(name="sgd"), "algorithm: must be one of online, cumulative, mixbp"),
    (dict(name="cumulative", sync_period=4), "sync_period: must be 1 for cumulative, which synchronises every step"),
    (dict(batch=0), "batch: must be >= 1"),
    (dict(batch=2.5), "batch: must be a whole number; got 2.5"),
    (dict(lr=float("inf")), "lr: must be a finite number > 0; got inf"),
    (dict(lr=float("nan")), "lr: must be a finite number > 0; got nan"),
    (dict(outer_lr=float("inf")), "outer_lr: must be a finite number > 0"),
    (dict(weight_decay=float("inf")), "weight_decay: must be a finite number >= 0"),
    (dict(momentum=1.5), "momentum: must be in"),
    (dict(lr_schedule="step"), "lr_schedule"),
])
def test_config_errors_name_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        AlgorithmConfig(**kwargs)


@pytest.mark.parametrize("make,message", [
    (lambda: RunConfig(seed=-1), "^seed: must be >= 0; got -1$"),     # numpy's ValueError in make_model, before
    (lambda: RunConfig(units=2.5), "^units: must be a whole number; got 2.5$"),
    (lambda: RunConfig(epochs=1.5), "^epochs: must be a whole number; got 1.5$"),
    (lambda: DataConfig(train_limit=2.5), "^train_limit: must be a whole number; got 2.5$"),
])
def test_counts_are_whole_numbers(make, message):
    with pytest.raises(ConfigError, match=message):
        make()
    assert RunConfig(seed=np.int64(3), units=np.int64(2)).units == 2      # numpy's integers are whole


def test_per_unit_lists_must_match_units():
    with pytest.raises(ConfigError, match="algorithm.unit_batches: has 2 entries for 3 units"):
        RunConfig(algorithm=AlgorithmConfig(unit_batches=(1, 2)), units=3)


@pytest.mark.parametrize("every", [0, -2])
def test_eval_every_epochs_must_be_at_least_one(every):
    """Refused where the configuration is made, naming the field (the in-process trainer
    divided by it: ZeroDivisionError after the first epoch's training)."""
    with pytest.raises(ConfigError, match=rf"^eval_every_epochs: must be >= 1; got {every}$"):
        RunConfig(eval_every_epochs=every)
    with pytest.raises(ConfigError, match="eval_every_epochs: must be >= 1"):
        replace(cfg(1), eval_every_epochs=every)


def test_the_reported_loss_leaves_out_a_diverged_units_contribution():
    """A unit whose update the combine refuses (not finite) made its epoch's train loss NaN
    in the summary and the progress; its samples still count as processed."""
    from streamnet.training.bp import trained_loss
    v = np.zeros(3, np.float32)
    ok = Contribution(0, 32, 1, 64.0, v)
    nan_loss = Contribution(1, 32, 1, float("nan"), v)
    refused = Contribution(2, 16, 1, 8.0, v, finite=False)      # a slice of a unit it judged not finite
    assert trained_loss([ok, nan_loss, refused]) == (64.0, 32)
    assert trained_loss([]) == (0, 0)


def test_a_units_own_parameters_travel_in_its_state_and_a_wrong_size_is_refused():
    """Overlap's checkpoint: a unit's own parameters (where its next round starts) are
    in its state; another model's are refused and leave the unit as it was."""
    from streamnet.nn import lenet5
    from streamnet.training.bp import plan_for
    plan = plan_for(AlgorithmConfig(name="mixbp", sync_period=2, overlap=True))
    unit = ComputeUnit(0, lenet5(), plan)
    unit.model.params[:] = 0.25
    state = unit.state(local=True)
    assert "local" not in unit.state() and np.all(state["local"] == 0.25)
    other = ComputeUnit(1, lenet5(), plan)
    local = other.set_state(state)
    assert np.all(local == 0.25) and not np.all(other.model.params == 0.25)
    before = other.velocity.copy()
    with pytest.raises(ValueError, match="own parameters of 3 values"):
        other.set_state(dict(state, local=np.zeros(3, np.float32), velocity=before + 1))
    assert np.array_equal(other.velocity, before)


def test_a_unit_without_inner_optimiser_continues_from_its_own_outer_step_with_overlap():
    """Overlap, cumulative and online: a unit's next round starts from the combined
    parameters moved by the outer step's rule with its own gradient (weight decay, the
    round's learning-rate multiplier, and a momentum of its own gradients, carried in its
    state) - not from them unmoved, a gradient one step old under momentum 0.9 (LeNet-5
    trained to chance with `train`'s settings). A change that is not finite moves nothing."""
    from streamnet.nn import lenet5
    alg = AlgorithmConfig(name="cumulative", batch=4, sync_period=1, lr=0.1, momentum=0.9, weight_decay=0.01,
                          overlap=True)
    unit = ComputeUnit(0, lenet5(), plan_for(alg))
    rng = np.random.default_rng(0)
    n = unit.model.num_params
    base, g1, g2 = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((4, 1, 28, 28)).astype(np.float32)
    unit.run_round([(x, np.arange(4) % 10)], lr_scale=0.5)
    unit.continue_from(g1, base=base)
    v1 = g1 + 0.01 * base
    np.testing.assert_allclose(unit.model.params, base - 0.1 * 0.5 * v1, rtol=1e-5, atol=1e-6)
    unit.continue_from(g2, base=base)
    v2 = 0.9 * v1 + g2 + 0.01 * base
    np.testing.assert_allclose(unit.model.params, base - 0.1 * 0.5 * v2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(unit.state()["velocity"], v2, rtol=1e-5, atol=1e-5)   # resumes exactly
    bad = g1.copy()
    bad[7] = np.nan
    unit.continue_from(bad, base=base)
    assert np.array_equal(unit.model.params, base)
    np.testing.assert_allclose(unit.velocity, v2, rtol=1e-5, atol=1e-5)
    # online BP: no momentum, no velocity to carry
    online = ComputeUnit(0, lenet5(), plan_for(AlgorithmConfig(name="online", batch=1, sync_period=1, lr=0.1, momentum=0.0,
                                                                overlap=True)))
    online.continue_from(g1, base=base)
    np.testing.assert_allclose(online.model.params, base - 0.1 * g1, rtol=1e-5, atol=1e-6)


def test_cumulative_with_overlap_trains_as_far_as_without():
    # from the combined parameters unmoved (a gradient one step old under momentum 0.9) the
    # same run ended at a training loss of 0.98 against 0.003 without overlap
    plain = train_local(replace(cfg(2), epochs=4)).summary
    over = train_local(replace(cfg(2, overlap=True), epochs=4)).summary
    assert plain.history[-1].train_loss < 0.1 and over.history[-1].train_loss < 0.1
