"""Turn what a training topology published into a RunSummary, through RunStats."""
from __future__ import annotations

import math

from .config import RunConfig
from .run_stats import RunStats
from .summary import EpochRecord, RunSummary


def summarise(cfg: RunConfig, results: dict, workers: int | None, wall_s: float | None = None) -> RunSummary:
    """The summary of a finished run; ResultsError when a record or field is missing."""
    return summary_of(cfg, RunStats.from_results(results), workers, wall_s)


def summary_of(cfg: RunConfig, run: RunStats, workers: int | None, wall_s: float | None = None) -> RunSummary:
    stats = run.sync
    alg = cfg.algorithm
    s = RunSummary(model=cfg.model.name, dataset=cfg.data.dataset, algorithm=alg.name, epochs=cfg.epochs,
                   workers=workers or len({t.worker for t in run.timings}) or 1, units=cfg.units, batch=alg.batch,
                   sync_period=alg.sync_period)
    # every evaluated epoch, and every epoch this run ended without evaluating it
    # (eval_every_epochs > 1): test accuracy and loss None, as the in-process trainer has them
    evaluated = {h.epoch: h for h in run.history}
    ended = {e for e, span in stats.epoch_clock.items() if span.end is not None}
    for epoch in sorted(evaluated.keys() | ended):
        # an epoch may lack a clock or a loss in this run's account: it ended before the
        # checkpoint this run resumed from, or before the sync task restarted
        span = stats.epoch_clock[epoch] if epoch in stats.epoch_clock else None
        seconds, samples = (span.seconds, span.samples) if span else (0.0, 0)
        loss = stats.epoch_train_loss[epoch] if epoch in stats.epoch_train_loss else math.nan
        h = evaluated.get(epoch)
        s.history.append(EpochRecord(epoch, loss, h.test_accuracy if h else None, h.test_loss if h else None,
                                     samples, seconds, samples / seconds if seconds > 0 else 0.0))
    s.num_params = stats.num_params
    if run.history:
        s.test_accuracy, s.test_loss = run.history[-1].test_accuracy, run.history[-1].test_loss
    s.sync_rounds = stats.sync_rounds
    s.samples_processed = stats.samples_processed
    # training: from the run's start to the sync task's last combine, as the in-process
    # trainer counts its epochs; the final evaluation and the topology's teardown are in wall_s
    s.train_s = stats.train_s
    s.wall_s = wall_s if wall_s is not None else s.train_s
    s.samples_per_s = stats.samples_this_run / s.train_s if s.train_s else 0.0
    per_worker: dict[str, dict] = {}
    for t in run.timings:
        w = per_worker.setdefault(t.worker, {"units": [], "compute_s": 0.0, "communication_s": 0.0,
                                             "barrier_wait_s": 0.0, "samples": 0})
        b = float(stats.barrier_s[t.unit])
        if alg.overlap:
            # the sync task's barrier time for the unit overlapped its next round; the unit
            # waited only while it held a result (wait_s): that, as barrier first
            b = min(b, t.wait_s)
        w["units"].append(t.unit)
        w["compute_s"] += t.compute_s
        w["barrier_wait_s"] += b
        w["communication_s"] += max(t.wait_s - b, 0.0)
        w["samples"] += t.samples
    s.extra["accuracy_at_s"] = [[h.time - stats.started, h.test_accuracy] for h in run.history]
    s.extra.update({
        "bytes_sent": stats.bytes_total,
        "bytes_per_sample": stats.bytes_total / max(s.samples_processed, 1),
        "samples_replayed": run.replayed_samples,          # None from a run of an older version
        "work_replayed": run.replayed,                     # work tuples (a unit's round each)
        "duplicate_contributions": stats.duplicates,
        "each_sample_counted_once": stats.each_sample_counted_once,
        "epoch_samples": {str(e): n for e, n in stats.epoch_samples.items()},
        "miscounted": stats.miscounted,
        "sync_tasks": stats.slices,
        # of every unit's communication time, what the rounds waited for the coordinator's save
        "sync_save_wait_s": stats.save_wait_s,
        "sync_recoveries": stats.recoveries,
        "lost_steps": stats.lost_steps,
        "refused_contributions": stats.refused,
        "resumed_from_step": stats.resumed_from_step,
        "stopped_at": run.stopped_at.to_dict() if run.stopped_at else None,
        "last_checkpoint": run.checkpoints.last,
        "checkpoint_errors": run.checkpoints.errors,
        "quarantined": stats.quarantined,
        "samples_quarantined": sum(q["count"] for q in stats.quarantined.values()),
        "per_worker": per_worker,
        "stragglers": run.stragglers,
    })
    return s
