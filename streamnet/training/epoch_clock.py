"""What the sync bolt measures per epoch: its wall-clock span, samples and training
loss; and the progress record clients poll (`sync.0.progress`)."""
from __future__ import annotations

import time
from dataclasses import replace

from .run_stats import EpochSpan


class EpochClock:
    """An epoch runs from the end of the one before (or the start of this run) to its
    last combine; the samples are those combined in this run (per-epoch throughput).
    Saved with the sync bolt's counters, so a restarted sync task keeps it."""

    def __init__(self, started: float, spans: dict[int, EpochSpan] | None = None):
        self.started = started
        self.spans: dict[int, EpochSpan] = dict(spans or {})

    def record(self, epoch: int, samples: int, ends: bool) -> None:
        if epoch not in self.spans:
            before = [s.end for e, s in self.spans.items() if e < epoch and s.end is not None]
            self.spans[epoch] = EpochSpan(start=max(before, default=self.started), end=None, samples=0)
        span = replace(self.spans[epoch], samples=self.spans[epoch].samples + samples)
        self.spans[epoch] = replace(span, end=time.time()) if ends else span

    def unrecord(self, epoch: int, samples: int) -> None:
        """Take back the latest record of `epoch` (a combine that is uncounted): its
        samples, and the end if it ended the epoch; a span left empty goes, so that the
        round counted again starts it anew."""
        span = self.spans.get(epoch)
        if span is None:
            return
        if span.samples <= samples:
            del self.spans[epoch]
        else:
            self.spans[epoch] = replace(span, samples=span.samples - samples, end=None)

    def to_state(self) -> dict:
        return {str(e): s.to_dict() for e, s in self.spans.items()}

    @classmethod
    def from_state(cls, started: float, state: dict | None) -> "EpochClock":
        return cls(started, {int(e): EpochSpan.from_dict(s) for e, s in (state or {}).items()})


class LossMeter:
    """Training loss: of each combined round (the latest is shown as progress) and
    summed per epoch (the summary's train loss). Not saved: a restarted sync task
    measures the rounds it combines."""

    def __init__(self):
        self.last: float | None = None
        self.sums: dict[int, list] = {}    # epoch (1-based) -> [loss sum, samples]

    def record(self, epoch: int, loss_sum: float, samples: int) -> None:
        self.last = loss_sum / max(samples, 1)
        acc = self.sums.setdefault(epoch, [0.0, 0])
        acc[0] += loss_sum
        acc[1] += samples

    def per_epoch(self) -> dict[int, float]:
        return {e: loss / max(n, 1) for e, (loss, n) in self.sums.items()}


def progress_record(*, epoch: int, rnd: int, rounds: int, epoch_rounds: int, samples: int, loss: float,
                    samples_this_run: int, elapsed_s: float) -> dict:
    """The progress a client shows (cli.progress.RunProgress.record); `epoch`, `rnd` 0-based."""
    return {"epoch": epoch + 1, "round": rnd + 1, "rounds": rounds, "epoch_rounds": epoch_rounds,
            "samples": samples, "loss": loss,
            "samples_per_s": samples_this_run / elapsed_s if elapsed_s else 0.0}
