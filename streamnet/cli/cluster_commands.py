"""streamnet-submit's cluster subcommands: submit, list, status, describe, rebalance, kill."""
from __future__ import annotations

import json
import os
import sys
import time

from ..errors import ConfigError, StreamnetError
from ..runtime.control import (RUNNING, ClusterTimeout, TopologyFailed, TopologyGone, UnknownTopologyError,
                               drain_topology, is_done, kill_topology, wait_done)
from ..runtime.assignment import MAX_THREADS, threads_ok
from ..runtime.topology import Topology, TopologyError, parallelism_fixed, resolve
from ..runtime.values import whole
from ..training.run_stats import CHECKPOINTS, EVAL_HISTORY, STOPPED_AT, STRAGGLERS, SYNC_STATS
from .common import (add_cluster_options, allowed_modules, check_writable, connect, parse_set, positive_float,
                     read_secret, write_secret)
from .metrics_log import MetricsLog, add_option as add_metrics_log_option
from .progress import ProgressLine, RunProgress, stragglers_line
from .train_args import (DEFAULT_BALANCE, TRAINING_FLAGS, add_training_options, auto_threads, check_paths,
                         check_set_types, given_options, naming_the_flag)


def build_topology(what: str, options: dict, flags: dict | None = None):
    """A topology by built-in name or "module:function"; returns (topology, checker or None).
    `flags`: {option: the command-line flag it came from}, to name in an error."""
    from ..examples.registry import EXAMPLES
    from ..training.nsmap import BUILDERS as builders
    if what in EXAMPLES:
        _check_options(what, options, flags)
        return EXAMPLES[what](**options)
    if what in builders:
        check_set_types(options)
        return builders[what](**{"balance": DEFAULT_BALANCE, **options})
    if ":" in what:
        try:
            topo = resolve(what)(**options)
        except TypeError as e:
            raise StreamnetError(f"{what}: {e}") from None
        except TopologyError as e:
            raise StreamnetError(f"topology {what!r}: {e}") from None
        if not isinstance(topo, Topology):
            raise StreamnetError(f"{what} returned {type(topo).__name__}, not a Topology")
        return topo, None
    raise StreamnetError(f"unknown topology {what!r}; built in: {', '.join(list(EXAMPLES) + list(builders))}; "
                         "or give module:function")


def _is_training(what: str) -> bool:
    from ..training.nsmap import BUILDERS
    return what in BUILDERS


def _check_options(example: str, options: dict, flags: dict | None = None) -> None:
    """An example's --set options against its builder's signature: a name it does not
    take, or a value of the wrong type, is one line listing what it does take, naming
    the flag the option came from where it came from one (`flags`: {option: flag})."""
    import importlib
    import inspect

    from ..runtime.topology import DEFAULT_CONFIG
    params = {k: p.default for k, p in
              inspect.signature(importlib.import_module(f"streamnet.examples.{example}").topology).parameters.items()
              if p.kind is p.POSITIONAL_OR_KEYWORD}
    known = sorted(params) + sorted(DEFAULT_CONFIG)
    for k, v in options.items():
        want = params.get(k, DEFAULT_CONFIG.get(k))
        if k not in params and k not in DEFAULT_CONFIG:
            if k in (flags or {}):
                raise StreamnetError(f"{example} does not take {flags[k]} (a training topology's flag); its "
                                     f"options (--set KEY=VALUE): {', '.join(known)}")
            raise StreamnetError(f"{example} has no option {k!r} (--set {k}=...); options: {', '.join(known)}")
        if isinstance(want, bool) and not isinstance(v, bool):
            raise StreamnetError(f"--set {k} takes true or false; got {v!r}")
        if isinstance(want, int) and not isinstance(want, bool) and (isinstance(v, bool) or not isinstance(v, int)):
            raise StreamnetError(f"--set {k} takes an integer; got {v!r}")
        if isinstance(want, float) and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise StreamnetError(f"--set {k} takes a number; got {v!r}")


