"""What a training topology reports when it ends, as typed values.

The tasks publish plain data under `<component>.<task index>.<key>`; `RunStats.
from_results` reads each record by its exact key and each field by name, and a
missing key or field is a `ResultsError` naming it: a renamed field must fail
loudly, not turn into a zero in the run summary. The sync bolt builds its record
as a `SyncStats`, so producer and reader share one declaration.

Only `data.0.stopped_at` may be absent: the spout publishes it when a drain stopped
the run, and its absence means the run went to its last epoch.

With S sync tasks (sharded synchronisation) each publishes its slice's account as
`sync.<s>.stats`; `RunStats.sync` is their merge (`SyncStats.merged`), and each
`sync.<s>.params` is that task's slice of the final parameters (`final_params`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import StreamnetError

SYNC_STATS = "sync.0.stats"
SYNC_STATS_OF = "sync.{}.stats"     # slice s's account
SYNC_PARAMS_OF = "sync.{}.params"
PROGRESS = "sync.0.progress"   # while the run goes: epoch_clock.progress_record
EVAL_HISTORY = "eval.0.history"
REPLAYED = "data.0.replayed"
REPLAYED_SAMPLES = "data.0.replayed_samples"
STOPPED_AT = "data.0.stopped_at"
CHECKPOINTS = "checkpoint.0.checkpoints"
TIMING = "timing"          # compute.<unit>.timing, one per compute task
STRAGGLERS = "sync.0.stragglers"   # stragglers.py: the units that held rounds, and why


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
    """A sync task's account of the run, for its slice (published as `sync.<s>.stats`),
    or all slices' merged."""
    sync_rounds: int
    samples_processed: int            # counted in the parameters, resumed runs included
    samples_this_run: int
    duplicates: int                   # contributions answered as replays or replaced
    bytes_received: int
    bytes_sent: int
    refused: int                      # contributions the aggregator refused (non-finite)
    recoveries: int                   # times a new sync task took over
    lost_steps: int                   # combined steps whose updates were lost with every replica
    epoch_samples: dict[int, int]     # epoch (1-based) -> samples counted
    each_sample_counted_once: bool
    miscounted: dict                  # SampleLedger.report
    barrier_s: dict[int, float]       # unit -> seconds its contributions waited for the round
    save_wait_s: float                # seconds combined rounds waited for the coordinator to confirm the save
    epoch_train_loss: dict[int, float]
    epoch_clock: dict[int, EpochSpan]
    num_params: int                   # of the whole model
    slices: int                       # sync tasks: the run's S
    resumed_from_step: int | None
    quarantined: dict                 # split -> {"count", ...}
    train_s: float                    # from the run's start to this task's last combine
    started: float                    # wall clock (time.time()) when the run started

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("epoch_samples", "barrier_s", "epoch_train_loss"):
            d[key] = _by_str(d[key])
        d["epoch_clock"] = _by_str(self.epoch_clock, EpochSpan.to_dict)
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = SYNC_STATS) -> "SyncStats":
        v = _take(cls, d, where)
        for key in ("epoch_samples", "barrier_s", "epoch_train_loss"):
            v[key] = _by_epoch(v[key])
        v["epoch_clock"] = _by_epoch(v["epoch_clock"], lambda c: EpochSpan.from_dict(c, f"{where} epoch_clock"))
        return cls(**v)

    @property
    def bytes_total(self) -> int:
        return self.bytes_sent + self.bytes_received

    @classmethod
    def merged(cls, parts: list["SyncStats"]) -> "SyncStats":
        """The run's account from its S slices' accounts. Every slice counts every round
        and sample: a sample is in the parameters once when every slice counted it once,
        so the counts are each epoch's least over the slices, and the run counted each
        sample once only if every slice did and all agree. Bytes and recoveries add up;
        a replayed or refused contribution is answered by every slice and is counted once
        (the most of any slice), and so are lost steps; barrier and save waits are the
        longest of any slice."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        epochs = sorted({e for p in parts for e in p.epoch_samples})
        agree = all(p.epoch_samples == first.epoch_samples for p in parts)
        clock = {}
        for e in sorted({e for p in parts for e in p.epoch_clock}):
            spans = [p.epoch_clock[e] for p in parts if e in p.epoch_clock]
            ends = [s.end for s in spans]
            clock[e] = EpochSpan(start=min(s.start for s in spans), end=None if None in ends else max(ends),
                                 samples=min(s.samples for s in spans))
        miscounted = {}
        for s, p in enumerate(parts):
            for e, entry in p.miscounted.items():
                miscounted.setdefault(e, {**entry, "slices": []})["slices"].append(s)
        return cls(
            sync_rounds=min(p.sync_rounds for p in parts), samples_processed=min(p.samples_processed for p in parts),
            samples_this_run=min(p.samples_this_run for p in parts), duplicates=max(p.duplicates for p in parts),
            bytes_received=sum(p.bytes_received for p in parts), bytes_sent=sum(p.bytes_sent for p in parts),
            refused=max(p.refused for p in parts), recoveries=sum(p.recoveries for p in parts),
            lost_steps=max(p.lost_steps for p in parts),
            epoch_samples={e: min(p.epoch_samples.get(e, 0) for p in parts) for e in epochs},
            each_sample_counted_once=agree and all(p.each_sample_counted_once for p in parts),
            miscounted=miscounted,
            barrier_s={u: max(p.barrier_s.get(u, 0.0) for p in parts) for u in first.barrier_s},
            save_wait_s=max(p.save_wait_s for p in parts),
            epoch_train_loss=first.epoch_train_loss, epoch_clock=clock, num_params=first.num_params,
            slices=first.slices, resumed_from_step=first.resumed_from_step, quarantined=first.quarantined,
            train_s=max(p.train_s for p in parts), started=min(p.started for p in parts))


def sync_stats_of(results: dict) -> list[SyncStats]:
    """Each sync task's account, in slice order; a missing one is a ResultsError naming it."""
    if SYNC_STATS not in results:
        raise ResultsError(f"the run's results lack {SYNC_STATS!r} (have: {', '.join(sorted(results)) or 'none'})")
    first = SyncStats.from_dict(results[SYNC_STATS])
    parts = [first]
    for s in range(1, first.slices):
        key = SYNC_STATS_OF.format(s)
        if key not in results:
            raise ResultsError(f"the run's results lack {key!r}: {first.slices} sync tasks published "
                               f"{sum(SYNC_STATS_OF.format(i) in results for i in range(first.slices))} accounts")
        parts.append(SyncStats.from_dict(results[key], key))
    return parts


