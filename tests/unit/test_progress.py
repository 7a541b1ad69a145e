"""Progress of a training run (tqdm bars on a terminal, plain lines elsewhere), the
--metrics-log file, and `streamnet-submit plot`."""
import io
import json

import pytest

from streamnet.cli import submit
from streamnet.cli.metrics_log import MetricsLog, plot, read
from streamnet.cli.progress import RunProgress
from streamnet.errors import StreamnetError

from tests.unit.test_cli_mistakes import one_line_error, run_main


class Terminal(io.StringIO):
    def isatty(self):
        return True


def run(progress: RunProgress, epochs=3, rounds=4):
    """A run's updates: every round, an evaluation at each epoch's end."""
    for e in range(1, epochs + 1):
        for r in range(1, rounds + 1):
            progress.round(epoch=e, round=r, epoch_rounds=rounds, loss=1.0 / (e * r), samples_per_s=100.0 * e,
                           step=(e - 1) * rounds + r, samples=32 * ((e - 1) * rounds + r), elapsed_s=float(r))
        progress.epoch(epoch=e, test_accuracy=0.5 + 0.1 * e, loss=0.1, elapsed_s=float(e))
    progress.close()


def test_off_a_terminal_a_plain_line_per_update_and_every_epoch(tmp_path):
    out = io.StringIO()
    run(RunProgress(3, stream=out, log_interval=0.0))
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert len(lines) == 12 + 3
    assert lines[0].startswith("epoch 1/3: round 1/4  loss 1.0000  100 samples/s  whole run: 1/12 rounds")
    assert "whole run: 7/12 rounds" in lines[7] and "ETA" in lines[7]      # epoch 2, round 3
    assert lines[4].startswith("epoch 1/3  loss 0.1000  test acc 60.00%") and "(run: 4/12 rounds" in lines[4]
    assert lines[-1].startswith("epoch 3/3  loss 0.1000  test acc 80.00%")


def test_off_a_terminal_updates_are_rate_limited_but_epochs_are_not():
    out = io.StringIO()
    run(RunProgress(3, stream=out, log_interval=3600.0))
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + 3            # the first update, then only the epochs
    assert [line.split()[1] for line in lines[1:]] == ["1/3", "2/3", "3/3"]


def test_on_a_terminal_two_bars_with_etas():
    out = Terminal()
    progress = RunProgress(3, stream=out)
    progress.round(epoch=2, round=1, epoch_rounds=4, loss=0.5, samples_per_s=1234.0)   # a resumed run
    text = out.getvalue()
    assert "run" in text and "5/12 rounds" in text and "loss 0.5000, 1,234 samples/s" in text
    assert "epoch 2/3" in text and "1/4" in text
    progress.epoch(epoch=2, test_accuracy=0.9)
    assert "epoch 2/3  test acc 90.00%" in out.getvalue()
    progress.close()


def test_each_epoch_is_shown_and_logged_once(tmp_path):
    out, log = io.StringIO(), MetricsLog(str(tmp_path / "m.jsonl"))
    progress = RunProgress(2, stream=out, metrics_log=log)
    for _ in range(2):                    # seen by the progress poll, then again in the summary
        progress.epoch(epoch=1, test_accuracy=0.7)
    log.close()
    assert out.getvalue().count("test acc 70.00%") == 1
    assert [r["kind"] for r in read(str(tmp_path / "m.jsonl"))] == ["epoch"]


