"""Placement: which worker runs which task. Pure functions - cluster status in,
assignment out - so they are tested with plain data and any leader can recompute
them from what the coordinator holds.

An assignment is plain data:
    {"tasks": {"<task>": "<worker>"}, "workers": {"<worker>": "http://host:port"},
     "threads": {"<worker>": n}}
"""
from __future__ import annotations

import math

from ...errors import StreamnetError
from ..topology import Topology


class NoWorkersError(StreamnetError):
    pass


def worker_url(info: dict) -> str:
    return f"http://{info['host']}:{info['port']}"


def assign(topology: Topology, workers: dict[str, dict], previous: dict | None = None) -> dict:
    """Spread tasks over live workers in proportion to their compute threads.

    Tasks already placed on a live worker stay there while that worker is within
    its fair share (so a worker's death moves only its own tasks); the rest go,
    in task order, to the worker with the lowest load per thread (ties: worker id).
    """
    if not workers:
        raise NoWorkersError("no live workers to assign tasks to; start streamnet-worker on some nodes")
    ids = sorted(workers)
    threads = {w: max(1, int(workers[w].get("threads", 1))) for w in ids}
    total_threads = sum(threads.values())
    n = topology.num_tasks
    share = {w: math.ceil(n * threads[w] / total_threads) for w in ids}
    load = {w: 0 for w in ids}
    placed: dict[str, str] = {}
    old = (previous or {}).get("tasks", {})
    for t in range(n):
        w = old.get(str(t))
        if w in workers and load[w] < share[w]:
            placed[str(t)] = w
            load[w] += 1
    for t in range(n):
        if str(t) in placed:
            continue
        w = min(ids, key=lambda k: ((load[k] + 1) / threads[k], k))
        placed[str(t)] = w
        load[w] += 1
    return {"tasks": placed, "workers": {w: worker_url(workers[w]) for w in ids if load[w]},
            "threads": {w: threads[w] for w in ids}}


def moved_tasks(before: dict | None, after: dict) -> dict[str, tuple[str | None, str]]:
    """Tasks whose worker changed: task -> (old worker or None, new worker)."""
    old = (before or {}).get("tasks", {})
    return {t: (old.get(t), w) for t, w in after["tasks"].items() if old.get(t) != w}
