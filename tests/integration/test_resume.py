"""Checkpoint and resume on the embedded cluster: a run stopped cleanly and resumed
ends with the parameters of a run never stopped (fixed seed, no faults)."""
from dataclasses import replace

import numpy as np
import pytest

from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, train_local
from streamnet.training.checkpoint import CheckpointError, list_checkpoints, read_checkpoint
from streamnet.training.cluster_run import train_on_local_cluster

pytestmark = pytest.mark.usefixtures("no_leaks")
DATA = DataConfig(dataset="synthetic", synthetic_train=2048, synthetic_test=64)


@pytest.fixture(autouse=True)
def prompt_progress(monkeypatch):
    """Progress every 0.05 s, not 0.5 s (these clusters run in this process): a stop asked
    after round 3 lands long before the run's last round, however fast the machine."""
    from streamnet.training.sync_bolt import SyncBolt
    monkeypatch.setattr(SyncBolt, "PUBLISH_S", 0.05)


def cfg(name, **alg):
    a = dict(name=name, batch=16, sync_period=1, lr=0.05, momentum=0.9, weight_decay=1e-3)
    a.update(alg)
    return RunConfig(model=ModelConfig(name="lenet5"), data=DATA, algorithm=AlgorithmConfig(**a),
                     units=2, threads=2, epochs=4, seed=5)


@pytest.mark.parametrize("c", [cfg("mixbp", sync_period=2, outer_momentum=0.5), cfg("cumulative"),
                               cfg("mixbp", sync_period=2, overlap=True), cfg("cumulative", overlap=True)],
                         ids=["mixbp-momentum", "cumulative", "mixbp-overlap", "cumulative-overlap"])
def test_stop_and_resume_equals_uninterrupted(tmp_path, c):
    whole, whole_results = train_on_local_cluster(c, workers=2, checkpoint_dir=str(tmp_path / "a"), name="run")
    reference = whole_results["sync.0.params"]
    total_steps = whole.sync_rounds

    ckdir = str(tmp_path / "b")
    first, results = train_on_local_cluster(c, workers=2, checkpoint_dir=ckdir, name="run", poll_s=0.02,
                                            stop_when=lambda p: p["rounds"] >= 3)
    stopped = results["data.0.stopped_at"]
    assert 0 < stopped["step"] < total_steps, f"the run was not stopped part-way: {stopped}, {total_steps} steps"
    saved = results["checkpoint.0.checkpoints"]["last"]
    assert saved["step"] == stopped["step"] and list_checkpoints(ckdir, "run")[0][1] == saved["path"]

    resumed, results = train_on_local_cluster(c, workers=2, checkpoint_dir=ckdir, name="run", resume=True)
    assert resumed.extra["resumed_from_step"] == stopped["step"]
    assert resumed.sync_rounds == total_steps
    assert resumed.extra["each_sample_counted_once"] is True
    assert results["sync.0.stats"]["epoch_samples"] == {str(e): 2048 for e in range(1, 5)}
    np.testing.assert_allclose(results["sync.0.params"], reference, rtol=0, atol=1e-6)


