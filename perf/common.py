"""Shared bits of the perf scripts: thread pinning, medians, JSON + PNG output."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
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
    """Median and quartiles of xs (at least one value), with their count."""
    q = statistics.quantiles(xs, n=4, method=method) if len(xs) >= 2 else [xs[0]] * 3
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2], "n": len(xs)}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def machine() -> dict:
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
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


def train_on_worker_processes(cfg, workers: int, zk_hosts: str, stop_when=None):
    """Train `cfg` on `workers` streamnet-worker processes (one compute thread each, worker i
    pinned to core i mod cores) on the ZooKeeper at zk_hosts, as users run them; the summary."""
    from streamnet.testing import running_cluster
    from streamnet.training.cluster_run import follow
    from streamnet.training.nsmap import build_topology
    from streamnet.training.summary_from_results import summarise
    topo = build_topology(cfg, name=f"perf-{time.time_ns() % 10**9}")
    with running_cluster(zk_hosts, workers=workers, threads=1, session_timeout=10.0, pin_cores=True) as (_, state):
        state.submit_topology(topo.name, topo.to_dict())
        results, wall = follow(state, topo, cfg, stop_when=stop_when, poll_s=0.2)
    return summarise(cfg, results, workers=workers, wall_s=wall)