def cmd_submit(a) -> int:
    check_writable(a.summary, "--summary")
    check_writable(a.metrics_log, "--metrics-log")
    if a.metrics_log and not a.wait:
        raise StreamnetError("--metrics-log needs --wait (the figures are read while following the run)")
    if a.summary and not a.wait:
        raise StreamnetError("--summary needs --wait (the summary is written when the run ends)")
    opts = parse_set(a.set)
    if a.name:
        opts["name"] = a.name
    given = given_options(a)
    check_paths(given)
    auto_threads(given)      # (a cluster's workers each decide their own threads)
    opts.update(given)
    for key in ("data_dir", "checkpoint_dir"):
        # a relative path is this command's: the workers, each in its own working directory
        # (the systemd unit's is /), read it as it stands
        if isinstance(opts.get(key), str) and opts[key]:
            opts[key] = os.path.abspath(opts[key])
    from ..runtime.control.roles import parse
    from ..training.checkpoint import signing_with
    # check the checkpoint's MAC here when we hold the cluster secret (the workers always do)
    secret = parse(read_secret(a.secret_file))[1] if getattr(a, "resume", None) and a.secret_file else None

    def build(extra: dict):
        try:
            with signing_with(secret):
                return build_topology(a.topology, {**opts, **extra},
                                      {f.key: f.flag for f in TRAINING_FLAGS if f.key in given})
        except ConfigError as e:
            raise naming_the_flag(e, given, opts) from None
        except TopologyError as e:
            raise StreamnetError(str(e)) from None
    topo, check = build({})
    try:   # what the workers will check: refuse here, before anything is written
        topo.validate(check_classes=True, allow=allowed_modules(a))
    except TopologyError as e:
        raise StreamnetError(f"topology {topo.name!r} would be refused by the workers: {e}") from None
    coord, state, _ = connect(a)
    try:
        workers = state.workers()
        if not workers:
            raise StreamnetError(f"no workers in cluster {a.cluster!r}; start streamnet-worker first")
        if _is_training(a.topology) and "sync_tasks" not in opts:   # its default depends on the cluster
            # built again, the checkpoint to resume from included: with the secret, as above
            # (without it, the newest file was taken whatever its MAC, and the workers refused it)
            topo, check = build({"live_workers": len(workers)})
        if getattr(a, "resume", None):
            from ..training.nsmap import check_recorded
            check_recorded(topo.to_dict(), state.checkpoint(topo.name))
        if getattr(a, "resume", None) and state.status(topo.name) == "stopping" and is_done(state, topo.name):
            # stopped cleanly by SIGTERM to its workers: its checkpoint is what we resume from
            kill_topology(state, topo.name, a.timeout)
            print(f"removed the stopped {topo.name}", file=sys.stderr)
        spec = topo.to_dict()
        from ..training.nsmap import set_aside_for_resume
        # a resumed run's newer checkpoints move aside only now: the name is free and every
        # check passed (moved while building, a failed submit or a live run lost them)
        state.submit_topology(topo.name, spec, before=lambda: set_aside_for_resume(spec))
        print(f"submitted {topo.name} ({topo.num_tasks} tasks) to cluster {a.cluster}", file=sys.stderr)
        if not a.wait:
            return 0
        return _follow(state, topo, check, a)
    finally:
        coord.close()


