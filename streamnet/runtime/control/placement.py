"""Placement: which worker runs which task, and the steps of a rebalance. Pure
functions - cluster status in, decision out - so they are tested with plain data
(tests/unit/test_scheduler.py) and any leader can recompute them from what the
coordinator holds. The scheduler (scheduler.py) reads, asks, and writes."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

from ...errors import StreamnetError
from ..assignment import DRAIN_TIMEOUT_S, DRAINING, MAX_THREADS, Assignment, threads_ok
from ..topology import Topology, TopologyError, parallelism_fixed, spec_version


class NoWorkersError(StreamnetError):
    pass


def worker_url(info: dict) -> str:
    return f"http://{info['host']}:{info['port']}"


def assign(topology: Topology, workers: dict[str, dict], previous: Assignment | None = None) -> Assignment:
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
    placed: dict[int, str] = {}
    old = previous.tasks if previous is not None else {}
    for t in range(n):
        w = old.get(t)
        if w in workers and load[w] < share[w]:
            placed[t] = w
            load[w] += 1
    for t in range(n):
        if t in placed:
            continue
        w = min(ids, key=lambda k: ((load[k] + 1) / threads[k], k))
        placed[t] = w
        load[w] += 1
    return Assignment(tasks=placed, workers={w: worker_url(workers[w]) for w in ids if load[w]},
                      threads={w: threads[w] for w in ids})


@dataclass(frozen=True)
class Step:
    """What the leader does for one topology in one pass, in this order: write
    `spec` (a parallelism change), write `assignment`, then set the rebalance
    request to `request` (None: leave it; {}: clear it)."""
    assignment: Assignment | None = None
    spec: dict | None = None
    request: dict | None = None
    notes: list[str] = field(default_factory=list)      # decisions worth a log line
    again: bool = False                                  # look again soon (phase 2 follows)


def plan(spec: dict, workers: dict[str, dict], current: Assignment | None, request: dict | None,
         stopped: set[str], now: float, topology: Topology | None = None) -> Step:
    """One pass of the rebalance state machine for one topology.

    - a parallelism request starts phase 1: the new spec, and a *draining* assignment
      with no tasks (workers stop the old tasks, saving their state); a threads part of
      the request is kept for phase 2;
    - a draining assignment waits until every live worker stopped the old tasks (or
      DRAIN_TIMEOUT_S passed), then phase 2 places every task afresh;
    - otherwise: place (keeping tasks where they are while fair), with the requested
      compute threads; nothing to write if nothing changed.

    `topology`: `spec` already parsed (the scheduler keeps it between passes).
    """
    request = request or {}
    if request.get("parallelism") and not (current and current.draining):
        if parallelism_fixed(spec):
            raise TopologyError(f"topology {spec.get('name')!r} fixes its components' parallelism (a training "
                                "run's units and sync slices); a rebalance may set threads, not parallelism")
        new_spec = copy.deepcopy(spec)
        notes = []
        for comp in new_spec["components"]:
            if comp["id"] in request["parallelism"]:
                old, new = comp["parallelism"], int(request["parallelism"][comp["id"]])
                notes.append(f"parallelism of {comp['id']} {old} -> {new} (rebalance request)")
                comp["parallelism"] = new
        new_spec["version"] = spec_version(spec) + 1
        Topology.from_dict(new_spec)       # TopologyError before anything is written
        draining = Assignment(threads=dict(current.threads) if current else {}, spec_version=new_spec["version"],
                              phase=DRAINING, draining_since=now)
        after = {"threads": request["threads"]} if request.get("threads") else {}
        return Step(assignment=draining, spec=new_spec, request=after, notes=notes, again=True)
    if current is not None and current.draining:
        if not set(workers) <= stopped and now - current.draining_since < DRAIN_TIMEOUT_S:
            return Step()          # phase 1 still running
        current = None             # phase 2: place everything afresh under the new spec
    new = assign(topology or Topology.from_dict(spec), workers, current)
    threads, notes = dict(new.threads), []
    if request.get("threads"):
        asked = {w: n for w, n in request["threads"].items() if w in workers}
        bad = {w: n for w, n in asked.items() if not threads_ok(n)}
        if bad:     # a request written past the client's checks: the rest of it is carried out
            notes.append(f"compute threads {bad} refused: each must be a whole number 1..{MAX_THREADS}")
        threads.update({w: n for w, n in asked.items() if w not in bad})
    # work shares are the load balancer's (balance.py): kept for the tasks that still exist
    shares = {t: w for t, w in current.shares.items() if t in new.tasks} if current is not None else {}
    new = replace(new, threads=threads, spec_version=spec_version(spec), shares=shares)
    # a threads-only request is carried out by this write; a parallelism request made
    # during a drain waits for the next pass
    done = {} if request and not request.get("parallelism") else None
    if current is not None and current.placement() == new.placement():
        return Step(request=done, notes=notes)
    if request.get("threads"):
        notes.append(f"compute threads now {threads} (rebalance request)")
    return Step(assignment=new, request=done, notes=notes)
