"""Sharded synchronisation: which part of the flat parameter vector each sync task
owns, and how the parts come back together.

With S sync tasks, task s owns the contiguous slice `bounds(size, S)[s]` of the
vector. A compute unit sends each slice of its contribution to its owner and
takes the combined slices back one by one; the eval and checkpoint bolts, which
need the whole vector, gather the S slices of a step (`Gather`) before they
evaluate or write. Every slice is combined by the same element-wise kernels in
the same unit order, so S = 1 and S > 1 give identical parameters.
"""
from __future__ import annotations

import numpy as np

from ..nn.parallel import shard_bounds
from ..runtime.values import whole


def bounds(size: int, slices: int) -> list[tuple[int, int]]:
    """[lo, hi) of each of the `slices` parts of a vector of `size` values."""
    if not 1 <= slices <= size:
        raise ValueError(f"{slices} sync tasks for a vector of {size} values: each needs at least one")
    return shard_bounds(size, slices)


def slice_index(value, slices: int) -> str | None:
    """Why `value` is not a slice index among `slices`, or None."""
    if not whole(value) or not 0 <= value < slices:
        return f"slice {value!r} is not one of the {slices} sync tasks' slices"
    return None


class Gather:
    """Items (tuples) that carry the slices of one vector, gathered per key (keys in
    the order of the run: a step, or (epoch, step)) until all S slices have come.

    After a fault the sync tasks answer a replayed round by sending their slice
    again, each when the replay reaches it, so copies of a slice come late: a second
    copy of a slice still gathering replaces the first, and a copy of a key finished
    already (`done`, the newest key the caller dealt with) is handed back at once -
    kept, it would wait for slices that never come again, and hold its tuple tree,
    and with it the spout's round, until the message timeout."""

    def __init__(self, slices: int):
        self.slices = slices
        self.parts: dict = {}     # key -> {slice: item}
        self.done = None          # the newest key finished (None: none yet)

    def add(self, key, s: int, item) -> tuple[list | None, object | None]:
        """(the key's items in slice order once all are in, else None; an item the
        caller is finished with and acks now - the copy this one replaced, or this one
        if its key was finished already - or None)."""
        if self.done is not None and key <= self.done:
            return None, item
        got = self.parts.setdefault(key, {})
        replaced = got.get(s)
        got[s] = item
        if len(got) < self.slices:
            return None, replaced
        del self.parts[key]
        return [got[i] for i in range(self.slices)], replaced

    def finish(self, key) -> list:
        """The caller dealt with `key`'s whole vector: later copies of its slices are
        handed back by add. Returns the items of the gatherings of older keys, to ack
        (left incomplete by a fault: their rounds were replayed)."""
        self.done = key if self.done is None else max(self.done, key)
        old = [k for k in self.parts if k <= key]
        return [item for k in old for item in self.parts.pop(k).values()]


def joined(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


# -- the checkpoint state (the sync bolt's `_checkpoint_state`) across slices -----------

def merge_checkpoint_states(states: list[dict]) -> dict:
    """One checkpoint's state from the S sync tasks' parts: the outer momentum is
    sliced like the parameters; the units' states travel with slice 0; position,
    counters and configuration are the same in every slice (slice 0's are kept)."""
    if len(states) == 1:
        return states[0]
    first = states[0]
    units = {}
    for st in states:
        units.update(st["units"])
    velocity = joined([st["outer"]["velocity"] for st in states])
    return {**first, "units": units, "outer": {**first["outer"], "velocity": velocity}}


def slice_of_outer_state(outer: dict, lo: int, hi: int) -> dict:
    """A checkpoint's outer-optimiser state for the slice [lo, hi) (empty without outer momentum)."""
    v = outer.get("velocity")
    return {**outer, "velocity": v[lo:hi] if v is not None and v.size else v}