def test_resume_refuses_a_corrupt_checkpoint_and_uses_the_previous(tmp_path, caplog):
    c = cfg("mixbp", sync_period=2)
    ckdir = tmp_path / "ck"
    train_on_local_cluster(replace_epochs(c, 2), workers=2, checkpoint_dir=str(ckdir), name="run")
    (newest_step, newest), (older_step, _) = list_checkpoints(str(ckdir), "run")[:2]
    raw = bytearray(open(newest, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(newest, "wb").write(bytes(raw))
    summary, _ = train_on_local_cluster(c, workers=2, checkpoint_dir=str(ckdir), name="run", resume=True)
    assert summary.extra["resumed_from_step"] == older_step < newest_step
    assert any("is corrupt" in r.getMessage() for r in caplog.records)
    # a checkpoint of another run configuration is refused before any cluster starts
    changed = {"algorithm": cfg("cumulative"),
               "model": replace(c, model=ModelConfig(name="lenet5", options={"activation": "tanh"})),
               "data": replace(c, data=replace(DATA, synthetic_train=1024)),
               "units": replace(c, units=3, threads=3),
               "seed": replace(c, seed=6)}
    for field, other in changed.items():
        with pytest.raises(CheckpointError, match=f"different settings: {field}"):
            train_on_local_cluster(other, workers=2, checkpoint_dir=str(ckdir), name="run", resume=True)


def replace_epochs(c, epochs):
    return replace(c, epochs=epochs)


SMALL = DataConfig(dataset="synthetic", synthetic_train=256, synthetic_test=64)


def test_resume_with_more_epochs_continues_the_run(tmp_path):
    """`--epochs` may change on resume: a run of 2 epochs resumed with 3 ends where a run
    of 3 never stopped ends (constant learning rate: the cosine schedule is over the
    run's length, so a longer run has another schedule)."""
    c = replace(cfg("mixbp", sync_period=2, outer_momentum=0.5, lr_schedule="constant"), data=SMALL, epochs=2)
    ckdir = str(tmp_path / "ck")
    first, _ = train_on_local_cluster(c, workers=2, checkpoint_dir=ckdir, name="run")
    # the same command again has nothing left to train: it ran 0 rounds and reported 0 %
    with pytest.raises(CheckpointError, match=r"run-\d+.ckpt was written after epoch 2: with --epochs 2 "
                                              "nothing is left to train; give more than 2 epochs to go on"):
        train_on_local_cluster(c, workers=2, checkpoint_dir=ckdir, name="run", resume=True)
    longer = replace(c, epochs=3)
    resumed, results = train_on_local_cluster(longer, workers=2, checkpoint_dir=ckdir, name="run", resume=True)
    assert resumed.extra["resumed_from_step"] == first.sync_rounds
    assert resumed.sync_rounds == first.sync_rounds * 3 // 2
    assert results["sync.0.stats"]["epoch_samples"] == {"1": 256, "2": 256, "3": 256}
    np.testing.assert_allclose(results["sync.0.params"], train_local(longer).params, rtol=1e-5, atol=1e-6)


def test_a_resumed_run_evaluates_the_epochs_an_uninterrupted_run_evaluates(tmp_path):
    """eval_every_epochs=3: a run of 1 epoch (evaluated: its last) resumed with 4 evaluates
    epochs 3 and 4 - epochs count from the run's start, not the resume - and not 2, whose
    end nothing waits on; it ends with the parameters of an uninterrupted run."""
    c = replace(cfg("mixbp", sync_period=2, lr_schedule="constant"), data=SMALL, epochs=1, eval_every_epochs=3)
    ckdir = str(tmp_path / "ck")
    first, results = train_on_local_cluster(c, workers=2, checkpoint_dir=ckdir, name="run")
    assert [h["epoch"] for h in results["eval.0.history"]] == [1]
    longer = replace(c, epochs=4)
    resumed, results = train_on_local_cluster(longer, workers=2, checkpoint_dir=ckdir, name="run", resume=True)
    assert resumed.extra["resumed_from_step"] == first.sync_rounds
    assert [h["epoch"] for h in results["eval.0.history"]] == [3, 4]
    assert [(h.epoch, h.test_accuracy is not None) for h in resumed.history] == [(2, False), (3, True), (4, True)]
    reference = train_local(longer)
    assert [(h.epoch, h.test_accuracy is not None) for h in reference.summary.history] == \
        [(1, False), (2, False), (3, True), (4, True)]
    assert results["sync.0.stats"]["epoch_samples"] == {str(e): 256 for e in range(1, 5)}
    assert resumed.extra["each_sample_counted_once"] is True
    np.testing.assert_allclose(results["sync.0.params"], reference.params, rtol=1e-5, atol=1e-6)


def test_disk_full_at_the_checkpoint_bolt_keeps_the_previous_checkpoint_and_training_goes_on(
        tmp_path, monkeypatch, caplog):
    """The first checkpoint is written; every later one fails with ENOSPC (at its fsync,
    as a full disk does): each failure is logged and counted, the first checkpoint stays
    intact, no temporary file is left, and the run ends with the parameters it would
    have had anyway."""
    import errno
    import os
    ckdir = tmp_path / "ck"
    real_fsync, written = os.fsync, []

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.startswith(str(ckdir) + "/") and target.endswith(".tmp"):
            if written:
                raise OSError(errno.ENOSPC, "No space left on device")
            written.append(target)
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    c = replace(cfg("cumulative"), data=SMALL, epochs=3)
    summary, results = train_on_local_cluster(c, workers=2, checkpoint_dir=str(ckdir), name="run")
    monkeypatch.undo()
    report = results["checkpoint.0.checkpoints"]
    assert report["errors"] == 2 and report["last"]["step"] == summary.sync_rounds // 3
    assert [p for _, p in list_checkpoints(str(ckdir), "run")] == [report["last"]["path"]]
    assert sorted(f.name for f in ckdir.iterdir()) == [os.path.basename(report["last"]["path"])]
    assert read_checkpoint(report["last"]["path"], report["last"]["sha256"]).size == summary.num_params
    failures = [r.getMessage() for r in caplog.records if "checkpoint failed" in r.getMessage()]
    assert len(failures) == 2 and all("No space left on device" in m for m in failures), failures
    assert summary.extra["each_sample_counted_once"] is True
    np.testing.assert_allclose(results["sync.0.params"], train_local(c).params, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_another_size_fails_the_resumed_run_naming_both(tmp_path):
    """A checkpoint whose configuration matches but whose parameters do not fit the model
    (a dataset with more classes, another version): every unit refused the parameters and
    asked again, forever."""
    from streamnet.runtime.control import TopologyFailed
    from streamnet.training.checkpoint import write_checkpoint
    from streamnet.training.config import run_config_to_dict
    c = replace(cfg("mixbp", sync_period=2), data=SMALL, epochs=2)
    state = {"config": run_config_to_dict(c), "position": {"step": 4, "epoch": 1, "round": 0, "shares": None}}
    write_checkpoint(str(tmp_path), "run", 4, np.zeros(7, np.float32), state)
    with pytest.raises(TopologyFailed, match=r"run-00000004.ckpt holds 7 parameters; lenet5 on this dataset has "
                                             r"\d+"):
        train_on_local_cluster(c, workers=2, checkpoint_dir=str(tmp_path), name="run", resume=True)