def _follow(state, topo: Topology, check, a) -> int:
    from ..training.nsmap import run_config_of
    cfg = run_config_of(topo)
    if cfg is None:
        line, t0 = ProgressLine(), time.monotonic()

        def spouts_done(done: int, total: int):
            line.update(f"{topo.name}: spouts done {done}/{total}  {time.monotonic() - t0:.0f} s")
        return _follow_topology(state, topo, check, a, spouts_done, line.line)
    # a training topology: the same live loss, accuracy and samples/s as train
    from ..training.cluster_run import ProgressReader
    log = MetricsLog(a.metrics_log) if a.metrics_log else None
    progress = RunProgress(cfg.epochs, metrics_log=log)
    reader = ProgressReader(state, topo.name, cfg.epochs)

    def training(done: int, total: int):
        p = reader.read()
        if p:
            progress.record(p)

    def evaluated(results: dict):     # the epochs that ended between two polls (and the last)
        losses = (results.get(SYNC_STATS) or {}).get("epoch_train_loss") or {}
        for h in results.get(EVAL_HISTORY) or []:
            progress.epoch(epoch=h["epoch"], test_accuracy=h["test_accuracy"], test_loss=h["test_loss"],
                           loss=losses.get(str(h["epoch"])))
    try:
        return _follow_topology(state, topo, check, a, training, progress.message, evaluated)
    finally:
        progress.close()
        if log:
            log.close()


def _follow_topology(state, topo: Topology, check, a, report, say, collected=None) -> int:
    """Wait for the end with report(done, total) after each look; collected(results) once
    they are in; say(text) the outcome."""
    t0 = time.monotonic()
    import signal
    signal.signal(signal.SIGTERM, signal.default_int_handler)    # SIGTERM leaves as Ctrl-C does
    try:
        wait_done(state, topo.name, a.timeout, interval=0.2, on_poll=report)
    except KeyboardInterrupt:   # only this client stops: the topology is the cluster's now
        where = f"--zk {a.zk} --cluster {a.cluster}" + (f" --secret-file {a.secret_file}" if a.secret_file else "")
        where += (f" --zk-root {a.zk_root}" if getattr(a, "zk_root", "/streamnet") != "/streamnet" else "") + \
            (f" --zk-tls {a.zk_tls}" if getattr(a, "zk_tls", None) else "")
        print(f"\nstreamnet-submit: interrupted; {topo.name} keeps running on cluster {a.cluster}; stop it with: "
              f"streamnet-submit kill {topo.name} {where} (add --checkpoint to keep a checkpoint)", file=sys.stderr)
        return 130
    except ClusterTimeout:
        print(f"\nstreamnet-submit: error: {topo.name} did not finish within {a.timeout:.0f} s", file=sys.stderr)
        return 1
    except TopologyGone:
        print(f"\nstreamnet-submit: error: {topo.name} was killed before finishing", file=sys.stderr)
        return 1
    except TopologyFailed as e:   # it would never finish: take it off the cluster
        kill_topology(state, topo.name, 60)
        print(f"\nstreamnet-submit: error: {e}; killed it", file=sys.stderr)
        return 1
    wall = time.monotonic() - t0
    results = kill_topology(state, topo.name, a.timeout)
    if STOPPED_AT in results:     # its workers were stopped (SIGTERM) before it finished
        print(f"\nstreamnet-submit: error: {topo.name} was stopped before finishing (its workers got a signal) at "
              f"step {results[STOPPED_AT]['step']}{resume_hint(results)}", file=sys.stderr)
        return 1
    if collected:
        collected(results)
    say(f"{topo.name} finished in {wall:.1f} s")
    ok, text, *extra = check(results, wall) if check else (True, f"{len(results)} results")
    print(f"{topo.name}: {'OK' if ok else 'WRONG'}: {text}")
    if a.summary:
        body = {"topology": topo.name, "ok": ok, "wall_s": wall, "text": text}
        body.update(extra[0] if extra else {"results": _jsonable(results)})
        body["wall_s"] = wall
        with open(a.summary, "w") as f:
            json.dump(_jsonable(body), f, indent=2, default=str)
    return 0 if ok else 1


