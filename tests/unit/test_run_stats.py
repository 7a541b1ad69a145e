"""RunStats reads a run's results by exact key and field name: a missing or renamed
one is an error naming it, never a zero in the summary."""
import math

import pytest

from streamnet.training import DataConfig, RunStats, lenet5_mixbp
from streamnet.training.run_stats import EpochSpan, ResultsError, SyncStats
from streamnet.training.summary_from_results import summarise


def _stats(**over) -> SyncStats:
    v = dict(sync_rounds=8, samples_processed=400, samples_this_run=300, duplicates=1, bytes_received=1000,
             bytes_sent=3000, refused=0, recoveries=1, epoch_samples={1: 200, 2: 200},
             each_sample_counted_once=True, miscounted={}, barrier_s={0: 0.5, 1: 0.25},
             save_wait_s=0.125, lost_steps=0, epoch_train_loss={1: 2.0, 2: 1.5},
             epoch_clock={1: EpochSpan(start=100.0, end=110.0, samples=200),
                          2: EpochSpan(start=110.0, end=None, samples=100)},
             num_params=61706, slices=1, resumed_from_step=None, quarantined={"train": {"count": 2}}, train_s=10.0,
             started=100.0)
    v.update(over)
    return SyncStats(**v)


def _results() -> dict:
    return {"sync.0.stats": _stats().to_dict(),
            "eval.0.history": [{"epoch": 1, "step": 4, "test_accuracy": 0.5, "test_loss": 1.2, "time": 111.0},
                               {"epoch": 2, "step": 8, "test_accuracy": 0.75, "test_loss": 0.9, "time": 121.0}],
            "compute.1.timing": {"worker": "w2", "unit": 1, "compute_s": 4.0, "wait_s": 1.0, "samples": 200},
            "compute.0.timing": {"worker": "w1", "unit": 0, "compute_s": 5.0, "wait_s": 0.25, "samples": 200},
            "data.0.replayed": 3, "data.0.replayed_samples": 96,
            "checkpoint.0.checkpoints": {"last": None, "errors": 0},
            "sync.0.params": None, "sync.0.progress": {}}


def test_sync_stats_travel_as_plain_data_with_string_epochs():
    d = _stats().to_dict()
    assert d["epoch_samples"] == {"1": 200, "2": 200}
    assert d["epoch_clock"] == {"1": {"from": 100.0, "to": 110.0, "samples": 200}, "2": {"from": 110.0, "samples": 100}}
    assert SyncStats.from_dict(d) == _stats()


def test_the_summary_reads_every_record():
    s = summarise(lenet5_mixbp(data=DataConfig(dataset="synthetic")), _results(), workers=None, wall_s=12.0)
    assert s.workers == 2 and s.test_accuracy == 0.75 and s.samples_per_s == 30.0 and s.wall_s == 12.0
    assert [(h.epoch, h.train_loss, h.samples, h.seconds) for h in s.history] == [(1, 2.0, 200, 10.0),
                                                                                 (2, 1.5, 100, 0.0)]
    # samples, as named (it was the work tuples' count); a run of an older version has none
    assert s.extra["samples_replayed"] == 96 and s.extra["work_replayed"] == 3
    assert s.extra["bytes_sent"] == 4000 and s.extra["stopped_at"] is None
    older = {k: v for k, v in _results().items() if k != "data.0.replayed_samples"}
    assert summarise(lenet5_mixbp(data=DataConfig(dataset="synthetic")), older, workers=None,
                     wall_s=12.0).extra["samples_replayed"] is None
    assert s.extra["sync_save_wait_s"] == 0.125
    assert s.extra["samples_quarantined"] == 2 and s.extra["accuracy_at_s"] == [[11.0, 0.5], [21.0, 0.75]]
    assert s.extra["per_worker"]["w2"] == {"units": [1], "compute_s": 4.0, "communication_s": 0.75,
                                           "barrier_wait_s": 0.25, "samples": 200}


def test_an_epoch_this_run_did_not_measure_is_unknown_not_zero_loss():
    r = _results()
    stats = _stats(epoch_train_loss={2: 1.5}, epoch_clock={2: EpochSpan(start=110.0, end=120.0, samples=200)})
    r["sync.0.stats"] = stats.to_dict()
    s = summarise(lenet5_mixbp(), r, workers=2)
    assert math.isnan(s.history[0].train_loss) and s.history[0].seconds == 0.0
    assert s.history[1].samples_per_s == 20.0


def test_an_epoch_ended_without_evaluation_is_in_the_history_with_no_test_figures():
    """eval_every_epochs=2 over 3 epochs: the eval bolt has epochs 2 and 3; the summary
    has all three, epoch 1 with its training figures and test accuracy and loss None, as
    the in-process trainer gives them; the run's accuracy is the last evaluated one."""
    r = _results()
    r["sync.0.stats"] = _stats(epoch_samples={1: 200, 2: 200, 3: 200}, epoch_train_loss={1: 2.0, 2: 1.5, 3: 1.25},
                               epoch_clock={1: EpochSpan(start=100.0, end=110.0, samples=200),
                                            2: EpochSpan(start=110.0, end=120.0, samples=200),
                                            3: EpochSpan(start=120.0, end=125.0, samples=200)}).to_dict()
    r["eval.0.history"] = [{"epoch": 2, "step": 8, "test_accuracy": 0.5, "test_loss": 1.2, "time": 121.0},
                           {"epoch": 3, "step": 12, "test_accuracy": 0.75, "test_loss": 0.9, "time": 126.0}]
    s = summarise(lenet5_mixbp(eval_every_epochs=2, epochs=3), r, workers=2)
    assert [(h.epoch, h.train_loss, h.test_accuracy, h.test_loss, h.samples, h.seconds) for h in s.history] == [
        (1, 2.0, None, None, 200, 10.0), (2, 1.5, 0.5, 1.2, 200, 10.0), (3, 1.25, 0.75, 0.9, 200, 5.0)]
    assert s.test_accuracy == 0.75 and s.test_loss == 0.9
    assert s.extra["accuracy_at_s"] == [[21.0, 0.5], [26.0, 0.75]]


