"""Typed configuration, one small frozen dataclass per concern, and named setups.

Named setups are functions (`lenet5_mixbp()`); the CLI picks one and overrides a
few fields with `dataclasses.replace`.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, replace

from ..errors import ConfigError

ALGORITHMS = ("online", "cumulative", "mixbp")
DATASETS = ("fashion-mnist", "mnist", "idx", "synthetic")
MODELS = ("lenet5", "alexnet")
BALANCE_MODES = ("static", "load")
MAX_SEED = 1 << 31


class FieldError(ConfigError):
    """A ConfigError about one field: "FIELD: PROBLEM". `problem` is a predicate
    ("must be >= 1; got 0"), so that the CLI can put the flag the value came from
    in the field's place ("--workers must be >= 1; got 0")."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"{field_name}: {problem}")
        self.field, self.problem = field_name, problem


def _require(cond: bool, field_name: str, problem: str) -> None:
    if not cond:
        raise FieldError(field_name, problem)


def _count(value, field_name: str, least: int = 1) -> None:
    """A whole number >= least (2.5 units, or a seed of -1, failed later with a TypeError
    or in numpy)."""
    try:
        operator.index(value)
    except TypeError:
        raise FieldError(field_name, f"must be a whole number; got {value!r}") from None
    _require(value >= least, field_name, f"must be >= {least}; got {value}")


def _finite_positive(value, field_name: str) -> None:
    _require(0 < value < math.inf, field_name, f"must be a finite number > 0; got {value}")


@dataclass(kw_only=True, frozen=True)
class DataConfig:
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    train_limit: int | None = None   # use only the first N training samples
    test_limit: int | None = None
    synthetic_train: int = 2048
    synthetic_test: int = 512

    def __post_init__(self):
        _require(self.dataset in DATASETS, "dataset", f"must be one of {', '.join(DATASETS)}; got {self.dataset!r}")
        for name in ("train_limit", "test_limit"):
            v = getattr(self, name)
            if v is not None:
                _count(v, name)


# LeNet-5's feature layers, (kernel, stride) as streamnet.nn.zoo.lenet5 stacks them: conv 5x5,
# pool 2/2, conv 5x5, pool 2/2. Any input but 28x28 (padded to 32x32, as in the paper) goes in as it
# is, and each layer needs an input at least its kernel's size: worked back from one output pixel,
# the smallest input is 16 (tests/unit/test_cli_bounds.py builds the network at it and one below).
_LENET5_FEATURES = ((5, 1), (2, 2), (5, 1), (2, 2))


def _smallest_input(layers) -> int:
    need = 1
    for kernel, stride in reversed(layers):
        need = (need - 1) * stride + kernel
    return need


LENET5_MIN_INPUT = _smallest_input(_LENET5_FEATURES)
#: the largest: fc1 grows with the square of the input (16 x s x s x 120 weights, s about a
#: quarter of it): 30 million parameters at 512, 1.2 million million at 100,000 (a MemoryError)
LENET5_MAX_INPUT = 512


@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    name: str = "lenet5"
    options: dict = field(default_factory=dict)  # passed to streamnet.nn.<name>()

    def __post_init__(self):
        _require(self.name in MODELS, "model", f"must be one of {', '.join(MODELS)}; got {self.name!r}")
        _require(self.name != "alexnet" or self.input_size in (64, 224), "input_size",
                 f"must be 64 or 224 for alexnet; got {self.input_size}")
        _require(self.name != "lenet5" or self.input_size >= LENET5_MIN_INPUT, "input_size",
                 f"must be >= {LENET5_MIN_INPUT} for lenet5 (smaller leaves a layer an input smaller than its "
                 f"kernel); got {self.input_size}")
        _require(self.name != "lenet5" or self.input_size <= LENET5_MAX_INPUT, "input_size",
                 f"must be <= {LENET5_MAX_INPUT} for lenet5 (its first dense layer grows with the input's "
                 f"square); got {self.input_size}")

    @property
    def input_size(self) -> int:
        return int(self.options.get("input_size", 28 if self.name == "lenet5" else 64))


