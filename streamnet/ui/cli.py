"""streamnet-ui: the web UI for a ZooKeeper cluster, a read-only daemon like Storm UI."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from ..cli.common import add_cluster_options, connect, error_exit
from ..errors import StreamnetError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamnet-ui", description=__doc__)
    add_cluster_options(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                   help="how often the UI reads the cluster, in seconds (default 1)")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


async def _serve(state, host: str, port: int, poll_s: float) -> None:
    from .server import serve
    runner, port = await serve(state, host, port, poll_s)
    print(f"streamnet-ui: serving cluster {state.cluster!r} on http://{host}:{port}/", file=sys.stderr)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=a.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    if not 0 <= a.port <= 65535 or a.poll <= 0:
        print("streamnet-ui: error: --port must be 0..65535 and --poll positive", file=sys.stderr)
        return 2
    try:
        coord, state, _secret = connect(a)
    except StreamnetError as e:
        return error_exit("streamnet-ui", e)
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # a service manager's stop: end as Ctrl-C does
    try:
        asyncio.run(_serve(state, a.host, a.port, a.poll))
    except StreamnetError as e:
        print(f"streamnet-ui: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        coord.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
