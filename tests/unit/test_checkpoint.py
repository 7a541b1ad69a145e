import os
import re

import numpy as np
import pytest

from streamnet.training.checkpoint import (CheckpointError, latest_checkpoint, load_checkpoint, read_checkpoint,
                                          write_checkpoint)


def test_round_trip_and_pointer(tmp_path):
    p = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    ptr = write_checkpoint(str(tmp_path), "run", 7, p)
    assert ptr["step"] == 7 and ptr["path"].endswith("run-00000007.ckpt")
    assert ptr["bytes"] == (tmp_path / "run-00000007.ckpt").stat().st_size
    np.testing.assert_array_equal(read_checkpoint(ptr["path"], ptr["sha256"]), p)
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]


def test_corrupt_checkpoint_is_refused(tmp_path):
    ptr = write_checkpoint(str(tmp_path), "run", 1, np.ones(100, np.float32))
    raw = bytearray(open(ptr["path"], "rb").read())
    raw[-5] ^= 0xFF
    open(ptr["path"], "wb").write(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt"):
        read_checkpoint(ptr["path"])
    (tmp_path / "junk.ckpt").write_bytes(b"hello")
    with pytest.raises(CheckpointError, match="not a streamnet checkpoint"):
        read_checkpoint(str(tmp_path / "junk.ckpt"))


def test_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    first = write_checkpoint(str(tmp_path), "run", 1, np.ones(10, np.float32))
    import errno
    import os

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device"):
        write_checkpoint(str(tmp_path), "run", 2, np.zeros(10, np.float32))
    monkeypatch.undo()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["run-00000001.ckpt"]  # no temp file left
    np.testing.assert_array_equal(read_checkpoint(first["path"]), np.ones(10))
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        write_checkpoint(str(tmp_path / "a-file" / "sub"), "run", 3, np.ones(10, np.float32))


def test_full_state_round_trip(tmp_path):
    state = {"position": {"epoch": 1, "round": 3, "step": 11}, "outer": {"velocity": np.arange(5, dtype=np.float32)},
             "units": {"0": {"velocity": np.ones(5, np.float32), "random": [4, 9]}, "1": {"velocity": None, "random": []}}}
    ptr = write_checkpoint(str(tmp_path), "run", 11, np.zeros(5, np.float32), state)
    ck = load_checkpoint(ptr["path"])
    assert ck["step"] == 11 and ck["sha256"] == ptr["sha256"] and ck["state"]["position"]["round"] == 3
    np.testing.assert_array_equal(ck["state"]["outer"]["velocity"], np.arange(5))
    assert ck["state"]["units"]["0"]["random"] == [4, 9] and ck["state"]["units"]["1"]["velocity"] is None


def test_latest_skips_corrupt_and_params_only_checkpoints(tmp_path, caplog):
    good = write_checkpoint(str(tmp_path), "run", 2, np.ones(3, np.float32), {"position": {}})
    write_checkpoint(str(tmp_path), "run", 3, np.ones(3, np.float32))               # parameters only
    bad = write_checkpoint(str(tmp_path), "run", 4, np.ones(3, np.float32), {"position": {}})
    raw = bytearray(open(bad["path"], "rb").read())
    raw[-3] ^= 0x55
    open(bad["path"], "wb").write(bytes(raw))
    write_checkpoint(str(tmp_path), "other", 9, np.ones(3, np.float32), {"position": {}})
    path, ck = latest_checkpoint(str(tmp_path), "run")
    assert path == good["path"] and ck["step"] == 2
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "run-00000004.ckpt is corrupt" in messages and "parameters only" in messages
    with pytest.raises(CheckpointError, match="no checkpoint of 'none'"):
        latest_checkpoint(str(tmp_path), "none")


@pytest.mark.parametrize("state", [{"config": {}}, {"position": {"step": 1, "epoch": 0, "round": 1}},
                                   {"config": {}, "position": {"step": "1", "epoch": 0, "round": 1}}])
def test_resuming_from_a_checkpoint_without_a_run_position_is_a_clear_error(tmp_path, state):
    from streamnet.training.checkpoint import CheckpointError, write_checkpoint
    from streamnet.training.config import lenet5_mixbp
    from streamnet.training.nsmap import resume_point
    p = write_checkpoint(str(tmp_path), "run", 1, np.zeros(4, np.float32), state, key=b"k" * 32)["path"]
    with pytest.raises(CheckpointError, match="holds no run configuration and position"):   # was a KeyError
        resume_point(lenet5_mixbp(), None, "run", path=p)


def test_resuming_a_run_with_no_epoch_left_is_a_clear_error(tmp_path):
    """The same command again after a run ended trained nothing and reported 0 %."""
    from dataclasses import replace

    from streamnet.training.checkpoint import CheckpointError, write_checkpoint
    from streamnet.training.config import lenet5_mixbp, run_config_to_dict
    from streamnet.training.nsmap import resume_point
    cfg = replace(lenet5_mixbp(), epochs=3)
    state = {"config": run_config_to_dict(cfg), "position": {"step": 30, "epoch": 3, "round": 0}}
    p = write_checkpoint(str(tmp_path), "run", 30, np.zeros(4, np.float32), state, key=b"k" * 32)["path"]
    with pytest.raises(CheckpointError, match="written after epoch 3: with --epochs 3 nothing is left to train; "
                                              "give more than 3 epochs to go on"):
        resume_point(cfg, None, "run", path=p)
    assert resume_point(replace(cfg, epochs=4), None, "run", path=p)["epoch"] == 3


def test_resume_compares_what_the_settings_mean_and_names_both_values(tmp_path, monkeypatch):
    """The default data directory given with --data was refused as 'different data', and the
    message showed only the saved value; --test-limit and --eval-every, which do not touch
    the training, were refused too."""
    from dataclasses import replace

    from streamnet.data.datasets import DEFAULT_DIRS
    from streamnet.training.checkpoint import CheckpointError, write_checkpoint
    from streamnet.training.config import lenet5_mixbp, run_config_to_dict
    from streamnet.training.nsmap import resume_point
    monkeypatch.delenv("STREAMNET_DATA", raising=False)
    cfg = replace(lenet5_mixbp(), epochs=3)
    state = {"config": run_config_to_dict(cfg), "position": {"step": 10, "epoch": 1, "round": 0}}
    p = write_checkpoint(str(tmp_path), "run", 10, np.zeros(4, np.float32), state, key=b"k" * 32)["path"]
    same = replace(cfg, data=replace(cfg.data, data_dir=DEFAULT_DIRS["fashion-mnist"] + "/", test_limit=500),
                   eval_every_epochs=2)
    assert resume_point(same, None, "run", path=p)["step"] == 10
    lr = cfg.algorithm.lr
    other = replace(cfg, algorithm=replace(cfg.algorithm, lr=lr * 2), data=replace(cfg.data, data_dir=str(tmp_path)))
    with pytest.raises(CheckpointError, match=re.escape(
            f"different settings: algorithm.lr {lr!r} (now {lr * 2!r}), data.data_dir "
            f"{os.path.realpath(DEFAULT_DIRS['fashion-mnist'])!r} (now {os.path.realpath(tmp_path)!r}); resume "
            "with the same settings")):
        resume_point(other, None, "run", path=p)


def _resuming(directory, point: dict) -> dict:
    """What set_aside_for_resume reads of a topology that resumes `point` (build_topology's
    sync and checkpoint components)."""
    return {"name": "run", "components": [{"id": "sync", "config": {"resume": point}},
                                          {"id": "checkpoint", "config": {"dir": str(directory)}}]}


def test_resuming_from_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path, caplog):
    """`--resume FILE` of an older step left the newer checkpoints in place: retention, which
    goes by step, removed the resumed run's own checkpoints first, and the next `--resume`
    continued the abandoned run. They are moved to DIR/superseded, nothing deleted - when
    the run is submitted, not when the resume point is checked (a review found a submit that
    then failed, a run of that name still going, and `describe` had moved them)."""
    from dataclasses import replace

    from streamnet.training.checkpoint import list_checkpoints
    from streamnet.training.config import lenet5_mixbp, run_config_to_dict
    from streamnet.training.nsmap import resume_point, set_aside_for_resume
    cfg = replace(lenet5_mixbp(), epochs=9)
    paths = {}
    for epoch in (1, 2, 3):
        state = {"config": run_config_to_dict(cfg), "position": {"step": 10 * epoch, "epoch": epoch, "round": 0}}
        paths[epoch] = write_checkpoint(str(tmp_path), "run", 10 * epoch, np.full(4, epoch, np.float32), state)["path"]
    other = write_checkpoint(str(tmp_path), "run-b", 40, np.zeros(4, np.float32))["path"]  # another run's: untouched
    point = resume_point(cfg, str(tmp_path), "run", path=paths[1])
    assert point["step"] == 10
    assert [s for s, _ in list_checkpoints(str(tmp_path), "run")] == [30, 20, 10]     # the check moves nothing
    set_aside_for_resume(_resuming(tmp_path, point))
    assert [s for s, _ in list_checkpoints(str(tmp_path), "run")] == [10]
    aside = tmp_path / "superseded"
    assert sorted(f.name for f in aside.iterdir()) == ["run-00000020.ckpt", "run-00000030.ckpt"]
    assert os.path.exists(other)
    assert "set aside the newer checkpoint" in caplog.text and "run-00000030.ckpt" in caplog.text
    # the resumed run writes on; a second resume takes its newest, and retention keeps its own
    for step in (11, 12, 13):
        write_checkpoint(str(tmp_path), "run", step, np.zeros(4, np.float32), None, keep=3)
    assert [s for s, _ in list_checkpoints(str(tmp_path), "run")] == [13, 12, 11]
    # a name already set aside is not overwritten
    write_checkpoint(str(tmp_path), "run", 20, np.zeros(4, np.float32))
    state = {"config": run_config_to_dict(cfg), "position": {"step": 13, "epoch": 1, "round": 3}}
    write_checkpoint(str(tmp_path), "run", 13, np.zeros(4, np.float32), state)
    point = resume_point(cfg, str(tmp_path), "run", path=str(tmp_path / "run-00000013.ckpt"))
    assert point["step"] == 13
    set_aside_for_resume(_resuming(tmp_path, point))
    assert sorted(f.name for f in aside.iterdir()) == ["run-00000020.ckpt", "run-00000020.ckpt.1", "run-00000030.ckpt"]
    np.testing.assert_array_equal(read_checkpoint(str(aside / "run-00000020.ckpt")), np.full(4, 2, np.float32))


