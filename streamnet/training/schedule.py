"""What both trainers agree on: the run's data, its model, and which batches each
unit takes in each round of an epoch.

The in-process trainer (`in_process.train_local`) and the topology's spout, compute
and sync tasks all call these, so the two paths cannot drift: the schedule is a
function of the seed alone, which is also what makes exactly-once accounting and an
exact resume possible (a round's samples can be recomputed anywhere).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
from dataclasses import asdict

import numpy as np

from ..data import Dataset, batch_slices, epoch_order, load_dataset, shard_indices, shard_sizes
from ..errors import DataError
from ..nn import Model, build_model
from .config import DataConfig, RunConfig

log = logging.getLogger(__name__)


def load_data(cfg: DataConfig, seed: int = 0) -> Dataset:
    """The run's data, with bad samples (NaN/Inf pixels, labels out of range) quarantined."""
    from ..data.quarantine import quarantine
    if cfg.dataset == "synthetic":
        ds = load_dataset("synthetic", train_size=cfg.synthetic_train, test_size=cfg.synthetic_test, seed=seed)
    else:
        ds = load_dataset(cfg.dataset, cfg.data_dir)
    if cfg.train_limit or cfg.test_limit:
        from ..data import Split
        cut = lambda s, n: s if n is None else Split(s.images[:n], s.labels[:n])
        ds = Dataset(ds.name, cut(ds.train, cfg.train_limit), cut(ds.test, cfg.test_limit),
                     ds.num_classes, ds.mean, ds.std)
    ds = quarantine(ds)
    for split in ("train", "test"):
        if not len(getattr(ds, split)):
            dropped = ds.quarantined.get(split, {}).get("count", 0)
            raise DataError(f"dataset {ds.name}: no {split} samples" + (f" ({dropped} quarantined: NaN or infinite "
                            "pixels, or labels out of range)" if dropped else "") + "; nothing to train on or score")
    return ds


@functools.lru_cache(maxsize=4)
def _dataset(data_key: str, seed: int) -> Dataset:
    """One copy per process however many tasks use it (the local cluster runs all
    workers in one process); read-only, so sharing is safe."""
    return load_data(DataConfig(**json.loads(data_key)), seed)


_loading = threading.Lock()


def dataset_for(cfg: RunConfig) -> Dataset:
    """The run's data for a topology task, shared by the tasks of this process. Tasks
    prepare on their workers' threads at once (the local cluster: every worker in one
    process); the lock makes the first load the only one - without it each task that
    asked before the first load ended made a copy of its own and kept it (100 units of
    Fashion-MNIST: ~10 GB)."""
    with _loading:
        return _dataset(json.dumps(asdict(cfg.data), sort_keys=True), cfg.seed)


def training_data(ds: Dataset) -> dict:
    """What the tasks check their training set against: its size and a digest of its
    labels, as the client that built the topology loaded them."""
    labels = np.ascontiguousarray(ds.train.labels, dtype=np.int64)
    return {"samples": len(ds.train), "labels_sha256": hashlib.sha256(labels.tobytes()).hexdigest()[:16]}


def check_training_data(expected: dict | None, ds: Dataset) -> None:
    """ValueError (the task fails, and the run with it, naming why) when this worker's
    training set is not the one the topology was built for: another STREAMNET_DATA or
    other files on this host. The schedule is cut for the client's: a larger set here
    had every round's work refused and replayed at once, a smaller one rounds that never
    combined - a run that never ended."""
    if not expected:
        return      # a topology built before this check
    here = training_data(ds) if "labels_sha256" in expected else {"samples": len(ds.train)}
    if here != expected:
        raise ValueError(f"this worker's training set is not the run's: {here['samples']} samples here"
                         + (f" (labels {here['labels_sha256']})" if "labels_sha256" in here else "")
                         + f", {expected['samples']} where the topology was built"
                         + (f" (labels {expected['labels_sha256']})" if "labels_sha256" in expected else "")
                         + "; give every worker and the client the same data (--data / STREAMNET_DATA)")


def batch_warning(cfg: RunConfig, train_size: int) -> str | None:
    """Warn (logged, and returned) a user whose batch is larger than a unit's part of the
    training set (each unit then takes its whole part as one batch, one step an epoch);
    None where it is not."""
    alg = cfg.algorithm
    per_unit = train_size // cfg.units
    largest = max(alg.batch_of(k) for k in range(cfg.units))
    if largest <= max(per_unit, 1):
        return None
    warning = (f"batch {largest} is larger than each unit's {per_unit:,} training samples ({train_size:,} over "
               f"{cfg.units} unit(s)): every unit takes its whole part as one batch, one step an epoch")
    log.warning("%s", warning)
    return warning


def make_model(cfg: RunConfig, num_classes: int = 10) -> Model:
    return build_model(cfg.model.name, num_classes=num_classes, seed=cfg.seed, **cfg.model.options)


class UnitSchedule:
    """Which batches unit k takes in each round of an epoch."""

    def __init__(self, cfg: RunConfig, train_size: int):
        self.cfg = cfg
        self.shards = [shard_indices(train_size, cfg.units, k, cfg.seed) for k in range(cfg.units)]

    def epoch(self, epoch: int) -> tuple[list[list[np.ndarray]], int]:
        """Per unit, the list of its rounds, each a list of index arrays; and the round count."""
        alg = self.cfg.algorithm
        plan = []
        for k, shard in enumerate(self.shards):
            order = epoch_order(shard, self.cfg.seed, epoch, k)
            batches = [order[s] for s in batch_slices(len(order), alg.batch_of(k))]
            h = alg.sync_period_of(k)
            plan.append([batches[i:i + h] for i in range(0, len(batches), h)])
        return plan, max(len(p) for p in plan)


