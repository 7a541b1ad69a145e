"""Turn what a training topology published into a RunSummary."""
from __future__ import annotations

from collections import defaultdict

from .config import RunConfig
from .summary import EpochRecord, RunSummary


def _one(results: dict, suffix: str, default=None):
    for k, v in results.items():
        if k.endswith(suffix):
            return v
    return default


def summarise(cfg: RunConfig, results: dict, workers: int | None, wall_s: float | None = None) -> RunSummary:
    stats = _one(results, "sync.0.stats", {}) or {}
    history = _one(results, "eval.0.history", []) or []
    timings = [v for k, v in results.items() if k.startswith("compute.") and k.endswith(".timing")]
    alg = cfg.algorithm
    s = RunSummary(model=cfg.model.name, dataset=cfg.data.dataset, algorithm=alg.name, epochs=cfg.epochs,
                   workers=workers or len({t["worker"] for t in timings}) or 1, units=cfg.units, batch=alg.batch,
                   sync_period=alg.sync_period)
    train_loss = stats.get("epoch_train_loss", {})
    clock = stats.get("epoch_clock", {})
    for h in history:
        c = clock.get(str(h["epoch"]), {})
        seconds = c["to"] - c["from"] if "to" in c else 0.0
        samples = c.get("samples", 0)
        s.history.append(EpochRecord(h["epoch"], train_loss.get(str(h["epoch"]), float("nan")), h["test_accuracy"],
                                     h["test_loss"], samples, seconds, samples / seconds if seconds > 0 else 0.0))
    s.num_params = stats.get("num_params", 0)
    if history:
        s.test_accuracy, s.test_loss = history[-1]["test_accuracy"], history[-1]["test_loss"]
    s.sync_rounds = stats.get("sync_rounds", 0)
    s.samples_processed = stats.get("samples_processed", 0)
    s.train_s = stats.get("wall_s", 0.0)
    s.wall_s = wall_s if wall_s is not None else s.train_s
    s.samples_per_s = stats.get("samples_this_run", s.samples_processed) / s.train_s if s.train_s else 0.0
    barrier = stats.get("barrier_s", {})
    per_worker: dict[str, dict] = defaultdict(lambda: {"units": [], "compute_s": 0.0, "communication_s": 0.0,
                                                       "barrier_wait_s": 0.0, "samples": 0})
    for t in timings:
        w = per_worker[t["worker"]]
        b = float(barrier.get(str(t["unit"]), 0.0))
        w["units"].append(t["unit"])
        w["compute_s"] += t["compute_s"]
        w["barrier_wait_s"] += b
        w["communication_s"] += max(t["wait_s"] - b, 0.0)
        w["samples"] += t["samples"]
    replayed = _one(results, "data.0.replayed", 0) or 0
    started = stats.get("started")
    s.extra["accuracy_at_s"] = [[h["time"] - started, h["test_accuracy"]] for h in history
                                if started and "time" in h]
    s.extra.update({
        "bytes_sent": stats.get("bytes_sent", 0) + stats.get("bytes_received", 0),
        "bytes_per_sample": (stats.get("bytes_sent", 0) + stats.get("bytes_received", 0)) / max(s.samples_processed, 1),
        "samples_replayed": replayed,
        "duplicate_contributions": stats.get("duplicates", 0),
        "each_sample_counted_once": stats.get("each_sample_counted_once"),
        "epoch_samples": stats.get("epoch_samples", {}),
        "miscounted": stats.get("miscounted", {}),
        "sync_recoveries": stats.get("recoveries", 0),
        "refused_contributions": stats.get("refused", 0),
        "resumed_from_step": stats.get("resumed_from_step"),
        "stopped_at": _one(results, "data.0.stopped_at"),
        "last_checkpoint": (_one(results, "checkpoint.0.checkpoints") or {}).get("last"),
        "checkpoint_errors": (_one(results, "checkpoint.0.checkpoints") or {}).get("errors", 0),
        "quarantined": stats.get("quarantined", {}),
        "samples_quarantined": sum(q["count"] for q in (stats.get("quarantined") or {}).values()),
        "per_worker": dict(per_worker),
    })
    return s
