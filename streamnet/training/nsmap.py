"""NS-Map: (model, data, algorithm, parallelism) -> a topology of runtime components."""
from __future__ import annotations

import logging
import os

from ..runtime import TopologyBuilder
from .config import SETUPS, FieldError, RunConfig, run_config_to_dict, with_overrides
from .schedule import batch_warning, load_data, make_model, training_data
from ..runtime.values import whole

log = logging.getLogger(__name__)

PKG = "streamnet.training"


def default_name(cfg: RunConfig) -> str:
    return f"{cfg.model.name}-{cfg.algorithm.name}"


def build_topology(cfg: RunConfig, name: str | None = None, checkpoint_dir: str | None = None,
                   message_timeout_s: float = 300.0, train_size: int | None = None, resume: dict | None = None,
                   keep_checkpoints: int | None = None):
    """The NS-Map topology. With `checkpoint_dir`, every epoch ends with a checkpoint that
    resumes exactly, and the newest `keep_checkpoints` are kept (checkpoint.DEFAULT_KEEP;
    0 keeps all); `resume` (from `resume_point`) continues a stopped run."""
    from .checkpoint import DEFAULT_KEEP
    keep = DEFAULT_KEEP if keep_checkpoints is None else keep_checkpoints
    if not whole(keep) or keep < 0:
        raise FieldError("keep_checkpoints", f"must be an integer >= 0 (0 keeps all); got {keep_checkpoints!r}")
    if train_size is None:
        data = training_data(load_data(cfg.data, cfg.seed))
        train_size = data["samples"]
    else:
        data = {"samples": train_size}
    batch_warning(cfg, train_size)
    num_params = make_model(cfg).num_params
    if cfg.sync_tasks > num_params:
        raise FieldError("sync_tasks", f"must be at most {num_params}, one slice per parameter of {cfg.model.name}; "
                         f"got {cfg.sync_tasks} (a few per worker is plenty)")
    run = run_config_to_dict(cfg)
    name = name or default_name(cfg)
    b = TopologyBuilder(name)
    alg = cfg.algorithm
    about = (f"{cfg.model.name} on {cfg.data.dataset}: {alg.name} b={alg.batch} H={alg.sync_period} lr={alg.lr}, "
             f"{cfg.units} units x {cfg.epochs} epochs, balance {cfg.balance}, {cfg.sync_tasks} sync task(s)")
    if resume:
        about += f", resumed at step {resume['step']}"
    b.add_spout("data", f"{PKG}.data_spout:DataSpout", about=about, run=run, train_size=train_size,
                checkpoints=checkpoint_dir is not None, resume=resume)
    (b.add_bolt("compute", f"{PKG}.compute_bolt:ComputeBolt", parallelism=cfg.units, run=run, data=data)
        .direct("data").all("sync", stream="params").direct("sync", stream="direct_params")
        .all("sync", stream="state_request"))
    # sync task s owns slice s of the parameters: each unit sends it that slice of its
    # contribution (direct), every sync task answers a resync, a replica goes to its asker
    (b.add_bolt("sync", f"{PKG}.sync_bolt:SyncBolt", parallelism=cfg.sync_tasks, run=run, resume=resume, data=data)
        .direct("compute").all("compute", stream="resync").direct("compute", stream="replica"))
    # the evaluation is split over the units' workers (eval_bolt.py): each eval task takes a
    # shard of the test set, and tasks 1.. send their counts to task 0
    (b.add_bolt("eval", f"{PKG}.eval_bolt:EvalBolt", parallelism=eval_tasks(cfg), run=run)
        .all("sync", stream="eval").direct("eval", stream="part"))
    b.add_bolt("checkpoint", f"{PKG}.checkpoint_bolt:CheckpointBolt", dir=checkpoint_dir,
              keep=keep).all("sync", stream="checkpoint")
    # the spout holds one tree per unit: a round's trees completing is the sync barrier. The
    # timeout covers an epoch's end, whose trees include the evaluation (AlexNet-64 on 10,000
    # test images takes over a minute on one core); a lost worker is handled sooner, when the
    # assignment changes. The parallelism is the run's configuration (units, sync slices, eval
    # tasks): a rebalance of it had the spout cut cfg.units shares for another number of units.
    return b.build(allow_cycles=True, max_spout_pending=2 * cfg.units, message_timeout_s=message_timeout_s,
                   queue_size=64, balance=cfg.balance, fixed_parallelism=True)


#: the most eval tasks a topology gets: each one gathers every slice of the parameters
#: at an epoch's end, and past a few the shards are too small to gain from
EVAL_TASKS = 8


def eval_tasks(cfg: RunConfig) -> int:
    """One eval task per unit, up to EVAL_TASKS: placed in turn like the units, they
    spread over the workers that host them."""
    return max(1, min(cfg.units, EVAL_TASKS))


def default_sync_tasks(cfg: RunConfig, workers: int) -> int:
    """One sync task per worker hosting a unit (the scheduler spreads the units over the
    workers), up to the number of units."""
    return max(1, min(cfg.units, workers))


