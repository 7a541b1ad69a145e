"""Checkpoint and resume on the embedded cluster: a run stopped cleanly and resumed
ends with the parameters of a run never stopped (fixed seed, no faults)."""
import numpy as np
import pytest

from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
from streamnet.training.checkpoint import CheckpointError, list_checkpoints
from streamnet.training.cluster_run import train_on_local_cluster

pytestmark = pytest.mark.usefixtures("no_leaks")
DATA = DataConfig(dataset="synthetic", synthetic_train=2048, synthetic_test=64)


def cfg(name, **alg):
    a = dict(name=name, batch=16, sync_period=1, lr=0.05, momentum=0.9, weight_decay=1e-3)
    a.update(alg)
    return RunConfig(model=ModelConfig(name="lenet5"), data=DATA, algorithm=AlgorithmConfig(**a),
                     units=2, threads=2, epochs=4, seed=5)


@pytest.mark.parametrize("c", [cfg("mixbp", sync_period=2, outer_momentum=0.5), cfg("cumulative")],
                         ids=["mixbp-momentum", "cumulative"])
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
    with pytest.raises(CheckpointError, match="different algorithm"):
        train_on_local_cluster(cfg("cumulative"), workers=2, checkpoint_dir=str(ckdir), name="run", resume=True)


def replace_epochs(c, epochs):
    from dataclasses import replace
    return replace(c, epochs=epochs)
