"""Straggler attribution: which unit held each round, and why.

The sync bolt knows when each unit's contribution arrived, and each contribution
says how long its unit computed and how long the work waited on its worker before
the compute began (queueing: the worker's threads were busy). What is left of the
time from the round's start to the arrival is communication (the work, the
parameters and the contribution on the wire, and the hops between). The round's
straggler is the unit that arrived last, when it arrived noticeably later than the
others; its reason is the part in which it exceeded the other units the most:

    compute        a slow node (a co-tenant, fewer cores, a larger share)
    communication  a slow link or a far worker
    queueing       a busy worker (more tasks than threads)

Pure bookkeeping, no engine: the sync bolt feeds it and reports what it holds.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import NamedTuple

REASONS = ("compute", "communication", "queueing")
MIN_LATE_S = 0.002      # later than the others' median arrival by less than this: no straggler
MIN_LATE_FRACTION = 0.1 # ... or by less than this fraction of the round


@dataclass(frozen=True)
class Arrival:
    unit: int
    worker: str
    arrived: float       # the sync task's clock
    compute_s: float
    queue_s: float


@dataclass
class UnitRecord:
    unit: int
    worker: str = ""
    rounds: int = 0                                     # rounds it held
    held_s: float = 0.0                                 # seconds the others waited for it in those rounds
    reasons: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))

    def to_dict(self) -> dict:
        return {"unit": self.unit, "worker": self.worker, "rounds": self.rounds, "held_s": round(self.held_s, 4),
                "reasons": dict(self.reasons)}


class Verdict(NamedTuple):
    unit: int
    worker: str
    late_s: float
    reason: str


class Stragglers:
    def __init__(self):
        self.units: dict[int, UnitRecord] = {}
        self.rounds = 0                  # rounds judged
        self.last: Verdict | None = None

    def judge(self, started: float | None, arrivals: list[Arrival]) -> Verdict | None:
        """One round: `started` is when the round began on the sync task's clock (it sent
        the previous round's parameters), None for the first round seen."""
        if started is None or len(arrivals) < 2:
            return None
        self.rounds += 1
        last = max(arrivals, key=lambda a: a.arrived)
        others = [a for a in arrivals if a is not last]
        late = last.arrived - statistics.median(a.arrived for a in others)
        if late < max(MIN_LATE_S, MIN_LATE_FRACTION * (last.arrived - started)):
            return None

        def parts(a: Arrival) -> dict[str, float]:
            return {"compute": a.compute_s, "queueing": a.queue_s,
                    "communication": max(0.0, a.arrived - started - a.compute_s - a.queue_s)}
        mine, theirs = parts(last), [parts(a) for a in others]
        excess = {r: mine[r] - statistics.median(t[r] for t in theirs) for r in REASONS}
        reason = max(REASONS, key=lambda r: excess[r])
        rec = self.units.setdefault(last.unit, UnitRecord(last.unit))
        rec.worker = last.worker
        rec.rounds += 1
        rec.held_s += late
        rec.reasons[reason] += 1
        self.last = Verdict(last.unit, last.worker, late, reason)
        return self.last

    def top(self, n: int = 3) -> list[dict]:
        """The units that held the most time, most first."""
        return [r.to_dict() for r in sorted(self.units.values(), key=lambda r: -r.held_s)[:n]]
