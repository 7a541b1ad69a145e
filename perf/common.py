"""Shared bits of the perf scripts: thread pinning, medians, JSON + PNG output."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import statistics
import threading
import time

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def pin_blas_threads(n: int) -> None:
    """Must run before numpy/scipy load their BLAS."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)


@contextlib.contextmanager
def on_one_core():
    """Run the block on the lowest core this process may use (where perf's first worker
    process is pinned), the affinity restored after it: the in-process trainer as the
    one-core base of a comparison."""
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, mask)


def spread(xs, method: str = "exclusive") -> dict:
    """Median and quartiles of xs (at least one value), with their count. Below 4 values
    the quartiles are the inclusive ones: the exclusive method reaches past the values
    there (quartiles 0.75 and 2.25 of [1, 2])."""
    if len(xs) < 4:
        method = "inclusive"
    q = statistics.quantiles(xs, n=4, method=method) if len(xs) >= 2 else [xs[0]] * 3
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2], "n": len(xs)}


def every_sample_once(cfg, summary) -> bool:
    """The run's own verdict (each_sample_counted_once) and, which that verdict leaves out
    (it judges the epochs it saw finished: a last epoch short of samples is not one),
    every epoch 1..cfg.epochs holding exactly the training set's samples."""
    from streamnet.training.schedule import dataset_for
    size = len(dataset_for(cfg).train)
    counts = summary.extra["epoch_samples"]
    return bool(summary.extra["each_sample_counted_once"]) and \
        all(counts.get(str(e)) == size for e in range(1, cfg.epochs + 1))


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def cpu_model() -> str | None:
    """The CPU's model name as /proc/cpuinfo gives it (platform names the kernel, not the host)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


def machine() -> dict:
    return {"cpu_count": os.cpu_count(), "cpu_model": cpu_model(), "hostname": platform.node(),
            "platform": platform.platform(), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            # numpy's OpenBLAS kernel family, where the environment names one: it decides the GEMMs' speed
            # (2026-12-01, this AVX-512 host: Haswell 130 GFLOP/s against SkylakeX 240 for a 512^3 matmul)
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}


def write_json(name: str, data: dict) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, name)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return path


def png_path(name: str) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    return os.path.join(RESULTS, name)


def png_beside(out: str) -> str:
    """The PNG that goes with the results file `out` (write_json's name or path)."""
    return png_path(os.path.splitext(out)[0] + ".png")


def out_option(p, default: str, png: bool = True) -> None:
    """--out: where the results go, so that a trial run (--quick, a subset) does not
    replace the committed figures."""
    p.add_argument("--out", default=default,
                   help=f"results file: a name under perf/results or a path (default {default}"
                        + ("; the PNG goes beside it)" if png else ")"))


class ThreadCpu:
    """Where a worker process's CPU goes, by thread, while its unit computes: samples
    /proc/PID/task/*/schedstat (nanoseconds on a core) every `every` s in a thread of
    its own. `account()` takes the intervals in which the busiest thread - the compute
    thread, on a one-thread worker - ran at least `busy` of the time (the steady
    training, start-up and the end left out) and says, per compute second, how many
    seconds the event loop (the main thread) and the other threads (the coordinator's
    client, executors) took: the engine's own CPU. On a worker whose core is its own,
    that CPU is time the compute thread could have had: a steadier figure than a
    samples/s ratio on a host whose speed drifts, since both move with the core's."""

    def __init__(self, pid: int, every: float = 0.2, others: dict[str, int] | None = None):
        """`others`: processes (name -> pid, e.g. the ZooKeeper server on the same cores)
        whose CPU is read in the same intervals, as `<name>_per_compute`."""
        self.pid, self.every, self.others = pid, every, dict(others or {})
        # (time.monotonic(), per thread, per other process): an interval is as long as it was,
        # not `every` (the sampler wakes late and reads ~80 files, a JVM's threads among them)
        self.samples: list[tuple[float, dict[int, int], dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _threads(pid: int) -> dict[int, int]:
        """Nanoseconds on a core so far, per thread of process `pid` ({} once it is gone)."""
        out = {}
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        out[int(tid)] = int(f.read().split()[0])
        except OSError:
            pass
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append((time.monotonic(), self._threads(self.pid),
                                 {name: sum(self._threads(pid).values()) for name, pid in self.others.items()}))

    def stop(self) -> dict | None:
        self._stop.set()
        self._thread.join()
        return self.account()

    def account(self, busy: float = 0.5) -> dict | None:
        per: dict[int, int] = {}
        others = dict.fromkeys(self.others, 0)
        window = 0.0
        for (ta, a, a_others), (tb, b, b_others) in zip(self.samples, self.samples[1:]):
            delta = {t: b[t] - a.get(t, b[t]) for t in b}
            top = max(delta, key=delta.get, default=None)
            if top is None or top == self.pid or delta[top] < busy * (tb - ta) * 1e9:
                continue
            window += tb - ta
            for t, d in delta.items():
                per[t] = per.get(t, 0) + d
            for name in others:      # a process's sum over its live threads drops when one exits: not below 0
                others[name] += max(b_others[name] - a_others[name], 0)
        if not per:
            return None
        compute_tid = max((t for t in per if t != self.pid), key=per.get)
        compute = per[compute_tid] / 1e9
        loop = per.get(self.pid, 0) / 1e9
        other = sum(d for t, d in per.items() if t not in (self.pid, compute_tid)) / 1e9
        out = {"window_s": round(window, 2), "compute_s": round(compute, 3), "loop_s": round(loop, 3),
               "other_threads_s": round(other, 3), "loop_per_compute": round(loop / compute, 4),
               "other_per_compute": round(other / compute, 4)}
        for name, ns in others.items():
            out[f"{name}_per_compute"] = round(ns / 1e9 / compute, 4)
        return out


#: requests a ZooKeeper started for a benchmark answers before the benchmark starts
WARM_OPS = 30_000


def warm_zookeeper(hosts: str, ops: int = WARM_OPS) -> float:
    """Put `ops` requests (writes of a sync task's saved counters' size and reads, 500 in
    flight) to the ZooKeeper at `hosts`; the seconds it took. A ZooKeeper the benchmark
    has just started runs its request path in the JVM's interpreter: on host5 (2 vCPUs)
    a cold server took 0.175-0.180 s of CPU per second a worker computed, on the cores
    the workers compute on, against 0.116-0.124 after 30,000 requests (three alternations
    of 2 worker processes, MixBP H=8). An ensemble users run has been up for long."""
    from kazoo.client import KazooClient
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    try:
        path = client.create("/perf-warm-up-", b"", sequence=True)
        t0, data = time.perf_counter(), b"x" * 700
        for _ in range(0, ops, 500):
            calls = [client.set_async(path, data) for _ in range(250)] + [client.get_async(path) for _ in range(250)]
            for call in calls:
                call.get(timeout=30)
        client.delete(path)
        return time.perf_counter() - t0
    finally:
        client.stop()
        client.close()


def started_zookeeper():
    """A one-server ZooKeeper for a benchmark (streamnet.testing.ZooKeeper: stop() it),
    warmed up (warm_zookeeper)."""
    from streamnet.testing import ZooKeeper
    zk = ZooKeeper().start()
    try:
        seconds = warm_zookeeper(zk.hosts)
    except BaseException:
        zk.stop()
        raise
    print(f"ZooKeeper on {zk.hosts}, warmed up with {WARM_OPS:,} requests in {seconds:.1f} s", flush=True)
    return zk


def zookeeper_pid(zk) -> int | None:
    """The server process of a one-server streamnet.testing.ZooKeeper (its pid file)."""
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(zk.dir, "s0", "pid")) as f:
            return int(f.read())
    return None


@functools.cache
def _compiled_once() -> None:
    """The kernels compiled into numba's cache here, once, before workers start: with a
    cold cache (a fresh checkout, another path) every worker compiled them at its start
    at once - over 60 s on 2 cores, past the wait for them to register."""
    from streamnet.training.warmup import load_kernels
    load_kernels()


def train_on_worker_processes(cfg, workers: int, zk_hosts: str, stop_when=None, thread_cpu: bool = False,
                              zk_pid: int | None = None):
    """Train `cfg` on `workers` streamnet-worker processes (one compute thread each, worker i
    pinned to core i mod cores) on the ZooKeeper at zk_hosts, as users run them; the summary.
    With thread_cpu, summary.extra["thread_cpu"] holds each worker's ThreadCpu account (the
    first worker's with the ZooKeeper server's CPU, given its pid: `zookeeper_per_compute`)."""
    from streamnet.testing import running_cluster
    from streamnet.training.cluster_run import follow
    from streamnet.training.nsmap import build_topology
    from streamnet.training.summary_from_results import summarise
    topo = build_topology(cfg, name=f"perf-{time.time_ns() % 10**9}")
    _compiled_once()
    with running_cluster(zk_hosts, workers=workers, threads=1, session_timeout=10.0, pin_cores=True) as (c, state):
        meters = {name: ThreadCpu(p.pid, others={"zookeeper": zk_pid} if zk_pid and i == 0 else None)
                  for i, (name, p) in enumerate(sorted(c.procs.items()))} if thread_cpu else {}
        try:
            state.submit_topology(topo.name, topo.to_dict())
            results, wall = follow(state, topo, cfg, stop_when=stop_when)   # polls as the CLI does
        finally:
            accounts = {name: m.stop() for name, m in meters.items()}
    summary = summarise(cfg, results, workers=workers, wall_s=wall)
    if thread_cpu:
        summary.extra["thread_cpu"] = accounts
    return summary
