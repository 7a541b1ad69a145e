"""The training flags, declared once for `streamnet-submit train` and `submit`.

Each flag overrides one field of a named setup (training.config.with_overrides); a
flag not given leaves the setup's value. `train` picks the setup with --model and
--algorithm, `submit` by the topology's name (lenet5-mixbp, ...). A value the
configuration refuses is an error that names the flag it came from.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from ..errors import ConfigError
from .common import threads_option
from ..training.config import (ALGORITHMS, DATASETS, LENET5_MAX_INPUT, LENET5_MIN_INPUT, MODELS, SETUPS,
                               AlgorithmConfig, ModelConfig, RunConfig, with_overrides)


def on_off(text: str) -> bool:
    t = text.strip().lower()
    if t in ("on", "true", "yes", "1"):
        return True
    if t in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"takes on or off; got {text!r}")


@dataclass(frozen=True)
class Flag:
    flag: str                  # on the command line
    key: str                   # what it sets: a with_overrides key, or a topology builder option
    type: type | None = None
    help: str | None = None
    choices: tuple | None = None
    metavar: str | None = None
    nargs: str | None = None
    const: object = None

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    def add_to(self, p) -> None:
        kw = {k: v for k, v in (("type", self.type), ("help", self.help), ("choices", self.choices),
                                ("metavar", self.metavar), ("nargs", self.nargs), ("const", self.const))
              if v is not None}
        p.add_argument(self.flag, **kw)


TRAINING_FLAGS: tuple[Flag, ...] = (
    Flag("--epochs", "epochs", int, "passes over the training set"),
    Flag("--workers", "units", int, "compute units (model replicas: the compute bolt's parallelism)"),
    Flag("--threads", "threads", threads_option, "compute threads in all (train; default one per unit), or "
         "'auto': the cores this process may run on, and with --balance load the leader then gives each "
         "embedded worker its part of the cores other processes leave free; on a cluster each worker's own "
         "--threads decides"),
    Flag("--batch", "batch", int, "local batch b per unit"),
    Flag("--sync-period", "sync_period", int, "H: local steps between synchronisations (mixbp)"),
    Flag("--lr", "lr", float, "learning rate"),
    Flag("--momentum", "momentum", float, "momentum of the local steps"),
    Flag("--outer-momentum", "outer_momentum", float, "Nesterov momentum on the averaged change (mixbp)"),
    Flag("--overlap", "overlap", on_off, "each unit's next round runs while its last is combined, from the "
         "parameters of the step before plus its own change (updates one round stale; default off)",
         metavar="on|off", nargs="?", const=True),
    Flag("--lr-schedule", "lr_schedule", choices=("constant", "cosine"), help="learning-rate schedule"),
    Flag("--input-size", "input_size", int, "images are resized to N x N for the network: LeNet-5 takes "
         f"N from {LENET5_MIN_INPUT} to {LENET5_MAX_INPUT} (default 28, padded to 32 as in the paper), AlexNet 64 "
         "or 224 (default 64)",
         metavar="N"),
    Flag("--dataset", "dataset", choices=DATASETS, help="default: fashion-mnist"),
    Flag("--data", "data_dir", metavar="DIR",
         help="IDX directory (default: $STREAMNET_DATA, else the dataset's installed location)"),
    Flag("--train-limit", "train_limit", int, "use only the first N training samples"),
    Flag("--test-limit", "test_limit", int, "evaluate on only the first N test samples"),
    Flag("--eval-every", "eval_every_epochs", int, "evaluate on the test set after every N-th epoch and after "
         "the last (default 1: every epoch)", metavar="N"),
    Flag("--seed", "seed", int, "default: 0"),
    Flag("--balance", "balance", choices=("static", "load"),
         help="load (default): each unit's batch share follows its measured speed, set live by the leader, "
              "and workers started with --threads auto get the cores other processes leave free; static: "
              "fixed shards and equal batches (deterministic)"),
    Flag("--sync-tasks", "sync_tasks", int, "sync tasks, each combining one slice of the parameters (default: "
         "one per worker hosting a unit, up to the number of units; train: at most 8); the result does not "
         "depend on it", metavar="S"),
    Flag("--checkpoint-dir", "checkpoint_dir", metavar="DIR",
         help="write a checkpoint at each epoch's end and when stopped cleanly (Ctrl-C, kill --checkpoint); "
              "on a cluster, a directory every worker can reach; not with --in-process"),
    Flag("--resume", "resume", nargs="?", const=True, metavar="CHECKPOINT",
         help="continue from the newest valid checkpoint of this run in --checkpoint-dir (or the file given)"),
    Flag("--keep-checkpoints", "keep_checkpoints", int, "checkpoints of this run kept in --checkpoint-dir, the "
         "newest (default 3; 0 keeps all)", metavar="N"),
)
RUN_ONLY = {"checkpoint_dir", "resume", "keep_checkpoints"}     # how to checkpoint: not part of the configuration
_FLAG_OF = {f.key: f.flag for f in TRAINING_FLAGS}
DEFAULT_BALANCE = "load"     # the commands' default (a RunConfig built in code is "static")


def add_training_options(p, setup: bool = False) -> None:
    """The training flags; with `setup`, also --model and --algorithm (train's choice of setup)."""
    if setup:
        p.add_argument("--model", choices=MODELS, default="lenet5", help="network (default lenet5)")
        p.add_argument("--algorithm", choices=ALGORITHMS, default="mixbp", help="BP mode (default mixbp)")
    for f in TRAINING_FLAGS:
        f.add_to(p)


def given_options(a: argparse.Namespace) -> dict:
    """{key: value} of the training flags given on the command line."""
    return {f.key: getattr(a, f.dest) for f in TRAINING_FLAGS if getattr(a, f.dest) is not None}


def naming_the_flag(err: ConfigError, given: dict, set_options: dict | None = None) -> ConfigError:
    """`err` about a field ("units: must be >= 1; got 0") said of the flag the value
    came from ("--workers must be >= 1; got 0", "--set epochs must be ..."); as it is
    when it came from no flag."""
    field = getattr(err, "field", None)
    if field in given and field in _FLAG_OF:
        return ConfigError(f"{_FLAG_OF[field]} {err.problem}")
    if field in (set_options or {}):
        return ConfigError(f"--set {field} {err.problem}")
    return err


def auto_threads(options: dict) -> bool:
    """--threads auto: the cores this process may run on, in `options`; whether it was asked."""
    if options.get("threads") != "auto":
        return False
    options["threads"] = len(os.sched_getaffinity(0))
    return True


def check_paths(given: dict) -> None:
    """--data and --checkpoint-dir must be directories: say so when one is a file (the
    loader would say "does not exist"; every checkpoint write failed, logged, the run going on)."""
    d = given.get("data_dir")
    if d and os.path.exists(d) and not os.path.isdir(d):
        raise ConfigError(f"--data {d} is a file; give the directory that holds the dataset's IDX files")
    d = given.get("checkpoint_dir")
    if d and os.path.exists(d) and not os.path.isdir(d):
        raise ConfigError(f"--checkpoint-dir {d} is a file; give a directory (made if it does not exist)")


_NUMBER_TYPES = {"units": int, "threads": int, "epochs": int, "seed": int, "batch": int, "sync_period": int,
                 "train_limit": int, "test_limit": int, "input_size": int, "lr": float, "momentum": float,
                 "outer_momentum": float, "outer_lr": float, "weight_decay": float,
                 "sync_tasks": int, "eval_every_epochs": int}


#: the settings that take text: a number or a list there reached the loader (`data_dir=[1]`:
#: a TypeError from os.stat; `data_dir=7` tested file descriptor 7)
_TEXT_KEYS = frozenset({"data_dir", "dataset", "lr_schedule", "balance", "checkpoint_dir"})


def check_set_types(options: dict) -> None:
    """--set KEY=VALUE for a training setup: a number where the configuration wants one
    (the dataclass checks compare numbers, and a string would be a TypeError there), and
    text where it wants text."""
    for k, v in options.items():
        if k in _TEXT_KEYS and not isinstance(v, str):
            raise ConfigError(f"--set {k} takes text; got {v!r}")
        if k == "overlap" and not isinstance(v, bool):
            raise ConfigError(f"--set overlap takes true or false; got {v!r}")
        want = _NUMBER_TYPES.get(k)
        if want is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise ConfigError(f"--set {k} takes an integer; got {v!r}")
        if want is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ConfigError(f"--set {k} takes a number; got {v!r}")


def setup_of(model: str, algorithm: str) -> RunConfig:
    name = f"{model}-{algorithm}"
    if name in SETUPS:
        return SETUPS[name]()
    return RunConfig(model=ModelConfig(name=model),
                     algorithm=AlgorithmConfig(name=algorithm, sync_period=1 if algorithm != "mixbp" else 8))


#: the most sync tasks train gives itself: the embedded workers share one process's file
#: descriptors and cores, and S sync tasks link each unit's worker with S others both ways
#: (about 4*U*S sockets, 2*U*S messages a round). With S = U = 100 that was a full mesh of
#: 19,800 sockets, past the 20,000 open files allowed, and the run never ended.
LOCAL_SYNC_TASKS = 8


def config_from_args(a: argparse.Namespace) -> RunConfig:
    """train's configuration: the setup of --model/--algorithm with the flags given."""
    base = setup_of(a.model, a.algorithm)
    given = given_options(a)
    check_paths(given)
    o = {k: v for k, v in given.items() if k not in RUN_ONLY}
    auto_threads(o)
    o.setdefault("threads", o.get("units", base.units))    # one compute thread per unit unless told
    o.setdefault("balance", DEFAULT_BALANCE)
    # train starts a worker per unit: a sync task on each, up to LOCAL_SYNC_TASKS
    o.setdefault("sync_tasks", min(o.get("units", base.units), LOCAL_SYNC_TASKS))
    try:
        return with_overrides(base, o)
    except ConfigError as e:
        raise naming_the_flag(e, given) from None
