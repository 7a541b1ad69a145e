"""The assignment of one topology: which worker runs which task, where each worker
listens, how many compute threads each should run. The leader writes it (versioned,
compare-and-set) and every worker converges to it.

Stored as JSON in the coordinator (readable with zkCli), task ids as strings there
because JSON keys are strings; in memory they are ints, everywhere:

    {"tasks": {"<task>": "<worker>"}, "workers": {"<worker>": "http://host:port"},
     "threads": {"<worker>": n}, "spec_version": v,
     "shares": {"<task>": w}}                 work shares set by load balancing, if any
    + "phase": "draining", "draining_since": <unix time>   during a parallelism change

A parallelism change is two-phase: a *draining* assignment with no tasks (every
worker stops the old tasks, saving their state, and acknowledges), then a placement
under the new spec. A new leader that finds a drain older than DRAIN_TIMEOUT_S
places anyway, so a dead worker cannot hold the topology.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..errors import StreamnetError
from .values import whole

RUNNING, DRAINING = "running", "draining"
DRAIN_TIMEOUT_S = 30.0


class AssignmentError(StreamnetError):
    pass


#: the most compute threads an assignment gives one worker (a rebalance asks for them):
#: far above any host's cores, far below what starting them would cost the worker
MAX_THREADS = 1024


def threads_ok(n) -> bool:
    """Whether `n` is a number of compute threads an assignment may give a worker."""
    return whole(n) and 1 <= n <= MAX_THREADS


@dataclass(frozen=True)
class Assignment:
    tasks: Mapping[int, str] = field(default_factory=dict)       # task -> worker
    workers: Mapping[str, str] = field(default_factory=dict)     # worker -> URL, those with tasks
    threads: Mapping[str, int] = field(default_factory=dict)     # worker -> compute threads
    spec_version: int = 0                                        # the topology spec it places
    phase: str = RUNNING
    draining_since: float = 0.0
    #: task -> relative share of its component's work (mean 1.0); set by the load
    #: balancer (control/balance.py) for tasks that report their speed; absent: equal
    shares: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self):
        if self.phase not in (RUNNING, DRAINING):
            raise AssignmentError(f"assignment phase must be {RUNNING!r} or {DRAINING!r}; got {self.phase!r}")
        bad = {t: w for t, w in self.shares.items() if not (0 < w < float("inf"))}
        if bad:
            raise AssignmentError(f"work shares must be positive and finite; got {bad}")

    @property
    def draining(self) -> bool:
        return self.phase == DRAINING

    def worker_of(self, task: int) -> str | None:
        return self.tasks.get(task)

    def placement(self) -> tuple:
        """What workers act on, for 'did anything change?' (not the drain's clock)."""
        return (dict(self.tasks), dict(self.workers), dict(self.threads), self.spec_version, self.phase,
                dict(self.shares))

    def to_json(self) -> dict:
        out = {"tasks": {str(t): w for t, w in sorted(self.tasks.items())}, "workers": dict(self.workers),
               "threads": dict(self.threads), "spec_version": self.spec_version}
        if self.draining:
            out.update(phase=self.phase, draining_since=self.draining_since)
        if self.shares:
            out["shares"] = {str(t): w for t, w in sorted(self.shares.items())}
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Assignment":
        try:
            return cls(tasks={int(t): str(w) for t, w in d.get("tasks", {}).items()},
                       workers={str(w): str(u) for w, u in d.get("workers", {}).items()},
                       threads={str(w): int(n) for w, n in d.get("threads", {}).items()},
                       spec_version=int(d.get("spec_version", 0)), phase=d.get("phase", RUNNING),
                       draining_since=float(d.get("draining_since", 0.0)),
                       shares={int(t): float(w) for t, w in d.get("shares", {}).items()})
        except (AttributeError, TypeError, ValueError) as e:
            raise AssignmentError(f"malformed assignment {str(d)[:120]}: {e}") from None


def moved_tasks(before: Assignment | None, after: Assignment) -> dict[int, tuple[str | None, str]]:
    """Tasks whose worker changed: task -> (old worker or None, new worker)."""
    old = before.tasks if before is not None else {}
    return {t: (old.get(t), w) for t, w in after.tasks.items() if old.get(t) != w}
