"""`train` and `submit` take the same training flags, from one declaration, and map
them to the same configuration."""
import pytest

from streamnet.cli.submit import build_parser, main
from streamnet.cli.train_args import TRAINING_FLAGS, config_from_args, given_options
from streamnet.training.config import SETUPS, with_overrides

# Adding a training flag means adding it here, and it reaches both commands.
FROZEN = ["--balance", "--batch", "--checkpoint-dir", "--data", "--dataset", "--epochs", "--eval-every", "--input-size",
          "--keep-checkpoints", "--lr",
          "--lr-schedule", "--momentum", "--outer-momentum", "--overlap", "--resume", "--seed", "--sync-period",
          "--sync-tasks", "--test-limit", "--threads", "--train-limit", "--workers"]
TRAIN_ONLY = {"-h", "--help", "--model", "--algorithm", "--local", "--in-process", "--summary", "--ui", "--ui-host"}
SUBMIT_ONLY = {"-h", "--help", "--name", "--set", "--wait", "--summary", "--timeout", "--zk", "--zk-root",
               "--zk-tls", "--cluster", "--secret-file", "--session-timeout"}
# on both commands, but not part of the configuration: where the run's figures go
TRAIN_ONLY |= {"--metrics-log"}
SUBMIT_ONLY |= {"--metrics-log"}
# on every subcommand (as before it)
TRAIN_ONLY |= {"--log-level"}
SUBMIT_ONLY |= {"--log-level"}


def _options(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {s for a in sub._actions for s in a.option_strings}


def test_the_flag_list_is_frozen():
    assert sorted(f.flag for f in TRAINING_FLAGS) == FROZEN


def test_train_and_submit_take_the_same_training_flags():
    assert _options("train") - TRAIN_ONLY == set(FROZEN)
    assert _options("submit") - SUBMIT_ONLY == set(FROZEN)


ALL = ["--epochs", "3", "--workers", "4", "--threads", "2", "--batch", "16", "--sync-period", "4", "--lr", "0.1",
       "--momentum", "0.5", "--outer-momentum", "0.3", "--lr-schedule", "constant", "--input-size", "32",
       "--dataset", "synthetic", "--data", "/nowhere", "--train-limit", "100", "--test-limit", "50",
       "--seed", "7", "--balance", "static", "--sync-tasks", "2", "--eval-every", "2", "--overlap", "on"]


def test_every_flag_lands_in_the_configuration_the_same_way_for_both_commands():
    train = build_parser().parse_args(["train", *ALL])
    submit = build_parser().parse_args(["submit", "lenet5-mixbp", "--zk", "z:1", *ALL])
    cfg = config_from_args(train)
    assert cfg == with_overrides(SETUPS["lenet5-mixbp"](), given_options(submit))
    alg = cfg.algorithm
    assert (cfg.epochs, cfg.units, cfg.threads, cfg.seed, cfg.balance, cfg.sync_tasks, cfg.eval_every_epochs) == \
        (3, 4, 2, 7, "static", 2, 2)
    assert (alg.batch, alg.sync_period, alg.lr, alg.momentum, alg.outer_momentum, alg.lr_schedule, alg.overlap) == \
        (16, 4, 0.1, 0.5, 0.3, "constant", True)
    assert cfg.model.input_size == 32
    assert (cfg.data.dataset, cfg.data.data_dir, cfg.data.train_limit, cfg.data.test_limit) == \
        ("synthetic", "/nowhere", 100, 50)


def test_flags_not_given_leave_the_setup_and_train_runs_a_thread_and_a_sync_task_per_unit():
    cfg = config_from_args(build_parser().parse_args(["train", "--workers", "3"]))
    assert cfg == with_overrides(SETUPS["lenet5-mixbp"](), {"units": 3, "threads": 3, "balance": "load",
                                                          "sync_tasks": 3})
    assert cfg.data.dataset == "fashion-mnist" and cfg.seed == 0


def test_run_options_are_not_configuration():
    a = build_parser().parse_args(["train", "--checkpoint-dir", "/tmp/x", "--resume"])
    assert given_options(a) == {"checkpoint_dir": "/tmp/x", "resume": True}
    assert config_from_args(a) == with_overrides(SETUPS["lenet5-mixbp"](), {"threads": 2, "balance": "load",
                                                                          "sync_tasks": 2})


def test_both_commands_balance_by_load_unless_told():
    from streamnet.cli.cluster_commands import build_topology
    assert config_from_args(build_parser().parse_args(["train"])).balance == "load"
    topo, _ = build_topology("lenet5-mixbp", {"dataset": "synthetic"})
    assert topo.config["balance"] == "load"
    topo, _ = build_topology("lenet5-mixbp", {"dataset": "synthetic", "balance": "static"})
    assert topo.config["balance"] == "static"
    assert SETUPS["lenet5-mixbp"]().balance == "static"      # a configuration built in code stays deterministic


@pytest.mark.parametrize("command", [["train"], ["submit", "lenet5-mixbp", "--zk", "127.0.0.1:1"]])
def test_a_refused_value_names_its_flag(command, capsys):
    assert main([*command, "--dataset", "synthetic", "--sync-period", "0"]) == 2
    assert "error: --sync-period must be >= 1; got 0" in capsys.readouterr().err


def test_submits_default_sync_tasks_is_one_per_worker_hosting_a_unit():
    from streamnet.training.nsmap import BUILDERS
    build = BUILDERS["lenet5-mixbp"]
    sync_tasks = lambda **o: len(build(dataset="synthetic", units=3, **o)[0].tasks("sync"))  # noqa: E731
    assert [sync_tasks(live_workers=w) for w in (1, 2, 5)] == [1, 2, 3]      # up to the number of units
    assert sync_tasks(live_workers=5, sync_tasks=2) == 2 and sync_tasks() == 1


def test_threads_auto_is_the_cores_this_process_may_run_on():
    import os
    a = build_parser().parse_args(["train", "--threads", "auto"])
    assert a.threads == "auto" and config_from_args(a).threads == len(os.sched_getaffinity(0))


def test_eval_every_defaults_to_every_epoch_and_reaches_the_topology():
    """--eval-every N sets RunConfig.eval_every_epochs for train and submit (the topology's
    spec carries it to the sync and eval bolts); without it, every epoch is evaluated."""
    from streamnet.cli.cluster_commands import build_topology
    from streamnet.training.nsmap import run_config_of
    assert config_from_args(build_parser().parse_args(["train"])).eval_every_epochs == 1
    assert config_from_args(build_parser().parse_args(["train", "--eval-every", "3"])).eval_every_epochs == 3
    submit = build_parser().parse_args(["submit", "lenet5-mixbp", "--zk", "z:1", "--eval-every", "3"])
    topo, _ = build_topology("lenet5-mixbp", {"dataset": "synthetic", **given_options(submit)})
    assert run_config_of(topo).eval_every_epochs == 3
    assert all(c["config"]["run"]["eval_every_epochs"] == 3 for c in topo.components if c["id"] in ("sync", "eval"))
