"""The UI's web server: a sampler that reads the cluster every `poll_s`, and an
aiohttp app serving the static pages and the JSON they poll.

Read-only: it reads the coordinator (ClusterState, as every client does) and the
workers' /status; it writes nothing anywhere. One sampler per server, whatever
the number of browsers: a page's poll reads the last snapshot, never the cluster.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
import time
from contextlib import contextmanager
from importlib import resources

import aiohttp
from aiohttp import web

from ..errors import StreamnetError
from ..runtime import monitor
from ..runtime.json_reply import json_reply
from ..runtime.control.cluster_state import ClusterState
from ..runtime.dataplane.compute import ComputePool
from ..runtime.dataplane.guard import HEADER_TIMEOUT_S, ConnectionGuard, GuardedRunner
from . import views

log = logging.getLogger(__name__)

STATIC = resources.files("streamnet.ui") / "static"


class Sampler:
    def __init__(self, state: ClusterState, poll_s: float = 1.0, token: str | None = None):
        """`token`: the workers' monitor token (runtime/monitor.py), sent with every /status read."""
        self.state, self.poll_s = state, poll_s
        self.token = token
        self.snapshot = views.Snapshot(taken=time.time(), workers={}, statuses={}, unreachable={}, topologies={})
        self.updated = asyncio.Event()
        # Coordinator reads run on a daemon thread of this pool, never through asyncio.to_thread:
        # asyncio.run joins that executor at shutdown without a bound (Python 3.11), so a read
        # waiting on a ZooKeeper that stopped answering would hold the daemon's exit.
        self._reader = ComputePool(1, name="ui-read")

    def close(self) -> None:
        self._reader.shutdown(timeout=0)

    def _read_coordinator(self) -> tuple[dict, dict]:
        """Worker records and topologies (blocking: runs in a thread)."""
        workers = self.state.workers()
        topologies = {}
        for name in self.state.topology_names():
            try:
                assignment, _ = self.state.assignment(name)
                topologies[name] = {"spec": self.state.topology(name), "status": self.state.status(name),
                                    "assignment": assignment.to_json() if assignment else None,
                                    "results": self.state.results(name)}
            except Exception as e:  # noqa: BLE001 - removed between the listing and the read
                log.debug("topology %s: %s", name, e)
        return workers, topologies

    async def sample(self, session: aiohttp.ClientSession) -> None:
        try:
            workers, topologies = await asyncio.wrap_future(self._reader.submit(self._read_coordinator))
            error = None
        except Exception as e:  # noqa: BLE001 - shown on the cluster page; the next pass tries again
            workers, topologies, error = self.snapshot.workers, self.snapshot.topologies, f"{type(e).__name__}: {e}"

        async def status(w, rec):
            try:
                return w, await monitor.fetch_status(session, f"http://{rec['host']}:{rec['port']}", self.token), None
            except Exception as e:  # noqa: BLE001 - an unreachable worker is shown, not fatal
                return w, None, f"{type(e).__name__}: {e}"
        answers = await asyncio.gather(*(status(w, rec) for w, rec in workers.items()))
        snap = views.Snapshot(taken=time.time(), workers=workers,
                              statuses={w: s for w, s, _ in answers if s is not None},
                              unreachable={w: e for w, _, e in answers if e is not None},
                              topologies=topologies, coordinator_error=error)
        views.record_loss(snap, self.snapshot.loss_curves)
        self.snapshot.before = None          # keep one pass back, not a chain
        snap.before = self.snapshot
        self.snapshot = snap
        self.updated.set()

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(2.0, 2 * self.poll_s))
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while True:
                    started = time.monotonic()
                    try:
                        await self.sample(session)
                    except Exception:  # noqa: BLE001 - one bad pass must not freeze every page for good
                        log.exception("the UI's sampling pass failed; trying again")
                    await asyncio.sleep(max(0.05, self.poll_s - (time.monotonic() - started)))
        finally:
            self.close()


def host_allowed(host_header: str, names: frozenset[str]) -> bool:
    """Whether a request's Host header names this UI: an IP address (a page cannot make
    one its own origin), or one of `names` (any port). A page of another site whose name
    is made to resolve to this host (DNS rebinding) sends its own name, and would read
    every /api reply - the workers' /status, fetched with the monitor token - as its own."""
    host = host_header.strip().lower()
    if host.startswith("["):                         # [IPv6]:port
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rpartition(":")[0]
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return host.rstrip(".") in names


def default_names(extra=()) -> frozenset[str]:
    """localhost, this machine's names, and `extra` (streamnet-ui --allow-host)."""
    names = {"localhost", socket.gethostname(), socket.getfqdn(), *extra}
    return frozenset(n.lower().rstrip(".") for n in names if n)