def _jsonable(value):
    try:
        import numpy as np
        if isinstance(value, np.ndarray):
            return value.tolist()
    except ImportError:
        pass
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def resume_hint(results: dict) -> str:
    """Where a stopped training run can go on from: its newest checkpoint, said to be
    older than the stop where the checkpoint of the stop itself was not written."""
    ck = (results.get(CHECKPOINTS) or {}).get("last")
    stopped = results.get(STOPPED_AT)
    if not ck:
        return ""
    if stopped and stopped.get("step") != ck.get("step"):
        return (f"; its checkpoint there was not written (the workers' logs say why): the newest is step "
                f"{ck['step']}, {ck['path']}; continue from it with: streamnet-submit submit ... --resume")
    return f"; checkpoint {ck['path']}; continue with: streamnet-submit submit ... --resume"


def drained_line(name: str, results: dict, finished: bool) -> str:
    """What `kill --checkpoint` says of a topology it drained and removed: one that could
    not run (failed), one that had finished before it was asked, or where it stopped."""
    n = len(results)
    failures = sorted(k for k in results if k.startswith(("failed.", "refused.")))
    if failures:
        return (f"{name} could not run ({', '.join(failures[:3])}); killed it without a clean stop; "
                f"{n} results published")
    if finished:
        return f"{name} had finished; nothing to stop or resume; {n} results published"
    stopped = results.get(STOPPED_AT)      # a training topology's; absent in others
    if stopped:
        return (f"stopped {name} at step {stopped['step']}"
                + (resume_hint(results) or " (it writes no checkpoints: no --checkpoint-dir)"))
    return f"stopped {name} cleanly, every spout done; {n} results published"


def cmd_kill(a) -> int:
    coord, state, _ = connect(a)
    try:
        if not a.checkpoint:
            results = kill_topology(state, a.topology, a.timeout)
            print(f"killed {a.topology}; {len(results)} results published")
            return 0
        try:
            finished = is_done(state, a.topology)     # before the stop: had it come to its end itself?
        except (StreamnetError, TypeError):           # not there (drain says so), or a node without a spec
            finished = False
        print(f"stopping {a.topology} cleanly (a last checkpoint round, then stop)...", file=sys.stderr)
        results = drain_topology(state, a.topology, a.timeout)
        print(drained_line(a.topology, results, finished))
        return 0
    finally:
        coord.close()


#: a topology node that holds no spec: what a worker's late write (a stopped mark, a result)
#: made again after a kill removed the topology; `submit` of that name clears it too
LEFTOVER = "(no spec: left over from a kill; `streamnet-submit kill {}` removes it)"


def cmd_list(a) -> int:
    coord, state, _ = connect(a)
    try:
        names = state.topology_names()
        if not names:
            print("no topologies")
        for n in names:
            try:
                spec = state.topology(n)
            except UnknownTopologyError:
                continue            # removed since the listing
            if not isinstance(spec, dict):
                print(f"{n:<20s} {LEFTOVER.format(n)}")
                continue
            asg, version = state.assignment(n)
            tasks = sum(c["parallelism"] for c in spec["components"])
            print(f"{n:<20s} {state.status(n) or '?':<8s} {tasks:4d} tasks  assignment v{version}  "
                  f"workers {','.join(sorted(asg.workers if asg else ())) or '-'}")
        return 0
    finally:
        coord.close()


def _get_status(url: str, token: str | None) -> tuple[dict | None, str]:
    """A worker's /status, or None and why it cannot be read: a worker that asks for the
    monitor token (401) answered, it is not "unreachable"."""
    import urllib.error

    from ..runtime import monitor
    try:
        return monitor.get_status(url, token), ""
    except urllib.error.HTTPError as e:
        if e.code == 401:
            return None, ("refused: it needs the monitor token (401); set $STREAMNET_MONITOR_TOKEN_FILE to its "
                          "--monitor-token-file" if token is None else "refused: not this monitor token (401)")
        return None, f"unreadable ({e.code})"
    except (OSError, ValueError):
        return None, "unreachable"


