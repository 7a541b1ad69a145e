"""Progress of long work. On a terminal: tqdm bars redrawn in place (a training run gets
two, the whole run and the current epoch, each with its ETA). Elsewhere (a log, CI): a
plain line per update, at most one per `log_interval` seconds, plus every epoch's
result. A training run's updates also go to the --metrics-log file, each of them."""
from __future__ import annotations

import sys
import time

from tqdm import tqdm

from .metrics_log import MetricsLog


class _Bar(tqdm):
    monitor_interval = 0     # no monitor thread: the bars are updated from one loop, at each poll


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class ProgressLine:
    """One line of progress (a topology's spouts done): in place on a terminal."""

    def __init__(self, stream=None, min_interval: float = 0.2, log_interval: float = 10.0):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.min_interval = min_interval if self.tty else log_interval
        self._last = float("-inf")       # monotonic() starts near boot: 0.0 would hold the first line back
        self._open = False

    def update(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return
        self._last = now
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def line(self, text: str) -> None:
        """A permanent line (a result)."""
        if self._open:
            self.stream.write("\r\033[K")
            self._open = False
        self.stream.write(text + "\n")
        self.stream.flush()
        self._last = time.monotonic()


class RunProgress:
    """A training run's progress: `round(...)` per progress record, `epoch(...)` per
    evaluated epoch. Epochs are 1-based; `round` counts within the epoch."""

    RUN_FORMAT = "{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} rounds [{elapsed}<{remaining}]{postfix}"
    EPOCH_FORMAT = "{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]"

    def __init__(self, epochs: int, stream=None, metrics_log: MetricsLog | None = None, log_interval: float = 10.0):
        self.epochs, self.log = epochs, metrics_log
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.log_interval = log_interval
        self._last_line = float("-inf")
        self._epochs_shown: set[int] = set()
        self.run_bar: tqdm | None = None      # made at the first record: a resumed run starts part-way
        self.epoch_bar: tqdm | None = None
        self._bar_epoch = 0
        self.t0 = time.monotonic()

    def _bars(self, epoch: int, rnd: int, epoch_rounds: int, postfix: str) -> None:
        done, total = (epoch - 1) * epoch_rounds + rnd, self.epochs * epoch_rounds
        # off a terminal the bars draw nowhere; their figures are printed as plain lines
        out = self.stream if self.tty else _Discard()
        if self.run_bar is None:
            self.run_bar = _Bar(total=total, initial=done, file=out, desc="run", postfix=postfix,
                                bar_format=self.RUN_FORMAT, dynamic_ncols=True, leave=False, position=0,
                                mininterval=0.2)
            self.epoch_bar = _Bar(total=epoch_rounds, initial=rnd, file=out, desc=f"epoch {epoch}/{self.epochs}",
                                  bar_format=self.EPOCH_FORMAT, dynamic_ncols=True, leave=False, position=1,
                                  mininterval=0.2)
            self._bar_epoch = epoch
        if epoch != self._bar_epoch:
            self.epoch_bar.reset(total=epoch_rounds)
            self._bar_epoch = epoch
        self.run_bar.set_postfix_str(postfix, refresh=False)
        self.epoch_bar.set_description_str(f"epoch {epoch}/{self.epochs}", refresh=False)
        self.run_bar.total = max(total, done)
        self.run_bar.update(done - self.run_bar.n)
        self.epoch_bar.total = max(epoch_rounds, rnd)
        self.epoch_bar.update(rnd - self.epoch_bar.n)

    def round(self, *, epoch: int, round: int, epoch_rounds: int, loss: float, samples_per_s: float,
              step: int | None = None, samples: int | None = None, elapsed_s: float | None = None) -> None:
        elapsed_s = time.monotonic() - self.t0 if elapsed_s is None else elapsed_s
        if self.log:
            self.log.write("round", epoch=epoch, round=round, epoch_rounds=epoch_rounds, step=step, loss=loss,
                           samples=samples, samples_per_s=samples_per_s, elapsed_s=elapsed_s)
        self._bars(epoch, round, max(epoch_rounds, 1), f"loss {loss:.4f}, {samples_per_s:,.0f} samples/s")
        if self.tty:
            self.run_bar.refresh()
            self.epoch_bar.refresh()
        elif time.monotonic() - self._last_line >= self.log_interval:
            self._last_line = time.monotonic()
            self.message(f"epoch {epoch}/{self.epochs}: round {round}/{epoch_rounds}  loss {loss:.4f}  "
                        f"{samples_per_s:,.0f} samples/s  whole run: {self._meter(self.run_bar)}")

    def epoch(self, *, epoch: int, test_accuracy: float, loss: float | None = None, test_loss: float | None = None,
              samples_per_s: float | None = None, elapsed_s: float | None = None) -> None:
        """A permanent line per evaluated epoch (each epoch once, whoever reports it)."""
        if epoch in self._epochs_shown:
            return
        self._epochs_shown.add(epoch)
        elapsed_s = time.monotonic() - self.t0 if elapsed_s is None else elapsed_s
        if self.log:
            self.log.write("epoch", epoch=epoch, test_accuracy=test_accuracy, test_loss=test_loss, loss=loss,
                           samples_per_s=samples_per_s, elapsed_s=elapsed_s)
        text = f"epoch {epoch}/{self.epochs}" + (f"  loss {loss:.4f}" if loss is not None else "") + \
            f"  test acc {test_accuracy:.2%}" + \
            (f"  {samples_per_s:,.0f} samples/s" if samples_per_s is not None else "") + \
            (f"  {elapsed_s:.0f} s" if elapsed_s is not None else "")
        if self.run_bar is not None and self.epochs > epoch:
            text += f"  (run: {self._meter(self.run_bar)})"
        self.message(text)

    def record(self, p: dict) -> None:
        """A record of training.cluster_run.ProgressReader (train and submit --wait)."""
        self.round(epoch=p["epoch"], round=p["round"], epoch_rounds=p["epoch_rounds"], loss=p["loss"],
                   samples_per_s=p["samples_per_s"], step=p["rounds"], samples=p["samples"], elapsed_s=p["elapsed_s"])
        for e in p.get("evaluated", ()):          # in epoch order, even when two landed between reads
            # the round figures go on the epoch's line only when the progress record is that
            # epoch's last round: the sync task writes it at most every 0.5 s, and an epoch 2
            # line showed round 1's loss and the rate of the run's first second
            latest = e["epoch"] == p["eval_epoch"] and p["epoch"] == e["epoch"] and p["round"] >= p["epoch_rounds"]
            if not latest and e["epoch"] >= self.epochs:
                continue      # the run's last epoch: its line comes at the end, with the epoch's mean loss
            self.epoch(epoch=e["epoch"], loss=p["loss"] if latest else None, test_accuracy=e["test_accuracy"],
                       test_loss=e.get("test_loss"), samples_per_s=p["samples_per_s"] if latest else None,
                       elapsed_s=p["elapsed_s"] if e["epoch"] == p["eval_epoch"] else None)

    @staticmethod
    def _meter(bar: tqdm) -> str:
        d = bar.format_dict
        remaining = (d["total"] - d["n"]) / d["rate"] if d.get("rate") and d["total"] else None
        left = tqdm.format_interval(remaining) if remaining is not None else "?"
        return f"{d['n']}/{d['total']} rounds, {tqdm.format_interval(d['elapsed'])} elapsed, ETA {left}"

    def message(self, text: str) -> None:
        if self.tty and self.run_bar is not None:
            tqdm.write(text, file=self.stream)        # above the bars, which are drawn again
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        for b in (self.epoch_bar, self.run_bar):
            if b is not None:
                b.close()
        self.epoch_bar = self.run_bar = None


def stragglers_line(record: dict | None) -> str | None:
    """One line naming the units that held the most rounds, and why (training/stragglers.py)."""
    if not record or not record.get("top"):
        return None
    parts = []
    for t in record["top"]:
        why = ", ".join(f"{r} {n}" for r, n in t["reasons"].items() if n)
        waited = f"{t['held_s']:.1f} s" if t["held_s"] >= 1 else f"{t['held_s'] * 1000:.0f} ms"
        parts.append(f"unit {t['unit']} on {t['worker']} held {t['rounds']} ({why}; the others waited {waited})")
    return f"stragglers over {record['rounds_judged']} rounds: " + "; ".join(parts)
