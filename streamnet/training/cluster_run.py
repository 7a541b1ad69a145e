"""Training on the engine: submit the NS-Map topology to a cluster (embedded or
ZooKeeper), follow its progress, collect the summary."""
from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Callable

from ..errors import StreamnetError
from ..runtime.control import ClusterTimeout, TopologyFailed, kill_topology, request_stop, wait_done
from .config import RunConfig
from .nsmap import build_topology, default_name, resume_point, set_aside_for_resume
from .run_stats import EVAL_HISTORY, PROGRESS
from .summary_from_results import summarise

log = logging.getLogger(__name__)


class ProgressReader:
    """A training topology's progress as its clients show it: the sync bolt's last
    progress record with the run's epochs and elapsed time, plus `test_accuracy`,
    `test_loss` and `eval_epoch` when an epoch was evaluated since the last read (the
    latest), and `evaluated`: every evaluation record since the last read, in order."""

    def __init__(self, state, name: str, epochs: int):
        self.state, self.name, self.epochs = state, name, epochs
        self.t0 = time.monotonic()
        self.seen_epochs = 0

    def read(self) -> dict | None:
        results = self.state.results(self.name)
        p = results.get(PROGRESS)               # both absent until the first round / evaluation
        hist = results.get(EVAL_HISTORY) or []
        if not p:
            return None
        p = dict(p, epochs=self.epochs, elapsed_s=time.monotonic() - self.t0)
        if len(hist) > self.seen_epochs:
            last = hist[-1]
            # every evaluation since the last read, in order (two can land between reads)
            p.update(test_accuracy=last["test_accuracy"], test_loss=last["test_loss"], eval_epoch=last["epoch"],
                     evaluated=hist[self.seen_epochs:])
            self.seen_epochs = len(hist)
        return p


def follow(state, topology, cfg: RunConfig, progress: Callable[[dict], None] | None = None,
           timeout: float = 24 * 3600, poll_s: float = 0.5, stop_when: Callable[[dict], bool] | None = None):
    """Wait until the topology's spouts are done, reporting progress; then kill it and
    return (results, wall seconds).

    When stop_when(progress) says so, or on Ctrl-C, the run is asked to stop cleanly:
    it finishes the round in flight, takes one more round that writes a checkpoint
    (when the topology has a checkpoint directory), and ends. A second Ctrl-C aborts."""
    t0 = time.monotonic()
    reader = ProgressReader(state, topology.name, cfg.epochs)
    stopping = False

    def ask_to_stop(why: str):
        nonlocal stopping
        if not stopping:
            log.warning("%s: stopping %s cleanly after a checkpoint round", why, topology.name)
            request_stop(state, topology.name)
            stopping = True

    def interrupted() -> bool:
        if stopping:
            return False      # the second Ctrl-C aborts
        ask_to_stop("interrupted (Ctrl-C again aborts without a checkpoint)")
        return True

    def report(done: int, total: int):
        if not (progress or stop_when):
            return
        p = reader.read()
        if not p:
            return
        if progress:
            progress(p)
        if stop_when and stop_when(p):
            ask_to_stop("stop condition met")

    try:
        wait_done(state, topology.name, timeout, interval=poll_s, on_poll=report, on_interrupt=interrupted)
    except ClusterTimeout:
        raise StreamnetError(f"training did not finish within {timeout:.0f} s") from None
    except TopologyFailed:     # a component could not start: the run would never end
        kill_topology(state, topology.name, 60)
        raise
    wall = time.monotonic() - t0
    return kill_topology(state, topology.name, 120), wall


def train_on_local_cluster(cfg: RunConfig, workers: int, threads: int = 1, progress=None, secret=None,
                           stop_when=None, checkpoint_dir: str | None = None, resume: bool | str = False,
                           name: str | None = None, poll_s: float = 0.5, attach=None,
                           keep_checkpoints: int | None = None, threads_auto: bool = False):
    """Train on an embedded cluster. `resume`: True continues from the newest checkpoint of
    `name` in `checkpoint_dir`, a path from that file. `attach(cluster)`, if given, returns a
    context manager held while the cluster runs (train --ui: the web UI over it). `threads_auto`:
    the workers are started as with `streamnet-worker --threads auto`."""
    from ..runtime import LocalCluster
    name = name or default_name(cfg)
    point = None
    if resume:
        point = resume_point(cfg, checkpoint_dir, name, None if resume is True else resume)
    topo = build_topology(cfg, name=name, checkpoint_dir=checkpoint_dir, resume=point,
                          keep_checkpoints=keep_checkpoints)
    with LocalCluster(workers=workers, threads=threads, secret=secret, threads_auto=threads_auto) as cluster, \
            (attach(cluster) if attach else nullcontext()):
        spec = topo.to_dict()
        cluster.submit(topo, before=lambda: set_aside_for_resume(spec))
        results, wall = follow(cluster.state, topo, cfg, progress, stop_when=stop_when, poll_s=poll_s)
    return summarise(cfg, results, workers=workers, wall_s=wall), results