def busy_rate(executed: int, busy_s: float) -> str:
    """A task's tuples per second of its own busy time, for `status`; below a
    millisecond of it, the time itself (9 tuples in a microsecond read as 9,000,000/s)."""
    if busy_s < 1e-3:
        return f"busy {busy_s * 1e6:.0f} us" if executed else "idle"
    return f"~{executed / busy_s:,.0f}/s busy"


def cmd_status(a) -> int:
    coord, state, _ = connect(a)
    try:
        from ..runtime import monitor
        token = monitor.token_from_environment()      # a bad token file: said before anything is printed
        names = state.topology_names()
        if a.topology and a.topology not in names:
            raise StreamnetError(f"no topology {a.topology!r} in cluster {a.cluster!r}; "
                                 f"running: {', '.join(names) or 'none'}")
        workers = state.workers()
        if not workers:
            print(f"cluster {a.cluster}: no workers")
            return 1
        print(f"cluster {a.cluster}: {len(workers)} worker(s)")
        statuses = {}
        for w, info in sorted(workers.items()):
            st, why = _get_status(f"http://{info['host']}:{info['port']}", token)
            statuses[w] = st
            lead = " leader" if st and st.get("leader") else ""
            fraction = st.get("busy_fraction") if st else None
            busy = why if not st else f"busy {fraction:.0%}" if isinstance(fraction, (int, float)) else "busy ?"
            load = info.get("load") or {}
            other = f"  other processes busy {load['foreign_busy']:.2f} of {load['cores']} cores" \
                if "foreign_busy" in load else ""
            print(f"  {w:<16s} {info['host']}:{info['port']:<6d} threads {info.get('threads')}  {busy}{lead}{other}")
        for n in names:
            if a.topology and n != a.topology:
                continue
            asg, version = state.assignment(n)
            try:
                if not isinstance(state.topology(n), dict):
                    print(f"topology {n}: {LEFTOVER.format(n)}")
                    continue
                status, done = state.status(n), is_done(state, n)
            except UnknownTopologyError:
                continue            # removed since the listing
            ended = (": stopped cleanly, every spout done" if status == "stopping" else ": finished, every spout done") \
                if done else ""
            print(f"topology {n} ({status}{ended}), assignment v{version}")
            failures = state.failures(n)          # why it cannot run (status "failed"), if it cannot
            for key, why in list(failures.items())[:5]:
                print(f"  {key}: {why}")
            if len(failures) > 5:
                print(f"  and {len(failures) - 5} more failures (all: the topology's results)")
            away = sorted(set(asg.tasks.values()) - set(workers)) if asg else []
            if away:
                print(f"  tasks on workers no longer registered: {', '.join(away)}"
                      + (" (left there: the topology is done)" if done else " (the leader moves them)"))
            for w, st in sorted(statuses.items()):
                tasks = (st or {}).get("topologies", {}).get(n, {}).get("tasks", {})
                for t, m in sorted(tasks.items(), key=lambda kv: int(kv[0])):
                    extra = f"queue {m['queue']}/{m['queue_max']}" if "queue" in m else \
                        f"pending {m['pending']}/{m['pending_max']}"
                    if m.get("overflow"):      # from other workers, behind a full queue (senders told to hold)
                        extra += f" + {m['overflow']} in overflow"
                    share = f"  share {asg.shares[int(t)]:.2f}" if asg and int(t) in asg.shares else ""
                    print(f"    task {t:>3s} {m['component']:<12s} on {w:<12s} executed {m['executed']:>8d}  "
                          f"acked {m['acked']:>8d}  failed {m['failed']:>5d}  {extra}  "
                          f"{busy_rate(m['executed'], m['execute_s_total'])}{share}")
            held = stragglers_line(state.results(n).get(STRAGGLERS))
            if held:
                print(f"  {held}")
            decisions = state.balance_log(n)
            if decisions:
                print(f"  load balancing: last {min(len(decisions), 5)} of {len(decisions)} decisions kept")
                for d in decisions[-5:]:
                    print(f"    {time.strftime('%H:%M:%S', time.localtime(d['time']))}  {d['decision']}")
        return 0
    finally:
        coord.close()


