# PYTHON_ARGCOMPLETE_OK: argcomplete's global completion looks for this mark
"""streamnet-ui: the web UI for a ZooKeeper cluster, a read-only daemon like Storm UI."""
from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import signal
import sys

from ..cli.common import (ENVIRONMENT, Parser, add_cluster_options, add_common_options, completing, connect,
                          error_exit, port_number, positive_float)
from ..errors import StreamnetError
from ..runtime.monitor import ENV, read_token


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="streamnet-ui", description=__doc__, epilog=ENVIRONMENT)
    add_common_options(p, "WARNING")
    add_cluster_options(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=port_number, default=8080, help="port to listen on (default 8080; 0: any free port)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a name besides localhost and this machine's that browsers may reach the UI by (its "
                        "Host header; repeatable): other names are refused, against DNS rebinding")
    p.add_argument("--poll", type=positive_float, default=1.0, metavar="SECONDS",
                   help="how often the UI reads the cluster, in seconds (default 1)")
    p.add_argument("--monitor-token-file", metavar="FILE", default=os.environ.get(ENV) or None,
                   help="the workers' monitor token, sent when reading their /status (default: "
                        "$STREAMNET_MONITOR_TOKEN_FILE, else none)")
    return p


async def _serve(state, host: str, port: int, poll_s: float, token: str | None = None, allow_hosts=()) -> None:
    from ..runtime.dataplane import accept_shortage
    from .server import serve
    accept_shortage.install(asyncio.get_running_loop())     # out of descriptors: a line a minute, not a flood
    runner, port = await serve(state, host, port, poll_s, token, allow_hosts)
    print(f"streamnet-ui: serving cluster {state.cluster!r} on http://{host}:{port}/", file=sys.stderr)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    a = completing(build_parser()).parse_args(argv)
    logging.basicConfig(level=a.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    try:
        token = read_token(a.monitor_token_file) if a.monitor_token_file else None
        coord, state, _secret = connect(a)
    except StreamnetError as e:
        return error_exit("streamnet-ui", e)
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # a service manager's stop: end as Ctrl-C does
    faulthandler.register(signal.SIGUSR1, all_threads=True)     # `kill -USR1`: every thread's stack on stderr
    try:
        asyncio.run(_serve(state, a.host, a.port, a.poll, token, a.allow_host))
    except StreamnetError as e:
        return error_exit("streamnet-ui", e)
    except KeyboardInterrupt:
        return 0
    finally:
        coord.close(timeout=CLOSE_S)    # bounded: a stop must end the daemon even when ZooKeeper stopped answering
    return 0


CLOSE_S = 2.0   # the UI holds no ephemeral node: closing its session is a courtesy


if __name__ == "__main__":
    sys.exit(main())