@dataclass(kw_only=True, frozen=True)
class AlgorithmConfig:
    """The BP family: one mechanism with two knobs, local batch `batch` (b) and sync
    period `sync_period` (H).

    - cumulative: every step each unit's gradient on its part of the global batch is
      combined and one SGD(-momentum) update applied everywhere (H = 1);
    - online: the same with a tiny batch (b = 1 by default);
    - mixbp: each unit takes H local SGD steps with batch b, then parameters are
      averaged weighted by samples seen; `outer_momentum` > 0 adds Nesterov
      momentum on the averaged change (as DiLoCo does).
    `unit_batches` / `unit_sync_periods` give per-unit b and H (load-aware sizing).
    """
    name: str = "mixbp"
    batch: int = 32
    sync_period: int = 8
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_schedule: str = "cosine"     # "constant" or "cosine" (over the whole run)
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    unit_batches: tuple[int, ...] | None = None
    unit_sync_periods: tuple[int, ...] | None = None
    #: each unit's round r + 1 starts from the combined parameters of step r plus its own
    #: round r (not from step r + 1's), so that it runs while round r is combined: the
    #: round trip and the barrier off the unit's path, at the price of updates one round
    #: stale (bp.py, "Overlap")
    overlap: bool = False

    def __post_init__(self):
        _require(self.name in ALGORITHMS, "algorithm", f"must be one of {', '.join(ALGORITHMS)}; got {self.name!r}")
        _count(self.batch, "batch")
        _count(self.sync_period, "sync_period")
        _require(self.name == "mixbp" or self.sync_period == 1, "sync_period",
                 f"must be 1 for {self.name}, which synchronises every step; got {self.sync_period} (mixbp "
                 "takes longer periods)")
        _finite_positive(self.lr, "lr")
        _require(0 <= self.momentum < 1, "momentum", f"must be in [0, 1); got {self.momentum}")
        _require(0 <= self.weight_decay < math.inf, "weight_decay", f"must be a finite number >= 0; got {self.weight_decay}")
        _require(self.lr_schedule in ("constant", "cosine"), "lr_schedule",
                 f"must be constant or cosine; got {self.lr_schedule!r}")
        _require(0 <= self.outer_momentum < 1, "outer_momentum", f"must be in [0, 1); got {self.outer_momentum}")
        _finite_positive(self.outer_lr, "outer_lr")
        _require(isinstance(self.overlap, bool), "overlap", f"must be true or false; got {self.overlap!r}")
        for name in ("unit_batches", "unit_sync_periods"):
            v = getattr(self, name)
            _require(v is None or all(int(i) >= 1 for i in v), name, f"must have every entry >= 1; got {v}")
        _require(self.name == "mixbp" or self.unit_sync_periods is None, "unit_sync_periods",
                 "must be None unless the algorithm is mixbp, the only one with a sync period to vary")

    def batch_of(self, unit: int) -> int:
        return int(self.unit_batches[unit]) if self.unit_batches else self.batch

    def sync_period_of(self, unit: int) -> int:
        return int(self.unit_sync_periods[unit]) if self.unit_sync_periods else self.sync_period


