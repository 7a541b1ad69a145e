"""What a training topology reports when it ends, as typed values.

The tasks publish plain data under `<component>.<task index>.<key>`; `RunStats.
from_results` reads each record by its exact key and each field by name, and a
missing key or field is a `ResultsError` naming it: a renamed field must fail
loudly, not turn into a zero in the run summary. The sync bolt builds its record
as a `SyncStats`, so producer and reader share one declaration.

Only `data.0.stopped_at` may be absent: the spout publishes it when a drain stopped
the run, and its absence means the run went to its last epoch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import StreamnetError

SYNC_STATS = "sync.0.stats"
PROGRESS = "sync.0.progress"   # while the run goes: epoch_clock.progress_record
EVAL_HISTORY = "eval.0.history"
REPLAYED = "data.0.replayed"
STOPPED_AT = "data.0.stopped_at"
CHECKPOINTS = "checkpoint.0.checkpoints"
TIMING = "timing"          # compute.<unit>.timing, one per compute task


class ResultsError(StreamnetError):
    """A run's published results lack a record or a field the summary needs."""


def _take(cls, d, where: str) -> dict:
    """The dataclass's fields from `d`, each required; unknown keys refused too."""
    if not isinstance(d, dict):
        raise ResultsError(f"{where} should be a record; got {type(d).__name__}")
    names = [f.name for f in fields(cls)]
    missing = [n for n in names if n not in d]
    unknown = sorted(set(d) - set(names))
    if missing or unknown:
        raise ResultsError(f"{where}: missing field(s) {missing}, unknown field(s) {unknown}")
    return {n: d[n] for n in names}


def _by_epoch(d: dict, value=lambda v: v) -> dict:
    return {int(k): value(v) for k, v in d.items()}


def _by_str(d: dict, value=lambda v: v) -> dict:
    return {str(k): value(v) for k, v in d.items()}


@dataclass(frozen=True)
class EpochSpan:
    """An epoch's wall-clock span in this run (from the end of the one before, or the
    run's start, to its last combine; `end` is None while it runs) and the samples
    combined in it by this run."""
    start: float
    end: float | None
    samples: int

    def to_dict(self) -> dict:
        d = {"from": self.start, "samples": self.samples}
        if self.end is not None:
            d["to"] = self.end
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "epoch clock") -> "EpochSpan":
        for k in ("from", "samples"):
            if k not in d:
                raise ResultsError(f"{where}: missing field {k!r}")
        return cls(start=d["from"], end=d["to"] if "to" in d else None, samples=d["samples"])

    @property
    def seconds(self) -> float:
        return self.end - self.start if self.end is not None else 0.0


@dataclass(frozen=True)
class SyncStats:
    """The sync bolt's account of the run (published as `sync.0.stats`)."""
    sync_rounds: int
    samples_processed: int            # counted in the parameters, resumed runs included
    samples_this_run: int
    duplicates: int                   # contributions answered as replays or replaced
    bytes_received: int
    bytes_sent: int
    refused: int                      # contributions the aggregator refused (non-finite)
    recoveries: int                   # times a new sync task took over
    epoch_samples: dict[int, int]     # epoch (1-based) -> samples counted
    each_sample_counted_once: bool
    miscounted: dict                  # SampleLedger.report
    barrier_s: dict[int, float]       # unit -> seconds its contributions waited for the round
    epoch_train_loss: dict[int, float]
    epoch_clock: dict[int, EpochSpan]
    num_params: int
    resumed_from_step: int | None
    quarantined: dict                 # split -> {"count", ...}
    wall_s: float
    started: float                    # wall clock (time.time()) when the run started

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("epoch_samples", "barrier_s", "epoch_train_loss"):
            d[key] = _by_str(d[key])
        d["epoch_clock"] = _by_str(self.epoch_clock, EpochSpan.to_dict)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SyncStats":
        v = _take(cls, d, SYNC_STATS)
        for key in ("epoch_samples", "barrier_s", "epoch_train_loss"):
            v[key] = _by_epoch(v[key])
        v["epoch_clock"] = _by_epoch(v["epoch_clock"], lambda c: EpochSpan.from_dict(c, f"{SYNC_STATS} epoch_clock"))
        return cls(**v)

    @property
    def bytes_total(self) -> int:
        return self.bytes_sent + self.bytes_received


@dataclass(frozen=True)
class Evaluation:
    """One evaluated epoch (the eval bolt's history entries)."""
    epoch: int
    step: int
    test_accuracy: float
    test_loss: float
    time: float

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class UnitTiming:
    """A compute task's time, published as `compute.<unit>.timing`."""
    worker: str
    unit: int
    compute_s: float
    wait_s: float        # from sending a contribution to receiving the parameters
    samples: int

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class CheckpointReport:
    last: dict | None    # the newest pointer written by this run {step, path, sha256, bytes, epoch}
    errors: int

    def to_dict(self) -> dict:
        return {"last": self.last, "errors": self.errors}


@dataclass(frozen=True)
class StoppedAt:
    epoch: int
    round: int
    step: int

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "round": self.round, "step": self.step}


@dataclass(frozen=True)
class RunStats:
    sync: SyncStats
    history: tuple[Evaluation, ...]
    timings: tuple[UnitTiming, ...]      # in unit order
    replayed: int                        # work tuples the spout replayed
    stopped_at: StoppedAt | None         # None: the run went to its last epoch
    checkpoints: CheckpointReport

    @classmethod
    def from_results(cls, results: dict) -> "RunStats":
        def need(key: str):
            if key not in results:
                raise ResultsError(f"the run's results lack {key!r} (have: {', '.join(sorted(results)) or 'none'})")
            return results[key]

        timings = []
        for key in sorted(results):
            component, _, rest = key.partition(".")
            index, _, name = rest.partition(".")
            if component == "compute" and name == TIMING:
                timings.append(UnitTiming(**_take(UnitTiming, results[key], key)))
        history = need(EVAL_HISTORY)
        stopped = results[STOPPED_AT] if STOPPED_AT in results else None
        return cls(sync=SyncStats.from_dict(need(SYNC_STATS)),
                   history=tuple(Evaluation(**_take(Evaluation, h, f"{EVAL_HISTORY} entry")) for h in history),
                   timings=tuple(sorted(timings, key=lambda t: t.unit)),
                   replayed=need(REPLAYED),
                   stopped_at=StoppedAt(**_take(StoppedAt, stopped, STOPPED_AT)) if stopped is not None else None,
                   checkpoints=CheckpointReport(**_take(CheckpointReport, need(CHECKPOINTS), CHECKPOINTS)))