def test_a_newer_checkpoint_that_cannot_be_set_aside_stops_the_resume(tmp_path, monkeypatch):
    from dataclasses import replace

    from streamnet.training.config import lenet5_mixbp, run_config_to_dict
    from streamnet.training.nsmap import resume_point, set_aside_for_resume
    cfg = replace(lenet5_mixbp(), epochs=9)
    state = {"config": run_config_to_dict(cfg), "position": {"step": 10, "epoch": 1, "round": 0}}
    old = write_checkpoint(str(tmp_path), "run", 10, np.zeros(4, np.float32), state)["path"]
    write_checkpoint(str(tmp_path), "run", 20, np.zeros(4, np.float32), state)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(os, "rename", refuse)
    point = resume_point(cfg, str(tmp_path), "run", path=old)
    with pytest.raises(CheckpointError, match="cannot set aside the checkpoints of 'run' newer than step 10 .*"
                                              "Permission denied"):
        set_aside_for_resume(_resuming(tmp_path, point))


def test_a_resume_that_is_not_submitted_moves_no_checkpoint(tmp_path, capsys):
    """`submit --resume FILE` that fails to reach the cluster, and `describe` of a resume:
    every checkpoint stays where it was (they set aside the newer ones, and a later plain
    --resume went on from the older step)."""
    from dataclasses import replace

    from streamnet.cli import submit
    from streamnet.training.checkpoint import list_checkpoints
    from streamnet.training.config import lenet5_mixbp, run_config_to_dict, with_overrides
    from tests.unit.test_cli_mistakes import UNREACHABLE_ZK, run_main
    cfg = replace(with_overrides(lenet5_mixbp(), {"dataset": "synthetic"}), epochs=9, balance="load")  # the CLI's
    paths = [write_checkpoint(str(tmp_path), "run", step, np.zeros(4, np.float32),
                              {"config": run_config_to_dict(cfg), "position": {"step": step, "epoch": 1, "round": 0}}
                              )["path"] for step in (10, 20, 30)]
    common = ["--name", "run", "--dataset", "synthetic", "--epochs", "9", "--checkpoint-dir", str(tmp_path),
              "--resume", paths[0]]
    assert run_main(submit.main, ["submit", "lenet5-mixbp", *common, "--zk", UNREACHABLE_ZK,
                                  "--session-timeout", "1"]) != 0
    assert "a cluster secret is required" in capsys.readouterr().err     # past the build, at connecting
    assert run_main(submit.main, ["describe", "lenet5-mixbp", "--set", "name=run", "--set", "dataset=synthetic",
                                  "--set", "epochs=9", "--set", f"checkpoint_dir={tmp_path}",
                                  "--set", f"resume={paths[0]}"]) == 0
    assert [s for s, _ in list_checkpoints(str(tmp_path), "run")] == [30, 20, 10]
    assert not (tmp_path / "superseded").exists()


