"""Real ZooKeeper servers and streamnet-worker processes, for the cluster tests and
perf/chaos.py. Needs the checkout (deploy/zookeeper.sh) and Debian's zookeeper package."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

from streamnet.runtime import kill_topology, wait_done, wait_for
from streamnet.runtime.control.placement import worker_url

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZK_SCRIPT = os.path.join(ROOT, "deploy", "zookeeper.sh")
SESSION_TIMEOUT = 4.0


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct ports that were free a moment ago: all held open together while picked,
    so none is picked twice (the kernel hands out each bound port once)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


async def until(cond, what: str, timeout: float = 20.0, interval: float = 0.01) -> None:
    """wait_for's asyncio face: until cond() is true, on the running loop (its tasks go on
    meanwhile); AssertionError naming `what` after `timeout` s."""
    import asyncio
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


class LoopRelay:
    """A TCP relay on the running event loop, from a port of its own to 127.0.0.1:`target`:
    a man in the middle for stream tests. `tamper(state, data) -> bytes`, if given, sees
    (and may change) what the sender writes, with a dict of its own per connection."""

    def __init__(self, target: int, tamper=None):
        self.target, self.tamper, self.tasks = target, tamper, set()

    async def start(self) -> int:
        import asyncio
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader, writer, tamper):
        import asyncio
        try:
            while data := await reader.read(1 << 16):
                writer.write(tamper(data) if tamper else data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader, writer):
        import asyncio
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        state: dict = {}
        tamper = (lambda data: self.tamper(state, data)) if self.tamper else None
        for coro in (self._pipe(reader, up_w, tamper), self._pipe(up_r, writer, None)):
            t = asyncio.get_running_loop().create_task(coro)
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    async def close(self):
        import asyncio
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()


async def stream_server_on(undo: contextlib.AsyncExitStack, server, runner=None) -> int:
    """A StreamServer's routes served on a free port until `undo` closes (a runner of the
    caller's, such as a worker's GuardedRunner, or a plain one); the port."""
    from aiohttp import web
    if runner is None:
        app = web.Application()
        app.add_routes(server.routes())
        runner = web.AppRunner(app)
    await runner.setup()
    undo.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return site._server.sockets[0].getsockname()[1]


async def link_through_relay(undo: contextlib.AsyncExitStack, port: int, secret: bytes, tamper=None, tls=None,
                             close_s: float = 0.5):
    """A started PeerLink from w0 to w1 on `port` through a LoopRelay(`tamper`), each
    closed when `undo` closes (the link aborted first)."""
    import aiohttp

    from streamnet.runtime import codec
    from streamnet.runtime.dataplane.transport import Auth, PeerLink
    relay = LoopRelay(port, tamper)
    relayed = await relay.start()
    undo.push_async_callback(relay.close)
    session = await undo.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)))
    link = PeerLink(sender="w0", peer="w1", url=f"http://127.0.0.1:{relayed}", auth=Auth(secret, "w0"),
                    session=session, limits=codec.DEFAULT_LIMITS, tls=tls)
    link.start()
    undo.push_async_callback(link.close, close_s)
    return link


def zookeeper_installed() -> bool:
    return shutil.which("java") is not None and any(
        f.startswith("zookeeper") and f.endswith(".jar") for f in os.listdir("/usr/share/java")
    ) if os.path.isdir("/usr/share/java") else False


class ZooKeeper:
    """A standalone ZooKeeper (or an ensemble of `servers`) in its own directory,
    started with deploy/zookeeper.sh on ports picked free here: the client port of
    each server and, for an ensemble, its two quorum ports. `start` returns once every
    member serves; a member that cannot start (another program took a port between
    the pick and the start) is reported with its log, and the start is tried once more
    on new ports."""

    def __init__(self, servers: int = 1, tls: bool = False):
        self.dir = tempfile.mkdtemp(prefix="streamnet-zk-")
        self.servers = servers
        #: with `tls`, clients connect over TLS only, with the certificates here (--zk-tls)
        self.tls_dir = os.path.join(self.dir, "tls") if tls else None
        self._pick_ports()

    def _pick_ports(self) -> None:
        ports = free_ports(3 * self.servers if self.servers > 1 else 1)
        self.client_ports = ports[:self.servers]
        peers = ports[self.servers:]
        self.peer_ports = [f"{peers[2 * i]}:{peers[2 * i + 1]}" for i in range(self.servers)] if self.servers > 1 \
            else []
        self.port = self.client_ports[0]
        self.hosts = ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def _run(self, *args):
        return subprocess.run([ZK_SCRIPT, *args, "--dir", self.dir], check=True, capture_output=True, text=True,
                              timeout=90)

    def start(self):
        for attempt in (1, 2):
            args = ["start", "--servers", str(self.servers), "--port", str(self.port),
                    "--client-ports", ",".join(map(str, self.client_ports))]
            if self.peer_ports:
                args += ["--peer-ports", ",".join(self.peer_ports)]
            if self.tls_dir:
                args += ["--tls-dir", self.tls_dir]
            try:
                self._run(*args)
                return self
            except subprocess.CalledProcessError as e:
                self._run("stop")
                if attempt == 2:
                    shutil.rmtree(self.dir, ignore_errors=True)     # the caller has no server to stop
                    raise RuntimeError(f"ZooKeeper did not start on ports {self.client_ports} "
                                       f"{self.peer_ports}: {e.stderr}") from None
                print(f"ZooKeeper did not start ({e.stderr.strip()}); trying new ports")
                self._pick_ports()

    def _ask(self, server: int, word: bytes) -> str:
        """A four-letter word's answer ("" if the server does not answer)."""
        try:
            with socket.create_connection(("127.0.0.1", self.client_ports[server]), timeout=1) as s:
                s.sendall(word)
                out = b""
                while chunk := s.recv(4096):
                    out += chunk
            return out.decode(errors="replace")
        except OSError:
            return ""

    def serving(self, server: int) -> bool:
        """The server answers `srvr` with its mode (it serves clients, in a quorum)."""
        return "Mode:" in self._ask(server, b"srvr")

    def clients(self, server: int) -> int:
        """Client sessions connected to `server` now (`stat`; not counting the asking
        connection itself, listed with no interest ops, [0])."""
        return sum(1 for line in self._ask(server, b"stat").splitlines()
                   if line.startswith(" /") and "[0]" not in line)

    def log_lines(self, server: int = 0, containing: str = "") -> list[str]:
        """The lines of a server's log that contain `containing` (for a test's failure
        message: when it expired which session, say)."""
        try:
            with open(os.path.join(self.dir, f"s{server}", "zookeeper.log"), errors="replace") as f:
                return [line.rstrip() for line in f if containing in line]
        except OSError:
            return []

    def kill(self, server: int = 0):
        self._run("kill", "--server", str(server))

    def restart(self, server: int = 0):
        self._run("restart-server", "--server", str(server))

    def stop(self):
        try:
            self._run("stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class Relay:
    """A TCP relay on a port of its own to 127.0.0.1:`target`, which a test can cut and
    heal: while cut, the connections through it are closed and new ones closed as soon
    as they are accepted - its clients find the far end unreachable while it runs on
    (a ZooKeeper that its workers cannot reach, e.g. to let it expire their sessions).
    While held, connections stay open and nothing passes: a far end that stopped
    answering (a ZooKeeper frozen, or behind a dead link)."""

    def __init__(self, target: int):
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._cut = self._closed = self._held = False
        self.bytes_held = 0       # bytes that came in while held (held back until healed)
        self._spawn(self._accept)

    def _spawn(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, name=f"relay-{self.port}", daemon=True)
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._cut or self._closed:
                    client.close()
                    upstream.close()
                    continue
                self._socks |= {client, upstream}
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self._held:
                    self.bytes_held += len(data)
                while self._held and not self._closed:
                    time.sleep(0.01)
                dst.sendall(data)
        except OSError:
            pass
        self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            for s in socks:
                self._socks.discard(s)
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)   # wakes the pump blocked on it
                s.close()

    def cut(self) -> None:
        self._cut = True
        with self._lock:
            socks = list(self._socks)
        self._drop(*socks)

    def heal(self) -> None:
        self._cut = self._held = False

    def hold(self) -> None:
        self._held = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        for t in self._threads:
            t.join(5)
        self._listener.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Cluster:
    """N streamnet-worker processes in a fresh cluster namespace."""

    def __init__(self, zk_hosts: str, workers: int = 3, threads: int = 1, secret: bytes | None = None,
                 session_timeout: float = SESSION_TIMEOUT, pin_cores: bool = False, zk_relays: bool = False,
                 zk_tls: str | None = None, worker_args: tuple[str, ...] = ()):
        self.zk_hosts = zk_hosts
        self.worker_args = list(worker_args)      # given to every worker it starts
        self.zk_tls = zk_tls     # a --zk-tls directory (ZooKeeper(tls=True).tls_dir)
        #: zk_relays: each worker reaches the (one) ZooKeeper through a Relay of its own,
        #: relays[name], which a test can cut to take that worker off ZooKeeper alone
        self.relays: dict[str, Relay] | None = {} if zk_relays else None
        self.session_timeout = session_timeout
        self.name = "t" + uuid.uuid4().hex[:8]
        #: the ZooKeeper root (--zk-root): tests/conftest.py gives each test one of its own;
        #: elsewhere (perf/) each cluster, of a secret of its own, gets one
        self.root = os.environ.get("STREAMNET_ZK_ROOT") or f"/streamnet-{self.name}"
        self.tmp = tempfile.mkdtemp(prefix="streamnet-cluster-")
        self.secret_file = os.path.join(self.tmp, "secret")
        with open(self.secret_file, "wb") as f:
            f.write(secret or os.urandom(24).hex().encode())
        os.chmod(self.secret_file, 0o600)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}
        self.threads = threads
        #: pin worker i to core i mod cores with taskset (benchmarks: one core per worker)
        self.pin_cores = pin_cores and shutil.which("taskset") is not None
        try:
            for i in range(workers):
                self.start_worker(f"w{i}")
        except BaseException:       # no Cluster for the caller to close: its workers and files go now
            self.close()
            raise

    def args(self, zk_hosts: str | None = None) -> list[str]:
        return ["--zk", zk_hosts or self.zk_hosts, "--zk-root", self.root, "--cluster", self.name,
                "--secret-file", self.secret_file,
                "--session-timeout", str(self.session_timeout), *(["--zk-tls", self.zk_tls] if self.zk_tls else [])]

    def start_worker(self, name: str, extra: list[str] = ()) -> subprocess.Popen:
        log = os.path.join(self.tmp, f"{name}.log")
        self.logs[name] = log
        pin = ["taskset", "-c", str(len(self.procs) % (os.cpu_count() or 1))] if self.pin_cores else []
        zk = None
        if self.relays is not None:
            host, _, port = self.zk_hosts.partition(":")
            if "," in self.zk_hosts or host not in ("127.0.0.1", "localhost"):
                raise ValueError(f"zk_relays needs one local ZooKeeper server; got {self.zk_hosts}")
            self.relays[name] = Relay(int(port))
            zk = self.relays[name].address
        # the runner's own worker settings stay out (worker_args give a test's)
        env = {k: v for k, v in os.environ.items() if k != "STREAMNET_CHECKPOINT_ROOT"}
        with open(log, "ab") as out:        # the worker holds its own copy
            p = subprocess.Popen([*pin, sys.executable, "-m", "streamnet.cli.worker", *self.args(zk), "--name", name,
                                  "--port", "0", "--threads", str(self.threads), *self.worker_args, *extra],
                                 stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.procs[name] = p
        return p

    def submit_cli(self, *args, timeout=300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "streamnet.cli.submit", *args[:1], *args[1:], *self.args()],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)

    def state(self, zk_hosts: str | None = None):
        """A client ClusterState, on the workers' ZooKeeper or on `zk_hosts`."""
        from streamnet.runtime.control.cluster_state import ClusterState
        from streamnet.runtime.control.zk import ZkCoordinator
        with open(self.secret_file, "rb") as f:
            coord = ZkCoordinator(zk_hosts or self.zk_hosts, f.read().strip(), session_timeout=SESSION_TIMEOUT,
                                  tls=self.zk_tls)
        try:
            return ClusterState(coord, self.name, root=self.root)
        except BaseException:
            coord.close()
            raise

    def wait_registered(self, n: int, state, timeout: float = 60):
        return wait_for(lambda: len(state.workers()) == n and state.workers(), timeout, f"{n} workers to register",
                        interval=0.1)

    def status(self, state, worker: str) -> dict | None:
        return worker_status(state, worker)

    def leader(self, state) -> str | None:
        for w in state.workers():
            st = self.status(state, w)
            if st and st.get("leader"):
                return w
        return None

    def kill9(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for relay in (self.relays or {}).values():
            relay.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def dump_logs(self) -> str:
        out = []
        for name, path in self.logs.items():
            try:
                with open(path) as f:   # without kazoo's line per reconnection attempt
                    text = "".join(line for line in f if "kazoo.client: Connection dropped" not in line)
                out.append(f"--- {name}\n" + text[-6000:])
            except OSError:
                pass
        return "\n".join(out)


@contextlib.contextmanager
def running_cluster(zk_hosts: str, workers: int = 3, threads: int = 1, session_timeout: float = SESSION_TIMEOUT,
                    pin_cores: bool = False, zk_relays: bool = False, zk_tls: str | None = None,
                    worker_args: tuple[str, ...] = ()):
    """A registered cluster and a client ClusterState; worker logs are printed on failure."""
    c = Cluster(zk_hosts, workers=workers, threads=threads, session_timeout=session_timeout, pin_cores=pin_cores,
                zk_relays=zk_relays, zk_tls=zk_tls, worker_args=worker_args)
    state = None
    try:
        state = c.state()
        c.wait_registered(workers, state)
        yield c, state
    except BaseException:
        print(c.dump_logs())
        raise
    finally:
        c.close()
        if state is not None:
            _remove_cluster(state, c.root)
            state.coord.close()


def _remove_cluster(state, root: str) -> None:
    """Remove a stopped cluster's nodes, and its root if nothing else is left there, so
    that an ensemble that outlives the tests ($STREAMNET_TEST_ZK) does not collect them.
    Best effort: a node it cannot remove is logged, not an error of the test."""
    import logging
    try:
        state.coord.delete(state.base, recursive=True)
        if not state.coord.children(root):
            state.coord.delete(root)
    except Exception as e:  # noqa: BLE001 - the test's outcome stands
        logging.getLogger(__name__).warning("could not remove cluster %s from ZooKeeper: %s", state.base, e)


class LocalHandle:
    """The embedded cluster (LocalCluster: worker threads, in-process coordinator)
    behind the face of Cluster, so that one test body runs on both execution modes."""

    def __init__(self, workers: int = 3, threads: int = 1):
        from streamnet.runtime import LocalCluster
        self.lc = LocalCluster(workers=workers, threads=threads).__enter__()
        self.state = self.lc.state
        self.dead: set[str] = set()

    def kill9(self, name: str) -> None:
        self.dead.add(name)
        self.lc.crash_worker(name)

    def leader(self, state=None) -> str | None:
        return self.lc.leader()

    def status(self, state, worker: str) -> dict | None:
        if worker in self.dead:
            return None
        w = next(w for w in self.lc.workers if w.id == worker)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{w.port}/status", timeout=3) as r:
                return json.load(r)
        except OSError:
            return None

    def dump_logs(self) -> str:
        return ""           # one process: the log is pytest's captured log

    def close(self) -> None:
        self.lc.__exit__(None, None, None)


@contextlib.contextmanager
def cluster_in_mode(mode: str, zk_hosts: str | None, workers: int = 3, threads: int = 1,
                    session_timeout: float = SESSION_TIMEOUT):
    """(cluster, ClusterState) in `mode`: "local" (LocalCluster) or "zk" (streamnet-worker
    processes on the ZooKeeper at zk_hosts, with ZooKeeper sessions of `session_timeout`).
    Both offer kill9(worker), leader(state), status(state, worker)."""
    if mode == "zk":
        with running_cluster(zk_hosts, workers=workers, threads=threads,
                             session_timeout=session_timeout) as (c, state):
            yield c, state
        return
    if mode != "local":
        raise ValueError(f"mode must be 'local' or 'zk'; got {mode!r}")
    h = LocalHandle(workers, threads)
    try:
        yield h, h.state
    finally:
        h.close()


def worker_status(state, worker: str) -> dict | None:
    """A registered worker's /status (None if it is not registered or does not answer)."""
    info = state.workers().get(worker)
    if not info:
        return None
    try:
        with urllib.request.urlopen(f"{worker_url(info)}/status", timeout=3) as r:
            return json.load(r)
    except OSError:
        return None


def spout_step(state, name: str, task: int) -> int | None:
    """The step now (the rounds completed) of topology `name`'s training spout, task
    `task`, from its worker's /metrics; None while it is not placed or does not answer."""
    from prometheus_client.parser import text_string_to_metric_families
    worker = placement(state, name).get(task)
    info = state.workers().get(worker) if worker else None
    if not info:
        return None
    try:
        with urllib.request.urlopen(f"{worker_url(info)}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    return next((int(s.value) for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == "streamnet_training_rounds_total" and s.labels.get("topology") == name), None)


def stale_dropped(state, name: str) -> int:
    """Tuples of topology `name` from superseded task instances that the registered
    workers dropped so far (fencing of the data plane: `stale` in each /status)."""
    return sum((worker_status(state, w) or {}).get("topologies", {}).get(name, {}).get("stale", 0)
               for w in state.workers())


def worker_sessions(state) -> dict[str, int]:
    """worker -> the ZooKeeper session that holds its registration (ephemeral) node."""
    out = {}
    for w in state.workers():
        stat = state.coord.zk.exists(state.path("workers", w))
        if stat is not None:
            out[w] = stat.ephemeralOwner
    return out


def placement(state, name: str) -> dict[int, str]:
    """task -> worker in the topology's current assignment ({} before the first)."""
    current = state.assignment(name)[0]
    return dict(current.tasks) if current is not None else {}


def finish(state, name: str, timeout: float = 180) -> dict:
    """Wait until the topology's spouts are done, kill it, return its results."""
    wait_done(state, name, timeout, interval=0.2)
    return kill_topology(state, name, 60)