def make_app(sampler: Sampler, names: frozenset[str] | None = None) -> web.Application:
    names = default_names() if names is None else names

    @web.middleware
    async def check_host(request, handler):
        if not host_allowed(request.headers.get("Host", ""), names):
            return web.Response(status=403, text=f"403: this UI answers to {', '.join(sorted(names))} or an IP "
                                                 "address, not to the name in this request's Host header "
                                                 "(streamnet-ui --allow-host NAME adds one)\n")
        return await handler(request)

    def snap() -> views.Snapshot:
        return sampler.snapshot

    async def index(_request):
        return web.Response(text=(STATIC / "index.html").read_text(), content_type="text/html")

    async def static(request):
        name = request.match_info["name"]
        kinds = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
        suffix = name[name.rfind("."):] if "." in name else ""
        f = STATIC / name
        try:
            found = "/" not in name and suffix in kinds and f.is_file()
        except OSError:             # a name too long for the file system, say
            found = False
        if not found:
            raise web.HTTPNotFound()
        return web.Response(text=f.read_text(), content_type=kinds[suffix])

    async def cluster(_request):
        return json_reply(views.cluster_view(snap()))

    async def topologies(_request):
        s = snap()
        return json_reply({"topologies": views.each(views.topology_view, s, sorted(s.topologies))})

    async def training(_request):
        s = snap()
        names = [n for n in sorted(s.topologies) if views.is_training(s, n)]
        return json_reply({"runs": views.each(views.training_view, s, names)})

    app = web.Application(middlewares=[check_host])
    app.add_routes([web.get("/", index), web.get("/static/{name}", static), web.get("/api/cluster", cluster),
                    web.get("/api/topologies", topologies), web.get("/api/training", training)])

    async def sampling(app):
        task = asyncio.create_task(sampler.run(), name="ui-sampler")
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    app.cleanup_ctx.append(sampling)
    return app


# the UI's connections, bounded as a worker's are (runtime/dataplane/guard.py): a browser
# holds a few; without bounds 1,100 half-sent requests held as many descriptors for aiohttp's
# keep-alive time (75 s) each, and the UI stopped answering
UI_MAX_CONNECTIONS = 256
UI_MAX_PER_ADDRESS = 64


async def serve(state: ClusterState, host: str, port: int, poll_s: float = 1.0,
                token: str | None = None, allow_hosts=(), header_timeout_s: float = HEADER_TIMEOUT_S,
                guard: ConnectionGuard | None = None) -> tuple[web.AppRunner, int]:
    """Start the UI on host:port; returns the runner (await runner.cleanup() to stop) and the port.
    `allow_hosts`: names besides localhost and this machine's that the UI answers to. A
    connection has `header_timeout_s` to send its request's headers (and at most that idle
    between requests), and `guard` (by default UI_MAX_CONNECTIONS, UI_MAX_PER_ADDRESS)
    bounds how many are open at once."""
    guard = guard or ConnectionGuard(UI_MAX_CONNECTIONS, UI_MAX_PER_ADDRESS, stuck_after_s=header_timeout_s)
    # a stop waits at most 1 s for requests in flight (aiohttp's default, 60 s, held Ctrl-C that long)
    runner = GuardedRunner(make_app(Sampler(state, poll_s, token), default_names(allow_hosts)), guard,
                           access_log=None, shutdown_timeout=1.0, keepalive_timeout=header_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise StreamnetError(f"cannot serve the UI on {host}:{port}: {e.strerror or e}") from None
    return runner, site._server.sockets[0].getsockname()[1]


class UiThread:
    """The UI on its own thread and event loop, beside a program that blocks (train
    --ui on an embedded cluster). A context manager: stopped and joined on exit."""

    def __init__(self, state: ClusterState, host: str = "127.0.0.1", port: int = 0, poll_s: float = 1.0):
        self.state, self.host, self.port, self.poll_s = state, host, port, poll_s
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="streamnet-ui", daemon=True)

    def _main(self) -> None:
        async def main():
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            try:
                runner, self.port = await serve(self.state, self.host, self.port, self.poll_s)
            except BaseException as e:  # noqa: BLE001 - reported to the starter
                self._error = e
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()
        asyncio.run(main())

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def __enter__(self) -> "UiThread":
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            self._thread.join(5)
            raise self._error
        log.warning("streamnet UI on %s", self.url)
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@contextmanager
def for_local_cluster(cluster, host: str = "127.0.0.1", port: int = 0, poll_s: float = 1.0):
    """The UI over an embedded LocalCluster, with a coordinator session of its own."""
    coord = cluster.server.session()
    try:
        with UiThread(ClusterState(coord, cluster.cluster), host, port, poll_s) as ui:
            yield ui
    finally:
        coord.close()
