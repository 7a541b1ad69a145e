"""Inputs a review found accepted where they should be refused, or refused with a
traceback: each is now one clear line (or a clear DataError/ExportError), before
anything is built or connected to."""
import json
import os

import numpy as np
import pytest

from streamnet.cli import cluster_commands, submit, worker
from streamnet.cli.metrics_log import MetricsLog
from streamnet.data import write_idx
from streamnet.data import datasets
from streamnet.errors import ConfigError, DataError, StreamnetError
from streamnet.nn.layers import Dropout
from streamnet.training.config import LENET5_MAX_INPUT, MAX_SEED, RunConfig

from tests.unit.test_cli_mistakes import UNREACHABLE_ZK, one_line_error, run_main
from tests.unit.test_data_hostile import _load

SHORT = ["--dataset", "synthetic", "--epochs", "1", "--train-limit", "64", "--test-limit", "64"]


# -- the seed ------------------------------------------------------------------------

@pytest.mark.parametrize("where", [["--in-process"], []])
def test_a_seed_too_large_for_the_dropout_streams_is_refused_naming_the_flag(where, capsys):
    assert run_main(submit.main, ["train", *where, "--seed", str(MAX_SEED), *SHORT]) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert line.endswith(f"--seed must be < {MAX_SEED} (2**31); got {MAX_SEED}"), line


def test_the_largest_seed_allowed_makes_a_run_configuration():
    assert RunConfig(seed=MAX_SEED - 1).seed == MAX_SEED - 1
    with pytest.raises(ConfigError):
        RunConfig(seed=MAX_SEED)


def test_dropout_takes_any_seed_and_keeps_the_stream_of_the_seeds_it_had():
    """A seed of 2**32 gave a key numba could not type: the first step raised a
    TypingError. The masks of smaller seeds are what they were: (seed << 32) + step."""
    from streamnet import kernels as K
    x = np.ones((4, 64), np.float32)
    for seed in (0, 7, MAX_SEED + 1, 2**32, 2**40):     # the model's dropout seeds are the run's + 1 and + 2
        layer = Dropout(0.5, seed=seed)
        layer.forward(x, train=True)
        out = layer.forward(x, train=True)              # step 1
        assert out.shape == x.shape and 0 < (out == 0).mean() < 1
        if seed < MAX_SEED:
            np.testing.assert_array_equal(out, K.dropout_forward(x, 0.5, (seed << 32) + 1, 0)[0])


# -- text where text is wanted ----------------------------------------------------------

@pytest.mark.parametrize("setting", ["data_dir=[1]", "data_dir=7", "lr_schedule=3", "balance=true"])
def test_set_of_a_text_setting_to_something_else_is_one_line(setting, capsys):
    assert run_main(submit.main, ["describe", "lenet5-mixbp", "--set", setting]) == 2
    key, value = setting.split("=")
    assert f"--set {key} takes text; got " in one_line_error(capsys, "streamnet-submit")


# -- the ZooKeeper session timeout ------------------------------------------------------

@pytest.mark.parametrize("main,prog,argv", [
    (submit.main, "streamnet-submit list", ["list"]),
    (worker.main, "streamnet-worker", []),
])
@pytest.mark.parametrize("value", ["1e306", "3601"])
def test_a_session_timeout_past_the_bound_is_refused_before_connecting(main, prog, argv, value, capsys):
    """1e306 overflowed kazoo's milliseconds (a traceback); 2.2 million seconds made a
    connect packet it could not write, and the command hung."""
    assert run_main(main, [*argv, "--zk", UNREACHABLE_ZK, "--session-timeout", value]) == 2
    line = one_line_error(capsys, prog)
    assert "argument --session-timeout: must be at most 3600 seconds" in line and f"got {value}" in line, line


# -- LeNet-5's input size ---------------------------------------------------------------

@pytest.mark.parametrize("where", [["--in-process"], []])
def test_lenet5_input_size_too_large_is_refused_naming_the_flag(where, capsys):
    size = str(LENET5_MAX_INPUT + 1)
    assert run_main(submit.main, ["train", *where, "--input-size", size, *SHORT]) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert line.startswith(f"streamnet-submit: error: --input-size must be <= {LENET5_MAX_INPUT} for lenet5"), line


