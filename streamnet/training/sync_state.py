"""The sync bolt's counters, in one typed value, and the shapes they leave in:

- `saved()` / `restore()`: what the task saves in the coordinator every few combines
  (sync_bolt `_must_save`), so that a sync task started anew (its worker died)
  continues the count (counting from the epoch plan what it did not find saved);
- `checkpoint_counters()` / `resume()`: the counters inside a checkpoint, so that a
  resumed run continues the count (the layout on disk is checkpoint.py's format);
- `stats()`: the run's account at the end (run_stats.SyncStats).

The parameters are not here: they live in the Aggregator, and come back after a
failure from the compute units' replicas (sync_recovery.py).
"""
from __future__ import annotations

import copy
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from .epoch_clock import EpochClock
from .ledger import SampleLedger
from .schedule import EpochPlans

RECENT = 2      # combines kept to undo (see SyncState.recent)


class LastRound(NamedTuple):
    """A recent combine: to undo its count if it was never delivered. Saved as a list."""
    step: int
    epoch: int      # 1-based
    samples: int
    round: int
    units: list     # the units whose samples it counted


@dataclass(kw_only=True, eq=False)
class SyncState:
    units: int
    next_step: int = 0                # the step the parameters start: the next one to combine
    rounds: int = 0                   # combines, resumed runs included
    samples: int = 0                  # samples counted, resumed runs included
    duplicates: int = 0
    recoveries: int = 0
    lost_steps: int = 0               # combined steps whose updates were lost with every replica (sync_recovery)
    epoch_samples: defaultdict = field(default_factory=lambda: defaultdict(int))   # epoch (1-based) -> samples
    started: float = field(default_factory=time.time)
    clock: EpochClock | None = None   # made in __post_init__ from `started`
    ledger: SampleLedger | None = None
    # the last RECENT combines, newest last: a sync task saves the counts of the round after
    # the one it sent before that round comes (sync_bolt.py), so the counters a successor
    # restores may be two rounds ahead of every replica
    recent: list = field(default_factory=list)
    samples_before: int = 0           # counted before the checkpoint this run resumed from
    resumed_from: int | None = None   # that checkpoint's step

    def __post_init__(self):
        self.clock = self.clock or EpochClock(self.started)
        self.ledger = self.ledger or SampleLedger(self.units)

    # -- counting --------------------------------------------------------------

    def count_round(self, plans: EpochPlans, step: int, epoch: int, rnd: int, samples: int, worked: list) -> None:
        """Count a combined round of `epoch` (0-based) with `samples` from the units `worked`."""
        self.next_step = step + 1
        self.rounds += 1
        self.samples += samples
        self.epoch_samples[epoch + 1] += samples
        self.ledger.record(epoch + 1, rnd, worked, plans.rounds(epoch))
        self.recent = self.recent[-(RECENT - 1):] + [LastRound(step, epoch + 1, samples, rnd, worked)]
        # an epoch can no longer change once a later one began and none of its rounds is
        # recent any more (an undo must find it open)
        for done in [e for e in self.ledger.open if e < self.recent[0].epoch]:
            self.ledger.close(done, plans.plan(done - 1))
        self.clock.record(epoch + 1, samples, plans.epoch_end(epoch, rnd))

    def snapshot(self) -> "SyncState":
        """A copy that counting rounds on leaves this one as it is (what a save ahead
        counts on: sync_bolt.py); 9 us against deepcopy's 66 on LeNet-5's counters."""
        c = copy.copy(self)
        c.epoch_samples = defaultdict(int, self.epoch_samples)
        c.clock = EpochClock(self.started, self.clock.spans)      # its spans are frozen: a shallow copy
        c.ledger = self.ledger.copy()
        c.recent = list(self.recent)
        return c

    @property
    def last_round(self) -> LastRound | None:
        return self.recent[-1] if self.recent else None

    def undo_last_round(self) -> None:
        """The last combine was counted but never delivered (its sync task died, or the
        combine failed): uncount it, so that its step is the next to combine again."""
        last = self.recent.pop()
        self.ledger.record(last.epoch, last.round, last.units, 0, delta=-1)
        self.epoch_samples[last.epoch] -= last.samples
        self.samples -= last.samples
        self.rounds -= 1
        self.clock.unrecord(last.epoch, last.samples)
        self.next_step = last.step

    # -- in the coordinator ----------------------------------------------------

    def saved(self) -> dict:
        return {"next_step": self.next_step, "epoch_samples": {str(k): v for k, v in self.epoch_samples.items()},
                "rounds": self.rounds, "samples": self.samples, "duplicates": self.duplicates,
                "recoveries": self.recoveries, "lost_steps": self.lost_steps, "started": self.started,
                "last_round": list(self.last_round) if self.last_round else None,
                "recent_rounds": [list(r) for r in self.recent],
                "ledger": self.ledger.to_state(), "epoch_clock": self.clock.to_state(),
                "samples_before": self.samples_before, "resumed_from": self.resumed_from}

    def restore(self, state: dict) -> None:
        """Continue from what the previous sync task saved; this is one more recovery."""
        self.next_step = state["next_step"]
        self.epoch_samples = defaultdict(int, {int(k): v for k, v in state["epoch_samples"].items()})
        self.ledger.load_state(state.get("ledger"))       # the .get()s: absent in states of older versions
        self.rounds, self.samples, self.duplicates = state["rounds"], state["samples"], state["duplicates"]
        self.recoveries = state["recoveries"] + 1
        self.lost_steps = state.get("lost_steps", 0)
        self.started = state["started"]
        self.clock = EpochClock.from_state(self.started, state.get("epoch_clock"))
        last = state.get("last_round")
        recent = state.get("recent_rounds")       # absent in states of older versions: the last alone
        self.recent = [LastRound(*r) for r in recent] if recent is not None else [LastRound(*last)] if last else []
        self.samples_before, self.resumed_from = state.get("samples_before", 0), state.get("resumed_from")

    # -- in a checkpoint -------------------------------------------------------

    def checkpoint_counters(self) -> dict:
        return {"epoch_samples": {str(k): v for k, v in self.epoch_samples.items()},
                "ledger": self.ledger.to_state(), "rounds": self.rounds, "samples": self.samples}

    def resume(self, step: int, counters: dict) -> None:
        """Continue the count of the run whose checkpoint of `step` this run resumes."""
        self.next_step = self.resumed_from = step
        self.epoch_samples = defaultdict(int, {int(k): v for k, v in counters["epoch_samples"].items()})
        self.ledger.load_state(counters.get("ledger"))     # absent in checkpoints of older versions
        self.rounds, self.samples = counters["rounds"], counters["samples"]
        self.samples_before = counters["samples"]
