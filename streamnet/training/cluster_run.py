"""Training on the engine: submit the NS-Map topology to a cluster (embedded or
ZooKeeper), follow its progress, collect the summary."""
from __future__ import annotations

import time
from typing import Callable

from ..errors import StreamnetError
from ..runtime.control import kill_topology, spout_tasks
from .config import RunConfig
from .nsmap import build_topology
from .summary_from_results import summarise


def follow(state, topology, cfg: RunConfig, progress: Callable[[dict], None] | None = None,
           timeout: float = 24 * 3600, poll_s: float = 0.5, stop_when: Callable[[dict], bool] | None = None):
    """Wait until the topology's spouts are done (or stop_when(progress) says so),
    reporting progress; then kill it and return (results, wall seconds)."""
    spouts = spout_tasks(topology)
    t0 = time.monotonic()
    seen_epochs = 0
    while not spouts <= state.done_tasks(topology.name):
        if time.monotonic() - t0 > timeout:
            raise StreamnetError(f"training did not finish within {timeout:.0f} s")
        if state.status(topology.name) != "active":
            raise StreamnetError(f"topology {topology.name} was killed")
        if progress or stop_when:
            results = state.results(topology.name)
            p = results.get("sync.0.progress")
            hist = results.get("eval.0.history") or []
            if p:
                p = dict(p, epochs=cfg.epochs, elapsed_s=time.monotonic() - t0)
                if len(hist) > seen_epochs:
                    p["test_accuracy"] = hist[-1]["test_accuracy"]
                    p["eval_epoch"] = hist[-1]["epoch"]
                    seen_epochs = len(hist)
                if progress:
                    progress(p)
                if stop_when and stop_when(p):
                    break
        time.sleep(poll_s)
    wall = time.monotonic() - t0
    return kill_topology(state, topology.name, 120), wall


def train_on_local_cluster(cfg: RunConfig, workers: int, threads: int = 1, progress=None, secret=None,
                           stop_when=None):
    from ..runtime import LocalCluster
    topo = build_topology(cfg)
    with LocalCluster(workers=workers, threads=threads, secret=secret) as cluster:
        cluster.submit(topo)
        results, wall = follow(cluster.state, topo, cfg, progress, stop_when=stop_when)
    return summarise(cfg, results, workers=workers, wall_s=wall), results