def test_lenet5_largest_input_builds():
    from streamnet.nn.zoo import lenet5
    assert lenet5(input_size=LENET5_MAX_INPUT).num_params < 40_000_000


@pytest.mark.parametrize("size", ["100000", "0"])
def test_export_of_bare_parameters_refuses_an_input_size_the_network_cannot_take(size, tmp_path, capsys):
    """100,000 built a 1.2-million-million-parameter layer (a MemoryError traceback); 0
    was taken as no size at all."""
    from streamnet.nn.zoo import lenet5
    from streamnet.training.checkpoint import write_checkpoint
    ck = write_checkpoint(str(tmp_path), "bare", 1, lenet5().params)["path"]
    assert run_main(submit.main, ["export", ck, str(tmp_path / "w.safetensors"), "--model", "lenet5",
                                  "--input-size", size]) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert f"--model lenet5 --input-size {size}: must be " in line, line


# -- submit's paths -----------------------------------------------------------------------

def test_submit_sends_its_relative_paths_as_absolute_ones(monkeypatch, tmp_path, capsys):
    """Workers read a path as it stands, from their own working directory (a systemd
    unit's is /): a relative --data or --checkpoint-dir is the submitting command's."""
    seen = {}

    def build_topology(name, options, flags):
        seen.update(options)
        raise StreamnetError("built")
    monkeypatch.setattr(cluster_commands, "build_topology", build_topology)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    assert run_main(submit.main, ["submit", "lenet5-mixbp", "--zk", UNREACHABLE_ZK, "--data", "data",
                                  "--checkpoint-dir", "ck"]) != 0
    assert "built" in capsys.readouterr().err
    assert seen["data_dir"] == os.path.join(str(tmp_path), "data")
    assert seen["checkpoint_dir"] == os.path.join(str(tmp_path), "ck")


# -- IDX datasets: sizes and pixel statistics -------------------------------------------------

def _image_dir(d, train, test=None):
    test = train[:2] if test is None else test
    write_idx(d / "train-images-idx3-ubyte", train)
    write_idx(d / "t10k-images-idx3-ubyte", test)
    write_idx(d / "train-labels-idx1-ubyte", np.zeros(len(train), ">i4"))
    write_idx(d / "t10k-labels-idx1-ubyte", np.zeros(len(test), ">i4"))


def test_pixel_statistics_are_numpys_summed_a_chunk_at_a_time(monkeypatch):
    monkeypatch.setattr(datasets, "_STATS_CHUNK", 1000)     # many chunks, one partial
    images = np.random.default_rng(1).integers(0, 256, (37, 9, 9)).astype(np.uint8)
    mean, std = datasets.pixel_stats(images)
    assert mean == pytest.approx(images.mean() / 255, rel=1e-12)
    assert std == pytest.approx(images.std() / 255, rel=1e-9)
    floats = images.astype(np.float32)
    floats[0, 0, 0], floats[3, 1, 2] = np.nan, -np.inf
    finite = floats[np.isfinite(floats)].astype(np.float64)
    assert datasets.pixel_stats(floats) == pytest.approx((finite.mean() / 255, finite.std() / 255), rel=1e-9)
    assert datasets.pixel_stats(np.full((2, 3, 3), 9, np.uint8)) == (9 / 255, 1.0)    # constant: std 1


def test_float_pixels_near_float32s_largest_make_finite_statistics_and_inputs(tmp_path):
    """Summed in float32, pixels of 1e20 made the std infinite (every input 0) and pixels
    near 3e38 the mean (every input NaN: the run ended "diverged")."""
    images = np.random.default_rng(2).uniform(0, 3e38, (4, 8, 8)).astype(">f4")
    _image_dir(tmp_path, images)
    ds = _load(tmp_path, "idx")
    assert np.isfinite(ds.mean) and np.isfinite(ds.std) and ds.std > 0
    x, _ = ds.batch(ds.train, np.arange(4))
    assert np.isfinite(x).all() and x.std() > 0.1