def cmd_describe(a) -> int:
    if a.zk:
        try:
            coord, state, _ = connect(a)
        except StreamnetError as e:
            if not _built_in(a.topology):
                raise
            # $STREAMNET_ZK set, say, without a secret: a built-in one needs no cluster
            print(f"streamnet-submit: not looking for a running {a.topology!r} ({e}); the built-in one:",
                  file=sys.stderr)
            return _describe_built(a)
        try:
            if a.topology in state.topology_names():
                print(Topology.from_dict(state.topology(a.topology)).describe())
                return 0
        finally:
            coord.close()
    return _describe_built(a)


def _built_in(what: str) -> bool:
    from ..examples.registry import EXAMPLES
    return what in EXAMPLES or _is_training(what)


def _describe_built(a) -> int:
    options = parse_set(a.set)
    try:
        topo, _ = build_topology(a.topology, options)
    except ConfigError as e:
        raise naming_the_flag(e, {}, options) from None
    print(topo.describe())
    return 0


def cmd_rebalance(a) -> int:
    request = {"parallelism": parse_set(a.parallelism, "--parallelism", "COMPONENT=N"),
               "threads": parse_set(a.threads, "--threads", "WORKER=N")}
    if not request["parallelism"] and not request["threads"]:
        raise StreamnetError("say what to change: --parallelism COMPONENT=N and/or --threads WORKER=N")
    coord, state, _ = connect(a)
    try:
        spec = state.topology(a.topology)
        # a topology that no longer runs has nothing to move: the request sat in the
        # coordinator, "requested", and was never carried out
        status = state.status(a.topology)
        if status not in RUNNING:
            raise StreamnetError(f"topology {a.topology!r} is {status or 'without a status'}: nothing of it runs to "
                                 "rebalance")
        if is_done(state, a.topology):
            raise StreamnetError(f"topology {a.topology!r} has finished (its spouts are done): nothing of it runs to "
                                 f"rebalance; `kill {a.topology}` collects its results")
        if request["parallelism"] and parallelism_fixed(spec):
            raise StreamnetError(f"topology {a.topology!r} fixes its components' parallelism (a training run's units "
                                 "and sync slices follow its configuration); --threads WORKER=N may change, "
                                 "--parallelism may not")
        known = {c["id"] for c in spec["components"]}
        for cid, n in request["parallelism"].items():
            if cid not in known:
                raise StreamnetError(f"topology {a.topology!r} has no component {cid!r}; known: {', '.join(sorted(known))}")
            if not whole(n) or n < 1:
                raise StreamnetError(f"parallelism of {cid!r} must be an integer >= 1; got {n!r}")
        if request["parallelism"]:          # the spec it would make, checked as the leader will
            after = {**spec, "components": [{**c, "parallelism": request["parallelism"].get(c["id"], c["parallelism"])}
                                            for c in spec["components"]]}
            try:
                Topology.from_dict(after, check_classes=False)
            except TopologyError as e:
                raise StreamnetError(f"topology {a.topology!r} cannot run with that parallelism: {e}") from None
        workers = state.workers()
        for w, n in request["threads"].items():
            if w not in workers:
                raise StreamnetError(f"no worker {w!r}; workers: {', '.join(sorted(workers))}")
            if not threads_ok(n):
                raise StreamnetError(f"threads of {w!r} must be an integer from 1 to {MAX_THREADS}; got {n!r}")
        state.add_rebalance_request(a.topology, request)
        print(f"rebalance of {a.topology} requested: {request}")
        return 0
    finally:
        coord.close()


def cmd_new_secret(a) -> int:
    write_secret(a.file)
    print(f"wrote a new cluster secret to {a.file} (mode 0600); give every worker and submitter a copy "
          "with the same mode", file=sys.stderr)
    return 0