def test_the_metrics_log_has_a_line_per_round_and_per_epoch(tmp_path):
    path = str(tmp_path / "m.jsonl")
    log = MetricsLog(path)
    run(RunProgress(3, stream=io.StringIO(), metrics_log=log, log_interval=3600.0))
    log.close()
    records = [json.loads(line) for line in open(path)]
    rounds = [r for r in records if r["kind"] == "round"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["step"] for r in rounds] == list(range(1, 13))
    assert rounds[5] == {"kind": "round", "time": rounds[5]["time"], "epoch": 2, "round": 2, "epoch_rounds": 4,
                         "step": 6, "loss": 0.25, "samples": 192, "samples_per_s": 200.0, "elapsed_s": 2.0}
    assert [(r["epoch"], r["test_accuracy"]) for r in epochs] == [(1, 0.6), (2, 0.7), (3, 0.8)]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "m.jsonl")
    log = MetricsLog(path)
    run(RunProgress(3, stream=io.StringIO(), metrics_log=log))
    log.close()
    assert plot(path) == str(tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_what_is_not_a_metrics_log(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "round", "loss": 1}\nnot json\n')
    with pytest.raises(StreamnetError, match="bad.jsonl:2: not a JSON line"):
        read(str(bad))
    bad.write_text('{"loss": 1}\n')
    with pytest.raises(StreamnetError, match="bad.jsonl:1: not a --metrics-log record"):
        read(str(bad))
    assert run_main(submit.main, ["plot", str(tmp_path / "absent.jsonl")]) == 2
    assert "cannot read" in one_line_error(capsys, "streamnet-submit")


def test_metrics_log_path_is_checked_before_the_run(capsys):
    assert run_main(submit.main, ["train", "--dataset", "synthetic", "--metrics-log", "/no/such/dir/m.jsonl"]) == 2
    assert "--metrics-log /no/such/dir/m.jsonl: directory /no/such/dir does not exist" in \
        one_line_error(capsys, "streamnet-submit")


def test_two_evaluations_landing_between_reads_are_logged_in_epoch_order(tmp_path):
    from streamnet.training.cluster_run import ProgressReader
    from streamnet.training.run_stats import EVAL_HISTORY, PROGRESS

    class State:       # the results as a client reads them: both epochs evaluated since the last read
        def results(self, name):
            return {PROGRESS: {"epoch": 2, "round": 4, "rounds": 8, "epoch_rounds": 4, "samples": 256,
                               "loss": 0.3, "samples_per_s": 50.0},
                    EVAL_HISTORY: [{"epoch": 1, "test_accuracy": 0.6, "test_loss": 1.0},
                                   {"epoch": 2, "test_accuracy": 0.7, "test_loss": 0.8}]}
    path = str(tmp_path / "m.jsonl")
    progress = RunProgress(2, stream=io.StringIO(), metrics_log=MetricsLog(path))
    progress.record(ProgressReader(State(), "t", 2).read())
    progress.close()
    progress.log.close()
    assert [(r["epoch"], r["test_accuracy"]) for r in read(path) if r["kind"] == "epoch"] == [(1, 0.6), (2, 0.7)]


def test_an_epochs_line_takes_no_figures_of_a_round_of_another_epoch(tmp_path):
    """The progress record is the sync task's last (written at most every 0.5 s): an epoch 2
    line showed epoch 1 round 1's loss and the rate of the run's first second."""
    from streamnet.training.cluster_run import ProgressReader
    from streamnet.training.run_stats import EVAL_HISTORY, PROGRESS

    def lines(progress_record, epochs=3):
        class State:
            def results(self, name):
                return {PROGRESS: progress_record, EVAL_HISTORY: [{"epoch": 2, "test_accuracy": 0.6, "test_loss": 1.0}]}
        path = tmp_path / "m.jsonl"
        path.unlink(missing_ok=True)
        out = io.StringIO()
        progress = RunProgress(epochs, stream=out, metrics_log=MetricsLog(str(path)))
        progress.record(ProgressReader(State(), "t", epochs).read())
        progress.close()
        progress.log.close()
        return [r for r in read(str(path)) if r["kind"] == "epoch"]

    def line(progress_record):
        return lines(progress_record)[0]
    stale = line({"epoch": 1, "round": 1, "rounds": 1, "epoch_rounds": 4, "samples": 64, "loss": 2.3,
                  "samples_per_s": 2380.0})
    assert stale.get("loss") is None and stale.get("samples_per_s") is None and stale["test_accuracy"] == 0.6
    last = line({"epoch": 2, "round": 4, "rounds": 8, "epoch_rounds": 4, "samples": 512, "loss": 1.1,
                 "samples_per_s": 9880.0})
    assert last["loss"] == 1.1 and last["samples_per_s"] == 9880.0
    # the run's last epoch without its own figures waits for the end-of-run lines (the epoch's mean loss)
    assert lines({"epoch": 1, "round": 1, "rounds": 1, "epoch_rounds": 4, "samples": 64, "loss": 2.3,
                  "samples_per_s": 2380.0}, epochs=2) == []