def resume_point(cfg: RunConfig, checkpoint_dir: str | None, name: str, path: str | None = None) -> dict:
    """Where a stopped run continues: the given checkpoint, or the newest one of `name`
    in `checkpoint_dir` that verifies (a corrupt one is refused and logged, and the
    previous one used). Refuses a checkpoint of a different run configuration. It moves
    nothing: the checkpoints newer than the one taken are set aside
    (`set_aside_for_resume`) once the run is about to be submitted - done here, a submit
    that then failed, a run of that name still going, or a `describe` moved them."""
    from .checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
    if path is None:
        if not checkpoint_dir:
            raise CheckpointError("--resume needs --checkpoint-dir (or a checkpoint file)")
        path, ck = latest_checkpoint(checkpoint_dir, name)
    else:
        ck = load_checkpoint(path)
        if not ck.get("state"):
            raise CheckpointError(f"{path} holds parameters only (not a resumable checkpoint)")
    state = ck["state"]
    position = state.get("position") if isinstance(state, dict) else None
    if not (isinstance(state, dict) and isinstance(state.get("config"), dict) and isinstance(position, dict)
            and all(isinstance(position.get(k), int) for k in ("step", "epoch", "round"))):
        raise CheckpointError(f"{path} holds no run configuration and position to resume from "
                              "(not a checkpoint of a training run)")
    saved, now = _settings(state["config"]), _settings(run_config_to_dict(cfg))
    differ = sorted(k for k in saved.keys() | now.keys() if k not in FREE_ON_RESUME and saved.get(k) != now.get(k))
    if differ:
        raise CheckpointError(f"{path} was written by a run with different settings: "
                              + ", ".join(f"{k} {saved.get(k)!r} (now {now.get(k)!r})" for k in differ)
                              + "; resume with the same settings")
    if position["epoch"] >= cfg.epochs:
        raise CheckpointError(f"{path} was written after epoch {position['epoch']}: with --epochs {cfg.epochs} "
                              f"nothing is left to train; give more than {position['epoch']} epochs to go on")
    return {"path": os.path.abspath(path), "sha256": ck["sha256"], "step": position["step"],
            "epoch": position["epoch"], "round": position["round"],
            "shares": position.get("shares")}    # the load balancer's, with --balance load


#: settings a resumed run may change: none of them decides the training's arithmetic
FREE_ON_RESUME = {"epochs", "threads", "sync_tasks", "eval_every_epochs", "data.test_limit", "data.synthetic_test"}


def _settings(config: dict) -> dict:
    """A run configuration as flat settings ("data.data_dir": ...), the data directory as
    the one it stands for: the default's path given with --data is the same data."""
    from ..data.datasets import DEFAULT_DIRS
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    data = flat.get("data.data_dir") or os.environ.get("STREAMNET_DATA") or DEFAULT_DIRS.get(flat.get("data.dataset"))
    flat["data.data_dir"] = os.path.realpath(data) if data else None
    return flat


def _config_of(spec: dict, component: str) -> dict:
    """The configuration of the component `component` in a topology's spec ({} if none)."""
    return next((c["config"] for c in spec["components"] if c["id"] == component), {})


def set_aside_for_resume(spec: dict) -> None:
    """Before a topology that resumes a run is submitted (its checks passed): move the
    checkpoints of its name in its checkpoint directory newer than the one it resumes
    (checkpoint.set_aside_newer), each move logged, so that the run writes below them and
    a later --resume continues this run, not the one it left."""
    from .checkpoint import set_aside_newer
    resume, directory = _config_of(spec, "sync").get("resume"), _config_of(spec, "checkpoint").get("dir")
    if not resume or not directory:
        return
    for moved in set_aside_newer(directory, spec["name"], resume["step"]):
        log.warning("resuming from step %d: set aside the newer checkpoint %s (a later --resume would have "
                    "continued it)", resume["step"], moved)


def check_recorded(spec: dict, pointer: dict | None) -> None:
    """The checkpoint a topology resumes from, against the pointer the workers recorded in
    the coordinator (which only workers may write): the same file must still have the
    SHA-256 it was written with. This catches a checkpoint changed since, also where the
    client cannot check its MAC (it holds a submit credential, not the secret)."""
    from .checkpoint import CheckpointError
    resume = _config_of(spec, "sync").get("resume")
    if not resume or not pointer or os.path.abspath(pointer.get("path", "")) != resume["path"]:
        return
    if pointer.get("sha256") != resume["sha256"]:
        raise CheckpointError(f"{resume['path']} was changed after the workers wrote it (SHA-256 "
                              f"{resume['sha256'][:12]}..., recorded {str(pointer.get('sha256'))[:12]}...): refusing it")


def run_config_of(topology) -> RunConfig | None:
    """The run configuration of an NS-Map topology (its data spout carries it); None for
    any other topology."""
    from .config import run_config_from_dict
    spout = next((c for c in topology.components if c["class"] == f"{PKG}.data_spout:DataSpout"), None)
    return run_config_from_dict(spout["config"]["run"]) if spout else None


def _builder(setup: str):
    def build(name: str | None = None, checkpoint_dir: str | None = None, resume: bool | str | None = None,
              keep_checkpoints: int | None = None, live_workers: int | None = None, **overrides):
        """`live_workers` (submit gives the cluster's) sets the default sync_tasks: one per
        worker hosting a unit, up to the number of units."""
        from .summary_from_results import summarise
        cfg = with_overrides(SETUPS[setup](), overrides)
        if live_workers and "sync_tasks" not in overrides:
            cfg = with_overrides(cfg, {"sync_tasks": default_sync_tasks(cfg, live_workers)})
        point = None
        if resume:
            point = resume_point(cfg, checkpoint_dir, name or default_name(cfg), None if resume is True else resume)
        topo = build_topology(cfg, name=name, checkpoint_dir=checkpoint_dir, resume=point,
                              keep_checkpoints=keep_checkpoints)

        def check(results, wall_s=None):
            s = summarise(cfg, results, workers=None, wall_s=wall_s)
            return True, f"{s.accuracy_line()}, {s.samples_per_s:,.0f} samples/s", s.to_dict()
        return topo, check
    return build


BUILDERS = {name: _builder(name) for name in SETUPS}
