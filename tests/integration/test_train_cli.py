"""`streamnet-submit train` and `run-example` as the README's CLI reference describes
them, on small synthetic data (seconds each)."""
import json
import os

import numpy as np
import pytest

from streamnet.cli.submit import build_parser, main
from streamnet.cli.train_args import config_from_args
from streamnet.examples.registry import EXAMPLES
from streamnet.training import train_local
from streamnet.training.checkpoint import list_checkpoints, read_checkpoint

pytestmark = pytest.mark.usefixtures("no_leaks", "keep_sigterm")
SMALL = ["--dataset", "synthetic", "--train-limit", "256", "--test-limit", "64", "--batch", "16", "--epochs", "1",
         "--workers", "2"]


def _config(*args):
    return config_from_args(build_parser().parse_args(["train", *args]))


def _train(tmp_path, *args, name="summary.json") -> dict:
    out = tmp_path / name
    assert main(["train", *args, "--summary", str(out)]) == 0
    return json.loads(out.read_text())


def _losses(s: dict) -> list[float]:
    return [h["train_loss"] for h in s["history"]]


# -- run-example ----------------------------------------------------------------------

SMALL_EXAMPLE = {"wordcount": ["--set", "count=600", "--set", "fail_every=7"],
                 "tensor_pipe": ["--set", "count=3", "--set", "size=4096"]}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_run_example_runs_and_checks_each_example(name, capsys):
    assert main(["run-example", name, "--workers", "2", *SMALL_EXAMPLE.get(name, [])]) == 0
    out = capsys.readouterr().out
    assert f"{name}: OK: " in out, out


def test_run_example_refuses_an_unknown_example(capsys):
    assert main(["run-example", "nope"]) == 2
    assert "unknown example 'nope'; known: " + ", ".join(EXAMPLES) in capsys.readouterr().err


# -- train --in-process ---------------------------------------------------------------

def test_train_in_process_runs_the_reference_trainer(tmp_path, capsys):
    args = [*SMALL, "--algorithm", "cumulative"]
    s = _train(tmp_path, "--in-process", *args)
    assert "with cumulative in this process" in capsys.readouterr().err
    reference = train_local(_config(*args)).summary
    assert s["workers"] == 1 and "bytes_sent" not in s          # no engine: no workers, nothing sent
    assert _losses(s) == [h.train_loss for h in reference.history]
    assert s["test_accuracy"] == reference.test_accuracy and s["samples_processed"] == 256


