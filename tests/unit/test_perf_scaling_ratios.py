"""perf/scaling.py's ratios of one mode (the same for a single run and for each pair of --pairs), and
perf/common.py's spread of them."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "perf"))
from scaling import mode_ratios  # noqa: E402


def test_a_modes_ratios_against_its_base_and_ceiling():
    runs = {"inproc": {"samples_per_s": 100.0, "epoch_samples_per_s": 110.0},
            "inproc x2": {"samples_per_s": 180.0},
            "1": {"samples_per_s": 90.0, "epoch_samples_per_s": None},
            "2": {"samples_per_s": 150.0, "epoch_samples_per_s": 165.0}}
    assert mode_ratios(runs, [1, 2]) == {
        "1 worker(s) / in-process 1 unit (samples/s)": pytest.approx(0.9),
        "2 worker(s) / in-process 1 unit (samples/s)": pytest.approx(1.5),
        "2 worker(s) / in-process 1 unit (epochs' own time)": pytest.approx(1.5),
        "2 in-process trainers at once / 1 (the machine's ceiling)": pytest.approx(1.8),
        "2 worker(s) / that ceiling": pytest.approx(150 / 180)}


def test_a_failed_run_gives_no_ratio_and_leaves_the_others():
    runs = {"inproc": {"samples_per_s": 100.0}, "inproc x2": {"samples_per_s": 180.0},
            "2": {"error": "a worker died"}}
    assert mode_ratios(runs, [2]) == {"2 in-process trainers at once / 1 (the machine's ceiling)": pytest.approx(1.8)}
    assert mode_ratios({"inproc": {"error": "x"}, "2": {"samples_per_s": 1.0}}, [2]) == {}


def test_the_spread_of_a_few_values_stays_within_them():
    from common import spread
    assert spread([1.0, 2.0]) == {"median": 1.5, "q1": 1.25, "q3": 1.75, "n": 2}
    s = spread([1.0, 2.0, 4.0])
    assert 1.0 <= s["q1"] <= s["median"] == 2.0 <= s["q3"] <= 4.0
    assert spread([3.0]) == {"median": 3.0, "q1": 3.0, "q3": 3.0, "n": 1}


def test_the_epochs_own_rate_leaves_out_the_first_epoch_whose_clock_starts_with_the_run():
    """The engine's epoch 1 runs from the run's start (start-up and first parameters in it):
    counted, the 'epochs' own time' ratio was the samples/s ratio under another name."""
    from types import SimpleNamespace as E

    from scaling import epoch_rate
    assert epoch_rate([E(samples=100, seconds=4.0), E(samples=100, seconds=1.0), E(samples=100, seconds=1.0)]) == 100.0
    assert epoch_rate([E(samples=100, seconds=4.0)]) == 25.0                 # one epoch: what there is
    assert epoch_rate([E(samples=0, seconds=0.0), E(samples=100, seconds=2.0)]) == 50.0   # epoch 1 not timed here
    assert epoch_rate([]) is None


def test_the_ratios_with_the_in_process_evaluations_timed_too():
    """The engine's samples/s have its evaluations in them (beside the next epoch); the
    in-process trainers' loops do not: the same work on both sides is a second ratio."""
    runs = {"inproc": {"samples_per_s": 100.0, "samples_per_s_evaluating": 80.0},
            "inproc x2": {"samples_per_s": 180.0, "samples_per_s_evaluating": 160.0},
            "2": {"samples_per_s": 150.0}}
    ratios = mode_ratios(runs, [2])
    assert ratios["2 worker(s) / in-process 1 unit (samples/s)"] == pytest.approx(1.5)
    assert ratios["2 worker(s) / in-process 1 unit, both with their evaluations (samples/s)"] == pytest.approx(150 / 80)
    assert ratios["2 worker(s) / that ceiling, both with their evaluations"] == pytest.approx(150 / 160)


def test_the_evaluating_rate_times_every_evaluation_but_the_last():
    """As the engine's run: its last evaluation is after its last combine, out of its time."""
    from types import SimpleNamespace as S

    from scaling import evaluating_rate
    assert evaluating_rate(S(samples_processed=300, train_s=2.0, extra={"eval_s": [0.5, 0.5, 9.0]})) == 100.0
    assert evaluating_rate(S(samples_processed=300, train_s=3.0, extra={"eval_s": [9.0]})) == 100.0
    assert evaluating_rate(S(samples_processed=300, train_s=3.0, extra={})) is None    # a summary without them


def test_the_in_process_trainer_times_each_evaluation_outside_its_training_time():
    from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, train_local
    cfg = RunConfig(model=ModelConfig(name="lenet5"),
                    data=DataConfig(dataset="synthetic", synthetic_train=256, synthetic_test=64),
                    algorithm=AlgorithmConfig(name="mixbp", batch=32, sync_period=2), units=1, epochs=2)
    s = train_local(cfg).summary
    assert len(s.extra["eval_s"]) == sum(h.test_accuracy is not None for h in s.history) >= 1
    assert all(t > 0 for t in s.extra["eval_s"])
    assert s.train_s == pytest.approx(sum(h.seconds for h in s.history))
