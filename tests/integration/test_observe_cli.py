"""Issue 14 parts 3 and 5 end to end: a training run's --metrics-log (train on the
embedded cluster, submit --wait on ZooKeeper, with the same live progress), and the
trained LeNet-5 exported and loaded into PyTorch."""
import json

import numpy as np
import pytest

from streamnet.cli.metrics_log import read
from streamnet.cli.submit import main
from streamnet.testing import running_cluster
from streamnet.training.checkpoint import latest_checkpoint

from tests.unit.test_export import _torch_models, assert_same_outputs, load_safetensors

pytestmark = pytest.mark.usefixtures("no_leaks", "keep_sigterm")
SMALL = ["--dataset", "synthetic", "--train-limit", "512", "--test-limit", "64", "--batch", "16", "--epochs", "2",
         "--workers", "2"]


def check_metrics_log(path, epochs: int):
    records = read(path)
    rounds = [r for r in records if r["kind"] == "round"]
    evaluated = [r for r in records if r["kind"] == "epoch"]
    assert [r["epoch"] for r in evaluated] == list(range(1, epochs + 1))
    assert all(0 <= r["test_accuracy"] <= 1 for r in evaluated)
    assert rounds and all(r["loss"] >= 0 and r["samples_per_s"] >= 0 and r["step"] >= 1 for r in rounds)
    assert [r["step"] for r in rounds] == sorted(r["step"] for r in rounds)
    return rounds, evaluated


def test_train_writes_the_metrics_log_and_the_trained_lenet5_loads_into_pytorch(tmp_path, capsys):
    log, ck = str(tmp_path / "m.jsonl"), str(tmp_path / "ck")
    assert main(["train", *SMALL, "--metrics-log", log, "--checkpoint-dir", ck, "--summary",
                 str(tmp_path / "s.json")]) == 0
    err = capsys.readouterr().err
    # (epoch 1's line has no training loss when both evaluations land between two reads)
    assert "epoch 1/2  " in err and "test acc" in err and "epoch 2/2  loss" in err
    _, evaluated = check_metrics_log(log, 2)
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [h["test_accuracy"] for h in summary["history"]] == [r["test_accuracy"] for r in evaluated]

    path, _ = latest_checkpoint(ck, "lenet5-mixbp")
    out = str(tmp_path / "lenet5.safetensors")
    assert main(["export", path, out]) == 0
    torch, models = _torch_models()
    tensors, meta = load_safetensors(out)
    module = models["lenet5"][0]()
    module.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
    from streamnet import nn
    from streamnet.training.checkpoint import read_checkpoint
    net = nn.lenet5()
    net.set_params(read_checkpoint(path))
    assert not np.allclose(net.params, nn.lenet5().params)        # trained, not the initial weights
    assert_same_outputs(torch, module, net, 28)
    assert meta["dataset"] == "synthetic" and "normalize" not in meta   # synthetic data is not pixel data


def test_submit_wait_shows_the_training_progress_and_writes_the_metrics_log(zk, tmp_path):
    log = str(tmp_path / "m.jsonl")
    with running_cluster(zk, workers=2) as (c, state):
        r = c.submit_cli("submit", "lenet5-mixbp", *SMALL, "--wait", "--metrics-log", log, "--timeout", "240",
                         timeout=300)
    assert r.returncode == 0, r.stderr
    assert "epoch 1/2  " in r.stderr and "test acc" in r.stderr and "samples/s" in r.stderr, r.stderr   # (see above)
    assert "spouts done" not in r.stderr
    check_metrics_log(log, 2)
