# PYTHON_ARGCOMPLETE_OK: argcomplete's global completion looks for this mark
"""streamnet-worker: the per-node daemon.

    streamnet-worker --zk zk1:2181,zk2:2181 --cluster prod --secret-file /etc/streamnet/secret \\
                     --host 0.0.0.0 --advertise-host 10.0.0.5 --port 7700 --threads 8

Registers in ZooKeeper, takes part in the leader election (the leader schedules),
runs the tasks assigned to it, serves /status and /metrics.

SIGTERM or SIGINT (`systemctl stop` on one node): hand the tasks back and exit 0;
the leader moves them and the topologies go on on the other workers (--on-signal
leave, the default). With --on-signal checkpoint (for shutting the whole cluster
down), first ask the topologies running here to stop cleanly, cluster-wide (training
finishes its round and writes a checkpoint; `streamnet-submit submit ... --resume`
continues it), waiting at most --stop-grace seconds; a second signal skips the wait.
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import socket
import sys

from ..errors import StreamnetError
from ..runtime.control.coordinator import NodeExistsError
from .common import (ENVIRONMENT, Parser, add_allow_option, add_cluster_options, add_common_options, allowed_modules,
                     completing, connect, error_exit, port_number, positive_float, threads_option,
                     worker_name)


ON_SIGNAL = ("leave", "checkpoint")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
#: run at start, before the worker registers: loads the compiled kernels (training/warmup.py)
DEFAULT_PRELOAD = ("streamnet.training.warmup:load_kernels",)


def build_parser() -> Parser:
    p = Parser(prog="streamnet-worker", description=__doc__.split("\n\n")[0], epilog=ENVIRONMENT)
    add_common_options(p, "INFO")
    add_cluster_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this host only)")
    p.add_argument("--advertise-host", help="address peers use to reach this worker (default: --host)")
    p.add_argument("--port", type=port_number, default=7700, help="port to listen on (default: 7700; 0: any free port)")
    p.add_argument("--threads", type=threads_option, default=len(os.sched_getaffinity(0)),
                   help="compute threads (default: one per core it may run on), or 'auto': start with one per "
                        "core and let the leader's load balancing set them to the cores other processes leave "
                        "free (topologies with --balance load)")
    p.add_argument("--name", type=worker_name,
                   help="worker id, unique in the cluster (default: HOSTNAME-PORT; with --port 0, HOSTNAME-PID)")
    p.add_argument("--on-signal", choices=ON_SIGNAL, default=os.environ.get("STREAMNET_ON_SIGNAL") or "leave",
                   help="on SIGTERM/SIGINT: leave, handing the tasks to the other workers (default: "
                        "$STREAMNET_ON_SIGNAL, else leave), or checkpoint: stop the topologies running here "
                        "cluster-wide, cleanly, with a checkpoint (for shutting the whole cluster down)")
    p.add_argument("--monitor-token-file", metavar="FILE",
                   default=os.environ.get("STREAMNET_MONITOR_TOKEN_FILE") or None,
                   help="require 'Authorization: Bearer <the file's token>' on /status and /metrics (as "
                        "Prometheus' authorization scrape setting sends it; default: $STREAMNET_MONITOR_TOKEN_FILE, "
                        "else they need none)")
    p.add_argument("--preload", action="append", metavar="MODULE:FUNCTION",
                   help="a function to run on the compute threads at start, before the worker registers "
                        "(repeatable; 'none': nothing; default: " + ",".join(DEFAULT_PRELOAD) + ", which loads "
                        "the compiled kernels so that the first round does not wait for them, where "
                        "--allow-module allows it)")
    p.add_argument("--checkpoint-root", metavar="DIR", type=checkpoint_root,
                   default=os.environ.get("STREAMNET_CHECKPOINT_ROOT"),     # an empty one is refused too
                   help="write and resume checkpoints only under DIR: a run whose --checkpoint-dir or --resume "
                        "file lies elsewhere fails, saying so (default: $STREAMNET_CHECKPOINT_ROOT, else "
                        "anywhere this worker's user may write - named by whoever submits)")
    p.add_argument("--stop-grace", type=positive_float, default=120.0, help="seconds to wait for a clean stop (default: 120)")
    tls = p.add_argument_group("TLS for tuple streams (all three, or none: frames then carry a MAC only)")
    tls.add_argument("--tls-cert", metavar="PEM", help="this worker's certificate (its subjectAltName names "
                                                       "the --advertise-host peers dial)")
    tls.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    tls.add_argument("--tls-ca", metavar="PEM", help="the CA that signs every worker's certificate; streams "
                                                     "from senders without one are refused")
    add_allow_option(p)
    return p


def checkpoint_root(value: str) -> str:
    """--checkpoint-root: a directory, as an absolute path (an empty one would mean anywhere)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must be a directory; got an empty path (the flag or "
                                         "$STREAMNET_CHECKPOINT_ROOT)")
    return os.path.abspath(value)


