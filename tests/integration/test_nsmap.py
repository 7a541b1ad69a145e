"""NN-S on the engine: the topology computes what the in-process BP family computes."""
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, train_local
from streamnet.training.cluster_run import train_on_local_cluster

pytestmark = pytest.mark.usefixtures("no_leaks")
DATA = DataConfig(dataset="synthetic", synthetic_train=256, synthetic_test=64)


def cfg(units, name="cumulative", **alg):
    a = dict(name=name, batch=8, sync_period=1, lr=0.05, momentum=0.9, weight_decay=1e-3)
    a.update(alg)
    return RunConfig(model=ModelConfig(name="lenet5"), data=DATA, algorithm=AlgorithmConfig(**a),
                     units=units, threads=units, epochs=2, seed=3)


@pytest.mark.parametrize("units", [1, 2, 4])
def test_cumulative_topology_equals_single_process_sgd(units):
    """train_local's cumulative mode equals plain SGD (tests/unit/test_bp_family.py); the
    topology must give the same parameters, whatever the arrival order of contributions."""
    c = cfg(units)
    summary, results = train_on_local_cluster(c, workers=min(units, 2))
    reference = train_local(c).params
    params = results["sync.0.params"]
    err = np.max(np.abs(params - reference)) / np.max(np.abs(reference))
    assert err < 1e-5, err
    assert summary.sync_rounds == 2 * 256 // (8 * units) and summary.samples_processed == 512


def test_mixbp_topology_with_per_unit_batches():
    c = cfg(3, name="mixbp", sync_period=4, unit_batches=(4, 8, 12))
    summary, results = train_on_local_cluster(c, workers=2)
    np.testing.assert_allclose(results["sync.0.params"], train_local(c).params, rtol=1e-5, atol=1e-6)
    assert summary.samples_processed == 2 * 256
    assert len(summary.history) == 2 and summary.test_accuracy > 0.3
    for h in summary.history:      # each epoch's own samples and time, measured by the sync bolt
        assert h.samples == 256 and h.seconds > 0
    d = summary.to_dict()
    for key in ("test_accuracy", "samples_per_s", "wall_s", "epochs", "algorithm", "workers", "sync_rounds",
                "bytes_sent", "samples_processed", "samples_replayed", "per_worker"):
        assert key in d, key
    assert {"compute_s", "communication_s", "barrier_wait_s"} <= set(next(iter(d["per_worker"].values())))
    # every round awaited its save: measured, and a part of the run's time
    assert 0 < d["sync_save_wait_s"] < summary.train_s


def test_every_second_epoch_and_the_last_are_evaluated_on_the_topology_as_in_process():
    """eval_every_epochs=2 over 3 epochs: both trainers evaluate epochs 2 and 3 only, and
    agree on the parameters and on each epoch's test figures; epoch 1 is in both
    summaries with its training figures and no test accuracy. Nothing waits for the
    evaluation that epoch 1 does not have: the run ends, every sample counted once."""
    c = replace(cfg(2, "mixbp", sync_period=2), epochs=3, eval_every_epochs=2)
    summary, results = train_on_local_cluster(c, workers=2)
    reference = train_local(c)
    assert [h["epoch"] for h in results["eval.0.history"]] == [2, 3]
    evaluated = lambda s: [(h.epoch, h.test_accuracy is not None) for h in s.history]  # noqa: E731
    assert evaluated(summary) == evaluated(reference.summary) == [(1, False), (2, True), (3, True)]
    np.testing.assert_allclose(results["sync.0.params"], reference.params, rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(summary.history[1:], reference.summary.history[1:]):
        assert ours.test_accuracy == pytest.approx(theirs.test_accuracy, abs=1e-9)
        assert ours.test_loss == pytest.approx(theirs.test_loss, rel=1e-4)
    assert summary.test_accuracy == pytest.approx(reference.summary.test_accuracy, abs=1e-9)
    assert [h.samples for h in summary.history] == [256, 256, 256] and all(h.seconds > 0 for h in summary.history)
    assert summary.extra["each_sample_counted_once"] is True


def test_online_topology_equals_the_in_process_trainer():
    """Online BP (batch 1 per unit) on the topology: 128 rounds of two one-sample
    gradients, ending with the in-process trainer's parameters (which equal plain SGD,
    tests/unit/test_bp_family.py)."""
    c = replace(cfg(2, name="online", batch=1, momentum=0.0, lr=0.01), epochs=1)
    summary, results = train_on_local_cluster(c, workers=2)
    assert summary.sync_rounds == 128 and summary.samples_processed == 256
    np.testing.assert_allclose(results["sync.0.params"], train_local(c).params, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,alg", [
    ("mixbp", dict(sync_period=2, unit_batches=(4, 8, 12))),       # a unit's rounds end before the others'
    ("cumulative", dict()),
])
@pytest.mark.parametrize("sync_tasks", [1, 2])
def test_overlap_on_the_topology_equals_overlap_in_process(name, alg, sync_tasks):
    """With overlap each unit's round runs while the last is combined (bp.py): the
    topology computes what the in-process trainer does, however the parameters and the
    next round's work race each other, and differs from the run without overlap."""
    units = 3 if "unit_batches" in alg else 2
    c = replace(cfg(units, name=name, overlap=True, **alg), sync_tasks=sync_tasks)
    summary, results = train_on_local_cluster(c, workers=2)
    reference = train_local(c)
    params = np.concatenate([results[f"sync.{s}.params"] for s in range(sync_tasks)])
    np.testing.assert_allclose(params, reference.params, rtol=1e-5, atol=1e-6)
    assert summary.samples_processed == reference.summary.samples_processed == 2 * 256
    assert summary.sync_rounds == reference.summary.sync_rounds
    plain = train_local(replace(c, algorithm=replace(c.algorithm, overlap=False))).params
    assert np.max(np.abs(plain - reference.params)) > 1e-3


