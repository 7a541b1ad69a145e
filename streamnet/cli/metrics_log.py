"""--metrics-log FILE: a training run's figures as JSON lines, and `streamnet-submit plot`.

One line per progress update ("kind": "round": epoch, round within it, step, training
loss, samples, samples/s) and one per evaluated epoch ("kind": "epoch": test accuracy
and loss), each with the wall-clock `time` and the run's `elapsed_s`. Any tool that
reads JSON lines reads it (pandas.read_json(lines=True), jq). On a cluster the client
reads the sync bolt's progress every half second, so a fast run logs a sample of its
rounds (each line names its step); the in-process trainer logs every round.
"""
from __future__ import annotations

import json
import math
import os
import time

from ..errors import StreamnetError


def add_option(p) -> None:
    """--metrics-log, the same on `train` and `submit`."""
    p.add_argument("--metrics-log", metavar="FILE",
                   help="write a JSON line per progress update and per evaluated epoch (loss, test accuracy, "
                        "samples/s, seconds); `streamnet-submit plot FILE` draws it")


class MetricsLog:
    def __init__(self, path: str):
        try:
            self.f = open(path, "w", buffering=1)     # a line at a time: `tail -f` sees each
        except OSError as e:
            raise StreamnetError(f"--metrics-log {path}: {e.strerror}") from None
        self.path = path

    def write(self, kind: str, **fields) -> None:
        """A line of the fields given; a figure that is not finite (the loss of a run that
        diverged) as null: JSON has no NaN, and jq and strict readers refused the line."""
        record = {"kind": kind, "time": round(time.time(), 3)}
        record.update({k: None if isinstance(v, float) and not math.isfinite(v) else v
                       for k, v in fields.items() if v is not None})
        self.f.write(json.dumps(record, allow_nan=False) + "\n")

    def close(self) -> None:
        self.f.close()


def read(path: str) -> list[dict]:
    return [record for _, record in _numbered(path)]


def _numbered(path: str) -> list[tuple[int, dict]]:
    """(line number, record) of each record of a --metrics-log file."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
    except OSError as e:
        raise StreamnetError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise StreamnetError(f"{path} is not a --metrics-log file (not UTF-8 text)") from None
    out = []
    for i, line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise StreamnetError(f"{path}:{i}: not a JSON line ({e.msg})") from None
        except RecursionError:
            raise StreamnetError(f"{path}:{i}: not a --metrics-log record (nested too deeply)") from None
        if not isinstance(record, dict) or record.get("kind") not in ("round", "epoch"):
            raise StreamnetError(f"{path}:{i}: not a --metrics-log record (no kind round or epoch)")
        out.append((i, record))
    return out


#: what plot draws of each kind of record (the figures MetricsLog's writers always give)
PLOTTED = {"round": ("elapsed_s", "loss", "samples_per_s"), "epoch": ("epoch", "test_accuracy")}


def _check_plotted(path: str, numbered: list[tuple[int, dict]]) -> None:
    """A record plot would draw without a figure it needs: an error naming the file and line."""
    for i, record in numbered:
        if record["kind"] == "round" and "elapsed_s" not in record:
            continue            # not drawn (plot keeps the rounds that have elapsed_s)
        for name in PLOTTED[record["kind"]]:     # a round's elapsed_s is its x (a string was drawn as a category)
            v = record.get(name)
            if v is None and name in record:
                continue        # null: a figure that was not finite, drawn as a gap
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise StreamnetError(f"{path}:{i}: {record['kind']} record with "
                                     + (f"no {name}" if v is None else f"{name} {v!r}, not a number"))


def plot(path: str, out: str | None = None) -> str:
    """Training loss and samples/s against time, test accuracy against epochs, as one PNG."""
    numbered = _numbered(path)
    _check_plotted(path, numbered)
    records = [record for _, record in numbered]
    rounds = [r for r in records if r["kind"] == "round" and "elapsed_s" in r]
    epochs = [r for r in records if r["kind"] == "epoch"]
    if not rounds and not epochs:
        raise StreamnetError(f"{path} holds no records to plot")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise StreamnetError("plot needs matplotlib (pip install matplotlib, or the perf extra)") from None
    out = out or os.path.splitext(path)[0] + ".png"
    fig, (ax_loss, ax_acc, ax_rate) = plt.subplots(1, 3, figsize=(14, 4))
    def figure(r, name, scale=1.0):
        return math.nan if r[name] is None else scale * r[name]      # null: not finite, a gap
    ax_loss.plot([r["elapsed_s"] for r in rounds], [figure(r, "loss") for r in rounds], lw=1)
    ax_loss.set(xlabel="seconds", ylabel="training loss", title="training loss per round")
    ax_acc.plot([r["epoch"] for r in epochs], [figure(r, "test_accuracy", 100) for r in epochs], "o-")
    ax_acc.set(xlabel="epoch", ylabel="test accuracy (%)", title="test accuracy per epoch")
    ax_rate.plot([r["elapsed_s"] for r in rounds], [figure(r, "samples_per_s") for r in rounds], lw=1)
    ax_rate.set(xlabel="seconds", ylabel="samples/s", title="throughput (this run)")
    for ax in (ax_loss, ax_acc, ax_rate):
        ax.grid(alpha=0.3)
    fig.suptitle(os.path.basename(path))
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise StreamnetError(f"cannot write {out}: {e.strerror}") from None
    except ValueError as e:     # a format matplotlib does not write (--out x.txt)
        raise StreamnetError(f"cannot write {out}: {e}") from None
    finally:
        plt.close(fig)
    return out
