# PYTHON_ARGCOMPLETE_OK: argcomplete's global completion looks for this mark
"""streamnet-submit: train locally, and (with the cluster) submit and manage topologies."""
from __future__ import annotations

import argparse
import logging
import sys

from ..errors import ConfigError, StreamnetError
from .common import (ENVIRONMENT, LOG_LEVELS, Parser, add_common_options, check_writable, completing, error_exit,
                     interrupted, parse_set, port_number, positive_float, positive_int)
from .metrics_log import MetricsLog, add_option as add_metrics_log_option
from .progress import RunProgress, stragglers_line
from .train_args import add_training_options, config_from_args, given_options, naming_the_flag


#: units `train` runs as embedded workers of this process (one worker each). They all
#: talk from one address, and a worker takes at most guard.MAX_PER_ADDRESS (256)
#: connections from one: 300 units waited for ever on refused connections (and a
#: Ctrl-C's clean stop with them). Past this, a cluster: streamnet-worker and submit.
MAX_LOCAL_UNITS = 128


def cmd_train(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    if not a.in_process and cfg.units > MAX_LOCAL_UNITS:
        raise StreamnetError(f"--workers {cfg.units}: the embedded local cluster runs at most {MAX_LOCAL_UNITS} units "
                             "(one worker each, in this process); start streamnet-worker processes and use "
                             "`streamnet-submit submit`, or --in-process")
    check_writable(a.summary, "--summary")
    check_writable(a.metrics_log, "--metrics-log")
    alg = cfg.algorithm
    where = "in this process" if a.in_process else f"on an embedded local cluster of {cfg.units} workers"
    print(f"training {cfg.model.name} on {cfg.data.dataset} with {alg.name} {where} "
          f"(units={cfg.units}, b={alg.batch}, H={alg.sync_period}, lr={alg.lr}, epochs={cfg.epochs})",
          file=sys.stderr)
    import signal
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # SIGTERM stops as Ctrl-C does, and says so
    if a.in_process and (a.checkpoint_dir or a.resume):
        raise StreamnetError("--checkpoint-dir and --resume need the engine; drop --in-process")
    if a.in_process and a.ui is not None:
        raise StreamnetError("--ui shows the engine's cluster; drop --in-process")
    log = MetricsLog(a.metrics_log) if a.metrics_log else None
    progress = RunProgress(cfg.epochs, metrics_log=log)
    try:
        summary = _train(a, cfg, progress)
    except ConfigError as e:     # refused when the topology is built (--keep-checkpoints, --sync-tasks)
        raise naming_the_flag(e, given_options(a)) from None
    finally:
        progress.close()
        if log:
            log.close()
    print(f"final {summary.accuracy_line()}  {summary.samples_per_s:,.0f} samples/s  "
          f"wall {summary.wall_s:.1f} s")
    held = stragglers_line(summary.extra.get("stragglers"))
    if held:
        print(held, file=sys.stderr)
    if a.summary:
        summary.write(a.summary)
        print(f"summary written to {a.summary}", file=sys.stderr)
    if a.metrics_log:
        print(f"metrics written to {a.metrics_log} (draw them: streamnet-submit plot {a.metrics_log})",
              file=sys.stderr)
    return 1 if summary.extra.get("stopped_at") else 0    # a run cut short did not succeed


def _train(a: argparse.Namespace, cfg, progress: RunProgress):
    if a.in_process:
        from ..training import train_local

        def show(p):
            progress.round(epoch=p.epoch, round=p.round, epoch_rounds=p.rounds, loss=p.loss,
                           samples_per_s=p.samples_per_s, step=p.step, samples=p.run_samples)
            if p.test_accuracy is not None:
                progress.epoch(epoch=p.epoch, loss=p.loss, test_accuracy=p.test_accuracy,
                               samples_per_s=p.samples_per_s)
        return train_local(cfg, progress=show).summary
    from ..training.cluster_run import train_on_local_cluster
    attach = None
    if a.ui is not None:
        from ..ui.server import for_local_cluster
        attach = lambda cluster: for_local_cluster(cluster, a.ui_host, a.ui)  # noqa: E731
    summary, _ = train_on_local_cluster(cfg, workers=cfg.units, threads=max(1, cfg.threads // cfg.units),
                                        threads_auto=a.threads == "auto",
                                        progress=progress.record, checkpoint_dir=a.checkpoint_dir,
                                        resume=a.resume or False, keep_checkpoints=a.keep_checkpoints,
                                        attach=attach)
    for h in summary.history:    # those that ended between two progress polls (each is shown once)
        if h.test_accuracy is None:      # an epoch not evaluated (--eval-every)
            continue
        progress.epoch(epoch=h.epoch, loss=h.train_loss, test_accuracy=h.test_accuracy, test_loss=h.test_loss)
    if summary.extra["resumed_from_step"] is not None:
        print(f"resumed from step {summary.extra['resumed_from_step']}", file=sys.stderr)
    if summary.extra["stopped_at"]:
        ck = summary.extra["last_checkpoint"]
        print(f"streamnet-submit: stopped by a signal at step {summary.extra['stopped_at']['step']} before "
              "the last epoch"
              + (f"; checkpoint {ck['path']}; continue with the same command and --resume" if ck else
                 f" (no checkpoint was written: {summary.extra['checkpoint_errors']} failed; see the log)"
                 if a.checkpoint_dir else " (no --checkpoint-dir: nothing to resume from)"), file=sys.stderr)
    return summary


def cmd_run_example(a: argparse.Namespace) -> int:
    import time

    from ..examples.registry import EXAMPLES
    from ..runtime import LocalCluster
    from .cluster_commands import build_topology
    if a.name not in EXAMPLES:
        raise StreamnetError(f"unknown example {a.name!r}; known: {', '.join(EXAMPLES)}")
    topo, check = build_topology(a.name, parse_set(a.set))
    print(topo.describe(), file=sys.stderr)
    with LocalCluster(workers=a.workers, threads=a.threads) as cluster:
        t0 = time.perf_counter()
        results = cluster.run(topo, timeout=a.timeout)
        ok, text = check(results)[:2]
    print(f"{a.name}: {'OK' if ok else 'WRONG'}: {text} ({time.perf_counter() - t0:.2f} s on {a.workers} workers)")
    return 0 if ok else 1


def build_parser() -> Parser:
    p = Parser(prog="streamnet-submit", description=__doc__, epilog=ENVIRONMENT)
    add_common_options(p, "WARNING")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a network (--local: in this machine)")
    add_training_options(t, setup=True)
    t.add_argument("--local", action="store_true", default=True,
                   help="train on an embedded local cluster on this machine (the default; a ZooKeeper "
                        "cluster uses `submit`)")
    t.add_argument("--in-process", action="store_true",
                   help="run the units in this process without the engine (the reference trainer)")
    t.add_argument("--summary", metavar="FILE", help="write a JSON run summary")
    add_metrics_log_option(t)
    t.add_argument("--ui", type=port_number, metavar="PORT",
                   help="serve the web UI (cluster, topology graph, training curves) on this port while training")
    t.add_argument("--ui-host", default="127.0.0.1", metavar="ADDRESS",
                   help="address the --ui server listens on (default 127.0.0.1: this machine only)")
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("run-example", help="run an example topology (wordcount, tensor_pipe) and check it")
    e.add_argument("name", help="example: wordcount or tensor_pipe")
    e.add_argument("--local", action="store_true", default=True, help="on an embedded local cluster (default)")
    e.add_argument("--workers", type=positive_int, default=2, help="local workers (default 2)")
    e.add_argument("--threads", type=positive_int, default=2, help="compute threads per worker (default: 2)")
    e.add_argument("--timeout", type=positive_float, default=300.0, help="seconds before giving up")
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="example option, e.g. count=5000 or fail_every=7")
    e.set_defaults(func=cmd_run_example)
    from .cluster_commands import add_commands
    add_commands(sub)
    from .file_commands import add_commands as add_file_commands
    add_file_commands(sub)
    for command in sub.choices.values():     # after the subcommand too (`list --log-level debug`)
        command.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=argparse.SUPPRESS,
                             help="as before the command")
    return p


def main(argv: list[str] | None = None) -> int:
    a = completing(build_parser()).parse_args(argv)
    logging.basicConfig(level=a.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    try:
        return a.func(a)
    except StreamnetError as e:
        return error_exit("streamnet-submit", e)
    except BaseException as e:   # Ctrl-C or SIGTERM, plain or wrapped by the code it landed in
        if not interrupted(e):
            raise
        print("\nstreamnet-submit: interrupted (Ctrl-C or SIGTERM)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