@pytest.mark.parametrize("bound,value,images,says", [
    ("MAX_SIDE", 16, (3, 17, 17), "images of 17x17 pixels; at most 16x16"),
    ("MAX_SAMPLES", 5, (6, 8, 8), "6 images; at most 5 in one file"),
])
def test_images_larger_or_more_than_the_bounds_are_refused(bound, value, images, says, tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, bound, value)
    _image_dir(tmp_path, np.zeros(images, np.uint8))
    with pytest.raises(DataError) as err:
        _load(tmp_path, "idx")
    assert f"train-images-idx3-ubyte: {says}" in str(err.value)


# -- the metrics log ----------------------------------------------------------------------

def _strict(line: str) -> dict:
    def refuse(name):
        raise AssertionError(f"{name} in a JSON line: {line}")
    return json.loads(line, parse_constant=refuse)


def test_a_metrics_log_writes_figures_that_are_not_finite_as_null(tmp_path):
    path = tmp_path / "m.jsonl"
    log = MetricsLog(str(path))
    log.write("round", epoch=1, round=1, epoch_rounds=2, loss=float("nan"), samples_per_s=5.0, elapsed_s=1.0)
    log.write("round", epoch=1, round=2, epoch_rounds=2, loss=float("inf"), samples_per_s=6.0, elapsed_s=2.0)
    log.write("epoch", epoch=1, test_accuracy=0.1, loss=float("-inf"), elapsed_s=2.0)
    log.close()
    records = [_strict(line) for line in path.read_text().splitlines()]
    assert [r["loss"] for r in records] == [None, None, None]
    assert records[0]["samples_per_s"] == 5.0


def test_plot_draws_a_log_with_null_figures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "m.jsonl"
    path.write_text('{"kind": "round", "epoch": 1, "round": 1, "loss": 2.0, "samples_per_s": 5.0, "elapsed_s": 1}\n'
                    '{"kind": "round", "epoch": 1, "round": 2, "loss": null, "samples_per_s": 5.0, "elapsed_s": 2}\n'
                    '{"kind": "epoch", "epoch": 1, "test_accuracy": 0.1, "elapsed_s": 2}\n')
    assert run_main(submit.main, ["plot", str(path)]) == 0
    assert (tmp_path / "m.png").stat().st_size > 0


ROUND = '{"kind": "round", "epoch": 1, "round": 1, "loss": 2.0, "samples_per_s": 5.0, "elapsed_s": 1}\n'


@pytest.mark.parametrize("content,out,says", [
    (os.urandom(64) + b"\xff\xfe", None, "is not a --metrics-log file (not UTF-8 text)"),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", None, ":1: not a --metrics-log record (nested too deeply)"),
    (ROUND.replace('"elapsed_s": 1', '"elapsed_s": "abc"').encode(), None, "elapsed_s 'abc', not a number"),
    (ROUND.encode(), "x.txt", "Format 'txt' is not supported"),
])
def test_plot_of_a_file_it_cannot_draw_is_one_line(content, out, says, tmp_path, capsys):
    """Each was a traceback (UnicodeDecodeError, RecursionError, matplotlib's ValueError), or
    (a string as a round's time) drawn as a category."""
    pytest.importorskip("matplotlib")
    path = tmp_path / "m.jsonl"
    path.write_bytes(content)
    argv = ["plot", str(path)] + (["--out", str(tmp_path / out)] if out else [])
    assert run_main(submit.main, argv) == 2
    assert says in one_line_error(capsys, "streamnet-submit")


# -- parallelism that is a bool -------------------------------------------------------------

def test_a_bool_is_not_a_parallelism():
    from streamnet.runtime.topology import TopologyBuilder, TopologyError
    with pytest.raises(TopologyError, match="parallelism must be an integer >= 1; got True"):
        TopologyBuilder("t").add_spout("s", "streamnet.examples.wordcount:SentenceSpout", parallelism=True)


@pytest.mark.parametrize("what", [":", ":foo", "a:b:c"])
def test_a_topology_path_without_a_module_or_a_name_is_one_line(what, capsys):
    """":foo" was importlib's ValueError (Empty module name), shown as a traceback."""
    assert run_main(submit.main, ["describe", what]) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert f"topology {what!r}: a path must be 'package.module:Class' (a topology function's " in line, line