def final_params(results: dict):
    """The run's final parameters, joined from the sync tasks' slices (None when the model
    was too large to publish them)."""
    import numpy as np
    slices = SyncStats.from_dict(results[SYNC_STATS]).slices if SYNC_STATS in results else 1
    parts = [results.get(SYNC_PARAMS_OF.format(s)) for s in range(slices)]
    if any(p is None for p in parts):
        return None
    return parts[0] if slices == 1 else np.concatenate(parts)


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
    stragglers: dict | None = None       # {"rounds_judged", "top", "last"}; absent in runs of older versions
    replayed_samples: int | None = None  # the samples of that work; absent in runs of older versions

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
        return cls(sync=SyncStats.merged(sync_stats_of(results)),
                   history=tuple(Evaluation(**_take(Evaluation, h, f"{EVAL_HISTORY} entry")) for h in history),
                   timings=tuple(sorted(timings, key=lambda t: t.unit)),
                   replayed=need(REPLAYED),
                   stopped_at=StoppedAt(**_take(StoppedAt, stopped, STOPPED_AT)) if stopped is not None else None,
                   checkpoints=CheckpointReport(**_take(CheckpointReport, need(CHECKPOINTS), CHECKPOINTS)),
                   stragglers=results.get(STRAGGLERS), replayed_samples=results.get(REPLAYED_SAMPLES))