def split(total: int, weights) -> list[int]:
    """`total` items cut in proportion to `weights` (largest remainder, lowest index first
    on ties); each part gets at least one item while there are as many items as parts."""
    sizes = shard_sizes(total, list(weights)) if total else [0] * len(weights)
    if total >= len(sizes):
        for i in range(len(sizes)):
            if sizes[i] == 0:
                sizes[max(range(len(sizes)), key=lambda k: sizes[k])] -= 1
                sizes[i] = 1
    return sizes


class SharedSchedule:
    """One epoch-wide schedule whose rounds can be cut by work shares (load balancing).

    Each epoch is one seeded permutation of the training set. Step j of round r takes
    the next B = batch x units samples of it, and round r is H such steps, whatever
    the shares; the shares only decide how a step's B samples are cut among the units
    (`round`), so a unit on a slower node takes a smaller batch and the others take
    the rest: every sample of the epoch is still trained on exactly once, and a
    round's samples can be recomputed anywhere from the seed and the shares.
    With equal shares (`epoch`) every unit takes `batch` samples per step.
    """

    def __init__(self, cfg: RunConfig, train_size: int):
        alg = cfg.algorithm
        self.cfg, self.n, self.units, self.h = cfg, train_size, cfg.units, alg.sync_period
        self.step = alg.batch * cfg.units
        self.num_rounds = max(1, -(-train_size // (self.step * self.h)))
        self._orders: dict[int, np.ndarray] = {}

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                del self._orders[min(self._orders)]
            self._orders[epoch] = np.random.default_rng([self.cfg.seed, epoch, 0x5EED]).permutation(self.n)
        return self._orders[epoch]

    def batch_sizes(self, shares) -> list[int]:
        """Each unit's batch in a full step under `shares` (they sum to batch x units)."""
        return split(self.step, shares)

    def round(self, epoch: int, rnd: int, shares=None) -> list[list[np.ndarray]]:
        """Per unit, its batches of round `rnd` under `shares` (None: equal)."""
        shares = shares or [1.0] * self.units
        order, full = self.order(epoch), self.batch_sizes(shares)
        out: list[list[np.ndarray]] = [[] for _ in range(self.units)]
        for j in range(self.h):
            start = (rnd * self.h + j) * self.step
            if start >= self.n:
                break
            sizes = full if start + self.step <= self.n else split(self.n - start, shares)
            for k, size in enumerate(sizes):
                if size:
                    out[k].append(order[start:start + size])
                start += size
        return out

    def epoch(self, epoch: int) -> tuple[list[list[list[np.ndarray]]], int]:
        """Per unit, its rounds under equal shares (every unit has every round); the round count."""
        rounds = [self.round(epoch, r) for r in range(self.num_rounds)]
        return [[rounds[r][k] for r in range(self.num_rounds)] for k in range(self.units)], self.num_rounds


def schedule_for(cfg: RunConfig, train_size: int) -> UnitSchedule | SharedSchedule:
    """The shared schedule when work shares may change (`balance="load"`), else fixed shards."""
    return SharedSchedule(cfg, train_size) if cfg.balance == "load" else UnitSchedule(cfg, train_size)


class EpochPlans:
    """The unit plans of the epochs a sync task is working on, computed once each.

    Two epochs are kept: at an epoch boundary the ledger closes the previous one as
    the next begins, and recomputing a plan costs a shuffle of the whole training set.
    """

    def __init__(self, schedule: UnitSchedule | SharedSchedule):
        self.schedule = schedule
        self._cache: dict[int, list] = {}

    def plan(self, epoch: int) -> list:
        """Per unit, its rounds of `epoch` (0-based)."""
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                del self._cache[max(self._cache, key=lambda e: abs(e - epoch))]
            self._cache[epoch] = self.schedule.epoch(epoch)[0]
        return self._cache[epoch]

    def cached(self, epoch: int) -> list | None:
        """The plan if it is at hand (for progress reports, which must not shuffle)."""
        return self._cache.get(epoch)

    def rounds(self, epoch: int) -> int:
        return max(len(r) for r in self.plan(epoch))

    def expected(self, epoch: int, rnd: int, flagged: bool = False) -> set[int]:
        """The units with work in a round; every unit in a checkpoint round."""
        return {u for u, rounds in enumerate(self.plan(epoch)) if flagged or rnd < len(rounds)}

    def worked(self, epoch: int, rnd: int, units) -> list[int]:
        """Those of `units` that had samples in the round (a checkpoint round's extra units had none)."""
        plan = self.plan(epoch)
        return [u for u in units if rnd < len(plan[u])]

    def epoch_end(self, epoch: int, rnd: int) -> bool:
        return rnd + 1 >= self.rounds(epoch)

    def next_round(self, epoch: int, rnd: int) -> tuple[int, int]:
        """(epoch, round) of the round after round `rnd` of `epoch`."""
        return (epoch + 1, 0) if self.epoch_end(epoch, rnd) else (epoch, rnd + 1)

    def planned(self, epoch: int, rnd: int) -> tuple[int, list]:
        """(samples, units that worked) of a round as the plan has it (under load
        balancing too: shares cut a round, not its total)."""
        plan = self.plan(epoch)
        worked = self.worked(epoch, rnd, sorted(self.expected(epoch, rnd)))
        return sum(len(b) for u in worked for b in plan[u][rnd]), worked