def preload_paths(given: list[str] | None, allow: tuple[str, ...]) -> tuple[str, ...]:
    """--preload as given (comma-separated lists allowed), 'none' for nothing. Without it,
    the default - where the worker may run training at all (its --allow-module list)."""
    if given is None:
        from ..runtime.topology import module_allowed
        return tuple(p for p in DEFAULT_PRELOAD if module_allowed(p.partition(":")[0], allow))
    paths = tuple(p.strip() for item in given for p in item.split(",") if p.strip())
    return tuple(p for p in paths if p != "none")


#: how long a worker waits for the registration of a namesake that does not answer to go
#: (its process died; ZooKeeper ends its session after the session timeout it asked for,
#: at most 20 ticks of the server's)
NAMESAKE_WAIT_S = 60.0


async def _wait_out_a_dead_namesake(state, name: str, secret: bytes, a) -> None:
    """Return once no worker named `name` is registered. One that answers on its address
    and proves the secret is alive: StreamnetError (exit 2, "stop it or pick another
    --name"). One that does not is a process that died within its session (a crash, then
    systemd's restart 5 s later): its registration lasts until ZooKeeper ends that
    session, so this waits for it to go - up to NAMESAKE_WAIT_S, then ClusterTimeout
    (exit 1: a supervisor tries again). Before, that restart exited 2, which the systemd
    unit does not restart (RestartPreventExitStatus=2): one crash left the node down."""
    from ..runtime.control import ClusterTimeout, wait_for
    from ..runtime.control.election import ProbeInconclusive, probe
    from ..runtime.dataplane.transport import Auth
    info = (await asyncio.to_thread(state.workers)).get(name)
    if info is None:
        return
    try:
        why = await asyncio.to_thread(probe, info, name, Auth(secret, name))
    except ProbeInconclusive as e:
        why = str(e)
    where = f"{info.get('host')}:{info.get('port')}"
    if why is None:
        raise StreamnetError(f"a worker named {name} is already registered in cluster {a.cluster} and answers at "
                             f"{where}; stop it or pick another --name")
    logging.getLogger("streamnet").warning(
        "a worker named %s is registered in cluster %s but does not answer at %s (%s): waiting up to %.0f s for "
        "its ZooKeeper session to end (a process that died)", name, a.cluster, where, why, NAMESAKE_WAIT_S)
    try:
        await asyncio.to_thread(wait_for, lambda: name not in state.workers(), NAMESAKE_WAIT_S,
                                f"the registration of the dead worker {name} to go", 0.25)
    except ClusterTimeout as e:
        raise ClusterTimeout(f"{e}; it does not answer at {where} ({why}), but its ZooKeeper session goes on: "
                             "another process holds it, or the server's session timeout is longer; try again, "
                             "or pick another --name") from None