@pytest.mark.parametrize("flag", [["--checkpoint-dir", "ck"], ["--resume"]], ids=["checkpoint-dir", "resume"])
def test_train_in_process_refuses_checkpoints(flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--in-process", *SMALL, *flag]) == 2
    assert "--checkpoint-dir and --resume need the engine; drop --in-process" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# -- training flags -------------------------------------------------------------------

def test_seed_decides_the_run_and_defaults_to_0(tmp_path):
    runs = {name: _train(tmp_path, "--in-process", *SMALL, *extra, name=f"{name}.json")
            for name, extra in [("7", ["--seed", "7"]), ("7 again", ["--seed", "7"]), ("default", []),
                                ("0", ["--seed", "0"])]}
    assert _losses(runs["7"]) == _losses(runs["7 again"])
    assert _losses(runs["default"]) == _losses(runs["0"]) != _losses(runs["7"])


def test_lr_schedule_cosine_by_default_and_constant_on_request(tmp_path):
    """The arithmetic of each schedule is checked in tests/unit/test_bp_family.py; here,
    that the flag picks it."""
    runs = {name: _train(tmp_path, "--in-process", *SMALL, "--epochs", "2", *extra, name=f"{name}.json")
            for name, extra in [("default", []), ("cosine", ["--lr-schedule", "cosine"]),
                                ("constant", ["--lr-schedule", "constant"])]}
    assert _losses(runs["default"]) == _losses(runs["cosine"]) != _losses(runs["constant"])
    constant = train_local(_config(*SMALL, "--epochs", "2", "--lr-schedule", "constant")).summary
    assert _losses(runs["constant"]) == [h.train_loss for h in constant.history]


@pytest.mark.parametrize("where", ["--in-process", "--local"])
def test_eval_every_evaluates_every_nth_epoch_and_the_last(where, tmp_path, capsys):
    """`--eval-every 2 --epochs 3`: epochs 2 and 3 are evaluated, in the progress lines,
    the metrics log and the summary (whose history keeps epoch 1, with no test accuracy);
    on the engine and in the process alike."""
    from streamnet.cli.metrics_log import read
    log = tmp_path / "m.jsonl"
    s = _train(tmp_path, where, *SMALL, "--epochs", "3", "--eval-every", "2", "--metrics-log", str(log))
    err = capsys.readouterr().err
    assert "epoch 2/3  " in err and "epoch 3/3  " in err and "epoch 1/3  " not in err, err
    evaluated = [r for r in read(str(log)) if r["kind"] == "epoch"]
    assert [r["epoch"] for r in evaluated] == [2, 3]
    assert [h["epoch"] for h in s["history"]] == [1, 2, 3] and s["history"][0]["test_accuracy"] is None
    assert [h["test_accuracy"] for h in s["history"][1:]] == [r["test_accuracy"] for r in evaluated]
    assert s["test_accuracy"] == evaluated[-1]["test_accuracy"]
    # each round line names its step and the run's samples so far, in the process as on the
    # engine (the in-process trainer's had neither)
    rounds = [r for r in read(str(log)) if r["kind"] == "round"]
    assert rounds and all(isinstance(r.get("step"), int) and isinstance(r.get("samples"), int) for r in rounds)
    assert [r["step"] for r in rounds] == sorted(r["step"] for r in rounds)
    assert [r["samples"] for r in rounds] == sorted(r["samples"] for r in rounds)
    if where == "--in-process":        # every round; the engine's client reads a sample of them
        assert sorted({r["step"] for r in rounds}) == list(range(1, s["sync_rounds"] + 1))
        assert rounds[-1]["samples"] == s["samples_processed"]
    else:
        assert rounds[-1]["samples"] <= s["samples_processed"]


def test_threads_are_the_embedded_workers_compute_threads(tmp_path, monkeypatch):
    """`--threads T` on the embedded cluster of K workers (one per unit): T // K compute
    threads each; by default one per unit; `auto`: the cores this process may run on,
    divided among the workers, which the balancer may then change (as `streamnet-worker
    --threads auto`)."""
    from streamnet.runtime import LocalCluster
    pools, enter = [], LocalCluster.__enter__

    def spy(self):
        cluster = enter(self)
        pools.append([(w.pool.size, w.threads_auto) for w in cluster.workers])
        return cluster
    monkeypatch.setattr(LocalCluster, "__enter__", spy)
    _train(tmp_path, *SMALL, "--threads", "4", name="four.json")
    _train(tmp_path, *SMALL, name="default.json")
    _train(tmp_path, *SMALL, "--threads", "auto", name="auto.json")
    per_worker = max(1, len(os.sched_getaffinity(0)) // 2)
    assert pools == [[(2, False)] * 2, [(1, False)] * 2, [(per_worker, True)] * 2]


@pytest.mark.parametrize("size", ["64", "224"])
def test_model_alexnet_at_its_input_size(size, tmp_path):
    s = _train(tmp_path, "--in-process", "--model", "alexnet", "--input-size", size, "--algorithm", "cumulative",
               "--dataset", "synthetic", "--train-limit", "8", "--test-limit", "8", "--batch", "8", "--epochs", "1",
               "--workers", "1")
    # counted by hand: 1-channel AlexNet convs (3,723,968 at 224) with fc 6400-4096-4096-10 at 224,
    # 4096-1024-1024-10 at 64 (its conv stack ends at 4x4)
    assert s["model"] == "alexnet" and s["num_params"] == {"64": 7703242, "224": 46764746}[size]
    assert np.isfinite(_losses(s)).all()


def test_model_alexnet_refuses_another_input_size(capsys):
    assert main(["train", "--in-process", "--model", "alexnet", "--input-size", "100", *SMALL]) == 2
    assert "error: --input-size must be 64 or 224 for alexnet; got 100" in capsys.readouterr().err


def _idx_dir(path, train: int, test: int):
    from streamnet.data import synthetic, write_idx
    ds = synthetic(train_size=train, test_size=test, seed=1)
    path.mkdir()
    write_idx(path / "train-images-idx3-ubyte", ds.train.images)
    write_idx(path / "train-labels-idx1-ubyte", ds.train.labels.astype(np.uint8))
    write_idx(path / "t10k-images-idx3-ubyte", ds.test.images)
    write_idx(path / "t10k-labels-idx1-ubyte", ds.test.labels.astype(np.uint8))
    return path


def test_data_directory_from_streamnet_data_unless_data_is_given(tmp_path, monkeypatch, capsys):
    data = _idx_dir(tmp_path / "idx", train=96, test=32)
    args = ["--in-process", "--dataset", "mnist", "--epochs", "1", "--workers", "1", "--batch", "16"]
    monkeypatch.setenv("STREAMNET_DATA", str(data))
    s = _train(tmp_path, *args, name="env.json")
    assert s["dataset"] == "mnist" and s["samples_processed"] == 96
    monkeypatch.setenv("STREAMNET_DATA", str(tmp_path / "nowhere"))
    assert _train(tmp_path, *args, "--data", str(data), name="flag.json")["samples_processed"] == 96
    capsys.readouterr()
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "nowhere") in err and "does not exist" in err


# -- checkpoints and resume on the embedded cluster ------------------------------------

def test_train_checkpoint_dir_then_resume_with_more_epochs(tmp_path, capsys):
    """`train --checkpoint-dir` writes a checkpoint at each epoch's end; `train --resume`
    with `--epochs` raised continues from the newest and ends where an uninterrupted
    run of that length ends (a constant learning rate: the cosine schedule spans the
    run, so a longer run has another; static balance: under load balancing the units'
    shares follow their measured speeds, which differ from run to run)."""
    ck = tmp_path / "ck"
    args = [*SMALL, "--algorithm", "mixbp", "--sync-period", "2", "--outer-momentum", "0.5", "--lr-schedule",
            "constant", "--balance", "static", "--checkpoint-dir", str(ck)]
    first = _train(tmp_path, *args, "--epochs", "2", name="first.json")
    assert first["sync_rounds"] == 8                  # 128 samples per unit, b = 16, H = 2: 4 rounds per epoch
    assert [step for step, _ in list_checkpoints(str(ck), "lenet5-mixbp")] == [8, 4]
    capsys.readouterr()
    second = _train(tmp_path, *args, "--epochs", "3", "--resume", name="second.json")
    assert "resumed from step 8" in capsys.readouterr().err
    assert second["resumed_from_step"] == 8 and second["sync_rounds"] == 12
    assert second["epoch_samples"] == {"1": 256, "2": 256, "3": 256} and second["each_sample_counted_once"] is True
    (step, newest), *_ = list_checkpoints(str(ck), "lenet5-mixbp")
    assert step == 12
    reference = train_local(_config(*args, "--epochs", "3")).params
    np.testing.assert_allclose(read_checkpoint(newest), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("where", ["--in-process", "--local"])
def test_a_run_that_diverges_ends_at_once_saying_so(where, capsys):
    """A learning rate far too large: the run stops within its first rounds with exit 1 and
    the reason, in the process or on the embedded cluster (its sync task fails the
    topology, which train kills), instead of training on to its end at chance accuracy."""
    args = ["--dataset", "synthetic", "--train-limit", "4096", "--test-limit", "64", "--epochs", "2", "--lr", "50"]
    assert main(["train", where, *args]) == 1
    err = capsys.readouterr().err
    assert "training diverged: unit" in err and "rounds in a row" in err and "try a smaller learning rate" in err
    assert "epoch 2/2" not in err
