"""Training in this process (`streamnet-submit train --in-process`): K compute units
on a thread pool, one aggregator.

It runs the BP family's rounds exactly as the topology does, without the engine,
over the same schedule (schedule.py): with one unit it is plain mini-batch SGD.
It is the reference the topology is tested against.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..data import Dataset
from .bp import Aggregator, ComputeUnit, lr_scale, plan_for, trained_loss
from .config import RunConfig
from .evaluate import evaluate
from .schedule import batch_warning, load_data, make_model, schedule_for
from .summary import EpochRecord, RunSummary


@dataclass
class Progress:
    epoch: int
    epochs: int
    round: int
    rounds: int
    samples: int          # this epoch, so far
    loss: float           # mean training loss of the last round
    samples_per_s: float  # this epoch, so far
    test_accuracy: float | None = None   # set on the event that ends an epoch
    step: int = 0         # rounds synchronised in the run (the engine's progress record's step)
    run_samples: int = 0  # samples trained in the run, so far


@dataclass
class TrainResult:
    summary: RunSummary
    params: np.ndarray    # the final synchronised parameters
    model_spec: dict


def train_local(cfg: RunConfig, dataset: Dataset | None = None,
                progress: Callable[[Progress], None] | None = None) -> TrainResult:
    wall0 = time.perf_counter()
    ds = dataset if dataset is not None else load_data(cfg.data, cfg.seed)
    batch_warning(cfg, len(ds.train))
    plan = plan_for(cfg.algorithm)
    # cfg.threads compute threads: units run side by side, and each unit's step is split
    # across the threads left over (3 threads for 1 unit: one step on 3 threads)
    step_threads = max(1, cfg.threads // cfg.units)
    units = [ComputeUnit(k, make_model(cfg, ds.num_classes), plan, threads=step_threads) for k in range(cfg.units)]
    agg = Aggregator(units[0].model.params, plan)
    size = units[0].model.input_shape[-1]
    schedule = schedule_for(cfg, len(ds.train))
    first_plan, rounds_per_epoch = schedule.epoch(0)
    total_rounds = rounds_per_epoch * cfg.epochs
    alg = cfg.algorithm
    summary = RunSummary(model=cfg.model.name, dataset=ds.name, algorithm=alg.name, epochs=cfg.epochs,
                         workers=1, units=cfg.units, batch=alg.batch, sync_period=alg.sync_period,
                         num_params=units[0].model.num_params)

    overlap = alg.overlap

    def run(unit: ComputeUnit, batches: list[np.ndarray], scale: float):
        return unit.run_round((ds.batch(ds.train, idx, size) for idx in batches), scale)

    train_s = 0.0
    eval_s: list[float] = []      # each evaluation's seconds (not in train_s)
    done_rounds = 0
    with ThreadPoolExecutor(max_workers=min(cfg.threads, cfg.units), thread_name_prefix="compute") as pool:
        for epoch in range(cfg.epochs):
            unit_rounds, rounds = (first_plan, rounds_per_epoch) if epoch == 0 else schedule.epoch(epoch)
            t0 = time.perf_counter()
            samples, loss_sum, loss_samples = 0, 0.0, 0
            for r in range(rounds):
                scale = lr_scale(alg, done_rounds / total_rounds)
                futures = [pool.submit(run, u, unit_rounds[u.unit][r], scale)
                           for u in units if r < len(unit_rounds[u.unit])]
                contributions = [f.result() for f in futures]
                before = agg.params.copy() if overlap else None    # the step this round is combined into
                params = agg.combine(contributions, scale, done_rounds)
                worked = {c.unit: c for c in contributions if c.samples} if overlap else {}
                for u in units:
                    if u.unit in worked:     # overlap: from the step before, moved by its own round (bp.py)
                        u.continue_from(worked[u.unit].vector, base=before)
                        u.start[...] = params
                    else:
                        u.receive(params)
                done_rounds += 1
                samples += sum(c.samples for c in contributions)
                round_loss, n = trained_loss(contributions)
                loss_sum, loss_samples = loss_sum + round_loss, loss_samples + n
                if progress:
                    el = time.perf_counter() - t0
                    progress(Progress(epoch + 1, cfg.epochs, r + 1, rounds, samples, round_loss / max(n, 1),
                                      samples / el if el > 0 else 0.0, step=done_rounds,
                                      run_samples=summary.samples_processed + samples))
            seconds = time.perf_counter() - t0
            train_s += seconds
            acc = tloss = None
            if cfg.evaluates(epoch + 1):
                e0 = time.perf_counter()
                acc, tloss = evaluate(units[0].model, ds, ds.test)
                eval_s.append(time.perf_counter() - e0)
            summary.history.append(EpochRecord(epoch + 1, loss_sum / max(loss_samples, 1), acc, tloss, samples,
                                               seconds, samples / seconds if seconds > 0 else 0.0))
            summary.samples_processed += samples
            if progress:
                progress(Progress(epoch + 1, cfg.epochs, rounds, rounds, samples, loss_sum / max(loss_samples, 1),
                                  samples / seconds if seconds > 0 else 0.0, acc, step=done_rounds,
                                  run_samples=summary.samples_processed))
    for u in units:
        u.close()
    summary.sync_rounds = done_rounds
    summary.test_accuracy = summary.history[-1].test_accuracy
    summary.test_loss = summary.history[-1].test_loss
    summary.train_s = train_s
    summary.samples_per_s = summary.samples_processed / train_s if train_s > 0 else 0.0
    summary.wall_s = time.perf_counter() - wall0
    summary.extra["refused_contributions"] = len(agg.refused)
    summary.extra["eval_s"] = eval_s
    summary.extra["quarantined"] = ds.quarantined
    summary.extra["samples_quarantined"] = sum(q["count"] for q in ds.quarantined.values())
    return TrainResult(summary, agg.params.copy(), units[0].model.spec())
