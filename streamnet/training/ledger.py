"""Exactly-once accounting: which work of each epoch went into the parameters.

A round's work for one unit is a fixed list of samples (the schedule is a function
of the seed), so counting (round, unit) slots counts samples. The ledger keeps one
byte per slot for the epochs still open, and, once an epoch can no longer change
(a round of a later epoch was combined), keeps only the slots that were missed or
counted more than once. `report` turns those into sample indices.
"""
from __future__ import annotations

import base64

import numpy as np

SHOWN = 20   # sample indices listed per epoch and fault


class SampleLedger:
    def __init__(self, units: int):
        self.units = units
        self.open: dict[int, bytearray] = {}         # epoch (1-based) -> count per round * units + unit
        self.faults: dict[int, dict[str, list]] = {}  # epoch -> {"missed": [[round, unit]], "doubled": [...]}

    def record(self, epoch: int, rnd: int, units: list[int], rounds: int, delta: int = 1) -> None:
        if delta < 0 and epoch not in self.open:
            return
        counts = self.open.setdefault(epoch, bytearray(rounds * self.units))
        for u in units:
            i = rnd * self.units + u
            counts[i] = min(max(counts[i] + delta, 0), 255)

    def close(self, epoch: int, plan: list) -> None:
        """The epoch is over: keep only its faults. `plan` is the epoch's unit plan."""
        counts = self.open.pop(epoch, None)
        if counts is None:
            return
        missed, doubled = [], []
        for u, unit_rounds in enumerate(plan):
            for r in range(len(unit_rounds)):
                if not len(unit_rounds[r]):
                    continue        # no batch of this unit in that round (load balancing's last round)
                n = counts[r * self.units + u] if r * self.units + u < len(counts) else 0
                if n == 0:
                    missed.append([r, u])
                elif n > 1:
                    doubled.append([r, u])
        if missed or doubled:
            self.faults[epoch] = {"missed": missed, "doubled": doubled}

    def copy(self) -> "SampleLedger":
        c = SampleLedger(self.units)
        c.open = {e: bytearray(counts) for e, counts in self.open.items()}
        c.faults = dict(self.faults)        # an epoch's faults are set once, never changed
        return c

    def clean(self, epoch: int) -> bool:
        return epoch not in self.faults

    def report(self, plan_of) -> dict:
        """{epoch: {"missed_samples", "missed_first", "doubled_samples", "doubled_first"}} for
        the epochs with faults; plan_of(epoch) gives that epoch's unit plan."""
        out = {}
        for epoch, f in sorted(self.faults.items()):
            plan = plan_of(epoch)
            entry = {}
            for kind in ("missed", "doubled"):
                idx = [np.concatenate(plan[u][r]) for r, u in f[kind] if len(plan[u][r])]
                flat = np.concatenate(idx) if idx else np.zeros(0, np.int64)
                entry[f"{kind}_samples"] = int(flat.size)
                entry[f"{kind}_first"] = np.sort(flat)[:SHOWN].tolist()
            out[str(epoch)] = entry
        return out

    def to_state(self) -> dict:
        return {"open": {str(e): base64.b64encode(bytes(c)).decode() for e, c in self.open.items()},
                "faults": {str(e): f for e, f in self.faults.items()}}

    def load_state(self, state: dict | None) -> None:
        if not state:
            return
        self.open = {int(e): bytearray(base64.b64decode(c)) for e, c in state.get("open", {}).items()}
        self.faults = {int(e): f for e, f in state.get("faults", {}).items()}