async def serve(a) -> int:
    from ..runtime.worker import Worker
    from ..runtime.monitor import read_token
    from ..runtime.dataplane.tls import TlsConfig
    from ..training.checkpoint import confined_to, signing_with
    token = read_token(a.monitor_token_file) if a.monitor_token_file else None
    tls = TlsConfig(cert=a.tls_cert, key=a.tls_key, ca=a.tls_ca) if a.tls_cert else None
    coord, state, secret = await asyncio.to_thread(connect, a, True)
    name = a.name or f"{socket.gethostname()}-{a.port or os.getpid()}"
    duplicate = StreamnetError(f"a worker named {name} is already registered in cluster {a.cluster}; "
                               "stop it or pick another --name")
    try:
        await _wait_out_a_dead_namesake(state, name, secret, a)
    except BaseException:
        await asyncio.to_thread(coord.close)
        raise
    auto = a.threads == "auto"
    worker = Worker(worker_id=name, state=state, secret=secret, host=a.host, port=a.port,
                    threads=len(os.sched_getaffinity(0)) if auto else a.threads, threads_auto=auto,
                    advertise_host=a.advertise_host, allow_modules=allowed_modules(a), monitor_token=token,
                    tls=tls, preload=preload_paths(a.preload, allowed_modules(a)))
    # checkpoints written and resumed here carry its MAC, and lie under --checkpoint-root
    with signing_with(secret), confined_to(a.checkpoint_root):
        try:
            try:
                await worker.start()
            except NodeExistsError:     # registered between the check above and now
                await worker.stop(drain_s=0)
                raise duplicate from None
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise StreamnetError(f"port {a.port} on {a.host} is in use; pick another with --port") \
                        from None
                raise StreamnetError(f"cannot listen on {a.host}:{a.port}: {e.strerror}") from None
            stop, hurry = asyncio.Event(), asyncio.Event()
            loop = asyncio.get_running_loop()

            def on_signal():
                (hurry if stop.is_set() else stop).set()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal)
            log = logging.getLogger("streamnet")
            log.info("worker %s up on %s:%d (cluster %s, ZooKeeper %s, session timeout %.1f s asked, within the "
                     "2 to 20 ticks the server grants: a worker silent that long is declared dead; refused "
                     "connections are detected sooner; classes from %s)", name,
                     a.host, worker.port, a.cluster, a.zk, a.session_timeout, ",".join(worker.allow_modules))
            await stop.wait()
            log.info("worker %s: signal received; stopping (%s)", name, a.on_signal)
            if a.on_signal == "checkpoint" and worker.runtimes:
                clean = asyncio.ensure_future(worker.stop_topologies_cleanly(a.stop_grace))
                await asyncio.wait([clean, asyncio.ensure_future(hurry.wait())],
                                   return_when=asyncio.FIRST_COMPLETED)
                if not clean.done():
                    log.warning("worker %s: second signal; leaving without waiting for the clean stop", name)
                    clean.cancel()
            await worker.stop()
            return 0
        finally:
            await asyncio.to_thread(coord.close)


def main(argv: list[str] | None = None) -> int:
    p = completing(build_parser())
    a = p.parse_args(argv)
    if a.on_signal not in ON_SIGNAL:
        p.error(f"$STREAMNET_ON_SIGNAL must be one of {', '.join(ON_SIGNAL)}; got {a.on_signal!r}")
    if a.host in WILDCARD_HOSTS and not a.advertise_host:
        # peers would dial 0.0.0.0, which reaches each peer's own machine, not this worker
        p.error(f"--host {a.host} listens on every address; give --advertise-host, the address other "
                "workers and clients reach this one at")
    given = [f for f in ("tls_cert", "tls_key", "tls_ca") if getattr(a, f)]
    if given and len(given) < 3:
        p.error("--tls-cert, --tls-key and --tls-ca go together; missing: "
                + ", ".join("--" + f.replace("_", "-") for f in ("tls_cert", "tls_key", "tls_ca") if f not in given))
    logging.basicConfig(level=a.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo.client").setLevel(logging.WARNING if a.log_level != "DEBUG" else logging.DEBUG)
    try:
        return asyncio.run(serve(a))
    except StreamnetError as e:   # 1 for an ensemble out of reach (a service manager restarts), 2 otherwise
        return error_exit("streamnet-worker", e)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
