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
import time
import urllib.request
import uuid

from streamnet.runtime import kill_topology, wait_done, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZK_SCRIPT = os.path.join(ROOT, "deploy", "zookeeper.sh")
SESSION_TIMEOUT = 4.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def zookeeper_installed() -> bool:
    return shutil.which("java") is not None and any(
        f.startswith("zookeeper") and f.endswith(".jar") for f in os.listdir("/usr/share/java")
    ) if os.path.isdir("/usr/share/java") else False


class ZooKeeper:
    """A standalone ZooKeeper (or an ensemble of `servers`) in its own directory,
    started with deploy/zookeeper.sh."""

    def __init__(self, servers: int = 1):
        self.dir = tempfile.mkdtemp(prefix="streamnet-zk-")
        self.servers = servers
        # an ensemble's client ports are port..port+N-1 (quorum ports above): hope they are free too
        self.port = free_port()
        self.hosts = ",".join(f"127.0.0.1:{self.port + i}" for i in range(servers))

    def _run(self, *args):
        return subprocess.run([ZK_SCRIPT, *args, "--dir", self.dir], check=True, capture_output=True, text=True,
                              timeout=90)

    def start(self):
        self._run("start", "--port", str(self.port), "--servers", str(self.servers))
        return self

    def kill(self, server: int = 0):
        self._run("kill", "--server", str(server))

    def restart(self, server: int = 0):
        self._run("restart-server", "--server", str(server))

    def stop(self):
        try:
            self._run("stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """N streamnet-worker processes in a fresh cluster namespace."""

    def __init__(self, zk_hosts: str, workers: int = 3, threads: int = 1, secret: bytes | None = None,
                 session_timeout: float = SESSION_TIMEOUT):
        self.zk_hosts = zk_hosts
        self.session_timeout = session_timeout
        self.name = "t" + uuid.uuid4().hex[:8]
        self.tmp = tempfile.mkdtemp(prefix="streamnet-cluster-")
        self.secret_file = os.path.join(self.tmp, "secret")
        with open(self.secret_file, "wb") as f:
            f.write(secret or os.urandom(24).hex().encode())
        os.chmod(self.secret_file, 0o600)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}
        self.threads = threads
        for i in range(workers):
            self.start_worker(f"w{i}")

    def args(self) -> list[str]:
        return ["--zk", self.zk_hosts, "--cluster", self.name, "--secret-file", self.secret_file,
                "--session-timeout", str(self.session_timeout)]

    def start_worker(self, name: str, extra: list[str] = ()) -> subprocess.Popen:
        log = os.path.join(self.tmp, f"{name}.log")
        self.logs[name] = log
        p = subprocess.Popen([sys.executable, "-m", "streamnet.cli.worker", *self.args(), "--name", name,
                              "--port", "0", "--threads", str(self.threads), *extra],
                             stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=ROOT)
        self.procs[name] = p
        return p

    def submit_cli(self, *args, timeout=300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "streamnet.cli.submit", *args[:1], *args[1:], *self.args()],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)

    def state(self):
        from streamnet.runtime.control.cluster_state import ClusterState
        from streamnet.runtime.control.zk import ZkCoordinator
        with open(self.secret_file, "rb") as f:
            coord = ZkCoordinator(self.zk_hosts, f.read().strip(), session_timeout=SESSION_TIMEOUT)
        return ClusterState(coord, self.name)

    def wait_registered(self, n: int, state, timeout: float = 60):
        return wait_for(lambda: len(state.workers()) == n and state.workers(), timeout, f"{n} workers to register",
                        interval=0.1)

    def status(self, state, worker: str) -> dict | None:
        info = state.workers().get(worker)
        if not info:
            return None
        try:
            with urllib.request.urlopen(f"http://{info['host']}:{info['port']}/status", timeout=3) as r:
                return json.load(r)
        except OSError:
            return None

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
        shutil.rmtree(self.tmp, ignore_errors=True)

    def dump_logs(self) -> str:
        out = []
        for name, path in self.logs.items():
            try:
                with open(path) as f:
                    out.append(f"--- {name}\n" + f.read()[-3000:])
            except OSError:
                pass
        return "\n".join(out)


@contextlib.contextmanager
def running_cluster(zk_hosts: str, workers: int = 3, threads: int = 1, session_timeout: float = SESSION_TIMEOUT):
    """A registered cluster and a client ClusterState; worker logs are printed on failure."""
    c = Cluster(zk_hosts, workers=workers, threads=threads, session_timeout=session_timeout)
    state = None
    try:
        state = c.state()
        c.wait_registered(workers, state)
        yield c, state
    except BaseException:
        print(c.dump_logs())
        raise
    finally:
        if state is not None:
            state.coord.close()
        c.close()


def placement(state, name: str) -> dict[int, str]:
    """task -> worker in the topology's current assignment ({} before the first)."""
    current = state.assignment(name)[0]
    return dict(current.tasks) if current is not None else {}


def finish(state, name: str, timeout: float = 180) -> dict:
    """Wait until the topology's spouts are done, kill it, return its results."""
    wait_done(state, name, timeout, interval=0.2)
    return kill_topology(state, name, 60)