@dataclass(kw_only=True, frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    units: int = 1          # compute units (model replicas)
    threads: int = 1        # compute threads running the units
    sync_tasks: int = 1     # S: the sync bolt's parallelism, each task owning one slice of the parameters
    epochs: int = 5
    seed: int = 0
    #: test-set evaluation after every N-th epoch and after the last (both trainers: `evaluates`)
    eval_every_epochs: int = 1
    #: "load": units' batch shares follow their measured speed (one epoch-wide schedule,
    #: schedule.SharedSchedule); "static": fixed per-unit shards, equal batches
    balance: str = "static"

    def __post_init__(self):
        _count(self.units, "units")
        _count(self.seed, "seed", 0)
        # the dropout layers' streams take (seed << 32) + step as one 64-bit integer
        _require(self.seed < MAX_SEED, "seed", f"must be < {MAX_SEED} (2**31); got {self.seed}")
        _require(self.balance in BALANCE_MODES, "balance", f"must be one of {', '.join(BALANCE_MODES)}; "
                 f"got {self.balance!r}")
        _require(self.balance == "static" or (self.algorithm.unit_batches is None and
                                              self.algorithm.unit_sync_periods is None), "balance",
                 "must be static with per-unit batches or sync periods (load sets each unit's batch by its "
                 "speed)")
        for name in ("threads", "sync_tasks", "epochs", "eval_every_epochs"):
            _count(getattr(self, name), name)
        for name in ("unit_batches", "unit_sync_periods"):
            v = getattr(self.algorithm, name)
            _require(v is None or len(v) == self.units, f"algorithm.{name}",
                     f"has {len(v) if v else 0} entries for {self.units} units")

    def evaluates(self, epoch: int) -> bool:
        """Whether the run evaluates on the test set at the end of `epoch` (1-based): every
        `eval_every_epochs`-th and the last. Epochs count from the run's start, so a resumed
        run evaluates the same epochs (and, with --epochs raised, its own last)."""
        return epoch % self.eval_every_epochs == 0 or epoch == self.epochs


def run_config_to_dict(cfg: RunConfig) -> dict:
    """Plain data (JSON-safe) for a topology spec; run_config_from_dict inverts it."""
    from dataclasses import asdict
    d = asdict(cfg)
    for key in ("unit_batches", "unit_sync_periods"):
        if d["algorithm"][key] is not None:
            d["algorithm"][key] = list(d["algorithm"][key])
    return d


def run_config_from_dict(d: dict) -> RunConfig:
    alg = dict(d["algorithm"])
    for key in ("unit_batches", "unit_sync_periods"):
        if alg.get(key) is not None:
            alg[key] = tuple(alg[key])
    return RunConfig(model=ModelConfig(**d["model"]), data=DataConfig(**d["data"]),
                     algorithm=AlgorithmConfig(**alg),
                     **{k: v for k, v in d.items() if k not in ("model", "data", "algorithm")})


# -- overrides: what the CLI and topology builders change on a named setup -------

ALG_KEYS = ("batch", "sync_period", "lr", "momentum", "weight_decay", "lr_schedule", "outer_lr", "outer_momentum",
            "overlap")
DATA_KEYS = ("dataset", "data_dir", "train_limit", "test_limit")
RUN_KEYS = ("epochs", "units", "threads", "seed", "balance", "sync_tasks", "eval_every_epochs")
MODEL_KEYS = ("input_size",)     # model options


def with_overrides(cfg: RunConfig, o: dict) -> RunConfig:
    """`cfg` with the fields named in `o` (flat keys: ALG_KEYS, DATA_KEYS, RUN_KEYS,
    MODEL_KEYS) replaced; an unknown key or a bad value is a ConfigError."""
    unknown = set(o) - set(ALG_KEYS) - set(DATA_KEYS) - set(RUN_KEYS) - set(MODEL_KEYS)
    if unknown:
        raise ConfigError(f"unknown training option(s) {sorted(unknown)}; known: "
                          f"{', '.join(sorted(ALG_KEYS + DATA_KEYS + RUN_KEYS + MODEL_KEYS))}")
    model = cfg.model
    if "input_size" in o:
        model = replace(model, options={**model.options, "input_size": o["input_size"]})
    alg = replace(cfg.algorithm, **{k: o[k] for k in ALG_KEYS if k in o})
    data = replace(cfg.data, **{k: o[k] for k in DATA_KEYS if k in o})
    return replace(cfg, model=model, algorithm=alg, data=data, **{k: o[k] for k in RUN_KEYS if k in o})


# -- named setups -----------------------------------------------------------

def lenet5_mixbp(**overrides) -> RunConfig:
    return replace(RunConfig(model=ModelConfig(name="lenet5"),
                             algorithm=AlgorithmConfig(name="mixbp", batch=32, sync_period=8, lr=0.05),
                             units=2, epochs=10), **overrides)


def lenet5_cumulative(**overrides) -> RunConfig:
    return replace(RunConfig(model=ModelConfig(name="lenet5"),
                             algorithm=AlgorithmConfig(name="cumulative", batch=32, sync_period=1, lr=0.05),
                             units=2, epochs=10), **overrides)


def lenet5_online(**overrides) -> RunConfig:
    return replace(RunConfig(model=ModelConfig(name="lenet5"),
                             algorithm=AlgorithmConfig(name="online", batch=1, sync_period=1, lr=0.01,
                                                       momentum=0.0),
                             units=2, epochs=3), **overrides)


def alexnet_mixbp(**overrides) -> RunConfig:
    return replace(RunConfig(model=ModelConfig(name="alexnet", options={"input_size": 64}),
                             algorithm=AlgorithmConfig(name="mixbp", batch=32, sync_period=8, lr=0.02,
                                                       weight_decay=5e-4),
                             units=2, epochs=5), **overrides)


SETUPS = {
    "lenet5-mixbp": lenet5_mixbp,
    "lenet5-cumulative": lenet5_cumulative,
    "lenet5-online": lenet5_online,
    "alexnet-mixbp": alexnet_mixbp,
}