def test_a_worker_with_a_checkpoint_root_writes_and_reads_under_it_only(tmp_path):
    # the directory a run checkpoints to and the file it resumes from are named by whoever
    # submits it: streamnet-worker --checkpoint-root bounds them
    from streamnet.training.checkpoint import confined_to
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    outside = write_checkpoint(str(elsewhere), "run", 1, np.zeros(4, np.float32))["path"]
    (root / "link").symlink_to(elsewhere)
    with confined_to(str(root)):
        inside = write_checkpoint(str(root / "runs"), "run", 2, np.ones(4, np.float32))["path"]
        np.testing.assert_array_equal(load_checkpoint(inside)["params"], np.ones(4, np.float32))
        for where in (str(elsewhere), str(root / ".." / "elsewhere"), str(root / "link"), str(tmp_path / "rootx")):
            with pytest.raises(CheckpointError,
                               match=f"is not under this worker's checkpoint root {re.escape(os.path.realpath(root))}"):
                write_checkpoint(where, "run", 3, np.zeros(4, np.float32))
        with pytest.raises(CheckpointError, match="is not under this worker's checkpoint root"):
            load_checkpoint(outside)
        with pytest.raises(CheckpointError, match="is not under this worker's checkpoint root"):
            load_checkpoint(str(root / "link" / os.path.basename(outside)))
    assert not (tmp_path / "rootx").exists() and sorted(os.listdir(elsewhere)) == [os.path.basename(outside)]
    load_checkpoint(outside)            # no root outside the block: anywhere


def test_an_empty_checkpoint_root_is_a_usage_error_not_anywhere(capsys):
    from streamnet.cli.worker import build_parser
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--zk", "z:1", "--checkpoint-root", ""])
    assert e.value.code == 2 and "--checkpoint-root: must be a directory; got an empty path" in capsys.readouterr().err
    assert build_parser().parse_args(["--zk", "z:1", "--checkpoint-root", "ck"]).checkpoint_root == os.path.abspath("ck")


def test_an_empty_checkpoint_root_variable_is_refused_too(monkeypatch, capsys):
    # worker.env's STREAMNET_CHECKPOINT_ROOT= overrides the systemd unit's root: it must not mean anywhere
    from streamnet.cli.worker import build_parser
    monkeypatch.setenv("STREAMNET_CHECKPOINT_ROOT", "")
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--zk", "z:1"])
    assert e.value.code == 2 and "$STREAMNET_CHECKPOINT_ROOT" in capsys.readouterr().err
    monkeypatch.delenv("STREAMNET_CHECKPOINT_ROOT")
    assert build_parser().parse_args(["--zk", "z:1"]).checkpoint_root is None