def cmd_new_credential(a) -> int:
    from ..runtime.control import roles
    secret = read_secret(a.secret_file)
    if roles.parse(secret)[0].role != roles.WORKER:
        raise StreamnetError(f"{a.secret_file} holds a role credential; new-credential needs the cluster secret")
    write_secret(a.file, roles.credential_text(secret, a.role))
    may = "may submit, kill, stop and rebalance topologies" if a.role == roles.SUBMIT else "may only read"
    article = "an" if a.role[0] in "aeiou" else "a"
    print(f"wrote {article} {a.role} credential for the cluster of {a.secret_file} to {a.file} (mode 0600); its "
          f"holder passes it as --secret-file and {may}", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    n = sub.add_parser("new-secret", help="write a new random cluster secret to FILE (mode 0600)")
    n.add_argument("file", metavar="FILE", help="where to write it (refused if it exists)")
    n.set_defaults(func=cmd_new_secret)

    c = sub.add_parser("new-credential", help="write a submit or observer credential for the cluster of "
                                              "--secret-file to FILE (mode 0600)")
    c.add_argument("role", choices=("submit", "observer"),
                   help="submit: submit, kill, stop, rebalance; observer: read only")
    c.add_argument("file", metavar="FILE", help="where to write it (refused if it exists)")
    c.add_argument("--secret-file", default=os.environ.get("STREAMNET_SECRET_FILE") or None,
                   help="the cluster secret it is derived from (default: $STREAMNET_SECRET_FILE)")
    c.set_defaults(func=cmd_new_credential)

    s = sub.add_parser("submit", help="submit a topology to a cluster")
    s.add_argument("topology", help="built-in name or module:function")
    s.add_argument("--name", help="topology name (default: the builder's)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="builder option")
    s.add_argument("--wait", action="store_true", help="follow it to completion, then collect its results")
    s.add_argument("--summary", metavar="FILE", help="with --wait: write a JSON summary")
    add_metrics_log_option(s)
    s.add_argument("--timeout", type=positive_float, default=24 * 3600.0, help="with --wait: seconds before giving up (default 1 day)")
    add_training_options(s.add_argument_group(
        "training topologies (lenet5-mixbp, alexnet-mixbp, lenet5-cumulative, lenet5-online)"))
    add_cluster_options(s)
    s.set_defaults(func=cmd_submit)

    k = sub.add_parser("kill", help="stop a topology everywhere and collect its results")
    k.add_argument("topology", help="topology name (see list)")
    k.add_argument("--checkpoint", action="store_true",
                   help="stop cleanly: finish the round in flight and a checkpoint round, then stop "
                        "(resume with submit --resume)")
    k.add_argument("--timeout", type=positive_float, default=300.0, help="seconds to wait for the workers")
    add_cluster_options(k)
    k.set_defaults(func=cmd_kill)

    ls = sub.add_parser("list", help="topologies on the cluster")
    add_cluster_options(ls)
    ls.set_defaults(func=cmd_list)

    st = sub.add_parser("status", help="workers, assignments, per-task rates")
    st.add_argument("topology", nargs="?", help="only this topology (default: all)")
    add_cluster_options(st)
    st.set_defaults(func=cmd_status)

    d = sub.add_parser("describe", help="print a topology (submitted, or built from its name)")
    d.add_argument("topology", help="submitted name, built-in name or module:function")
    d.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="builder option")
    add_cluster_options(d, zk_required=False)
    d.set_defaults(func=cmd_describe)

    r = sub.add_parser("rebalance", help="change parallelism or compute threads, live")
    r.add_argument("topology", help="topology name (see list)")
    r.add_argument("--parallelism", action="append", default=[], metavar="COMPONENT=N",
                   help="new parallelism of a component (repeatable)")
    r.add_argument("--threads", action="append", default=[], metavar="WORKER=N",
                   help="new compute threads of a worker (repeatable)")
    add_cluster_options(r)
    r.set_defaults(func=cmd_rebalance)