def test_describe_prints_the_nsmap_topology():
    r = subprocess.run([sys.executable, "-m", "streamnet.cli.submit", "describe", "lenet5-mixbp", "--set",
                        "dataset=synthetic"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for part in ("spout data", "bolt  compute", "<- data [direct]", "<- sync stream 'params' [all]",
                 "bolt  sync", "<- compute [direct]", "bolt  eval", "bolt  checkpoint"):
        assert part in r.stdout, part


def test_train_cli_on_the_embedded_cluster(tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "streamnet.cli.submit", "train", "--dataset", "synthetic",
                        "--epochs", "1", "--workers", "2", "--local", "--summary", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "embedded local cluster of 2 workers" in r.stderr and "final test accuracy" in r.stdout
    import json
    s = json.loads(out.read_text())
    assert s["workers"] == 2 and s["sync_rounds"] > 0 and s["samples_processed"] == 2048


def test_alexnet_smoke_on_the_embedded_cluster():
    c = RunConfig(model=ModelConfig(name="alexnet", options={"input_size": 64}),
                  data=DataConfig(dataset="synthetic", synthetic_train=64, synthetic_test=32),
                  algorithm=AlgorithmConfig(name="mixbp", batch=8, sync_period=2, lr=0.02), units=2, threads=2,
                  epochs=1)
    summary, results = train_on_local_cluster(c, workers=2)
    assert summary.samples_processed == 64 and summary.sync_rounds == 2
    assert summary.num_params == 7703242 and np.isfinite(summary.history[0].train_loss)
    # 31 MB of parameters per contribution crossed the socket
    assert summary.extra["bytes_sent"] >= 2 * 2 * 7703242 * 4


def test_bad_samples_are_quarantined_and_reported_on_the_engine(tmp_path):
    """NaN/Inf pixels and out-of-range labels never reach a unit, nor the evaluation: the
    run trains on the rest, each remaining sample is counted once, the parameters and
    the test loss stay finite (a scored NaN sample would make it NaN), and the summary
    reports what was quarantined in each split."""
    from streamnet.data import synthetic, write_idx
    ds = synthetic(train_size=512, test_size=64, seed=1)
    images = ds.train.images.astype(np.float32)
    images[[5, 77], 3, 3] = [np.nan, np.inf]
    labels = ds.train.labels.astype(np.uint8)
    labels[200] = 10   # mnist has classes 0..9
    test_images = ds.test.images.astype(np.float32)
    test_images[9, 0, 0] = np.nan
    test_labels = ds.test.labels.astype(np.uint8)
    test_labels[[3, 40]] = 12
    write_idx(tmp_path / "train-images-idx3-ubyte", images)
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", test_images)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", test_labels)
    c = replace(cfg(2, "mixbp", sync_period=2), data=DataConfig(dataset="mnist", data_dir=str(tmp_path)))
    summary, results = train_on_local_cluster(c, workers=2)
    assert summary.extra["samples_quarantined"] == 6
    q = summary.extra["quarantined"]["train"]
    assert q["non-finite"]["first"] == [5, 77] and q["label out of range"]["first"] == [200]
    q = summary.extra["quarantined"]["test"]
    assert q["non-finite"]["first"] == [9] and q["label out of range"]["first"] == [3, 40]
    assert all(np.isfinite(h.test_loss) for h in summary.history)
    assert summary.extra["each_sample_counted_once"] is True
    assert results["sync.0.stats"]["epoch_samples"] == {"1": 509, "2": 509}
    assert np.isfinite(results["sync.0.params"]).all()
