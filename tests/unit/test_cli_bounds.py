"""Values out of range refused in one line before anything runs (--input-size, --ui,
--timeout), exit codes as the README gives them, and the smaller CLI nits of the same
review (plot of a record without its figure, --data's lookup order, a training flag on
an example topology)."""
import pytest

from streamnet.cli import submit
from streamnet.cli.common import error_exit
from streamnet.runtime.control import ClusterTimeout, TopologyGone
from streamnet.training.config import LENET5_MAX_INPUT, LENET5_MIN_INPUT

from tests.unit.test_cli_mistakes import UNREACHABLE_ZK, one_line_error, run_main

SHORT = ["--dataset", "synthetic", "--epochs", "1", "--train-limit", "64", "--test-limit", "64"]


@pytest.mark.parametrize("size", ["3", "0", str(LENET5_MIN_INPUT - 1)])
@pytest.mark.parametrize("where", [["--in-process"], []])
def test_lenet5_input_size_too_small_is_refused_naming_the_flag(size, where, capsys):
    assert run_main(submit.main, ["train", *where, "--input-size", size, *SHORT]) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert line.startswith(f"streamnet-submit: error: --input-size must be >= {LENET5_MIN_INPUT} for lenet5"), line
    assert line.endswith(f"got {size}")


def test_lenet5_input_size_from_set_is_refused(capsys):
    assert run_main(submit.main, ["describe", "lenet5-mixbp", "--set", "input_size=-5",
                                  "--set", "dataset=synthetic"]) == 2
    assert one_line_error(capsys, "streamnet-submit").startswith(
        f"streamnet-submit: error: --set input_size must be >= {LENET5_MIN_INPUT} for lenet5")


def test_lenet5_smallest_input_is_the_networks():
    """LENET5_MIN_INPUT is worked out in the configuration: the network agrees."""
    from streamnet.nn.zoo import lenet5
    from streamnet.training.config import ModelConfig
    lenet5(input_size=LENET5_MIN_INPUT)
    with pytest.raises(ValueError):
        lenet5(input_size=LENET5_MIN_INPUT - 1)
    assert ModelConfig(name="lenet5", options={"input_size": LENET5_MIN_INPUT}).input_size == LENET5_MIN_INPUT


def test_input_size_help_covers_both_networks(capsys):
    assert run_main(submit.main, ["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"LeNet-5 takes N from {LENET5_MIN_INPUT} to {LENET5_MAX_INPUT}" in out and "AlexNet 64 or 224" in out


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_train_ui_port_is_checked_before_the_cluster_starts(port, capsys):
    assert run_main(submit.main, ["train", "--ui", port, *SHORT]) == 2
    assert "argument --ui: must be from 0 to 65535" in one_line_error(capsys, "streamnet-submit train")


@pytest.mark.parametrize("e", [ClusterTimeout("timed out after 5.0 s waiting for topology 't' to finish"),
                               TopologyGone("topology 't' was killed before it finished")])
def test_timed_out_or_stopped_before_its_end_exits_1(e, capsys):
    """README: "1 a run that ... timed out or was stopped before its end"."""
    assert error_exit("streamnet-submit", e) == 1
    assert one_line_error(capsys, "streamnet-submit").endswith(str(e))


@pytest.mark.parametrize("argv", [
    ["submit", "wordcount", "--wait", "--timeout", "0"],
    ["submit", "wordcount", "--wait", "--timeout", "-5"],
    ["kill", "t", "--timeout", "0"],
    ["kill", "t", "--timeout", "-1"],
    ["kill", "t", "--timeout", "inf"],          # kazoo and Event.wait overflow on it
    ["kill", "t", "--timeout", "nan"],
])
def test_timeouts_must_be_positive(argv, capsys):
    assert run_main(submit.main, argv + ["--zk", UNREACHABLE_ZK]) == 2
    line = one_line_error(capsys, f"streamnet-submit {argv[0]}")
    assert "argument --timeout: must be a finite number > 0" in line


def test_plot_of_an_epoch_record_without_test_accuracy_names_the_line(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    path.write_text('{"kind": "round", "epoch": 1, "round": 1, "loss": 1.0, "samples_per_s": 5.0, "elapsed_s": 1}\n'
                    '{"kind": "epoch", "epoch": 1, "elapsed_s": 2}\n')
    assert run_main(submit.main, ["plot", str(path)]) == 2
    assert f"error: {path}:2: epoch record with no test_accuracy" in one_line_error(capsys, "streamnet-submit")


def test_data_help_gives_the_lookup_order(capsys):
    assert run_main(submit.main, ["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: $STREAMNET_DATA, else the dataset's installed location)" in out


def test_a_training_flag_on_an_example_is_named(capsys):
    assert run_main(submit.main, ["submit", "wordcount", "--workers", "3", "--zk", UNREACHABLE_ZK]) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert "wordcount does not take --workers" in line and "'units'" not in line
    assert "count" in line      # its options are still listed


def test_log_level_goes_before_or_after_the_subcommand():
    from streamnet.cli.submit import build_parser
    p = build_parser()
    assert p.parse_args(["list", "--log-level", "debug"]).log_level == "DEBUG"
    assert p.parse_args(["--log-level", "info", "status", "x"]).log_level == "INFO"
    assert p.parse_args(["--log-level", "info", "list", "--log-level", "error"]).log_level == "ERROR"
    assert p.parse_args(["list"]).log_level == "WARNING"              # the default stays the top level's


@pytest.mark.parametrize("args, why", [
    (["run-example", "wordcount", "--set", "count=-5"], "wordcount's count must be >= 0; got -5"),
    (["submit", "wordcount", "--set", "count=100000000", "--zk", "127.0.0.1:1"],
     "wordcount's count must be at most 100,000"),
    (["describe", "wordcount", "--set", "delay_s=-1"], "wordcount's delay_s must be >= 0; got -1"),
    (["run-example", "tensor_pipe", "--set", "size=0"], "tensor_pipe takes count >= 0 and size >= 1"),
])
def test_an_example_option_out_of_range_is_refused(args, why, capsys):
    assert run_main(submit.main, args) == 2                    # count=-5 ran, and said "OK: 0 words counted"
    assert why in one_line_error(capsys, "streamnet-submit")