def test_a_run_stopped_before_an_evaluated_epoch_reports_no_accuracy_not_zero():
    """Its summary said test_accuracy 0.0 and `train` printed "final test accuracy 0.00%";
    a run stopped after an unevaluated epoch said its older accuracy was the final one."""
    r = _results()
    r["eval.0.history"] = []
    s = summarise(lenet5_mixbp(eval_every_epochs=2, epochs=3), r, workers=2)
    assert s.test_accuracy is None and s.test_loss is None and s.to_dict()["test_accuracy"] is None
    assert s.accuracy_line() == "no test accuracy (the run ended before an evaluated epoch did)"
    r["eval.0.history"] = _results()["eval.0.history"][:1]
    r["sync.0.stats"] = _stats(epoch_clock={1: EpochSpan(start=100.0, end=110.0, samples=200),
                                            2: EpochSpan(start=110.0, end=120.0, samples=200)}).to_dict()
    s = summarise(lenet5_mixbp(eval_every_epochs=1, epochs=3), r, workers=2)
    assert s.accuracy_line() == "test accuracy 50.00% (after epoch 1; epoch 2 ended unevaluated)"
    assert summarise(lenet5_mixbp(), _results(), workers=2).accuracy_line() == "test accuracy 75.00%"


@pytest.mark.parametrize("key", ["sync.0.stats", "eval.0.history", "data.0.replayed", "checkpoint.0.checkpoints"])
def test_a_missing_record_is_an_error_naming_it(key):
    r = _results()
    del r[key]
    with pytest.raises(ResultsError, match=key.replace(".", r"\.")):
        RunStats.from_results(r)


@pytest.mark.parametrize("field", ["samples_this_run", "barrier_s", "epoch_clock"])
def test_a_renamed_field_is_an_error_naming_both_names(field):
    r = _results()
    r["sync.0.stats"][field + "_renamed"] = r["sync.0.stats"].pop(field)
    with pytest.raises(ResultsError, match=f"missing field.*'{field}'.*unknown field.*'{field}_renamed'"):
        RunStats.from_results(r)


def test_a_timing_record_missing_a_field_is_an_error():
    r = _results()
    del r["compute.1.timing"]["wait_s"]
    with pytest.raises(ResultsError, match=r"compute\.1\.timing: missing field\(s\) \['wait_s'\]"):
        RunStats.from_results(r)


def test_stopped_at_is_the_one_optional_record():
    r = _results()
    assert RunStats.from_results(r).stopped_at is None
    r["data.0.stopped_at"] = {"epoch": 1, "round": 0, "step": 4}
    assert RunStats.from_results(r).stopped_at.step == 4


def test_a_tuple_is_laid_out_by_field_name_and_every_field_must_be_given():
    from streamnet.training.streams import PARAMS, row
    assert row(PARAMS, params="p", generation=2, slice=1, step=3) == [3, 1, "p", 2]
    with pytest.raises(KeyError, match=r"missing \['params'\], unknown \['parms'\]"):
        row(PARAMS, step=3, slice=0, parms="p", generation=0)


def test_the_slices_accounts_merge_into_the_runs():
    """With S sync tasks each publishes its slice's account: bytes and recoveries add up,
    counts are what every slice counted, and one slice's fault makes the run's."""
    from streamnet.training.run_stats import final_params
    import numpy as np
    r = _results()
    r["sync.0.stats"] = _stats(slices=2).to_dict()
    with pytest.raises(ResultsError, match=r"lack 'sync\.1\.stats': 2 sync tasks published 1 accounts"):
        RunStats.from_results(r)
    r["sync.1.stats"] = _stats(slices=2, bytes_received=500, recoveries=0, duplicates=3,
                               barrier_s={0: 0.75, 1: 0.0}, save_wait_s=0.5).to_dict()
    s = RunStats.from_results(r).sync
    assert (s.bytes_received, s.bytes_sent, s.recoveries, s.duplicates) == (1500, 6000, 1, 3)
    assert s.save_wait_s == 0.5     # the slices' rounds wait for their saves side by side: the longest
    assert s.barrier_s == {0: 0.75, 1: 0.25} and s.each_sample_counted_once and s.epoch_samples == {1: 200, 2: 200}
    r["sync.1.stats"] = _stats(slices=2, epoch_samples={1: 200, 2: 150}, each_sample_counted_once=False,
                               miscounted={"2": {"missed_samples": 50}}).to_dict()
    s = RunStats.from_results(r).sync
    assert not s.each_sample_counted_once and s.epoch_samples == {1: 200, 2: 150}
    assert s.miscounted == {"2": {"missed_samples": 50, "slices": [1]}}
    r["sync.0.params"], r["sync.1.params"] = np.arange(3, dtype=np.float32), np.arange(3, 5, dtype=np.float32)
    np.testing.assert_array_equal(final_params(r), np.arange(5))
